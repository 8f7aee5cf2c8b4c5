#!/usr/bin/env bash
# run.sh - runs the coding agents' end-to-end tests (node --test) for ctest; exits 77 (skipped)
# when node or the agent CLIs are missing. CAIRN_AGENTS picks the clients (harness.mjs).
set -u
cd "$(dirname "$0")/../.."
bin=tests/node_modules/.bin
if ! command -v node >/dev/null || [ ! -e $bin/qwen ] || [ ! -e $bin/opencode ] || [ ! -e $bin/codex ] || [ ! -e $bin/claude ]; then
  echo "skipped: needs node and 'npm install --prefix tests --no-save' (the agent CLIs)"
  exit 77
fi
mkdir -p "${CAIRN_TMP:-build/tmp}"
exec node --test --test-concurrency=1 --test-timeout=300000 tests/agents/
