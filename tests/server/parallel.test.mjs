// parallel.test.mjs - `cairn serve --parallel 3`: requests that arrive together run at once, their
// decode steps in one forward (the log says how many steps each took beside the others), and each
// answer is the one it gets alone (greedy: on the CPU a request's tokens do not depend on what
// runs beside it). A prompt sent again on another lane resumes from what the first one recorded.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer } from './harness.mjs';

const MODEL = 'tiny';
let srv;

before(async () => {
  // each token's cancel poll paced at 15 ms, so three requests sent together overlap whatever the
  // machine's speed
  srv = await startServer(['--name', MODEL, '--ctx', '2048', '--parallel', '3'],
    { CAIRN_TEST_FORWARD_DELAY_MS: '15' });
});
after(async () => {
  if (srv) assert.equal(await srv.stop(), 0, srv.log());
});

function logged() {
  return [...srv.log().matchAll(/request: (\d+) tokens, (\d+) matched, (\d+) restored from cache, (\d+) evaluated, (\d+) generated(?:, (\d+) steps beside other requests)?/g)]
    .map((m) => ({ tokens: +m[1], restored: +m[3], generated: +m[5], beside: +(m[6] || 0) }));
}

async function generate(prompt) {
  const r = await fetch(srv.url + '/api/generate', {
    method: 'POST',
    body: JSON.stringify({ model: MODEL, prompt, stream: false, raw: true,
      options: { temperature: 0, num_predict: 24 } }),
  });
  assert.equal(r.status, 200);
  const j = await r.json();
  assert.ok(j.done, JSON.stringify(j));
  return j;
}

const head = 'The lanes share one trie of restore points. '.repeat(6);
const prompts = ['alpha beta gamma', 'one two three four', 'red green blue'].map((s) => head + s);

test('three requests at once: batched steps, the answers they get alone', async () => {
  const before = logged().length;
  const together = await Promise.all(prompts.map(generate));
  const lines = logged().slice(before);
  assert.equal(lines.length, 3);
  assert.ok(lines.reduce((a, l) => a + l.beside, 0) > 0, srv.log());
  // one at a time, every prompt again (it restores before its end) and on a fresh branch: the
  // same tokens as when it ran beside the others
  for (let i = 0; i < prompts.length; i++) {
    const alone = await generate(prompts[i]);
    assert.equal(alone.response, together[i].response);
    const last = logged().at(-1);
    assert.ok(last.restored >= last.tokens - 5, JSON.stringify(last)); // the pre-end point (pair keys: -5)
  }
});

test('more requests than lanes: the rest wait their turn and all answer', async () => {
  const more = await Promise.all([0, 1, 2, 3, 4].map((i) => generate(head + 'request number ' + i)));
  assert.equal(more.length, 5);
  for (const m of more) assert.ok(m.response.length > 0);
});
