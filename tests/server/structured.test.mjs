// structured.test.mjs - structured output and forced tool calls through both official clients.
// The tiny model's weights are random, so whatever it would say, the output must parse as JSON
// (and satisfy the schema) or be one call of the right tool: the constraint, not the model, makes
// it so. Schemas here bound every string, array and key set, so each output closes well within
// num_predict; format "json" without a schema may run out, which must then say "length".
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { Ollama } from 'ollama';
import OpenAI from 'openai';
import { startServer } from './harness.mjs';

let srv, ollama, openai;
const MODEL = 'tiny';
const ask = [{ role: 'user', content: 'Describe a person as JSON.' }];
const person = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 8 },
    age: { type: 'integer' },
    ok: { type: 'boolean' },
    color: { enum: ['red', 'green', 'blue'] },
    tags: { type: 'array', items: { type: 'string', maxLength: 4 }, maxItems: 3 },
    nick: { anyOf: [{ type: 'string', maxLength: 4 }, { type: 'null' }], title: 'Nick' },
  },
  required: ['name', 'age', 'ok', 'color', 'tags', 'nick'],
  additionalProperties: false,
};

function checkPerson(text) {
  const v = JSON.parse(text);
  assert.deepEqual(Object.keys(v).sort(), ['age', 'color', 'name', 'nick', 'ok', 'tags']);
  assert.ok(v.nick === null || (typeof v.nick === 'string' && [...v.nick].length <= 4));
  assert.equal(typeof v.name, 'string');
  assert.ok([...v.name].length <= 8);
  assert.ok(Number.isInteger(v.age));
  assert.equal(typeof v.ok, 'boolean');
  assert.ok(['red', 'green', 'blue'].includes(v.color));
  assert.ok(Array.isArray(v.tags) && v.tags.length <= 3);
  for (const t of v.tags) assert.ok(typeof t === 'string' && [...t].length <= 4);
}

before(async () => {
  srv = await startServer(['--ctx', '4096']);
  ollama = new Ollama({ host: srv.url });
  openai = new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'unused', maxRetries: 0 });
});
after(async () => {
  if (srv) assert.equal(await srv.stop(), 0, srv.log());
});

test('ollama: a schema in format gives JSON that satisfies it, greedy and sampled, whole and streamed', async () => {
  for (const options of [{ temperature: 0 }, { temperature: 1, seed: 1 }, { temperature: 1.5, seed: 7, top_k: 0 }]) {
    const r = await ollama.chat({ model: MODEL, messages: ask, format: person, think: false, options: { ...options, num_predict: 1500 } });
    assert.equal(r.done_reason, 'stop', r.message.content);
    checkPerson(r.message.content);
    let text = '', last;
    for await (const part of await ollama.chat({ model: MODEL, messages: ask, format: person, think: false, stream: true,
      options: { ...options, num_predict: 1500 } })) {
      text += part.message.content;
      last = part;
    }
    assert.equal(last.done_reason, 'stop');
    assert.equal(text, r.message.content); /* the same seed and mask give the same tokens */
  }
  const g = await ollama.generate({ model: MODEL, prompt: 'A person:', format: person, think: false, options: { temperature: 0, num_predict: 1500 } });
  assert.equal(g.done_reason, 'stop');
  checkPerson(g.response);
  const raw = await ollama.generate({ model: MODEL, prompt: 'A person:', raw: true, format: person, options: { temperature: 0.7, seed: 3, num_predict: 1500 } });
  checkPerson(raw.response);
});

