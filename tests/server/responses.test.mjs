// responses.test.mjs - POST /v1/responses through the official clients that speak it: the
// `openai` npm client (responses.create, whole and streamed, and its stream accumulator), the
// OpenAI Agents SDK and the AI SDK's openai provider. The tiny model's weights are random, so
// the tests assert structure, event order, equality of streamed and whole answers under greedy
// sampling and cache reuse; tool calls come from a second server whose answers are canned
// (CAIRN_TEST_CANNED_OUTPUT), through the real parser.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { Agent, OpenAIResponsesModel, run, tool, setDefaultOpenAIClient, setOpenAIAPI, setTracingDisabled } from '@openai/agents';
import { createOpenAI } from '@ai-sdk/openai';
import { generateText, streamText, jsonSchema } from 'ai';
import { startServer, longText } from './harness.mjs';

const MODEL = 'tiny';
const CANNED = '<think>\nI should check the weather.\n</think>\n<tool_call>\n<function=get_weather>\n' +
  '<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n';
const weatherTool = {
  type: 'function', name: 'get_weather', description: 'Weather forecast for a city', strict: false,
  parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] },
};
const ask = 'Weather in Paris for 3 days?';
let srv, canned, openai, tools;

before(async () => {
  [srv, canned] = await Promise.all([
    startServer(['--chunk', '64', '--ctx', '4096']),
    startServer(['--name', MODEL], { CAIRN_TEST_CANNED_OUTPUT: CANNED }),
  ]);
  openai = new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'unused', maxRetries: 0 });
  tools = new OpenAI({ baseURL: canned.url + '/v1', apiKey: 'unused', maxRetries: 0 });
});
after(async () => {
  for (const s of [srv, canned]) if (s) assert.equal(await s.stop(), 0, s.log());
});

// The events of one streamed request, checked for numbering and order as they come.
async function events(client, req) {
  const out = [];
  for await (const ev of await client.responses.create({ ...req, stream: true })) {
    assert.equal(ev.sequence_number, out.length, `${ev.type} is numbered in order`);
    out.push(ev);
  }
  return out;
}

// What a client rebuilds from the events: each item's text from its deltas, checked against
// the .done events and the final response.
function replay(evs) {
  const items = [];
  const types = evs.map((e) => e.type);
  assert.deepEqual(types.slice(0, 2), ['response.created', 'response.in_progress']);
  assert.ok(['response.completed', 'response.incomplete'].includes(types.at(-1)), types.at(-1));
  for (const e of evs.slice(2, -1)) {
    switch (e.type) {
      case 'response.output_item.added':
        assert.equal(e.output_index, items.length);
        items.push({ item: e.item, text: '', done: false });
        break;
      case 'response.content_part.added':
        assert.equal(e.content_index, 0);
        assert.equal(e.item_id, items[e.output_index].item.id);
        break;
      case 'response.output_text.delta':
      case 'response.reasoning_text.delta':
      case 'response.function_call_arguments.delta':
        assert.equal(e.item_id, items[e.output_index].item.id);
        assert.equal(e.output_index, items.length - 1, 'deltas go to the newest item');
        items[e.output_index].text += e.delta;
        break;
      case 'response.output_text.done':
      case 'response.reasoning_text.done':
        assert.equal(e.text, items[e.output_index].text);
        break;
      case 'response.function_call_arguments.done':
        assert.equal(e.arguments, items[e.output_index].text);
        break;
      case 'response.content_part.done':
        assert.equal(e.part.text, items[e.output_index].text);
        break;
      case 'response.output_item.done':
        items[e.output_index].done = true;
        items[e.output_index].item = e.item;
        break;
      default:
        assert.fail(`unexpected event ${e.type}`);
    }
  }
  assert.ok(items.every((it) => it.done), 'every item was closed');
  const final = evs.at(-1).response;
  assert.deepEqual(final.output, items.map((it) => it.item), 'the final response holds every item');
  return { items, final, types };
}

const textOf = (r, type) => r.output.filter((o) => o.type === type)
  .map((o) => (type === 'message' ? o.content : o.content ?? []).map((c) => c.text).join('')).join('');

