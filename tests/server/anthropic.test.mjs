// anthropic.test.mjs - /v1/messages and /v1/messages/count_tokens through the official
// @anthropic-ai/sdk and plain fetch. One server runs the tiny random model (structure, equality
// of streamed and whole answers under greedy sampling, cache figures, errors, auth, aliases);
// a second answers canned text (CAIRN_TEST_CANNED_OUTPUT) so that thinking, tool calls and stop
// sequences go through the real parser and frame writers.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { startServer, longText } from './harness.mjs';

const KEY = 'sekrit';
const MODEL = 'tiny';
const CANNED = '<think>\nI should check the weather.\n</think>\n<tool_call>\n<function=get_weather>\n' +
  '<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n';
const tools = [
  {
    name: 'get_weather',
    description: 'Weather forecast for a city',
    input_schema: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] },
    cache_control: { type: 'ephemeral' },
  },
  { type: 'web_search_20250305', name: 'web_search', max_uses: 5 },
];
const ask = [{ role: 'user', content: 'Weather in Paris for 3 days?' }];
let srv, canned, client, cclient;

before(async () => {
  srv = await startServer(['--chunk', '64', '--ctx', '4096', '--api-key', KEY, '--alias', 'claude-*=tiny',
    '--alias', 'sonnet=tiny']);
  canned = await startServer(['--ctx', '4096'], { CAIRN_TEST_CANNED_OUTPUT: CANNED });
  client = new Anthropic({ baseURL: srv.url, apiKey: KEY, maxRetries: 0 });
  cclient = new Anthropic({ baseURL: canned.url, apiKey: 'unused', maxRetries: 0 });
});
after(async () => {
  if (srv) assert.equal(await srv.stop(), 0, srv.log());
  if (canned) assert.equal(await canned.stop(), 0, canned.log());
});

// The raw SSE events of a streamed request: [{event, data}].
async function rawEvents(url, body, headers = {}) {
  const r = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-api-key': KEY, 'anthropic-version': '2023-06-01', ...headers },
    body: JSON.stringify({ ...body, stream: true }),
  });
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /text\/event-stream/);
  const text = await r.text();
  return text.split('\n\n').filter((f) => f.trim()).map((f) => {
    const ev = f.match(/^event: (.*)$/m)[1];
    const data = JSON.parse(f.match(/^data: (.*)$/m)[1]);
    assert.equal(data.type, ev, 'the event line names the data type');
    return { event: ev, data };
  });
}

// Checks the event grammar @anthropic-ai/sdk accumulates; returns the events without pings.
function checkOrder(events) {
  const evs = events.filter((e) => e.event !== 'ping');
  assert.equal(evs[0].event, 'message_start');
  assert.equal(evs.at(-1).event, 'message_stop');
  assert.equal(evs.at(-2).event, 'message_delta');
  let open = -1, next = 0;
  for (const { event, data } of evs.slice(1, -2)) {
    if (event === 'content_block_start') {
      assert.equal(open, -1, 'a block starts only after the previous one stopped');
      assert.equal(data.index, next++);
      open = data.index;
    } else if (event === 'content_block_delta') {
      assert.equal(data.index, open);
    } else if (event === 'content_block_stop') {
      assert.equal(data.index, open);
      open = -1;
    } else {
      assert.fail(`unexpected event ${event}`);
    }
  }
  assert.equal(open, -1, 'every block stopped');
  return evs;
}

