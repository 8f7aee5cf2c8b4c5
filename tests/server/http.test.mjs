// http.test.mjs - the HTTP layer under clients no library would be: raw HTTP/1.1 over sockets
// (rawhttp.mjs) against a real `cairn serve` (under AddressSanitizer in `make test`'s second pass).
// Every test ends by checking that the server still answers; the last one stops it and requires a
// clean exit, so a leak or a crash anywhere in the run fails here.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';

import { startServer, sleep, waitFor, longText } from './harness.mjs';
import { connect, request, chunked } from './rawhttp.mjs';

let srv; // no delays: fast answers
let slow; // forwards paced by CAIRN_TEST_FORWARD_DELAY_MS, so a client can leave mid-prefill
const MODEL = 'tiny';
const MAX_BODY = 65536;

before(async () => {
  srv = await startServer(['--name', MODEL, '--max-body', String(MAX_BODY), '--header-timeout', '2']);
  slow = await startServer(['--name', MODEL, '--chunk', '16', '--keepalive', '0.2'], {
    CAIRN_TEST_FORWARD_DELAY_MS: '40',
  });
});

after(async () => {
  await srv?.stop();
  await slow?.stop();
});

const chatBody = (content, extra = {}) =>
  JSON.stringify({ model: MODEL, messages: [{ role: 'user', content }], max_tokens: 3, ...extra });

async function alive(s = srv) {
  const c = await connect(s.port);
  await c.write(request('GET', '/api/version'));
  const r = await c.response();
  c.destroy();
  assert.equal(r.status, 200);
  assert.match(r.body, /"version"/);
}

test('HEAD, GET, POST, OPTIONS and unknown methods mixed on one keep-alive connection', async () => {
  const c = await connect(srv.port);
  const steps = [
    ['HEAD', '/', undefined, 200],
    ['GET', '/', undefined, 200],
    ['HEAD', '/api/tags', undefined, 200],
    ['POST', '/v1/chat/completions', chatBody('hello'), 200],
    ['OPTIONS', '/v1/chat/completions', undefined, 204],
    ['BREW', '/api/chat', undefined, 405],
    ['FOO', '/nowhere', undefined, 404],
    ['GET', '/api/chat', undefined, 405],
    ['HEAD', '/api/version', undefined, 200],
    ['POST', '/api/generate', JSON.stringify({ model: MODEL, prompt: 'hi', stream: false, options: { num_predict: 2 } }), 200],
    ['GET', '/v1/models', undefined, 200],
  ];
  for (const [method, path, body, status] of steps) {
    await c.write(request(method, path, { body }));
    const r = await c.response(method);
    assert.equal(r.status, status, `${method} ${path}`);
    if (method === 'HEAD') {
      assert.equal(r.body, '');
      assert.ok(Number(r.headers['content-length']) > 0, 'HEAD keeps the length of the GET body');
    }
    if (status === 204 || status === 405) assert.match(r.headers.allow, /POST/);
  }
  c.destroy();
  await alive();
});

test('HEAD / HTTP/1.0, then the connection closes', async () => {
  for (let i = 0; i < 3; i++) {
    const c = await connect(srv.port);
    await c.write('HEAD / HTTP/1.0\r\n\r\n');
    const r = await c.response('HEAD');
    assert.equal(r.status, 200);
    assert.ok(await c.waitClosed(5000));
  }
  await alive();
});

test('pipelined requests are answered in order', async () => {
  const c = await connect(srv.port);
  const reqs = [
    request('GET', '/api/version'),
    request('HEAD', '/'),
    request('POST', '/v1/chat/completions', { body: chatBody('one') }),
    request('GET', '/api/tags'),
    request('POST', '/api/show', { body: JSON.stringify({ model: MODEL }) }),
    request('GET', '/nowhere'),
  ];
  await c.write(Buffer.concat(reqs));
  const methods = ['GET', 'HEAD', 'POST', 'GET', 'POST', 'GET'];
  const want = [200, 200, 200, 200, 200, 404];
  for (let i = 0; i < reqs.length; i++) {
    const r = await c.response(methods[i]);
    assert.equal(r.status, want[i], `pipelined request ${i}`);
  }
  c.destroy();
});

