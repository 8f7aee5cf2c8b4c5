// e2e.test.mjs - `cairn serve` driven by the official, unmodified `ollama` and `openai` npm clients
// and by curl, on loopback. The model is the tiny synthetic one (random weights: the text is
// gibberish), so the tests assert structure, fields, equality of streamed and whole answers under
// greedy sampling, cancellation and cache reuse, never meaning. Tool calls come from a second
// server whose answers are canned (CAIRN_TEST_CANNED_OUTPUT), through the real parser.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { Ollama } from 'ollama';
import OpenAI from 'openai';
import { startServer, longText, sleep, waitFor } from './harness.mjs';

let srv, ollama, openai;
const MODEL = 'tiny';
const greedy = { temperature: 0, num_predict: 12 };
const chat1 = [{ role: 'user', content: 'Why is the sky blue?' }];

before(async () => {
  srv = await startServer(['--chunk', '64', '--ctx', '4096']);
  ollama = new Ollama({ host: srv.url });
  openai = new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'unused', maxRetries: 0 });
});
after(async () => {
  if (srv) assert.equal(await srv.stop(), 0, srv.log());
});

test('info endpoints: version, tags, show, ps, models', async () => {
  assert.match((await ollama.version()).version, /^\d+\.\d+\.\d+$/);
  const tags = await ollama.list();
  assert.equal(tags.models.length, 1);
  assert.equal(tags.models[0].name, MODEL);
  assert.equal(tags.models[0].details.family, 'nemotron_h');
  const show = await ollama.show({ model: MODEL });
  assert.ok(show.capabilities.includes('tools'));
  assert.equal(show.model_info['general.architecture'], 'nemotron_h');
  const ps = await ollama.ps();
  assert.equal(ps.models[0].name, MODEL);
  const models = await openai.models.list();
  assert.deepEqual(models.data.map((m) => m.id), [MODEL]);
  assert.equal((await openai.models.retrieve(MODEL)).id, MODEL);
});

test('ollama chat: streamed text equals the whole answer under greedy sampling', async () => {
  const whole = await ollama.chat({ model: MODEL, messages: chat1, options: greedy, stream: false });
  assert.equal(whole.done, true);
  assert.equal(whole.message.role, 'assistant');
  for (const k of ['total_duration', 'load_duration', 'prompt_eval_count', 'prompt_eval_duration',
                   'eval_count', 'eval_duration'])
    assert.equal(typeof whole[k], 'number', k);
  // the random model may end early with an end-of-sequence token
  assert.ok(whole.eval_count >= 1 && whole.eval_count <= 12);
  assert.equal(whole.done_reason, whole.eval_count === 12 ? 'length' : 'stop');
  let content = '', thinking = '', last, chunks = 0;
  for await (const part of await ollama.chat({ model: MODEL, messages: chat1, options: greedy, stream: true })) {
    content += part.message.content;
    thinking += part.message.thinking ?? '';
    last = part;
    chunks++;
  }
  assert.ok(chunks > 2);
  assert.equal(last.done, true);
  assert.equal(content, whole.message.content);
  assert.equal(thinking, whole.message.thinking ?? '');
  assert.equal(last.eval_count, whole.eval_count);
  // the second run found the prompt in the cache: it evaluated fewer tokens than the first
  assert.ok(last.prompt_eval_count < whole.prompt_eval_count || whole.prompt_eval_count < 8);
});

test('ollama chat: think true puts output in thinking, think false in content', async () => {
  const on = await ollama.chat({ model: MODEL, messages: chat1, think: true, options: greedy, stream: false });
  assert.ok(on.message.thinking.length > 0);
  const off = await ollama.chat({ model: MODEL, messages: chat1, think: false, options: greedy, stream: false });
  assert.equal(off.message.thinking, undefined);
  assert.ok(off.message.content.length > 0);
});

test('ollama generate: raw and templated, streamed equals whole, options honoured', async () => {
  const opts = { temperature: 0, num_predict: 10, top_k: 5, top_p: 0.9, min_p: 0.01, seed: 7,
                 repeat_penalty: 1.1, presence_penalty: 0.1, frequency_penalty: 0.1, num_ctx: 4096 };
  const whole = await ollama.generate({ model: MODEL, prompt: 'Once upon a time', raw: true, options: opts, keep_alive: '5m' });
  assert.equal(whole.done, true);
  assert.ok(whole.eval_count <= 10);
  let text = '';
  for await (const p of await ollama.generate({ model: MODEL, prompt: 'Once upon a time', raw: true, options: opts, stream: true }))
    text += p.response;
  assert.equal(text, whole.response);
  const tmpl = await ollama.generate({ model: MODEL, prompt: 'Hi', system: 'Be brief.', think: false, options: greedy });
  assert.equal(tmpl.done, true);
  assert.equal(typeof tmpl.response, 'string');
});