test('responses: streamed equals whole under greedy sampling; events, usage, cache', async () => {
  for (const reasoning of [undefined, { effort: 'none' }]) {
    const req = { model: MODEL, instructions: 'Answer briefly.', input: 'Why is the sky blue?', temperature: 0,
                  max_output_tokens: 12, reasoning, store: false, include: ['reasoning.encrypted_content'],
                  prompt_cache_key: 'k1', metadata: { a: 'b' }, truncation: 'disabled', user: 'u' };
    const whole = await openai.responses.create(req);
    assert.match(whole.id, /^resp_/);
    assert.equal(whole.object, 'response');
    assert.equal(whole.model, MODEL);
    assert.equal(typeof whole.created_at, 'number');
    assert.equal(whole.error, null);
    assert.equal(whole.instructions, 'Answer briefly.');
    assert.equal(whole.max_output_tokens, 12);
    assert.deepEqual(whole.metadata, { a: 'b' });
    const u = whole.usage;
    assert.ok(u.output_tokens >= 1 && u.output_tokens <= 12);
    assert.equal(u.total_tokens, u.input_tokens + u.output_tokens);
    assert.equal(typeof u.input_tokens_details.cached_tokens, 'number');
    assert.ok(u.output_tokens_details.reasoning_tokens <= u.output_tokens);
    assert.equal(whole.status, u.output_tokens === 12 ? 'incomplete' : 'completed');
    if (whole.status === 'incomplete') assert.equal(whole.incomplete_details.reason, 'max_output_tokens');
    if (reasoning) {
      assert.deepEqual(whole.output.map((o) => o.type), ['message'], 'thinking off: no reasoning');
      assert.equal(u.output_tokens_details.reasoning_tokens, 0);
      assert.equal(whole.output_text, textOf(whole, 'message'), "the SDK's output_text");
    } else {
      assert.equal(whole.output[0].type, 'reasoning');
      assert.match(whole.output[0].id, /^rs_/);
      assert.deepEqual(whole.output[0].summary, []);
      assert.equal(whole.output[0].content[0].type, 'reasoning_text');
    }
    for (const o of whole.output)
      if (o.type === 'message') {
        assert.match(o.id, /^msg_/);
        assert.equal(o.role, 'assistant');
        assert.deepEqual(o.content[0].annotations, []);
      }
    const evs = await events(openai, req);
    const { final, types } = replay(evs);
    for (const t of ['response.output_item.added', 'response.content_part.added', 'response.content_part.done',
                     'response.output_item.done', reasoning ? 'response.output_text.done' : 'response.reasoning_text.done'])
      assert.ok(types.includes(t), t);
    assert.equal(evs[0].response.id, final.id);
    assert.equal(evs[0].response.status, 'in_progress');
    assert.equal(final.status, whole.status);
    assert.equal(textOf(final, 'message'), textOf(whole, 'message'));
    assert.equal(textOf(final, 'reasoning'), textOf(whole, 'reasoning'));
    assert.equal(final.usage.output_tokens, u.output_tokens);
    assert.ok(final.usage.input_tokens_details.cached_tokens > 0, 'the repeated input came from the cache');
    // the client's own stream helper accumulates the same response
    const helper = openai.responses.stream(req);
    const acc = await helper.finalResponse();
    assert.equal(acc.output_text, whole.output_text);
    assert.equal(textOf(acc, 'reasoning'), textOf(whole, 'reasoning'));
  }
});

test('responses: a streamed prompt past the context fails as response.failed with context_length_exceeded', async () => {
  const input = longText(2500, 5);
  await assert.rejects(openai.responses.create({ model: MODEL, input }),
    (e) => e.status === 400 && e.code === 'context_length_exceeded' && /past the context of 4096/.test(e.message));
  const evs = await events(openai, { model: MODEL, input });
  assert.deepEqual(evs.map((e) => e.type), ['response.created', 'response.in_progress', 'response.failed']);
  assert.equal(evs[2].response.status, 'failed');
  assert.equal(evs[2].response.error.code, 'context_length_exceeded');
});

test('responses: a long prefill sends SSE comments, which the client skips', async () => {
  const req = { model: MODEL, input: longText(500, 3), max_output_tokens: 2, stream: true };
  const raw = await (await fetch(srv.url + '/v1/responses', { method: 'POST', body: JSON.stringify(req) })).text();
  assert.match(raw, /^: prefill \d+\/\d+\n\n/m);
  assert.doesNotMatch(raw, /\[DONE\]/);
  const { final } = replay(await events(openai, { ...req, input: longText(500, 4) }));
  // the random model may end at its first token (a sampled end of sequence)
  assert.ok(final.usage.output_tokens >= 1 && final.usage.output_tokens <= 2, JSON.stringify(final.usage));
});

