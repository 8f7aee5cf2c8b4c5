// http_fuzz.mjs - random and mutated HTTP byte streams against a live `cairn serve`, for a bounded
// time. The request-parser fuzzer (fuzz_request.c) covers what a body can hold; this covers what
// a connection can carry: broken request lines, lying lengths, chunk sizes past 2^63, headers cut
// anywhere, pipelines of half-requests, bytes dribbled in pieces, sockets dropped mid-answer.
//
//   node tests/fuzz/http_fuzz.mjs --bin build-asan/cairn --seconds 30 [--seed N] [--workers 8]
//
// Passes when the server answered a health check at every checkpoint and, stopped at the end with
// SIGTERM, exited 0 with nothing from a sanitizer on stderr (under ASan, a leak or a bad access
// makes the exit status non-zero). On a failure the last inputs are written to --out (default
// build-asan/http-fuzz-failure) to be replayed.
import { spawn, execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';

const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1]]);
  return acc;
}, []));
const BIN = args.bin || process.env.CAIRN_BIN || 'build-asan/cairn';
const SECONDS = Number(args.seconds || 30);
const WORKERS = Number(args.workers || 8);
let seed = Number(args.seed || (Date.now() % 2147483647));
const OUT = args.out || path.join(path.dirname(BIN), 'http-fuzz-failure');
const TMP = args.tmp || path.join(path.dirname(BIN), 'tmp');

// xorshift32: the run is replayable from its seed (the timing of the server's answers is not).
function rnd() {
  seed ^= seed << 13; seed >>>= 0;
  seed ^= seed >>> 17;
  seed ^= seed << 5; seed >>>= 0;
  return seed / 4294967296;
}
const pick = (a) => a[Math.floor(rnd() * a.length)];
const int = (n) => Math.floor(rnd() * n);

const MODEL = 'tiny';
const chat = (extra = {}) => JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'hi there' }], max_tokens: 2, ...extra });
const BODIES = [
  chat(), chat({ stream: true }),
  JSON.stringify({ model: MODEL, prompt: 'abc', stream: false, options: { num_predict: 2 } }),
  JSON.stringify({ model: MODEL, prompt: 'abc', max_tokens: 2 }),
  JSON.stringify({ model: MODEL }),
  JSON.stringify({ model: MODEL, max_tokens: 2, messages: [{ role: 'user', content: [{ type: 'text', text: 'hi' }] }] }),
  JSON.stringify({ model: MODEL, input: 'hi', max_output_tokens: 2 }),
  '{"model":', '[]', '', '\u0000\u00ff',
];
const PATHS = ['/', '/api/version', '/api/tags', '/api/ps', '/api/show', '/api/chat', '/api/generate',
  '/v1/models', `/v1/models/${MODEL}`, '/v1/chat/completions', '/v1/completions', '/v1/messages',
  '/v1/messages/count_tokens', '/v1/responses', '/nowhere', '/v1/chat/completions?beta=true', '/%00', '//', '/..'];
const METHODS = ['GET', 'HEAD', 'POST', 'OPTIONS', 'PUT', 'DELETE', 'PATCH', 'BREW', 'G ET', '', 'POST\t'];
const LENGTHS = ['0', '1', '-1', '18446744073709551616', '9223372036854775807', '4294967296', '+5', ' 7', 'abc', '0x10', '99999999'];
const CHUNKS = ['0', 'ffffffffffffffffff', '-1', '1;ext=1', 'zz', '7fffffffffffffff', '10', ''];

function chunkedBody(b) {
  let out = '';
  for (let i = 0; i < b.length;) {
    const n = 1 + int(9);
    const part = b.slice(i, i + n);
    out += (rnd() < 0.1 ? pick(CHUNKS) : part.length.toString(16)) + '\r\n' + part + '\r\n';
    i += n;
  }
  return out + (rnd() < 0.8 ? '0\r\n\r\n' : '');
}

function validRequest() {
  const method = rnd() < 0.6 ? 'POST' : pick(['GET', 'HEAD', 'OPTIONS']);
  const body = method === 'POST' ? pick(BODIES) : '';
  let h = `${method} ${pick(PATHS)} HTTP/1.${rnd() < 0.9 ? 1 : 0}\r\nHost: x\r\n`;
  if (rnd() < 0.2) h += 'Expect: 100-continue\r\n';
  if (rnd() < 0.1) h += 'Connection: close\r\n';
  if (rnd() < 0.1) h += 'x-api-key: k\r\nAuthorization: Bearer k\r\n';
  if (method === 'POST' && rnd() < 0.3) return h + 'Transfer-Encoding: chunked\r\n\r\n' + chunkedBody(body);
  return h + `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n` + body;
}

// One stream: a pipeline of valid requests, then mutations at the byte and the token level.
function input() {
  let s = '';
  const n = 1 + int(3);
  for (let i = 0; i < n; i++) s += validRequest();
  let b = Buffer.from(s, 'latin1');
  const muts = int(4);
  for (let m = 0; m < muts; m++) {
    const at = int(b.length + 1);
    switch (int(9)) {
    case 0: if (b.length) b[int(b.length)] ^= 1 << int(8); break;
    case 1: b = Buffer.concat([b.subarray(0, at), Buffer.from([int(256)]), b.subarray(at)]); break;
    case 2: b = Buffer.concat([b.subarray(0, at), b.subarray(at + 1 + int(16))]); break;
    case 3: b = b.subarray(0, at); break; // truncate
    case 4: b = Buffer.concat([b.subarray(0, at), b.subarray(int(b.length), int(b.length) + 64), b.subarray(at)]); break;
    case 5: b = Buffer.from(b.toString('latin1').replace(/Content-Length: \S*/, `Content-Length: ${pick(LENGTHS)}`), 'latin1'); break;
    case 6: b = Buffer.from(b.toString('latin1').replace(/^\S+/, pick(METHODS)), 'latin1'); break;
    case 7: b = Buffer.concat([b.subarray(0, at), Buffer.from(`X-${int(1e6)}: ${'v'.repeat(int(3) ? 10 : 40000)}\r\n`), b.subarray(at)]); break;
    case 8: b = Buffer.from(b.toString('latin1').replace(/\r\n/g, () => (rnd() < 0.3 ? '\n' : '\r\n')), 'latin1'); break;
    }
  }
  if (rnd() < 0.05) b = Buffer.from(Array.from({ length: int(2000) }, () => int(256)));
  return b;
}

