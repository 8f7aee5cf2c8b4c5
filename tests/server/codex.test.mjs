// codex.test.mjs - the Codex CLI (`codex exec`, from tests/node_modules) against `cairn serve`
// through /v1/responses, configured as the README says. Codex sends its real request (a ~17k-token
// prompt, its tools, reasoning and include settings) and must print the answer; the answer is
// canned (CAIRN_TEST_CANNED_OUTPUT) since the tiny model's is gibberish. Skipped when the codex
// binary is not installed.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { startServer, TMP } from './harness.mjs';

const CODEX = path.resolve('tests/node_modules/.bin/codex');
const ANSWER = 'hello from cairn';
let srv, home;

before(async () => {
  if (!existsSync(CODEX)) return;
  srv = await startServer(['--name', 'cobble', '--ctx', '32768'],
                          { CAIRN_TEST_CANNED_OUTPUT: `<think>\nThe user greets me.\n</think>\n${ANSWER}` });
  mkdirSync(TMP, { recursive: true });
  home = mkdtempSync(path.join(path.resolve(TMP), 'codex-'));
  mkdirSync(path.join(home, '.codex'));
  mkdirSync(path.join(home, 'work'));
  writeFileSync(path.join(home, '.codex', 'config.toml'),
    `model = "cobble"\nmodel_provider = "cairn"\n\n[model_providers.cairn]\nname = "cairn"\n` +
    `base_url = "${srv.url}/v1"\nwire_api = "responses"\nrequest_max_retries = 0\nstream_max_retries = 0\n`);
});
after(async () => {
  if (srv) assert.equal(await srv.stop(), 0, srv.log());
  if (home) rmSync(home, { recursive: true, force: true });
});

// its prompt takes a while to prefill on one thread (longer under the sanitizers)
test('codex exec answers through /v1/responses', { skip: !existsSync(CODEX) && 'codex is not installed', timeout: 400000 }, async () => {
  const env = { PATH: process.env.PATH, HOME: home, CODEX_HOME: path.join(home, '.codex') };
  const { stdout, stderr } = await new Promise((resolve, reject) => {
    const p = execFile(CODEX, ['exec', '--skip-git-repo-check', 'Say hello'],
      { cwd: path.join(home, 'work'), env, timeout: 360000 },
      (err, stdout, stderr) => (err ? reject(Object.assign(err, { stdout, stderr })) : resolve({ stdout, stderr })));
    p.stdin.end();
  });
  assert.equal(stdout.trim(), ANSWER, stderr);
  const m = srv.log().match(/request: (\d+) tokens/);
  assert.ok(m && Number(m[1]) > 1000, "Codex's own prompt was rendered: " + srv.log());
});