test('non-streaming and streaming give the same text; events in order; SDK accumulation', async () => {
  const req = { model: MODEL, max_tokens: 12, temperature: 0, messages: [{ role: 'user', content: 'Why is the sky blue?' }] };
  const whole = await client.messages.create(req);
  assert.ok(whole.id.startsWith('msg_'));
  assert.equal(whole.type, 'message');
  assert.equal(whole.role, 'assistant');
  assert.equal(whole.model, MODEL);
  const n = whole.usage.output_tokens;
  assert.ok(n >= 1 && n <= 12);
  assert.equal(whole.stop_reason, n === 12 ? 'max_tokens' : 'end_turn');
  assert.equal(whole.stop_sequence, null);
  assert.equal(whole.usage.cache_creation_input_tokens, 0);
  const text = (m) => m.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  const thinking = (m) => m.content.filter((b) => b.type === 'thinking').map((b) => b.thinking).join('');

  const events = checkOrder(await rawEvents(srv.url + '/v1/messages', req));
  let st = '', sth = '';
  for (const { data } of events) {
    if (data.type === 'content_block_delta' && data.delta.type === 'text_delta') st += data.delta.text;
    if (data.type === 'content_block_delta' && data.delta.type === 'thinking_delta') sth += data.delta.thinking;
  }
  assert.equal(st, text(whole));
  assert.equal(sth, thinking(whole));
  const start = events[0].data.message;
  assert.deepEqual(start.content, []);
  assert.equal(start.stop_reason, null);
  assert.equal(typeof start.usage.input_tokens, 'number');
  const delta = events.at(-2).data;
  assert.equal(delta.delta.stop_reason, whole.stop_reason);
  assert.equal(delta.usage.output_tokens, n);

  const stream = client.messages.stream(req);
  const seen = [];
  stream.on('streamEvent', (e) => seen.push(e.type));
  const fin = await stream.finalMessage();
  assert.equal(text(fin), text(whole));
  assert.equal(thinking(fin), thinking(whole));
  assert.equal(fin.stop_reason, whole.stop_reason);
  assert.equal(fin.usage.output_tokens, n);
  assert.deepEqual(fin.content.map((b) => b.type), whole.content.map((b) => b.type));
  for (const b of fin.content) if (b.type === 'thinking') assert.ok(b.signature.length > 0);
  assert.equal(seen[0], 'message_start');
  assert.equal(seen.at(-1), 'message_stop');
  // the repeated prompt came from the prefix cache, reported in Anthropic's fields
  assert.ok(fin.usage.cache_read_input_tokens > 0, JSON.stringify(fin.usage));
  assert.equal(fin.usage.input_tokens + fin.usage.cache_read_input_tokens,
    whole.usage.input_tokens + whole.usage.cache_read_input_tokens, 'the same prompt in all');
});

test('max_tokens past the room left: the context ends the answer, and says so', async () => {
  // the canned answer (~50 tokens, end of sequence ignored) outlasts a room of 5..30 tokens
  let lo = 10, hi = 4000, messages, room;
  for (let i = 0; i < 20; i++) {
    const mid = (lo + hi) >> 1;
    messages = [{ role: 'user', content: longText(mid, 31) }];
    room = 4096 - (await cclient.messages.countTokens({ model: MODEL, messages })).input_tokens;
    if (room > 30) lo = mid + 1;
    else if (room < 5) hi = mid - 1;
    else break;
  }
  assert.ok(room >= 5 && room <= 30, `room ${room}`);
  const r = await cclient.messages.create({ model: MODEL, max_tokens: 8000, messages });
  assert.equal(r.stop_reason, 'model_context_window_exceeded');
  assert.equal(r.usage.output_tokens, room);
  const short = await cclient.messages.create({ model: MODEL, max_tokens: 2, messages });
  assert.equal(short.stop_reason, 'max_tokens');
  assert.equal(short.usage.output_tokens, 2);
});

test('pings keep a long prefill alive; message_start comes first', async () => {
  const evs = await rawEvents(srv.url + '/v1/messages?beta=true', {
    model: MODEL, max_tokens: 1, messages: [{ role: 'user', content: longText(400, 21) }],
  });
  assert.ok(evs.some((e) => e.event === 'ping'), 'progress pings during the prefill');
  assert.equal(evs[0].event, 'message_start');
  checkOrder(evs);
});