test('ollama: a stop string ends the answer before it', async () => {
  const base = await ollama.generate({ model: MODEL, prompt: 'abc', raw: true, options: { temperature: 0, num_predict: 12 } });
  const text = base.response;
  if (text.length < 4) return; // nothing to cut
  const stop = text.slice(2, 4);
  const cut = await ollama.generate({ model: MODEL, prompt: 'abc', raw: true, options: { temperature: 0, num_predict: 12, stop: [stop] } });
  assert.equal(cut.response, text.slice(0, text.indexOf(stop)));
  assert.equal(cut.done_reason, 'stop');
});

test('openai chat: streamed equals whole, usage and cached_tokens', async () => {
  const req = { model: MODEL, messages: chat1, temperature: 0, max_tokens: 12, seed: 1 };
  const whole = await openai.chat.completions.create(req);
  assert.equal(whole.object, 'chat.completion');
  assert.equal(whole.choices.length, 1);
  const n = whole.usage.completion_tokens;
  assert.ok(n >= 1 && n <= 12);
  assert.equal(whole.choices[0].finish_reason, n === 12 ? 'length' : 'stop');
  assert.equal(whole.usage.total_tokens, whole.usage.prompt_tokens + n);
  assert.equal(typeof whole.usage.prompt_tokens_details.cached_tokens, 'number');
  const stream = await openai.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  let content = '', reasoning = '', usage, finish, first = true;
  for await (const c of stream) {
    if (c.usage) usage = c.usage;
    if (!c.choices.length) continue;
    if (first) assert.equal(c.choices[0].delta.role, 'assistant');
    first = false;
    content += c.choices[0].delta.content ?? '';
    reasoning += c.choices[0].delta.reasoning_content ?? '';
    if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
  }
  assert.equal(content, whole.choices[0].message.content);
  assert.equal(reasoning, whole.choices[0].message.reasoning_content ?? '');
  assert.equal(finish, whole.choices[0].finish_reason);
  assert.ok(usage, 'include_usage sends a usage chunk');
  assert.ok(usage.prompt_tokens_details.cached_tokens > 0, 'the repeated prompt came from the cache');
  // max_completion_tokens and stop as a string are accepted too
  const r = await openai.chat.completions.create({ model: MODEL, messages: chat1, temperature: 0, max_completion_tokens: 3, stop: 'zzzz', n: 1, ignore_eos: true });
  assert.equal(r.usage.completion_tokens, 3);
});

test('openai chat: enable_thinking false sends no reasoning', async () => {
  const r = await openai.chat.completions.create({ model: MODEL, messages: chat1, temperature: 0, max_tokens: 8,
                                                   chat_template_kwargs: { enable_thinking: false } });
  assert.equal(r.choices[0].message.reasoning_content, undefined);
  assert.ok(r.choices[0].message.content.length > 0);
});

test('openai completions: streamed equals whole', async () => {
  const req = { model: MODEL, prompt: 'The capital of France', temperature: 0, max_tokens: 9, ignore_eos: true };
  const whole = await openai.completions.create(req);
  assert.equal(whole.object, 'text_completion');
  assert.equal(whole.usage.completion_tokens, 9);
  let text = '';
  for await (const c of await openai.completions.create({ ...req, stream: true })) text += c.choices[0]?.text ?? '';
  assert.equal(text, whole.choices[0].text);
});

test('curl: SSE stream ends with [DONE], NDJSON lines parse, headers come first', () => {
  const sse = execFileSync('curl', ['-sN', '--max-time', '30', srv.url + '/v1/chat/completions', '-H', 'Content-Type: application/json',
    '-d', JSON.stringify({ model: MODEL, messages: chat1, stream: true, max_tokens: 4, temperature: 0 })]).toString();
  assert.match(sse, /data: \[DONE\]\n\n$/);
  const nd = execFileSync('curl', ['-sN', '--max-time', '30', '-i', srv.url + '/api/chat',
    '-d', JSON.stringify({ model: MODEL, messages: chat1, options: { num_predict: 4 } })]).toString();
  assert.match(nd, /^HTTP\/1\.1 200/);
  assert.match(nd, /content-type: application\/x-ndjson/i);
  const lines = nd.split('\r\n\r\n')[1].trim().split('\n');
  assert.equal(JSON.parse(lines.at(-1)).done, true);
});

