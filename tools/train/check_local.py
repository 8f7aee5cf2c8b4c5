#!/usr/bin/env python3
"""check_local.py - what cobble was trained on is what cairn feeds it, checked without a GPU.

  1. data.py's targets: for N conversations of each split, the generation prompt plus the
     completion the model learned equals the chat template's own rendering of the finished turn
     (jinja2, as transformers renders it);
  2. the renderer: `cairn render` gives the same bytes as data.py's jinja2 rendering for those
     conversations (thinking on and off, tools, tool responses, multi-turn history);
  3. the tokenizer: `cairn tokenize --model models/cobble` gives the ids Hugging Face tokenizers
     gave at training time for tok_sample.json (rendered held-out conversations and odd text).

    python3 tools/train/check_local.py [--bin build/cairn] [--model models/cobble] [--n 40]
Exit 0 when all agree, 1 with the first difference printed, 77 when jinja2 is missing.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import data  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.environ.get("CAIRN_BIN", os.path.join(ROOT, "build", "cairn")))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "cobble"))
    ap.add_argument("--n", type=int, default=40)
    args = ap.parse_args()
    try:
        import jinja2  # noqa: F401
    except ImportError:
        print("check_local.py: jinja2 missing (apt-get install python3-jinja2): skipped")
        return 77
    n = 0
    for split in ("train", "heldout"):
        for i in range(args.n):
            ex = data.example(1, i, split)
            data.check_example(ex)
            want = data.render(ex["request"])
            got = subprocess.run([args.bin, "render", "--model", args.model], input=json.dumps(ex["request"]),
                                 capture_output=True, text=True)
            if got.returncode or got.stdout != want:
                print(f"render differs for {split} {i} ({ex['kind']}): {got.stderr}\n{got.stdout!r}\n!=\n{want!r}")
                return 1
            n += 1
    with open(os.path.join(HERE, "tok_sample.json"), encoding="utf-8") as f:
        sample = json.load(f)
    for s in sample:
        got = subprocess.run([args.bin, "tokenize", "--model", args.model, "--json", "-"], input=s["text"],
                             capture_output=True, text=True)
        if got.returncode or json.loads(got.stdout) != s["ids"]:
            print(f"tokenize differs for {s['text'][:60]!r}: {got.stdout[:200]} {got.stderr}")
            return 1
    print(f"check_local.py: {n} conversations render identically (template targets checked), "
          f"{len(sample)} tokenizer samples give the training ids")
    return 0


if __name__ == "__main__":
    sys.exit(main())