// Sends b in a few pieces, reads for a while, and drops the socket (sometimes at once).
function shoot(port, b) {
  return new Promise((resolve) => {
    const sock = net.connect({ port, host: '127.0.0.1' });
    let got = 0;
    const done = () => { sock.destroy(); resolve(got); };
    const t = setTimeout(done, 50 + int(400));
    sock.on('data', (d) => { got += d.length; });
    sock.on('error', () => {});
    sock.on('close', () => { clearTimeout(t); resolve(got); });
    sock.on('connect', async () => {
      const pieces = 1 + int(4);
      for (let i = 0, at = 0; i < pieces && !sock.destroyed; i++) {
        const end = i === pieces - 1 ? b.length : at + int(b.length - at + 1);
        sock.write(b.subarray(at, end));
        at = end;
        if (rnd() < 0.3) await new Promise((r) => setTimeout(r, int(30)));
      }
      if (rnd() < 0.1) done();
    });
  });
}

function health(port) {
  return new Promise((resolve) => {
    const sock = net.connect({ port, host: '127.0.0.1' });
    let buf = '';
    const t = setTimeout(() => { sock.destroy(); resolve(false); }, 15000);
    sock.on('connect', () => sock.write('GET /api/version HTTP/1.1\r\nHost: x\r\n\r\n'));
    sock.on('data', (d) => {
      buf += d;
      if (/\r\n\r\n[\s\S]*"version"/.test(buf)) { clearTimeout(t); sock.destroy(); resolve(true); }
    });
    sock.on('error', () => { clearTimeout(t); resolve(false); });
  });
}

async function main() {
  const model = path.join(TMP, 'http-fuzz', 'tiny');
  if (!existsSync(path.join(model, 'config.json'))) {
    mkdirSync(path.dirname(model), { recursive: true });
    execFileSync(BIN, ['make-model', '--preset', 'tiny', '--out', model], { stdio: 'ignore' });
  }
  const startSeed = seed;
  console.log(`http-fuzz: ${BIN}, ${SECONDS} s, ${WORKERS} workers, seed ${startSeed}`);
  const proc = spawn(BIN, ['serve', '--model', model, '--name', MODEL, '--port', '0', '--threads', '1',
    '--max-body', '256K', '--header-timeout', '1', '--max-queue', '16'], {
    env: { ...process.env, CAIRN_LOG: 'warn' }, stdio: ['ignore', 'ignore', 'pipe'],
  });
  let log = '';
  proc.stderr.on('data', (d) => { log += d; if (log.length > 1 << 22) log = log.slice(-(1 << 21)); });
  const port = await new Promise((resolve, reject) => {
    const t = setTimeout(() => reject(new Error('server did not start:\n' + log)), 60000);
    const check = () => {
      const m = log.match(/serving \S+ on http:\/\/[^\s]+:(\d+)/);
      if (m) { clearTimeout(t); resolve(Number(m[1])); }
    };
    proc.stderr.on('data', check);
    proc.on('exit', (c) => reject(new Error(`server exited with ${c}:\n${log}`)));
  });
  const recent = [];
  let sent = 0, answered = 0, failure = null;
  const end = Date.now() + SECONDS * 1000;
  const worker = async () => {
    while (Date.now() < end && !failure) {
      const b = input();
      recent.push(b);
      if (recent.length > 64) recent.shift();
      sent++;
      if (await shoot(port, b)) answered++;
    }
  };
  const checker = async () => {
    while (Date.now() < end && !failure) {
      await new Promise((r) => setTimeout(r, 2000));
      if (proc.exitCode !== null || !(await health(port))) failure = 'the server stopped answering';
    }
  };
  await Promise.all([checker(), ...Array.from({ length: WORKERS }, worker)]);
  if (!failure && !(await health(port))) failure = 'the server stopped answering';
  proc.removeAllListeners('exit');
  const code = await new Promise((resolve) => {
    if (proc.exitCode !== null) return resolve(proc.exitCode);
    const t = setTimeout(() => proc.kill('SIGKILL'), 30000);
    proc.on('exit', (c, sig) => { clearTimeout(t); resolve(c ?? sig); });
    proc.kill('SIGTERM');
  });
  if (!failure && code !== 0) failure = `the server exited with ${code}`;
  if (!failure && /AddressSanitizer|LeakSanitizer|runtime error:/.test(log)) failure = 'a sanitizer reported';
  console.log(`http-fuzz: ${sent} streams sent, ${answered} got bytes back`);
  if (failure) {
    mkdirSync(OUT, { recursive: true });
    recent.forEach((b, i) => writeFileSync(path.join(OUT, `input-${i}.bin`), b));
    writeFileSync(path.join(OUT, 'server.log'), log);
    console.error(`http-fuzz: FAILED (seed ${startSeed}): ${failure}; last inputs and the log in ${OUT}`);
    console.error(log.split('\n').slice(-40).join('\n'));
    process.exit(1);
  }
  console.log('http-fuzz: ok');
}

main().catch((e) => { console.error(e); process.exit(1); });
