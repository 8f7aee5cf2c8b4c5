// cancel.test.mjs - an agent's client that gives up mid-prefill and retries, through the official
// @anthropic-ai/sdk (Messages) and openai (Responses) clients: the abandoned prompt stops at a
// chunk boundary (--finish-cancelled 0), its prefix stays in the cache, and the retry resumes from
// there. Each answer's usage figures must be the ones the server logged for that request
// ("request: N tokens, M matched, K restored from cache, E evaluated, G generated").
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { startServer, longText, waitFor, sleep } from './harness.mjs';

const MODEL = 'tiny';
let srv, anthropic, openai;

before(async () => {
  // 16-token chunks paced at 30 ms: a 1,500-token prompt takes a few seconds to absorb, so a
  // client can leave in the middle of it.
  srv = await startServer(['--name', MODEL, '--ctx', '4096', '--chunk', '16', '--finish-cancelled', '0'],
    { CAIRN_TEST_FORWARD_DELAY_MS: '30' });
  anthropic = new Anthropic({ baseURL: srv.url, apiKey: 'unused', maxRetries: 0 });
  openai = new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'unused', maxRetries: 0 });
});
after(async () => {
  if (srv) assert.equal(await srv.stop(), 0, srv.log());
});

// The engine's log lines for finished requests, parsed, in order.
function logged() {
  return [...srv.log().matchAll(/request: (\d+) tokens, (\d+) matched, (\d+) restored from cache, (\d+) evaluated, (\d+) generated/g)]
    .map((m) => ({ tokens: +m[1], matched: +m[2], restored: +m[3], evaluated: +m[4], generated: +m[5] }));
}

const busy = async () => (await (await fetch(srv.url + '/api/ps')).json()).models[0].running === 1;

// Waits until the request runs, lets it absorb part of its prompt, then gives up.
async function abortMidPrefill(ac) {
  await waitFor(busy, 20000, 'the request running');
  await sleep(900); // about 30 chunks of 16 tokens: a third of the prompt
  ac.abort();
}

test('Messages: a stream given up mid-prefill, then the retry resumes from the cache', async () => {
  const before = logged().length;
  const messages = [{ role: 'user', content: longText(1200, 41) }];
  const ac = new AbortController();
  const gone = (async () => {
    const stream = anthropic.messages.stream({ model: MODEL, max_tokens: 4, messages }, { signal: ac.signal });
    try {
      for await (const ev of stream) void ev;
      return 'finished';
    } catch (e) {
      return e.name;
    }
  })();
  await abortMidPrefill(ac);
  assert.match(await gone, /Abort|APIUserAbortError/);
  await waitFor(() => /client disconnected/.test(srv.log()), 20000, 'the disconnect');
  await waitFor(() => logged().length > before, 20000, 'the cancelled request to close');
  const cancelled = logged().at(-1);
  assert.ok(cancelled.evaluated > 0 && cancelled.evaluated < cancelled.tokens,
    `the cancelled request stopped mid-prefill: ${JSON.stringify(cancelled)}`);
  const r = await anthropic.messages.create({ model: MODEL, max_tokens: 4, messages });
  const line = logged().at(-1);
  assert.equal(r.usage.cache_read_input_tokens, line.restored);
  assert.equal(r.usage.input_tokens, line.evaluated);
  assert.equal(r.usage.input_tokens + r.usage.cache_read_input_tokens, line.tokens);
  assert.equal(r.usage.output_tokens, line.generated);
  assert.ok(line.restored > 0, `the retry resumed: ${JSON.stringify(line)}`);
  assert.ok(line.restored >= cancelled.evaluated - 16, `from where the cancel stopped: ${JSON.stringify({ cancelled, line })}`);
});

test('Responses: a stream given up mid-prefill, then the retry resumes from the cache', async () => {
  const before = logged().length;
  const input = longText(1200, 43);
  const ac = new AbortController();
  const gone = (async () => {
    try {
      const stream = await openai.responses.create({ model: MODEL, input, max_output_tokens: 4, stream: true }, { signal: ac.signal });
      for await (const ev of stream) void ev;
      return 'finished';
    } catch (e) {
      return e.name;
    }
  })();
  await abortMidPrefill(ac);
  await gone; // openai's stream ends its iteration quietly on an abort
  await waitFor(() => logged().length > before, 20000, 'the cancelled request to close');
  const cancelled = logged().at(-1);
  assert.ok(cancelled.evaluated > 0 && cancelled.evaluated < cancelled.tokens, JSON.stringify(cancelled));
  const r = await openai.responses.create({ model: MODEL, input, max_output_tokens: 4 });
  const line = logged().at(-1);
  assert.equal(r.usage.input_tokens, line.tokens);
  assert.equal(r.usage.input_tokens_details.cached_tokens, line.restored);
  assert.equal(r.usage.output_tokens, line.generated);
  assert.equal(r.usage.total_tokens, line.tokens + line.generated);
  assert.ok(line.restored > 0 && line.restored >= cancelled.evaluated - 16, JSON.stringify({ cancelled, line }));
});

test('usage of whole answers equals the log line, in both APIs and in OpenAI chat', async () => {
  const prompt = longText(200, 47);
  const a = await anthropic.messages.create({ model: MODEL, max_tokens: 3, messages: [{ role: 'user', content: prompt }] });
  let line = logged().at(-1);
  assert.deepEqual([a.usage.input_tokens, a.usage.cache_read_input_tokens, a.usage.cache_creation_input_tokens, a.usage.output_tokens],
    [line.evaluated, line.restored, 0, line.generated]);
  const b = await openai.responses.create({ model: MODEL, input: prompt, max_output_tokens: 3 });
  line = logged().at(-1);
  assert.deepEqual([b.usage.input_tokens, b.usage.input_tokens_details.cached_tokens, b.usage.output_tokens],
    [line.tokens, line.restored, line.generated]);
  const c = await openai.chat.completions.create({ model: MODEL, max_tokens: 3, messages: [{ role: 'user', content: prompt }] });
  line = logged().at(-1);
  assert.deepEqual([c.usage.prompt_tokens, c.usage.prompt_tokens_details.cached_tokens, c.usage.completion_tokens],
    [line.tokens, line.restored, line.generated]);
});