test('a query string on every route routes on the path', async () => {
  const c = await connect(srv.port);
  const routes = [
    ['GET', '/', undefined],
    ['GET', '/api/version', undefined],
    ['GET', '/api/tags', undefined],
    ['GET', '/api/ps', undefined],
    ['GET', '/v1/models', undefined],
    ['GET', `/v1/models/${MODEL}`, undefined],
    ['POST', '/api/show', JSON.stringify({ model: MODEL })],
    ['POST', '/api/chat', JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'x' }], stream: false, options: { num_predict: 2 } })],
    ['POST', '/api/generate', JSON.stringify({ model: MODEL, prompt: 'x', stream: false, options: { num_predict: 2 } })],
    ['POST', '/v1/chat/completions', chatBody('x')],
    ['POST', '/v1/completions', JSON.stringify({ model: MODEL, prompt: 'x', max_tokens: 2 })],
  ];
  for (const [method, path, body] of routes) {
    await c.write(request(method, `${path}?beta=true&x=%20y`, { body }));
    const r = await c.response(method);
    assert.equal(r.status, 200, `${method} ${path}?beta=true: ${r.body}`);
  }
  c.destroy();
});

test('a chunked request body', async () => {
  const c = await connect(srv.port);
  await c.write(request('POST', '/v1/chat/completions', {
    headers: { 'Transfer-Encoding': 'chunked', 'Content-Type': 'application/json' },
    body: chunked(chatBody('chunked hello'), 5),
  }));
  const r = await c.response('POST');
  assert.equal(r.status, 200, r.body);
  assert.equal(JSON.parse(r.body).object, 'chat.completion');
  // and the connection carries on
  await c.write(request('GET', '/api/version'));
  assert.equal((await c.response()).status, 200);
  c.destroy();
});

test('Expect: 100-continue gets 100 before the body is sent', async () => {
  const c = await connect(srv.port);
  const body = Buffer.from(chatBody('expecting'));
  await c.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
    `Content-Length: ${body.length}\r\nExpect: 100-continue\r\n\r\n`);
  const cont = await c.response('POST', 10000);
  assert.equal(cont.status, 100);
  await c.write(body);
  const r = await c.response('POST');
  assert.equal(r.status, 200, r.body);
  c.destroy();
});

test('a declared body over --max-body gets 413 without the body being read', async () => {
  const c = await connect(srv.port);
  await c.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: ${MAX_BODY * 100}\r\n` +
    'Expect: 100-continue\r\n\r\n');
  const r = await c.response('POST', 10000);
  assert.equal(r.status, 413);
  assert.match(JSON.parse(r.body).error.message, /over the limit of 65536 bytes/);
  c.destroy();
  // without Expect: the answer comes while the client is still sending
  const d = await connect(srv.port);
  await d.write(`POST /api/chat HTTP/1.1\r\nHost: x\r\nContent-Length: ${MAX_BODY * 100}\r\n\r\n`);
  const r2 = await d.response('POST', 10000);
  assert.equal(r2.status, 413);
  assert.match(JSON.parse(r2.body).error, /over the limit/);
  d.destroy();
  await alive();
});

test('a chunked body over --max-body closes the connection before it is all sent', async () => {
  const c = await connect(srv.port);
  await c.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n`);
  const piece = Buffer.alloc(16384, 'a');
  const chunk = Buffer.concat([Buffer.from('4000\r\n'), piece, Buffer.from('\r\n')]);
  let sent = 0;
  while (!c.closed && sent < MAX_BODY * 200) { // 13 MB if the server read it all
    if (!(await c.write(chunk))) break;
    sent += piece.length;
  }
  assert.ok(await c.waitClosed(10000), 'the server closes the connection');
  assert.ok(sent < MAX_BODY * 200, `the server read ${sent} bytes`);
  c.destroy();
  await alive();
});

