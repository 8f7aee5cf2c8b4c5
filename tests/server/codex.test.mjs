// codex.test.mjs - the Codex CLI (`codex exec`, from tests/node_modules) against `cairn serve`
// through /v1/responses, configured as the README says. Codex sends its real request (its developer
// and user messages, tools, reasoning and include settings) and must print the answer; the answer is
// canned (CAIRN_TEST_CANNED_OUTPUT) since the tiny model's is gibberish. Skipped when the codex
// binary is not installed, and under the sanitizers (ASAN_OPTIONS set, as `make test-asan` sets
// it): their build prefills Codex's ~7k-token prompt too slowly for the suite's time limits.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { startServer, TMP } from './harness.mjs';

const CODEX = path.resolve('tests/node_modules/.bin/codex');
const skip = !existsSync(CODEX) ? 'codex is not installed'
  : process.env.ASAN_OPTIONS !== undefined ? 'too slow under the sanitizers' : false;
const ANSWER = 'hello from cairn';
let srv, home;

before(async () => {
  if (skip) return;
  srv = await startServer(['--name', 'cobble', '--ctx', '32768'],
                          { CAIRN_TEST_CANNED_OUTPUT: `<think>\nThe user greets me.\n</think>\n${ANSWER}` });
  mkdirSync(TMP, { recursive: true });
  home = mkdtempSync(path.join(path.resolve(TMP), 'codex-'));
  mkdirSync(path.join(home, '.codex'));
  mkdirSync(path.join(home, 'work'));
  // Codex's own base instructions are most of its prompt; a short file in their place keeps the
  // request's shape (developer and user messages, tools, reasoning) and its prefill quick
  writeFileSync(path.join(home, 'instructions.md'), 'You are a coding agent. Answer briefly.\n');
  writeFileSync(path.join(home, '.codex', 'config.toml'),
    `model = "cobble"\nmodel_provider = "cairn"\nmodel_instructions_file = "${path.join(home, 'instructions.md')}"\n\n` +
    `[model_providers.cairn]\nname = "cairn"\n` +
    `base_url = "${srv.url}/v1"\nwire_api = "responses"\nrequest_max_retries = 0\nstream_max_retries = 0\n`);
});
after(async () => {
  if (srv) assert.equal(await srv.stop(), 0, srv.log());
  if (home) rmSync(home, { recursive: true, force: true });
});

test('codex exec answers through /v1/responses', { skip }, async () => {
  const env = { PATH: process.env.PATH, HOME: home, CODEX_HOME: path.join(home, '.codex') };
  const { stdout, stderr } = await new Promise((resolve, reject) => {
    const p = execFile(CODEX, ['exec', '--skip-git-repo-check', 'Say hello'],
      { cwd: path.join(home, 'work'), env, timeout: 100000 },
      (err, stdout, stderr) => (err ? reject(Object.assign(err, { stdout, stderr })) : resolve({ stdout, stderr })));
    p.stdin.end();
  });
  assert.equal(stdout.trim(), ANSWER, stderr);
  const m = srv.log().match(/request: (\d+) tokens/);
  assert.ok(m && Number(m[1]) > 1000, "Codex's own prompt was rendered: " + srv.log());
  assert.match(srv.log(), /tools of type .*web_search.* left out/);
});