test('keep-alives: long prefill sends progress (SSE comments, NDJSON prefill chunks)', async () => {
  const prompt = longText(500, 3);
  const res = await fetch(srv.url + '/v1/completions', { method: 'POST', body: JSON.stringify({ model: MODEL, prompt, max_tokens: 1, stream: true }) });
  const body = await res.text();
  assert.match(body, /^: prefill \d+\/\d+\n\n/m);
  let progress = 0;
  for await (const p of await ollama.generate({ model: MODEL, prompt: longText(500, 4), raw: true, stream: true, options: { num_predict: 1 } }))
    if (p.prefill) { progress++; assert.ok(p.prefill.done < p.prefill.total); assert.equal(p.response, ''); }
  assert.ok(progress > 3, 'several progress chunks');
});

test('abort mid-stream: the server cancels and keeps serving', async () => {
  const ac = new AbortController();
  const stream = await openai.chat.completions.create({ model: MODEL, messages: chat1, max_tokens: 3000, ignore_eos: true, stream: true }, { signal: ac.signal });
  let n = 0;
  try { // the openai client ends the iteration quietly on abort
    for await (const _ of stream) if (++n === 3) { ac.abort(); break; }
  } catch (e) { assert.equal(e.name, 'AbortError'); }
  assert.equal(n, 3);
  await waitFor(async () => (await ollama.ps()).models[0].running === 0, 20000, 'the aborted request to end');
  assert.match(srv.log(), /client disconnected/);
  const gen = [...srv.log().matchAll(/(\d+) generated \(canceled\)/g)].map((m) => Number(m[1]));
  assert.ok(gen.length >= 1 && gen.at(-1) < 3000, 'the engine stopped early: ' + gen);
  const r = await ollama.chat({ model: MODEL, messages: chat1, options: greedy, stream: false });
  assert.equal(r.done, true);
});

// Aborts an ollama stream once the first prefill progress chunk arrives; returns the prefill total.
async function abortAtFirstProgress(client, prompt) {
  const it = await client.generate({ model: MODEL, prompt, raw: true, stream: true, options: { num_predict: 4, temperature: 0 } });
  let total = 0;
  try {
    for await (const p of it) if (p.prefill) { total = p.prefill.total; it.abort(); }
  } catch { /* AbortError */ }
  return total;
}

test('abort mid-prefill, retry later: the prefill finished in idle time, the retry evaluates almost nothing', async () => {
  const prompt = longText(500, 11);
  const total = await abortAtFirstProgress(ollama, prompt);
  assert.ok(total > 500);
  await waitFor(async () => (await ollama.ps()).models[0].running === 0, 30000, 'the abandoned prefill to finish');
  const r = await ollama.generate({ model: MODEL, prompt, raw: true, stream: false, options: { num_predict: 2 } });
  assert.ok(r.prompt_eval_count < 64, `retry evaluated ${r.prompt_eval_count} of ${total}`);
});

test('abort mid-prefill, retry at once: the retry joins the running prefill', async () => {
  const prompt = longText(500, 12);
  const total = await abortAtFirstProgress(ollama, prompt);
  const r = await ollama.generate({ model: MODEL, prompt, raw: true, stream: false, options: { num_predict: 2 } });
  assert.ok(r.prompt_eval_count < total - 64, `retry evaluated ${r.prompt_eval_count} of ${total}`);
});

test('concurrent clients, some cancelling: the rest get whole answers', async () => {
  const jobs = [];
  for (let i = 0; i < 6; i++) {
    const msgs = [{ role: 'user', content: `question number ${i}` }];
    if (i % 3 === 1) {
      const ac = new AbortController();
      jobs.push(openai.chat.completions.create({ model: MODEL, messages: msgs, max_tokens: 2000, ignore_eos: true, stream: true }, { signal: ac.signal })
        .then(async (s) => { for await (const _ of s) { ac.abort(); } }).then(() => 'finished', () => 'aborted'));
      setTimeout(() => ac.abort(), 30);
    } else {
      jobs.push(openai.chat.completions.create({ model: MODEL, messages: msgs, max_tokens: 6, temperature: 0, ignore_eos: true })
        .then((r) => { assert.equal(r.usage.completion_tokens, 6); return 'ok'; }));
    }
  }
  const out = await Promise.all(jobs);
  assert.equal(out.filter((x) => x === 'ok').length, 4);
  await waitFor(async () => { const m = (await ollama.ps()).models[0]; return m.running === 0 && m.queued === 0; }, 20000, 'idle');
});

