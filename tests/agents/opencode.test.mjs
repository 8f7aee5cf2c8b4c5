// opencode.test.mjs - opencode (`opencode run`, Chat Completions through the AI SDK's
// openai-compatible provider) against cairn: an answer, a second turn with --continue that reuses
// the first turn's prompt from the prefix cache, and a tool round trip through its own bash tool.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import {
  ANSWER, CANNED_ANSWER, CANNED_FINAL, FINAL, FULL, MODEL, TOOL_OUTPUT, assertCachedTurn, assertOk,
  cannedCall, isolatedHome, runClient, skipReason, startCairn,
} from './harness.mjs';

const skip = skipReason('opencode');

function setup(url) {
  const { home, cwd } = isolatedHome('opencode');
  const config = {
    $schema: 'https://opencode.ai/config.json',
    provider: {
      cairn: {
        npm: '@ai-sdk/openai-compatible',
        name: 'cairn',
        options: { baseURL: `${url}/v1`, apiKey: 'unused' },
        models: { [MODEL]: { name: MODEL } },
      },
    },
    model: `cairn/${MODEL}`,
  };
  if (!FULL) { // lean: a one-line system prompt and only the bash tool (stock: ~30 KB a request)
    config.agent = { build: { prompt: 'You are a coding agent. Run shell commands with the bash tool.' } };
    config.tools = Object.fromEntries(
      ['edit', 'glob', 'grep', 'read', 'skill', 'task', 'todowrite', 'webfetch', 'write'].map((t) => [t, false]));
  }
  mkdirSync(path.join(home, '.config', 'opencode'), { recursive: true });
  writeFileSync(path.join(home, '.config', 'opencode', 'opencode.json'), JSON.stringify(config, null, 2));
  // The models.dev fetch would wait on the network that a local setup may not have.
  const env = {
    HOME: home, OPENCODE_DISABLE_MODELS_FETCH: '1', OPENCODE_DISABLE_AUTOUPDATE: '1',
    OPENCODE_DISABLE_SHARE: '1',
  };
  return { home, cwd, env };
}

// --title skips the title request a new session sends first (lean runs only).
const FLAGS = ['--model', `cairn/${MODEL}`, '--format', 'json', ...(FULL ? [] : ['--title', 'cairn test'])];

// `--format json` prints one JSON event a line; the text parts joined are the answer.
function events(stdout) {
  return stdout.split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l));
}
const text = (ev) => ev.filter((e) => e.type === 'text').map((e) => e.part.text).join('');

let chat, tools;
before(async () => {
  if (skip) return;
  chat = await startCairn({ canned: CANNED_ANSWER });
  tools = await startCairn({ canned: cannedCall('bash', { command: `echo ${TOOL_OUTPUT}` }), afterTool: CANNED_FINAL });
});
after(async () => {
  if (chat) assert.equal(await chat.stop(), 0, chat.log());
  if (tools) assert.equal(await tools.stop(), 0, tools.log());
});

let session;
let firstTurn; // the first turn's main request (a new session may send a title request first)
test('opencode: answers a question (opencode run)', { skip }, async () => {
  session = setup(chat.url);
  const r = await runClient('opencode', ['run', ...FLAGS, 'Say hello'], session);
  assertOk(r, 'opencode run');
  assert.equal(text(events(r.stdout)), ANSWER, r.stdout);
  firstTurn = chat.requests().at(-1);
  assert.ok(firstTurn, chat.log());
});

test('opencode: a second turn (--continue) evaluates little more than what it adds', { skip }, async (t) => {
  assert.ok(firstTurn, 'the first turn ran');
  const n = chat.requests().length;
  const r = await runClient('opencode', ['run', '--continue', ...FLAGS, 'And again'], session);
  assertOk(r, 'opencode run --continue');
  assert.equal(text(events(r.stdout)), ANSWER, r.stdout);
  const reqs = chat.requests().slice(n);
  assert.equal(reqs.length, 1, chat.log());
  t.diagnostic(assertCachedTurn(firstTurn, reqs[0]));
});

test('opencode: a tool round trip through bash', { skip }, async () => {
  const s = setup(tools.url);
  const r = await runClient('opencode', ['run', ...FLAGS, `Run echo ${TOOL_OUTPUT}`], s);
  assertOk(r, 'opencode run');
  const ev = events(r.stdout);
  const calls = ev.filter((e) => e.type === 'tool_use');
  assert.equal(calls.length, 1, r.stdout);
  assert.equal(calls[0].part.tool, 'bash');
  assert.equal(calls[0].part.state.status, 'completed');
  assert.equal(calls[0].part.state.output.trim(), TOOL_OUTPUT); // the client ran it
  assert.equal(text(ev), FINAL, r.stdout); // and sent the result back: the after-tool answer
});
