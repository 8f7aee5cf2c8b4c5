// qwen.test.mjs - qwen-code (`qwen`, Chat Completions) against cairn: an answer, a second turn
// with --continue that reuses the first turn's prompt from the prefix cache, and a tool round
// trip through its own run_shell_command tool.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import {
  ANSWER, CANNED_ANSWER, CANNED_FINAL, FINAL, FULL, MODEL, TOOL_OUTPUT, assertCachedTurn, assertOk,
  cannedCall, isolatedHome, runClient, skipReason, startCairn,
} from './harness.mjs';

const skip = skipReason('qwen');
// Lean: one tool and a one-line system prompt (the stock ones are ~70 KB of JSON per request).
const LEAN = ['--bare', '--exclude-tools', 'edit,notebook_edit,read_file,get_goal,update_goal',
  '--system-prompt', 'You are a coding agent. Run shell commands with run_shell_command.'];
// --yolo on every turn: the approval mode changes the tools and the system prompt, and both
// turns must send the same ones for the prefix to match.
const FLAGS = ['--yolo', ...(FULL ? [] : LEAN)];

function setup(url) {
  const { home, cwd } = isolatedHome('qwen');
  mkdirSync(path.join(home, '.qwen'));
  // Without these, every run sends a second, memory-extraction request after its answer.
  writeFileSync(path.join(home, '.qwen', 'settings.json'), JSON.stringify({
    memory: { enableManagedAutoMemory: false },
    privacy: { usageStatisticsEnabled: false },
    telemetry: { enabled: false },
  }));
  const env = {
    HOME: home, OPENAI_BASE_URL: `${url}/v1`, OPENAI_API_KEY: 'unused', OPENAI_MODEL: MODEL,
    QWEN_CODE_SUPPRESS_YOLO_WARNING: '1',
  };
  return { home, cwd, env };
}

// qwen -o json prints one JSON array of events; the last is the result.
function result(stdout) {
  const events = JSON.parse(stdout);
  return events.at(-1);
}

let chat, tools;
before(async () => {
  if (skip) return;
  chat = await startCairn({ canned: CANNED_ANSWER });
  tools = await startCairn({
    canned: cannedCall('run_shell_command', { command: `echo ${TOOL_OUTPUT}` }),
    afterTool: CANNED_FINAL,
  });
});
after(async () => {
  if (chat) assert.equal(await chat.stop(), 0, chat.log());
  if (tools) assert.equal(await tools.stop(), 0, tools.log());
});

let session; // the first test's HOME and cwd, continued by the second
test('qwen: answers a question (qwen -p)', { skip }, async () => {
  session = setup(chat.url);
  const r = await runClient('qwen', [...FLAGS, '-o', 'json', 'Say hello'], session);
  assertOk(r, 'qwen');
  const res = result(r.stdout);
  assert.equal(res.subtype, 'success', r.stdout);
  assert.equal(res.result, ANSWER);
  assert.equal(chat.requests().length, 1, chat.log());
});

test('qwen: a second turn (--continue) evaluates little more than what it adds', { skip }, async (t) => {
  assert.ok(session, 'the first turn ran');
  const first = chat.requests().at(-1);
  const r = await runClient('qwen', [...FLAGS, '--continue', '-o', 'json', 'And again'], session);
  assertOk(r, 'qwen --continue');
  assert.equal(result(r.stdout).result, ANSWER);
  const reqs = chat.requests();
  assert.equal(reqs.length, 2, chat.log());
  // qwen moves its "current date" reminder out of the previous user turn (that message's last
  // text part) into the new one, so the prompt branches inside the first turn's user message:
  // the first request kept a restore point where that part began, the second resumes there and
  // evaluates what follows, the moved reminder (~120 tokens) included.
  t.diagnostic(assertCachedTurn(first, reqs[1], { rewritten: 150 }));
});

test('qwen: a tool round trip through run_shell_command', { skip }, async () => {
  const s = setup(tools.url);
  const r = await runClient('qwen', [...FLAGS, '-o', 'json', `Run echo ${TOOL_OUTPUT}`], s);
  assertOk(r, 'qwen');
  const events = JSON.parse(r.stdout);
  assert.equal(events.at(-1).result, FINAL, r.stdout);
  // the tool ran and its output went back to the model: the transcript holds the result
  const results = events.flatMap((e) => e.message?.content ?? []).filter((c) => c.type === 'tool_result');
  assert.equal(results.length, 1, r.stdout);
  assert.match(JSON.stringify(results[0].content), new RegExp(TOOL_OUTPUT));
  assert.equal(tools.requests().length, 2, tools.log()); // the call, then the final answer
});
