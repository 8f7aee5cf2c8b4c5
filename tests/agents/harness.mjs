// harness.mjs - drives the real coding-agent CLIs (claude, codex, qwen, opencode) against a real
// `cairn serve --model models/cobble` for the agents' end-to-end tests.
//
// The random committed model cannot write a tool call or a stable answer, so the server's answers
// are canned (CAIRN_TEST_CANNED_OUTPUT; CAIRN_TEST_CANNED_AFTER_TOOL for a request that ends in a
// tool result): they still stream through the real tokenizer, reply parser and response builders.
// Every client runs under a hard timeout with its own HOME (and config dirs) under CAIRN_TMP, so
// nothing leaks between runs or from the machine's own configuration. CAIRN_AGENTS lists the
// clients to run (default DEFAULT_CLIENTS); CAIRN_AGENTS_FULL=1 runs the clients' stock system
// prompts and tools instead of the lean configuration (about 15-30k tokens per request: slow on a
// CPU).
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync } from 'node:fs';
import path from 'node:path';
import assert from 'node:assert/strict';

import { serveModel } from '../server/harness.mjs';

export const TMP = path.resolve(process.env.CAIRN_TMP || 'build/tmp');
export const MODEL_DIR = process.env.CAIRN_AGENTS_MODEL || 'models/cobble';
export const MODEL = 'cobble';
export const FULL = process.env.CAIRN_AGENTS_FULL === '1';
// Every client by default; CAIRN_AGENTS=qwen,codex (say) runs some.
export const DEFAULT_CLIENTS = 'qwen,opencode,codex,claude';
const CLIENTS = (process.env.CAIRN_AGENTS || DEFAULT_CLIENTS).split(',').map((s) => s.trim());
const NODE_BIN = path.resolve('tests/node_modules/.bin');

export const ANSWER = 'The answer is cairn-answer-ok.';
export const FINAL = 'The command printed cairn-tool-ok.';
export const TOOL_OUTPUT = 'cairn-tool-ok';
// The reply template opens a thinking block, so a canned answer closes one first.
export const CANNED_ANSWER = `<think>\nA short answer.\n</think>\n${ANSWER}`;
export const CANNED_FINAL = `<think>\nThe tool ran.\n</think>\n${FINAL}`;
// One call in the model's own tool-call format (what the reply parser turns into the API's call).
export function cannedCall(fn, args) {
  const params = Object.entries(args)
    .map(([k, v]) => `<parameter=${k}>\n${v}\n</parameter>\n`)
    .join('');
  return `<think>\nI will run it.\n</think>\n<tool_call>\n<function=${fn}>\n${params}</function>\n</tool_call>\n`;
}

// Whether this client is asked for and installed; else the reason to skip its tests.
export function skipReason(client, exe = client) {
  if (!CLIENTS.includes(client)) return `not in CAIRN_AGENTS (${CLIENTS.join(',')})`;
  if (!existsSync(path.join(NODE_BIN, exe))) return `tests/node_modules/.bin/${exe} is not installed`;
  return false;
}

export function clientBin(exe) {
  return path.join(NODE_BIN, exe);
}

// A fresh HOME for one client with an empty working directory in it: { home, cwd }. The
// directory is a git repository of its own with no commits: the clients put a snapshot of the
// repository they run in into their prompts (branch, status, recent commits), and without one
// they would describe the cairn checkout the tests run from, which changes as it is edited.
export function isolatedHome(client) {
  const root = path.join(TMP, 'agents');
  mkdirSync(root, { recursive: true });
  const home = mkdtempSync(path.join(root, `${client}-`));
  const cwd = path.join(home, 'work');
  mkdirSync(cwd);
  execFileSync('git', ['init', '-q', '-b', 'main', cwd], { stdio: 'ignore' });
  return { home, cwd };
}

// The engine's per-request line: "request: N tokens, M matched, K restored from cache, E
// evaluated, G generated".
const REQ_LINE = /request: (\d+) tokens, (\d+) matched, (\d+) restored from cache, (\d+) evaluated, (\d+) generated/g;

