// codex.test.mjs - Codex CLI (`codex exec`, OpenAI Responses: POST /v1/responses) against cairn:
// an answer, a second turn with `exec resume --last` that reuses the first turn's prompt from the
// prefix cache, and a tool round trip through its own exec_command tool. Runs when CAIRN_AGENTS
// names codex (it needs cairn's /v1/responses).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import {
  ANSWER, CANNED_ANSWER, CANNED_FINAL, FINAL, FULL, MODEL, TOOL_OUTPUT, assertCachedTurn, assertOk,
  cannedCall, isolatedHome, runClient, skipReason, startCairn,
} from './harness.mjs';

const skip = skipReason('codex');

function setup(url) {
  const { home, cwd } = isolatedHome('codex');
  const codexHome = path.join(home, '.codex');
  mkdirSync(codexHome);
  let toml = `model = "${MODEL}"\nmodel_provider = "cairn"\n`;
  if (!FULL) { // lean: a one-line system prompt, no sub-agents, goals or web search (stock: ~40 KB)
    const instr = path.join(codexHome, 'instructions.md');
    writeFileSync(instr, 'You are a coding agent. Run shell commands with exec_command.\n');
    toml += `model_instructions_file = "${instr}"\ninclude_permissions_instructions = false\n` +
      'include_environment_context = false\nweb_search = "disabled"\n\n' +
      '[features]\ngoals = false\nview_image = false\n\n[agents]\nenabled = false\n';
  }
  toml += `\n[model_providers.cairn]\nname = "cairn"\nbase_url = "${url}/v1"\n` +
    'env_key = "CAIRN_API_KEY"\nwire_api = "responses"\n';
  writeFileSync(path.join(codexHome, 'config.toml'), toml);
  return { home, cwd, env: { HOME: home, CODEX_HOME: codexHome, CAIRN_API_KEY: 'unused' } };
}

const EXEC = ['exec', '--skip-git-repo-check', '--json'];
// --json: one JSON event a line; the agent's messages are item.completed agent_message items.
function events(stdout) {
  return stdout.split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l));
}
const items = (ev, type) => ev.filter((e) => e.type === 'item.completed' && e.item.type === type).map((e) => e.item);
const answer = (stdout) => items(events(stdout), 'agent_message').map((i) => i.text).join('');

let chat, tools;
before(async () => {
  if (skip) return;
  chat = await startCairn({ canned: CANNED_ANSWER });
  tools = await startCairn({ canned: cannedCall('exec_command', { cmd: `echo ${TOOL_OUTPUT}` }), afterTool: CANNED_FINAL });
});
after(async () => {
  if (chat) assert.equal(await chat.stop(), 0, chat.log());
  if (tools) assert.equal(await tools.stop(), 0, tools.log());
});

let session;
test('codex: answers a question (codex exec)', { skip }, async () => {
  session = setup(chat.url);
  const r = await runClient('codex', [...EXEC, 'Say hello'], session);
  assertOk(r, 'codex exec');
  assert.equal(answer(r.stdout), ANSWER, r.stdout);
  assert.equal(chat.requests().length, 1, chat.log());
});

test('codex: a second turn (exec resume --last) evaluates little more than what it adds', { skip }, async (t) => {
  assert.ok(session, 'the first turn ran');
  const first = chat.requests().at(-1);
  const r = await runClient('codex', [...EXEC, 'resume', '--last', 'And again'], session);
  assertOk(r, 'codex exec resume');
  assert.equal(answer(r.stdout), ANSWER, r.stdout);
  const reqs = chat.requests();
  assert.equal(reqs.length, 2, chat.log());
  t.diagnostic(assertCachedTurn(first, reqs[1]));
});

test('codex: a tool round trip through exec_command', { skip }, async () => {
  const s = setup(tools.url);
  const r = await runClient('codex', [...EXEC, `Run echo ${TOOL_OUTPUT}`], s);
  assertOk(r, 'codex exec');
  const cmds = items(events(r.stdout), 'command_execution');
  assert.equal(cmds.length, 1, r.stdout);
  assert.equal(cmds[0].exit_code, 0);
  assert.equal(cmds[0].aggregated_output.trim(), TOOL_OUTPUT); // the client ran it
  assert.equal(answer(r.stdout), FINAL, r.stdout); // and sent the result back
  assert.equal(tools.requests().length, 2, tools.log());
});