test('ollama: format "json" is a JSON object, or says length when num_predict ends first', async () => {
  for (const seed of [1, 2, 3]) {
    const r = await ollama.chat({ model: MODEL, messages: ask, format: 'json', think: false, options: { temperature: 1, seed, num_predict: 200 } });
    if (r.done_reason === 'stop') {
      const v = JSON.parse(r.message.content);
      assert.ok(v && typeof v === 'object' && !Array.isArray(v));
    } else {
      assert.equal(r.done_reason, 'length');
      assert.equal(r.eval_count, 200);
      assert.match(r.message.content, /^\s*\{/);
    }
  }
  /* a budget far too small to close anything */
  const short = await ollama.chat({ model: MODEL, messages: ask, format: person, think: false, options: { num_predict: 3 } });
  assert.equal(short.done_reason, 'length');
  assert.equal(short.eval_count, 3);
});

test('ollama: with thinking on, the format applies once thinking ends', async () => {
  const r = await ollama.chat({ model: MODEL, messages: ask, format: person, think: true, options: { temperature: 0, num_predict: 60 } });
  // the random model rarely ends its thinking: then the budget runs out inside it
  if (r.done_reason === 'stop') checkPerson(r.message.content);
  else assert.equal(r.done_reason, 'length');
});

test('openai: response_format json_schema and json_object', async () => {
  const r = await openai.chat.completions.create({
    model: MODEL, messages: ask, temperature: 0.9, seed: 5, max_tokens: 1500,
    response_format: { type: 'json_schema', json_schema: { name: 'person', strict: true, schema: person } },
    chat_template_kwargs: { enable_thinking: false },
  });
  assert.equal(r.choices[0].finish_reason, 'stop');
  checkPerson(r.choices[0].message.content);
  let text = '';
  for await (const c of await openai.chat.completions.create({
    model: MODEL, messages: ask, temperature: 0.9, seed: 5, max_tokens: 1500, stream: true,
    response_format: { type: 'json_schema', json_schema: { name: 'person', schema: person } },
    chat_template_kwargs: { enable_thinking: false },
  })) text += c.choices[0]?.delta?.content ?? '';
  assert.equal(text, r.choices[0].message.content);
  const o = await openai.chat.completions.create({
    model: MODEL, messages: ask, temperature: 0, max_tokens: 200, response_format: { type: 'json_object' },
    chat_template_kwargs: { enable_thinking: false },
  });
  if (o.choices[0].finish_reason === 'stop') assert.equal(typeof JSON.parse(o.choices[0].message.content), 'object');
  else assert.equal(o.choices[0].finish_reason, 'length');
});

const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather for a city',
    parameters: { type: 'object', properties: { city: { type: 'string', maxLength: 12 }, days: { type: 'integer' },
      unit: { type: 'string', enum: ['c', 'f'] } }, required: ['city', 'days'] } } },
  { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: { zone: { type: 'string', maxLength: 6 } } } } },
];

test('openai: tool_choice forces a parsed call of the named tool, or of one offered', async () => {
  for (const seed of [1, 2]) {
    const r = await openai.chat.completions.create({
      model: MODEL, messages: ask, tools, tool_choice: { type: 'function', function: { name: 'get_weather' } },
      temperature: 1, seed, max_tokens: 1500, chat_template_kwargs: { enable_thinking: false },
    });
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    const calls = r.choices[0].message.tool_calls;
    assert.equal(calls.length, 1);
    assert.equal(calls[0].function.name, 'get_weather');
    const args = JSON.parse(calls[0].function.arguments);
    assert.equal(typeof args.city, 'string');
    assert.ok(Number.isInteger(args.days));
    if ('unit' in args) assert.ok(['c', 'f'].includes(args.unit));
  }
  const calls = [];
  let finish;
  for await (const c of await openai.chat.completions.create({
    model: MODEL, messages: ask, tools, tool_choice: 'required', temperature: 0, max_tokens: 1500, stream: true,
    chat_template_kwargs: { enable_thinking: false },
  })) {
    for (const tc of c.choices[0]?.delta?.tool_calls ?? []) calls.push(tc);
    finish = c.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(finish, 'tool_calls');
  assert.equal(calls.length, 1);
  assert.ok(['get_weather', 'get_time'].includes(calls[0].function.name));
  JSON.parse(calls[0].function.arguments);
  // "none": the tools are not offered, so no call is forced or parsed from a template it never saw
  const none = await openai.chat.completions.create({ model: MODEL, messages: ask, tools, tool_choice: 'none',
    temperature: 0, max_tokens: 8 });
  assert.equal(none.choices[0].message.tool_calls, undefined);
});