// Starts `cairn serve --model models/cobble --port 0` with canned answers; resolves to
// { url, log(), requests(), stop() } where requests() lists the engine's per-request figures.
export async function startCairn({ canned, afterTool } = {}) {
  const s = await serveModel(MODEL_DIR, ['--name', MODEL, '--ctx', '65536'], {
    CAIRN_TEST_CANNED_OUTPUT: canned ?? null,
    CAIRN_TEST_CANNED_AFTER_TOOL: afterTool ?? null,
  });
  return {
    ...s,
    requests: () => [...s.log().matchAll(REQ_LINE)].map((x) => ({
      tokens: +x[1], matched: +x[2], restored: +x[3], evaluated: +x[4], generated: +x[5],
    })),
  };
}

// Runs one client command with stdin closed, killed (whole process group) after timeoutMs;
// resolves to { code, stdout, stderr, ms }. A timeout is a failure naming the command.
export function runClient(exe, args, { env, cwd, timeoutMs = 150000 }) {
  const t0 = Date.now();
  const proc = spawn(clientBin(exe), args, {
    cwd, env: { PATH: process.env.PATH, LANG: 'C.UTF-8', TERM: 'dumb', NO_COLOR: '1', ...env },
    stdio: ['ignore', 'pipe', 'pipe'], detached: true,
  });
  let stdout = '', stderr = '', timedOut = false;
  proc.stdout.on('data', (d) => (stdout += d.toString()));
  proc.stderr.on('data', (d) => (stderr += d.toString()));
  const timer = setTimeout(() => {
    timedOut = true;
    try { process.kill(-proc.pid, 'SIGKILL'); } catch { /* already gone */ }
  }, timeoutMs);
  return new Promise((resolve, reject) => {
    proc.on('error', reject);
    proc.on('close', (code) => {
      clearTimeout(timer);
      const r = { code, stdout, stderr, ms: Date.now() - t0 };
      if (timedOut) reject(new Error(`${exe} ${args.join(' ')}: timed out after ${timeoutMs} ms\n${stderr}`));
      else resolve(r);
    });
  });
}

// Asserts a client run exited 0, naming its output otherwise.
export function assertOk(r, what) {
  assert.equal(r.code, 0, `${what} exited ${r.code}\nstdout: ${r.stdout}\nstderr: ${r.stderr}`);
}

// The few tokens a follow-up turn may evaluate beyond what it adds: the restore point a few
// tokens before the previous prompt's end (the engine's pre_end) and the previous turn's
// generation prompt, which the history renders differently.
export const TURN_SLACK = 32;

// Asserts the second turn's request reused the first turn's prompt from the prefix cache: it
// matched all of the first prompt but `rewritten` tokens the client is known to change in its
// history, resumed from a restore point at most the pre-end margin (4 tokens) below where the two
// prompts part, and evaluated at most the tokens it adds to the first prompt (plus the rewritten
// ones) plus TURN_SLACK.
export function assertCachedTurn(first, second, { rewritten = 0 } = {}) {
  const added = second.tokens - first.tokens;
  const why = `(second turn: ${second.tokens} tokens, matched ${second.matched}, restored ` +
    `${second.restored}, evaluated ${second.evaluated}; first turn: ${first.tokens} tokens)`;
  assert.ok(added > 0, `the second turn extends the first ${why}`);
  assert.ok(second.matched >= first.tokens - rewritten - TURN_SLACK,
    `the second turn re-sent the first turn's prompt ${why}`);
  assert.ok(second.restored >= second.matched - 4,
    `the second turn resumed well below where it left the first ${why}`);
  assert.ok(second.evaluated <= added + rewritten + TURN_SLACK,
    `the second turn evaluated more than the ${added} tokens it adds plus ` +
    `${rewritten + TURN_SLACK} ${why}`);
  return why;
}
