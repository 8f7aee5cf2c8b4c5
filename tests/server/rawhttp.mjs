// rawhttp.mjs - HTTP/1.1 spoken byte by byte over a plain socket, for the tests that must send
// what no client library sends: pipelined requests, chunked uploads, half-sent headers, a byte a
// second, methods that do not exist.
//
// A Conn buffers everything the server sends; response() parses the next response off that buffer
// (status, headers, body by Content-Length, chunked encoding or close; no body for HEAD, 1xx, 204
// and 304), so several responses to pipelined requests come out one by one. Every wait is bounded.
import net from 'node:net';

export class Conn {
  constructor(port) {
    this.buf = Buffer.alloc(0);
    this.closed = false;
    this.waiters = [];
    this.sock = net.connect({ port, host: '127.0.0.1' });
    this.sock.on('data', (d) => {
      this.buf = Buffer.concat([this.buf, d]);
      this.wake();
    });
    this.sock.on('close', () => {
      this.closed = true;
      this.wake();
    });
    this.sock.on('error', () => {
      this.closed = true;
      this.wake();
    });
  }

  ready() {
    return new Promise((resolve, reject) => {
      if (this.sock.readyState === 'open') return resolve();
      this.sock.once('connect', resolve);
      this.sock.once('error', reject);
    });
  }

  wake() {
    const w = this.waiters;
    this.waiters = [];
    for (const f of w) f();
  }

  // Resolves when cond() holds, or rejects after ms.
  until(cond, ms, what) {
    return new Promise((resolve, reject) => {
      const check = () => {
        let v;
        try {
          v = cond();
        } catch (e) {
          clearTimeout(t);
          return reject(e);
        }
        if (v !== undefined && v !== false) {
          clearTimeout(t);
          return resolve(v);
        }
        if (this.closed && !cond.allowClosed) {
          clearTimeout(t);
          return reject(new Error(`connection closed while waiting for ${what}`));
        }
        this.waiters.push(check);
      };
      const t = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
      check();
    });
  }

  write(data) {
    return new Promise((resolve) => {
      if (this.closed) return resolve(false);
      this.sock.write(data, (err) => resolve(!err));
    });
  }

  // The next response; method is the request's (HEAD has no body).
  async response(method = 'GET', ms = 30000) {
    const r = await this.until(() => parseResponse(this.buf, method, this.closed), ms, 'a response');
    this.buf = this.buf.subarray(r.used);
    return r;
  }

  // Resolves true once the server closed the connection (within ms), false if it did not.
  async waitClosed(ms) {
    const cond = () => this.closed || undefined;
    cond.allowClosed = true;
    try {
      await this.until(cond, ms, 'the close');
      return true;
    } catch {
      return false;
    }
  }

  destroy() {
    this.sock.destroy();
  }
}

export async function connect(port) {
  const c = new Conn(port);
  await c.ready();
  return c;
}

// One request's bytes. body: string or Buffer; headers: object (Host is always sent first).
export function request(method, path, { body, headers = {}, version = '1.1' } = {}) {
  let h = `${method} ${path} HTTP/${version}\r\nHost: 127.0.0.1\r\n`;
  const b = body === undefined ? null : Buffer.from(body);
  for (const [k, v] of Object.entries(headers)) h += `${k}: ${v}\r\n`;
  if (b && !Object.keys(headers).some((k) => /^(content-length|transfer-encoding)$/i.test(k)))
    h += `Content-Length: ${b.length}\r\n`;
  h += '\r\n';
  return b ? Buffer.concat([Buffer.from(h), b]) : Buffer.from(h);
}

// A body in chunked transfer encoding, cut into pieces of n bytes.
export function chunked(body, n = 7) {
  const b = Buffer.from(body);
  const parts = [];
  for (let i = 0; i < b.length; i += n) {
    const p = b.subarray(i, i + n);
    parts.push(Buffer.from(p.length.toString(16) + '\r\n'), p, Buffer.from('\r\n'));
  }
  parts.push(Buffer.from('0\r\n\r\n'));
  return Buffer.concat(parts);
}

// Parses one response off buf, or returns undefined when more bytes are needed.
export function parseResponse(buf, method, closed) {
  const end = buf.indexOf('\r\n\r\n');
  if (end < 0) return undefined;
  const head = buf.subarray(0, end).toString('latin1').split('\r\n');
  const m = head[0].match(/^HTTP\/1\.[01] (\d{3})/);
  if (!m) throw new Error(`not a status line: ${JSON.stringify(head[0])}`);
  const status = Number(m[1]);
  const headers = {};
  for (const line of head.slice(1)) {
    const i = line.indexOf(':');
    headers[line.slice(0, i).trim().toLowerCase()] = line.slice(i + 1).trim();
  }
  let at = end + 4;
  const noBody = method === 'HEAD' || (status >= 100 && status < 200) || status === 204 || status === 304;
  if (noBody) return { status, headers, body: '', used: at };
  if (headers['content-length'] !== undefined) {
    const n = Number(headers['content-length']);
    if (buf.length < at + n) return undefined;
    return { status, headers, body: buf.subarray(at, at + n).toString(), used: at + n };
  }
  if (/chunked/i.test(headers['transfer-encoding'] || '')) {
    const parts = [];
    for (;;) {
      const le = buf.indexOf('\r\n', at);
      if (le < 0) return undefined;
      const size = parseInt(buf.subarray(at, le).toString('latin1'), 16);
      if (Number.isNaN(size)) throw new Error('bad chunk size');
      if (buf.length < le + 2 + size + 2) return undefined;
      if (size === 0) {
        const te = buf.indexOf('\r\n\r\n', le);
        const used = te === le ? le + 4 : te < 0 ? undefined : te + 4;
        if (used === undefined) return undefined;
        return { status, headers, body: Buffer.concat(parts).toString(), used };
      }
      parts.push(buf.subarray(le + 2, le + 2 + size));
      at = le + 2 + size + 2;
    }
  }
  if (!closed) return undefined; // the body runs to the close
  return { status, headers, body: buf.subarray(at).toString(), used: buf.length };
}
