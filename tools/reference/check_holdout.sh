#!/usr/bin/env bash
# Checks cairn against the held-out checkpoint (written by transformers' save_pretrained, read by
# no test): all-position logits within 1e-4 of the largest reference logit, same greedy tokens.
# Usage: tools/reference/check_holdout.sh [path/to/cairn]
set -euo pipefail
cd "$(dirname "$0")/../.."
CAIRN=${1:-build/cairn}
H=tools/reference/holdout
ids() { python3 -c "import json,sys; print(','.join(map(str, json.load(open('$H/reference.json'))['$1'])))"; }
V=$(python3 -c "import json; print(json.load(open('$H/reference.json'))['vocab_size'])")
prompt=$(ids prompt)
greedy=$(ids greedy)
n=$(echo "$greedy" | tr ',' '\n' | wc -l)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$CAIRN" logits --model "$H" --tokens "$prompt" --out "$out"
python3 tools/reference/compare.py "$out" "$H/logits.f32" "$V"
got=$("$CAIRN" generate --model "$H" --tokens "$prompt" --max-tokens "$n" --json 2>/dev/null |
      python3 -c "import json,sys; print(','.join(map(str, json.load(sys.stdin)['tokens'])))")
if [ "$got" = "$greedy" ]; then echo "greedy: identical ($n tokens)"; else
  echo "greedy: DIFFERENT"; echo " cairn: $got"; echo " ref:   $greedy"; exit 1; fi
