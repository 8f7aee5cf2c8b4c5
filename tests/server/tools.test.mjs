// tools.test.mjs - tool definitions and tool-call round trips through both official clients.
// The random model cannot write a call, so this server's answers are canned text
// (CAIRN_TEST_CANNED_OUTPUT): it still streams token by token through the real stop-string
// matcher, reasoning/tool-call parser and response builders.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Ollama } from 'ollama';
import OpenAI from 'openai';
import { startServer } from './harness.mjs';

const CANNED = '<think>\nI should check the weather.\n</think>\n<tool_call>\n<function=get_weather>\n' +
  '<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n';
const MODEL = 'weather-bot';
const tools = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Weather forecast for a city',
    parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] },
  },
}];
const ask = [{ role: 'user', content: 'Weather in Paris for 3 days?' }];
let srv, ollama, openai;

before(async () => {
  srv = await startServer(['--name', MODEL], { CAIRN_TEST_CANNED_OUTPUT: CANNED });
  ollama = new Ollama({ host: srv.url });
  openai = new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'unused', maxRetries: 0 });
});
after(async () => { if (srv) assert.equal(await srv.stop(), 0, srv.log()); });

test('openai: a tool call, whole and streamed, then the round trip', async () => {
  const r = await openai.chat.completions.create({ model: MODEL, messages: ask, tools, tool_choice: 'auto', temperature: 0 });
  const m = r.choices[0].message;
  assert.equal(r.choices[0].finish_reason, 'tool_calls');
  assert.equal(m.content, null);
  assert.equal(m.reasoning_content, 'I should check the weather.');
  assert.equal(m.tool_calls.length, 1);
  assert.equal(m.tool_calls[0].type, 'function');
  assert.equal(m.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(JSON.parse(m.tool_calls[0].function.arguments), { city: 'Paris', days: 3 });

  const calls = [];
  let reasoning = '', finish;
  for await (const c of await openai.chat.completions.create({ model: MODEL, messages: ask, tools, stream: true })) {
    const d = c.choices[0]?.delta ?? {};
    reasoning += d.reasoning_content ?? '';
    for (const tc of d.tool_calls ?? []) calls.push(tc);
    finish = c.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(reasoning, 'I should check the weather.');
  assert.equal(finish, 'tool_calls');
  assert.equal(calls.length, 1);
  assert.equal(calls[0].index, 0);
  assert.ok(calls[0].id.startsWith('call_'));
  assert.deepEqual(JSON.parse(calls[0].function.arguments), { city: 'Paris', days: 3 });

  const follow = await openai.chat.completions.create({
    model: MODEL, tools,
    messages: [...ask, m, { role: 'tool', tool_call_id: m.tool_calls[0].id, content: '{"forecast":"sunny"}' }],
  });
  assert.equal(follow.choices.length, 1);
  assert.ok(follow.usage.prompt_tokens > r.usage.prompt_tokens, 'the tool result is in the prompt');
});

test('openai: tool_choice none keeps the call as text', async () => {
  const r = await openai.chat.completions.create({ model: MODEL, messages: ask, tools, tool_choice: 'none' });
  // without tools the parser still splits calls out of the text: the model was told of none
  assert.equal(r.choices.length, 1);
});

test('ollama: a tool call, whole and streamed, then the round trip', async () => {
  const r = await ollama.chat({ model: MODEL, messages: ask, tools, stream: false });
  assert.equal(r.message.thinking, 'I should check the weather.');
  assert.equal(r.message.tool_calls.length, 1);
  assert.equal(r.message.tool_calls[0].function.name, 'get_weather');
  assert.deepEqual(r.message.tool_calls[0].function.arguments, { city: 'Paris', days: 3 });
  assert.equal(r.done_reason, 'stop');

  const calls = [];
  for await (const p of await ollama.chat({ model: MODEL, messages: ask, tools, stream: true }))
    calls.push(...(p.message.tool_calls ?? []));
  assert.equal(calls.length, 1);
  assert.deepEqual(calls[0].function.arguments, { city: 'Paris', days: 3 });

  const follow = await ollama.chat({
    model: MODEL, tools, stream: false,
    messages: [...ask, r.message, { role: 'tool', content: 'sunny', tool_name: 'get_weather' }],
  });
  assert.equal(follow.done, true);
  assert.ok(follow.prompt_eval_count >= 1);
});

test('ollama: thinking off passes the think tags through as content', async () => {
  const r = await ollama.chat({ model: MODEL, messages: ask, think: false, stream: false });
  assert.equal(r.message.thinking, undefined);
  assert.match(r.message.content, /I should check the weather/);
});
