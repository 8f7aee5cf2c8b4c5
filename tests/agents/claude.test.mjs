// claude.test.mjs - Claude Code (`claude -p`, Anthropic Messages: POST /v1/messages) against
// cairn: an answer, a second turn with --continue that reuses the first turn's prompt from the
// prefix cache, and a tool round trip through its own Bash tool. Runs when CAIRN_AGENTS names
// claude (it needs cairn's /v1/messages).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import {
  ANSWER, CANNED_ANSWER, CANNED_FINAL, FINAL, FULL, MODEL, TOOL_OUTPUT, assertCachedTurn, assertOk,
  cannedCall, isolatedHome, runClient, skipReason, startCairn,
} from './harness.mjs';

const skip = skipReason('claude');
// Lean: a one-line system prompt, only the Bash tool, no skills (stock: ~50 KB a request).
const LEAN = ['--system-prompt', 'You are a coding agent. Run shell commands with the Bash tool.',
  '--tools', 'Bash', '--disable-slash-commands'];
const FLAGS = ['-p', '--allowedTools', 'Bash', ...(FULL ? [] : LEAN)];

function setup(url) {
  const { home, cwd } = isolatedHome('claude');
  const env = {
    HOME: home, ANTHROPIC_BASE_URL: url, ANTHROPIC_AUTH_TOKEN: 'unused', ANTHROPIC_MODEL: MODEL,
    // without these it probes HEAD /api/hello and reaches for telemetry hosts
    CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1', DISABLE_TELEMETRY: '1',
  };
  return { home, cwd, env };
}

// --output-format stream-json --verbose: one JSON event a line, the last the result.
function events(stdout) {
  return stdout.split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l));
}

let chat, tools;
before(async () => {
  if (skip) return;
  chat = await startCairn({ canned: CANNED_ANSWER });
  tools = await startCairn({ canned: cannedCall('Bash', { command: `echo ${TOOL_OUTPUT}` }), afterTool: CANNED_FINAL });
});
after(async () => {
  if (chat) assert.equal(await chat.stop(), 0, chat.log());
  if (tools) assert.equal(await tools.stop(), 0, tools.log());
});

let session;
test('claude: answers a question (claude -p)', { skip }, async () => {
  session = setup(chat.url);
  const r = await runClient('claude', [...FLAGS, '--output-format', 'json', 'Say hello'], session);
  assertOk(r, 'claude -p');
  const res = JSON.parse(r.stdout);
  assert.equal(res.is_error, false, r.stdout);
  assert.equal(res.result, ANSWER);
  assert.equal(chat.requests().length, 1, chat.log());
});

test('claude: a second turn (--continue) evaluates little more than what it adds', { skip }, async (t) => {
  assert.ok(session, 'the first turn ran');
  const first = chat.requests().at(-1);
  const r = await runClient('claude', [...FLAGS, '--continue', '--output-format', 'json', 'And again'], session);
  assertOk(r, 'claude -p --continue');
  assert.equal(JSON.parse(r.stdout).result, ANSWER);
  const reqs = chat.requests();
  assert.equal(reqs.length, 2, chat.log());
  t.diagnostic(assertCachedTurn(first, reqs[1]));
});

test('claude: a tool round trip through Bash', { skip }, async () => {
  const s = setup(tools.url);
  const r = await runClient('claude', [...FLAGS, '--output-format', 'stream-json', '--verbose',
    `Run echo ${TOOL_OUTPUT}`], s);
  assertOk(r, 'claude -p');
  const ev = events(r.stdout);
  const blocks = ev.flatMap((e) => (Array.isArray(e.message?.content) ? e.message.content : []));
  const uses = blocks.filter((b) => b.type === 'tool_use');
  assert.equal(uses.length, 1, r.stdout);
  assert.equal(uses[0].name, 'Bash');
  const results = blocks.filter((b) => b.type === 'tool_result');
  assert.equal(results.length, 1, r.stdout);
  assert.match(JSON.stringify(results[0].content), new RegExp(TOOL_OUTPUT)); // the client ran it
  assert.equal(ev.at(-1).result, FINAL, r.stdout); // and sent the result back
  assert.equal(tools.requests().length, 2, tools.log());
});