test('tool_use: whole, streamed through the SDK, then a tool_result round trip', async () => {
  const r = await cclient.messages.create({ model: MODEL, max_tokens: 200, messages: ask, tools });
  assert.equal(r.stop_reason, 'tool_use');
  assert.deepEqual(r.content.map((b) => b.type), ['thinking', 'tool_use']);
  assert.equal(r.content[0].thinking, 'I should check the weather.');
  assert.ok(r.content[0].signature.length > 0);
  const call = r.content[1];
  assert.ok(call.id.startsWith('toolu_'));
  assert.equal(call.name, 'get_weather');
  assert.deepEqual(call.input, { city: 'Paris', days: 3 });
  assert.match(canned.log(), /server tools left out of the prompt: web_search web_search_20250305/);

  const fin = await cclient.messages.stream({ model: MODEL, max_tokens: 200, messages: ask, tools }).finalMessage();
  assert.equal(fin.stop_reason, 'tool_use');
  assert.deepEqual(fin.content.map((b) => b.type), ['thinking', 'tool_use']);
  assert.equal(fin.content[0].thinking, 'I should check the weather.');
  assert.deepEqual(fin.content[1].input, { city: 'Paris', days: 3 });
  const evs = checkOrder(await rawEvents(canned.url + '/v1/messages', { model: MODEL, max_tokens: 200, messages: ask, tools }));
  const kinds = evs.map((e) => e.event + (e.event === 'content_block_delta' ? ':' + e.data.delta.type : ''));
  assert.deepEqual(kinds.filter((k) => k !== 'content_block_delta:thinking_delta'), [
    'message_start', 'content_block_start', 'content_block_delta:signature_delta', 'content_block_stop',
    'content_block_start', 'content_block_delta:input_json_delta', 'content_block_stop',
    'message_delta', 'message_stop']);

  const follow = [...ask, { role: 'assistant', content: r.content },
    { role: 'user', content: [
      { type: 'tool_result', tool_use_id: call.id, content: [{ type: 'text', text: '{"forecast":"sunny"}' }] },
      { type: 'text', text: 'Thanks!', cache_control: { type: 'ephemeral' } }] }];
  const r2 = await cclient.messages.create({ model: MODEL, max_tokens: 200, messages: follow, tools });
  assert.equal(r2.type, 'message');
  const total = (u) => u.input_tokens + u.cache_read_input_tokens;
  assert.ok(total(r2.usage) > total(r.usage), 'the call and its result are in the prompt');
  const c1 = await cclient.messages.countTokens({ model: MODEL, messages: follow, tools });
  assert.equal(c1.input_tokens, total(r2.usage), 'count_tokens counts the prompt the request renders');
  const errd = follow.slice(0, 2).concat([{ role: 'user', content: [{ type: 'tool_result', tool_use_id: call.id, content: 'boom', is_error: true }] }]);
  const c2 = await cclient.messages.countTokens({ model: MODEL, messages: errd, tools });
  assert.ok(c2.input_tokens > 0);
});

test('tool_choice: tool and any build forced calls, none leaves the tools out', async () => {
  const c = async (tool_choice) => (await cclient.messages.countTokens({ model: MODEL, messages: ask, tools, tool_choice })).input_tokens;
  const none = await c({ type: 'none' }), auto = await c({ type: 'auto' });
  assert.ok(none < auto, 'no tools in the prompt with none');
  const r = await cclient.messages.create({ model: MODEL, max_tokens: 200, messages: ask, tools, tool_choice: { type: 'tool', name: 'get_weather', disable_parallel_tool_use: true } });
  assert.equal(r.stop_reason, 'tool_use');
  await assert.rejects(cclient.messages.create({ model: MODEL, max_tokens: 20, messages: ask, tools, tool_choice: { type: 'tool', name: 'nope' } }),
    (e) => e.status === 400 && /nope/.test(e.message));
  await assert.rejects(cclient.messages.create({ model: MODEL, max_tokens: 20, messages: ask, tool_choice: { type: 'any' } }),
    (e) => e.status === 400 && /no tools/.test(e.message));
  // the random model, constrained: any gives a call with an object input
  const forced = await client.messages.create({ model: MODEL, max_tokens: 300, temperature: 0, messages: ask,
    thinking: { type: 'disabled' }, tool_choice: { type: 'any' },
    tools: [{ name: 'pick', input_schema: { type: 'object', properties: { n: { type: 'integer', enum: [1, 2, 3] } }, required: ['n'] } }] });
  assert.equal(forced.stop_reason, 'tool_use', JSON.stringify(forced.content));
  const tu = forced.content.find((b) => b.type === 'tool_use');
  assert.equal(tu.name, 'pick');
  assert.ok([1, 2, 3].includes(tu.input.n), JSON.stringify(tu.input));
});