test('bad input: 400 JSON, fields, UTF-8; 404 model and path; 400 context; nothing runs', async () => {
  const post = (path, body, headers = {}) => fetch(srv.url + path, { method: 'POST', body, headers });
  let r = await post('/api/chat', '{"model":');
  assert.equal(r.status, 400);
  assert.match((await r.json()).error, /not valid JSON/);
  r = await post('/v1/chat/completions', '[1,2]');
  assert.equal(r.status, 400);
  const e = (await r.json()).error;
  assert.equal(e.type, 'invalid_request_error');
  assert.match(e.message, /JSON object/);
  r = await post('/api/chat', Buffer.from([0x7b, 0x22, 0xff, 0x22, 0x3a, 0x31, 0x7d]));
  assert.equal(r.status, 400);
  assert.match((await r.json()).error, /UTF-8/);
  r = await post('/api/chat', JSON.stringify({ messages: chat1 }));
  assert.equal(r.status, 400);
  r = await post('/api/chat', JSON.stringify({ model: MODEL, messages: [{ role: 'wizard', content: 'x' }] }));
  assert.equal(r.status, 400);
  assert.match((await r.json()).error, /role/);
  r = await post('/api/chat', JSON.stringify({ model: MODEL, messages: chat1, options: { temperature: 'hot' } }));
  assert.equal(r.status, 400);
  assert.match((await r.json()).error, /temperature/);
  r = await post('/api/generate', JSON.stringify({ model: MODEL, prompt: 'x', suffix: 'y' }));
  assert.equal(r.status, 400);
  assert.match((await r.json()).error, /suffix/);
  r = await post('/v1/chat/completions', JSON.stringify({ model: MODEL, messages: chat1, n: 2 }));
  assert.equal(r.status, 400);
  await assert.rejects(ollama.chat({ model: 'nope', messages: chat1 }), (err) => err.status_code === 404);
  await assert.rejects(openai.chat.completions.create({ model: 'nope', messages: chat1 }), (err) => err.status === 404 && /nope/.test(err.message));
  r = await fetch(srv.url + '/api/nothing');
  assert.equal(r.status, 404);
  r = await fetch(srv.url + '/api/chat');
  assert.equal(r.status, 405);
  const huge = longText(2500, 5);
  await assert.rejects(openai.completions.create({ model: MODEL, prompt: huge }),
    (err) => err.status === 400 && /\d+ tokens, past the context of 4096 tokens .*--ctx N/.test(err.message) &&
      err.code === 'context_length_exceeded');
  r = await post('/api/generate', JSON.stringify({ model: MODEL, prompt: huge, stream: false }));
  assert.equal(r.status, 400);
  assert.match((await r.json()).error, /past the context of 4096 tokens .*--ctx N/);
});

test('formats and tool choices cairn cannot hold to are refused by name', async () => {
  await assert.rejects(ollama.chat({ model: MODEL, messages: chat1, format: 'xml' }), (e) => e.status_code === 400 && /format/.test(e.message));
  await assert.rejects(ollama.chat({ model: MODEL, messages: chat1, format: { type: 'string', pattern: '^a+$' } }),
    (e) => e.status_code === 400 && /pattern/.test(e.message));
  await assert.rejects(openai.chat.completions.create({ model: MODEL, messages: chat1,
    response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'object', properties: { a: { $ref: '#' } } } } } }),
  (e) => e.status === 400 && /\$ref/.test(e.message));
  await assert.rejects(openai.chat.completions.create({ model: MODEL, messages: chat1, tool_choice: 'required' }),
    (e) => e.status === 400 && /no tools/.test(e.message));
  await assert.rejects(openai.chat.completions.create({ model: MODEL, messages: chat1, tool_choice: { type: 'function', function: { name: 'g' } },
    tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: {} } } }] }),
  (e) => e.status === 400 && /no tool named "g"/.test(e.message));
});