test('responses: refusals name the field; the empty probe answers', async () => {
  const bad = [
    [{ input: 'x', previous_response_id: 'resp_1' }, /previous_response_id is not supported.*whole conversation/],
    [{ input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'data:image/png;base64,AA==' }] }] }, /input_image/],
    [{ input: [{ type: 'item_reference', id: 'msg_1' }] }, /item_reference/],
    [{ input: [{ role: 'wizard', content: 'x' }] }, /role/],
    [{ input: 'x', text: { format: { type: 'json_schema', name: 'x', schema: { type: 'string', pattern: 'a+' } } } }, /pattern/],
    [{ input: 'x', tool_choice: 'required' }, /no tools/],
    [{ input: 'x', reasoning: { effort: 'extreme' } }, /reasoning\.effort/],
  ];
  for (const [body, re] of bad)
    await assert.rejects(openai.responses.create({ model: MODEL, ...body }), (e) => e.status === 400 && re.test(e.message), re.source);
  await assert.rejects(openai.responses.create({ model: 'nope', input: 'x' }), (e) => e.status === 404);
  // Codex probes with no input and one token; a whole answer, whole and streamed
  const probe = await openai.responses.create({ model: MODEL, input: [], max_output_tokens: 1 });
  assert.equal(probe.usage.output_tokens, 1);
  assert.equal(probe.status, 'incomplete');
  const { final } = replay(await events(openai, { model: MODEL, input: [], max_output_tokens: 1 }));
  assert.equal(final.usage.output_tokens, 1);
});

test('responses: text.format json_schema gives JSON that satisfies it', async () => {
  const schema = { type: 'object', properties: { ok: { type: 'boolean' }, n: { type: 'integer' } },
                   required: ['ok', 'n'], additionalProperties: false };
  const r = await openai.responses.create({ model: MODEL, input: 'JSON please', reasoning: { effort: 'none' },
    max_output_tokens: 200, text: { format: { type: 'json_schema', name: 'x', strict: true, schema } } });
  assert.equal(r.status, 'completed', r.output_text);
  const v = JSON.parse(r.output_text);
  assert.deepEqual(Object.keys(v).sort(), ['n', 'ok']);
  assert.equal(typeof v.ok, 'boolean');
  assert.ok(Number.isInteger(v.n));
  assert.deepEqual(r.text.format.schema, schema);
});

test('responses: a tool call, whole and streamed, then the function_call_output round trip', async () => {
  const req = { model: MODEL, input: ask, tools: [weatherTool, { type: 'web_search' }], tool_choice: 'auto', parallel_tool_calls: true };
  const r = await tools.responses.create(req);
  assert.equal(r.status, 'completed');
  assert.deepEqual(r.output.map((o) => o.type), ['reasoning', 'function_call']);
  assert.equal(r.output[0].content[0].text, 'I should check the weather.');
  const fc = r.output[1];
  assert.match(fc.id, /^fc_/);
  assert.match(fc.call_id, /^call_/);
  assert.equal(fc.name, 'get_weather');
  assert.equal(fc.status, 'completed');
  assert.deepEqual(JSON.parse(fc.arguments), { city: 'Paris', days: 3 });
  assert.ok(r.usage.output_tokens_details.reasoning_tokens > 0);
  assert.ok(r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens);
  assert.equal(r.tools.length, 2, 'the tools are echoed as sent');

  const evs = await events(tools, req);
  const { items, final, types } = replay(evs);
  assert.equal(types.at(-1), 'response.completed');
  assert.deepEqual(items.map((it) => it.item.type), ['reasoning', 'function_call']);
  for (const t of ['response.reasoning_text.delta', 'response.function_call_arguments.delta', 'response.function_call_arguments.done'])
    assert.ok(types.includes(t), t);
  assert.equal(evs.find((e) => e.type === 'response.output_item.added' && e.item.type === 'function_call').item.arguments, '');
  assert.deepEqual(JSON.parse(final.output[1].arguments), { city: 'Paris', days: 3 });
  assert.equal(final.output[1].call_id, items[1].item.call_id);

  // the whole history comes back, the output items as they were plus the result
  const follow = await tools.responses.create({
    model: MODEL, tools: [weatherTool],
    input: [{ role: 'user', content: ask }, ...r.output,
            { type: 'function_call_output', call_id: fc.call_id, output: '{"forecast":"sunny"}' }],
  });
  assert.equal(follow.status, 'completed');
  assert.ok(follow.usage.input_tokens > r.usage.input_tokens, 'the call and its result are in the prompt');
  const parts = await tools.responses.create({
    model: MODEL, tools: [weatherTool],
    input: [{ role: 'user', content: ask }, ...r.output,
            { type: 'function_call_output', call_id: fc.call_id, output: [{ type: 'input_text', text: '{"forecast":"sunny"}' }] }],
  });
  assert.equal(parts.usage.input_tokens, follow.usage.input_tokens, 'output parts render as the string does');
  // a forced call by name is accepted
  const forced = await tools.responses.create({ ...req, tool_choice: { type: 'function', name: 'get_weather' } });
  assert.equal(forced.output.at(-1).type, 'function_call');
});