test('thinking: disabled gives no thinking block; stop_sequences report the match', async () => {
  const off = await cclient.messages.create({ model: MODEL, max_tokens: 200, messages: ask, thinking: { type: 'disabled' } });
  assert.ok(!off.content.some((b) => b.type === 'thinking'));
  assert.match(off.content.map((b) => b.text ?? '').join(''), /I should check the weather/);
  const on = await cclient.messages.create({ model: MODEL, max_tokens: 200, messages: ask, thinking: { type: 'enabled', budget_tokens: 1024 } });
  assert.equal(on.content[0].type, 'thinking');

  const req = { model: MODEL, max_tokens: 200, messages: ask, stop_sequences: ['zzz', 'weather.'] };
  const r = await cclient.messages.create(req);
  assert.equal(r.stop_reason, 'stop_sequence');
  assert.equal(r.stop_sequence, 'weather.');
  assert.equal(r.content[0].thinking, 'I should check the');
  const fin = await cclient.messages.stream(req).finalMessage();
  assert.equal(fin.stop_reason, 'stop_sequence');
  assert.equal(fin.stop_sequence, 'weather.');
  assert.equal(fin.content[0].thinking, 'I should check the');
});

test('system blocks: the billing header is left out of the prompt', async () => {
  const body = (cch) => ({
    model: 'claude-haiku-4-5-20251001',
    system: [
      { type: 'text', text: `x-anthropic-billing-header: cc_version=2.1.197; cc_entrypoint=cli; cch=${cch};` },
      { type: 'text', text: 'You are a helpful agent.', cache_control: { type: 'ephemeral' } }],
    messages: [{ role: 'user', content: [{ type: 'text', text: '<system-reminder>x</system-reminder>' }, { type: 'text', text: 'hi' }] }],
  });
  const a = await client.messages.countTokens(body('a1b2c'));
  const b = await client.messages.countTokens(body('ffff0'));
  const plain = await client.messages.countTokens({ ...body(''), system: 'You are a helpful agent.' });
  assert.equal(a.input_tokens, b.input_tokens);
  assert.equal(a.input_tokens, plain.input_tokens);
  const r1 = await client.messages.create({ ...body('a1b2c'), max_tokens: 1 });
  const r2 = await client.messages.create({ ...body('99999'), max_tokens: 1 });
  assert.ok(r2.usage.cache_read_input_tokens > 0, 'the second prompt hit the cache');
  assert.equal(r2.usage.input_tokens + r2.usage.cache_read_input_tokens, r1.usage.input_tokens + r1.usage.cache_read_input_tokens);
});

