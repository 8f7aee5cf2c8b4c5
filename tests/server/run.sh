#!/usr/bin/env bash
# run.sh - runs the server's end-to-end tests (node --test) for ctest; exits 77 (skipped) when
# node or the client packages are missing. CI installs both (.ci/run), so there they run.
set -u
cd "$(dirname "$0")/../.."
if ! command -v node >/dev/null || [ ! -d tests/node_modules/openai ] || [ ! -d tests/node_modules/ollama ] ||
   [ ! -d tests/node_modules/@anthropic-ai/sdk ]; then
  echo "skipped: needs node and 'npm install --prefix tests --no-save'"
  exit 77
fi
mkdir -p "${CAIRN_TMP:-build/tmp}"
exec node --test --test-concurrency=1 --test-timeout=120000 tests/server/