test('clients that vanish mid-headers and mid-body leave the server serving', async () => {
  for (let i = 0; i < 5; i++) {
    const a = await connect(srv.port);
    await a.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le');
    a.destroy();
    const b = await connect(srv.port);
    await b.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{"model":');
    b.destroy();
    const d = await connect(srv.port);
    await d.write('POST /api/chat HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n{"model":"tiny"');
    d.destroy();
  }
  await alive();
});

test('a client that vanishes mid-prefill cancels its job; the next request is served', async () => {
  const c = await connect(slow.port);
  const body = JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: longText(600, 7) }], max_tokens: 4, stream: true });
  await c.write(request('POST', '/v1/chat/completions', { body }));
  await c.until(() => c.buf.includes(': prefill') || undefined, 20000, 'prefill progress');
  c.destroy();
  await waitFor(() => /client disconnected/.test(slow.log()), 20000, 'the disconnect in the log');
  await alive(slow);
  const d = await connect(slow.port);
  await d.write(request('POST', '/v1/chat/completions', { body: chatBody('after the cancel') }));
  assert.equal((await d.response('POST', 60000)).status, 200);
  d.destroy();
});

test('a client that vanishes mid-stream; the next request is served', async () => {
  const c = await connect(slow.port);
  const body = JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: 'stream to me' }], max_tokens: 200, ignore_eos: true, stream: true });
  await c.write(request('POST', '/v1/chat/completions', { body }));
  await c.until(() => c.buf.includes('"delta"') || undefined, 30000, 'the first delta');
  const before = (slow.log().match(/client disconnected/g) || []).length;
  c.destroy();
  await waitFor(() => (slow.log().match(/client disconnected/g) || []).length > before, 20000, 'the disconnect');
  const d = await connect(slow.port);
  await d.write(request('POST', '/v1/chat/completions', { body: chatBody('after the stream') }));
  assert.equal((await d.response('POST', 60000)).status, 200);
  d.destroy();
});

test('headers sent one byte a second are cut off by --header-timeout, and others are served meanwhile', async () => {
  const c = await connect(srv.port);
  const text = 'GET /api/version HTTP/1.1\r\nHost: x\r\nX-Slow: ' + 'z'.repeat(40) + '\r\n\r\n';
  const t0 = Date.now();
  let i = 0;
  const drip = (async () => {
    while (!c.closed && i < text.length) {
      await c.write(text[i++]);
      await sleep(1000);
    }
  })();
  await alive(); // another connection is not held up
  assert.ok(await c.waitClosed(8000), 'the slow connection is closed');
  const took = Date.now() - t0;
  assert.ok(took >= 1500 && took < 6000, `closed after ${took} ms (deadline 2 s)`);
  assert.ok(i < text.length, 'before its headers were complete');
  await drip;
  c.destroy();
  // an idle keep-alive connection is closed by the same deadline, after serving its requests
  const k = await connect(srv.port);
  await k.write(request('GET', '/api/version'));
  assert.equal((await k.response()).status, 200);
  assert.ok(await k.waitClosed(6000), 'an idle keep-alive connection is closed');
  await alive();
});

test('1,000 requests on one connection', async () => {
  const c = await connect(srv.port);
  for (let i = 0; i < 1000; i++) {
    const method = i % 3 === 0 ? 'HEAD' : 'GET';
    await c.write(request(method, i % 2 ? '/api/version' : '/'));
    const r = await c.response(method);
    assert.equal(r.status, 200, `request ${i}`);
  }
  c.destroy();
});

test('64 connections at once', async () => {
  const conns = await Promise.all(Array.from({ length: 64 }, () => connect(srv.port)));
  await Promise.all(conns.map((c, i) => c.write(i % 4 === 0
    ? request('POST', '/v1/chat/completions', { body: chatBody(`client ${i}`) })
    : request('GET', '/api/tags'))));
  const rs = await Promise.all(conns.map((c, i) => c.response(i % 4 === 0 ? 'POST' : 'GET', 90000)));
  for (const [i, r] of rs.entries()) assert.equal(r.status, 200, `connection ${i}: ${r.body}`);
  for (const c of conns) c.destroy();
  await alive();
});

test('the server exits cleanly after all of it', async () => {
  await alive();
  const code = await srv.stop();
  srv = null;
  assert.equal(code, 0, 'exit status (a leak or crash under ASan makes it non-zero)');
  const code2 = await slow.stop();
  slow = null;
  assert.equal(code2, 0);
});