test('errors in Anthropic shape: bad JSON, missing messages, image, unknown model, auth', async () => {
  const post = (path, body, headers = { 'x-api-key': KEY }) => fetch(srv.url + path, {
    method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body,
  });
  const expect = async (r, status, type, re) => {
    assert.equal(r.status, status);
    const j = await r.json();
    assert.equal(j.type, 'error');
    assert.equal(j.error.type, type);
    assert.match(j.error.message, re);
  };
  await expect(await post('/v1/messages', '{"model":'), 400, 'invalid_request_error', /not valid JSON/);
  await expect(await post('/v1/messages', JSON.stringify({ model: MODEL, max_tokens: 5 })), 400, 'invalid_request_error', /messages/);
  await expect(await post('/v1/messages/count_tokens', '[]'), 400, 'invalid_request_error', /JSON object/);
  await expect(await post('/v1/messages', JSON.stringify({ model: MODEL, messages: [{ role: 'user', content: [
    { type: 'text', text: 'what is this?' }, { type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AA==' } }] }] })),
  400, 'invalid_request_error', /content\[1\]: image/);
  await expect(await post('/v1/messages', JSON.stringify({ model: 'gpt-9', max_tokens: 5, messages: ask })), 404, 'not_found_error', /gpt-9.*tiny.*claude-\*/);
  await expect(await post('/v1/messages', JSON.stringify({ model: MODEL, messages: ask }), {}), 401, 'authentication_error', /missing API key/);
  await expect(await post('/v1/messages', JSON.stringify({ model: MODEL, messages: ask }), { 'x-api-key': 'wrong' }), 401, 'authentication_error', /invalid API key/);
  await expect(await post('/v1/messages', JSON.stringify({ model: MODEL, max_tokens: 5, messages: ask, temperature: 3 })), 400, 'invalid_request_error', /temperature/);
  const get = await fetch(srv.url + '/v1/messages', { headers: { 'x-api-key': KEY } });
  await expect(get, 405, 'invalid_request_error', /not allowed/);

  await assert.rejects(client.messages.create({ model: 'gpt-9', max_tokens: 5, messages: ask }),
    (e) => e instanceof Anthropic.NotFoundError && e.error.error.type === 'not_found_error');
  const bad = new Anthropic({ baseURL: srv.url, apiKey: 'wrong', maxRetries: 0 });
  await assert.rejects(bad.messages.create({ model: MODEL, max_tokens: 5, messages: ask }), (e) => e instanceof Anthropic.AuthenticationError);
  // Authorization: Bearer works as well as x-api-key (Claude Code's ANTHROPIC_AUTH_TOKEN)
  const bearer = new Anthropic({ baseURL: srv.url, apiKey: null, authToken: KEY, maxRetries: 0 });
  assert.equal((await bearer.messages.create({ model: MODEL, max_tokens: 1, messages: ask })).type, 'message');
  // unknown fields are accepted and ignored
  const extra = await post('/v1/messages?beta=true', JSON.stringify({ model: MODEL, max_tokens: 1, messages: ask,
    metadata: { user_id: 'u' }, context_management: { edits: [{ type: 'clear_thinking_20251015', keep: 'all' }] },
    output_config: { effort: 'high' }, thinking: { type: 'adaptive' } }), { 'x-api-key': KEY, 'anthropic-beta': 'x,y' });
  assert.equal(extra.status, 200);
});

test('--alias: other names are served by the loaded model and echoed', async () => {
  const r = await client.messages.create({ model: 'claude-sonnet-4-5', max_tokens: 2, messages: ask });
  assert.equal(r.model, 'claude-sonnet-4-5');
  const s = await client.messages.create({ model: 'sonnet', max_tokens: 2, messages: ask });
  assert.equal(s.model, 'sonnet');
  await assert.rejects(client.messages.create({ model: 'sonnet-2', max_tokens: 2, messages: ask }), (e) => e.status === 404);
  // the aliases hold for the other APIs too
  const openai = new OpenAI({ baseURL: srv.url + '/v1', apiKey: KEY, maxRetries: 0 });
  const o = await openai.chat.completions.create({ model: 'claude-opus-4', max_tokens: 2, messages: ask });
  assert.equal(o.model, 'claude-opus-4');
  const ol = await fetch(srv.url + '/api/chat', { method: 'POST', headers: { authorization: `Bearer ${KEY}` },
    body: JSON.stringify({ model: 'claude-x', stream: false, messages: ask, options: { num_predict: 1 } }) });
  assert.equal((await ol.json()).model, 'claude-x');
});

test('Claude Code\'s own requests (tests/data/server/claude-code) are accepted and counted', async () => {
  const { readFileSync } = await import('node:fs');
  const load = (n) => JSON.parse(readFileSync(new URL(`../data/server/claude-code/turn${n}.json`, import.meta.url)));
  const counts = [];
  for (const n of [1, 2]) {
    const body = load(n);
    const r = await fetch(srv.url + '/v1/messages/count_tokens?beta=true', {
      method: 'POST', body: JSON.stringify(body),
      headers: { authorization: `Bearer ${KEY}`, 'anthropic-version': '2023-06-01', 'anthropic-beta': 'claude-code-20250219' },
    });
    assert.equal(r.status, 200);
    counts.push((await r.json()).input_tokens);
  }
  assert.ok(counts[1] > counts[0] && counts[0] > 4096, JSON.stringify(counts));
  // past the served context the request itself is refused, naming both numbers
  const r = await fetch(srv.url + '/v1/messages?beta=true', { method: 'POST', body: JSON.stringify(load(1)), headers: { 'x-api-key': KEY } });
  assert.equal(r.status, 400);
  const e = await r.json();
  assert.equal(e.error.type, 'invalid_request_error');
  assert.match(e.error.message, new RegExp(`${counts[0]} tokens, past the context of 4096`));
});