test('agents SDK: a text answer, and a function tool called with the parsed arguments', async () => {
  setTracingDisabled(true);
  setOpenAIAPI('responses');
  setDefaultOpenAIClient(openai);
  const agent = new Agent({ name: 'a', instructions: 'Be brief.', model: MODEL,
    modelSettings: { temperature: 0, maxTokens: 200, reasoning: { effort: 'none' } } });
  const res = await run(agent, 'Why is the sky blue? /no_think');
  assert.equal(typeof res.finalOutput, 'string');
  assert.ok(res.rawResponses.length === 1);
  const whole = await openai.responses.create({ model: MODEL, instructions: 'Be brief.', input: 'Why is the sky blue? /no_think',
                                               temperature: 0, max_output_tokens: 200, reasoning: { effort: 'none' } });
  if (whole.status === 'completed') assert.equal(res.finalOutput, whole.output_text);
  const streamed = await run(agent, 'Why is the sky blue? /no_think', { stream: true });
  let deltas = '';
  for await (const ev of streamed)
    if (ev.type === 'raw_model_stream_event' && ev.data.type === 'output_text_delta') deltas += ev.data.delta;
  await streamed.completed;
  assert.equal(deltas, streamed.finalOutput);
  assert.equal(streamed.finalOutput, res.finalOutput);

  const seen = [];
  const weather = tool({
    name: 'get_weather', description: 'Weather forecast for a city', strict: false,
    parameters: weatherTool.parameters,
    execute: async (args) => { seen.push(args); return 'sunny'; },
  });
  // the canned model calls the tool every turn: stop on the first call, its result the answer
  const model = new OpenAIResponsesModel(tools, MODEL); // the default client is cached by now
  const toolAgent = new Agent({ name: 't', model, tools: [weather], toolUseBehavior: 'stop_on_first_tool' });
  const tr = await run(toolAgent, ask);
  assert.deepEqual(seen, [{ city: 'Paris', days: 3 }]);
  assert.equal(tr.finalOutput, 'sunny');
  // and a second turn sends the call and its output back: the server renders them
  const loop = new Agent({ name: 'l', model, tools: [weather] });
  await assert.rejects(run(loop, ask, { maxTurns: 2 }), (e) => /max turns/i.test(e.message));
  assert.equal(seen.length, 3);
});

test('AI SDK: openai.responses with generateText and streamText, and a tool call', async () => {
  const provider = createOpenAI({ baseURL: srv.url + '/v1', apiKey: 'unused' });
  const req = { model: provider.responses(MODEL), prompt: 'Why is the sky blue? /no_think', temperature: 0,
                maxOutputTokens: 12, maxRetries: 0 };
  const whole = await generateText(req);
  assert.ok(whole.text.length > 0);
  assert.ok(whole.usage.outputTokens >= 1 && whole.usage.outputTokens <= 12);
  const s = streamText(req);
  let text = '';
  for await (const t of s.textStream) text += t;
  assert.equal(text, whole.text);
  assert.equal((await s.usage).outputTokens, whole.usage.outputTokens);
  assert.equal(await s.finishReason, whole.finishReason);

  const tp = createOpenAI({ baseURL: canned.url + '/v1', apiKey: 'unused' });
  const calls = [];
  const r = await generateText({
    model: tp.responses(MODEL), prompt: ask, maxRetries: 0,
    tools: { get_weather: { description: 'Weather forecast for a city', inputSchema: jsonSchema(weatherTool.parameters),
                            execute: async (args) => { calls.push(args); return 'sunny'; } } },
  });
  assert.deepEqual(calls, [{ city: 'Paris', days: 3 }]);
  assert.equal(r.toolCalls[0].toolName, 'get_weather');
  assert.equal(r.finishReason, 'tool-calls');
  const st = streamText({ model: tp.responses(MODEL), prompt: ask, maxRetries: 0,
    tools: { get_weather: { inputSchema: jsonSchema(weatherTool.parameters) } } });
  const got = await st.toolCalls;
  assert.deepEqual(got.map((c) => [c.toolName, c.input]), [['get_weather', { city: 'Paris', days: 3 }]]);
});
