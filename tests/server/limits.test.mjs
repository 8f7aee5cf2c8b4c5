// limits.test.mjs - a server with every limit set: --api-key (401), --max-body (413),
// --max-queue (503 with Retry-After), queued requests whose client leaves (dropped unrun), and
// --finish-cancelled 0 (an abandoned prefill stops at once; the retry resumes where it stopped).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Ollama } from 'ollama';
import OpenAI from 'openai';
import { startServer, longText, waitFor } from './harness.mjs';

const KEY = 'sekret-key';
const MODEL = 'tiny';
let srv, ollama, openai;
const auth = { Authorization: `Bearer ${KEY}` };

before(async () => {
  // A pause between forwards (test-only) keeps requests running long enough to queue behind,
  // however fast the machine is.
  // --ctx 4096: the tiny model's own context (2048) is shorter than the queueing test's prompt
  srv = await startServer(['--api-key', KEY, '--ctx', '4096', '--max-body', '64K', '--max-queue', '2',
                           '--chunk', '16', '--finish-cancelled', '0'], { CAIRN_TEST_FORWARD_DELAY_MS: '20' });
  ollama = new Ollama({ host: srv.url, headers: auth });
  openai = new OpenAI({ baseURL: srv.url + '/v1', apiKey: KEY, maxRetries: 0 });
});
after(async () => { if (srv) assert.equal(await srv.stop(), 0, srv.log()); });

const ps = async () => (await ollama.ps()).models[0];
const idle = () => waitFor(async () => { const m = (await ollama.ps()).models[0]; return m.running === 0 && m.queued === 0; }, 30000, 'idle');

test('401 without the bearer key or with a wrong one, in each dialect', async () => {
  let r = await fetch(srv.url + '/api/tags');
  assert.equal(r.status, 401);
  assert.match((await r.json()).error, /API key/);
  r = await fetch(srv.url + '/v1/models', { headers: { Authorization: 'Bearer nope' } });
  assert.equal(r.status, 401);
  assert.equal((await r.json()).error.type, 'authentication_error');
  const bad = new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(bad.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'x' }] }), (e) => e.status === 401);
  await assert.rejects(new Ollama({ host: srv.url }).list(), (e) => e.status_code === 401);
  assert.equal((await ollama.list()).models[0].name, MODEL);
  assert.equal((await openai.models.list()).data[0].id, MODEL);
});

test('413 for a declared body over --max-body', async () => {
  const big = JSON.stringify({ model: MODEL, prompt: 'x'.repeat(100 * 1024) });
  const r = await fetch(srv.url + '/api/generate', { method: 'POST', headers: auth, body: big });
  assert.equal(r.status, 413);
  assert.match((await r.json()).error, /limit of 65536 bytes/);
});

test('503 with Retry-After when the queue is full; every accepted request completes', async () => {
  const gen = (seed) => openai.completions.create({ model: MODEL, prompt: longText(500, seed), max_tokens: 2 });
  const accepted = [gen(101)];
  await waitFor(async () => (await ps()).running === 1, 20000, 'the first request running');
  accepted.push(gen(102), gen(103)); // two wait: the queue is full
  await waitFor(async () => (await ps()).queued === 2, 20000, 'two requests queued');
  const r = await fetch(srv.url + '/v1/completions', { method: 'POST', headers: auth,
    body: JSON.stringify({ model: MODEL, prompt: 'one more', max_tokens: 1 }) });
  assert.equal(r.status, 503);
  assert.ok(Number(r.headers.get('retry-after')) > 0);
  assert.match((await r.json()).error.message, /busy/);
  for (const x of await Promise.all(accepted)) assert.equal(x.choices.length, 1);
  await idle();
});

test('a queued request whose client leaves is dropped without running', async () => {
  // Each step waits for the server to show the state it needs, never for a fixed time: on a loaded
  // machine the first request can reach the server after the second.
  const first = openai.completions.create({ model: MODEL, prompt: longText(1100, 201), max_tokens: 2 });
  await waitFor(async () => (await ps()).running === 1, 20000, 'the first request running');
  const ac = new AbortController();
  const queued = fetch(srv.url + '/api/generate', { method: 'POST', headers: auth, signal: ac.signal,
    body: JSON.stringify({ model: MODEL, prompt: 'left while queued', raw: true, options: { num_predict: 2 } }) })
    .then((r) => r.text()).catch((e) => e.name);
  await waitFor(async () => (await ps()).queued === 1, 20000, 'the second request queued');
  ac.abort();
  assert.equal(await queued, 'AbortError');
  await first;
  await idle();
  assert.match(srv.log(), /client left while queued; dropped/);
});

test('--finish-cancelled 0: an abandoned prefill stops, the retry resumes where it stopped', async () => {
  const prompt = longText(500, 301);
  const it = await ollama.generate({ model: MODEL, prompt, raw: true, stream: true, options: { num_predict: 2 } });
  let total = 0, seen = 0;
  try {
    for await (const p of it) if (p.prefill) { total = p.prefill.total; seen = p.prefill.done; it.abort(); }
  } catch { /* AbortError */ }
  assert.ok(total > 500 && seen < total);
  await idle();
  const r = await ollama.generate({ model: MODEL, prompt, raw: true, stream: false, options: { num_predict: 2 } });
  // it resumed (less than the whole prompt) and the first attempt did not finish it (more than a tail)
  assert.ok(r.prompt_eval_count < total - 16, `retry evaluated ${r.prompt_eval_count} of ${total}`);
  assert.ok(r.prompt_eval_count > 64, `retry evaluated ${r.prompt_eval_count} of ${total}`);
});
