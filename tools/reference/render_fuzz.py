#!/usr/bin/env python3
"""render_fuzz.py - random chat requests through jinja2 and through `cairn render`; any difference fails.

Usage: tools/reference/render_fuzz.py [--bin build/cairn] [--seed 0] [-n 300]
The goldens pin each branch of the template once; this throws random mixes at both (think tags,
Unicode whitespace, odd schema shapes, mixed scalars and containers as arguments) to find
combinations the cases missed. Requests the mapping refuses (e.g. a /think toggle) are skipped.
Exits 1 on any mismatch, after printing the first three.
"""
import argparse
import json
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import render_goldens as rg  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--bin", default=os.path.join(rg.ROOT, "build", "cairn"))
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("-n", type=int, default=300)
args = ap.parse_args()
with open(os.path.join(rg.DATA, "nemotron3-nano-chat-template.jinja"), encoding="utf-8") as f:
    tmpl = rg.make_env().from_string(f.read())
R = random.Random(args.seed)
atoms = ["", " ", "\n", "  \n", "<think>", "</think>", "a", "hello world", "\t", "é", "😀", "\u00a0", "\u3000", "x y", "<tool_call>", "\r\n", "/", "think", "\u200b"]
def text(): return "".join(R.choice(atoms) for _ in range(R.randint(0, 6)))
def scalar():
    return R.choice([R.randint(-5, 5), R.random() * 10 ** R.randint(-8, 20), True, False, None, text(), 1.0, 0.1, 1e-05])
def value(d=0):
    k = R.random()
    if d > 2 or k < 0.6: return scalar()
    if k < 0.8: return [value(d + 1) for _ in range(R.randint(0, 3))]
    return {R.choice(["a", "b", "type", "items", "name", "enum", "description", "k"]): value(d + 1) for _ in range(R.randint(0, 3))}
def schema():
    s = {}
    for key in R.sample(["type", "description", "enum", "default", "items", "name", "minimum", "format", "x"], R.randint(0, 5)):
        s[key] = value(1) if key != "description" or R.random() < 0.3 else text()
    return s if R.random() < 0.9 else value(2)
def tool():
    fn = {"name": R.choice(["f", "get_x", "g"])}
    if R.random() < 0.7: fn["description"] = text() if R.random() < 0.8 else value(1)
    if R.random() < 0.8:
        p = {"type": "object", "properties": {R.choice("abcdef"): schema() for _ in range(R.randint(0, 3))}}
        if R.random() < 0.5: p["required"] = value(1)
        if R.random() < 0.3: p["additionalProperties"] = value(1)
        fn["parameters"] = p if R.random() < 0.9 else value(1)
    if R.random() < 0.3: fn["strict"] = scalar()
    return {"type": "function", "function": fn} if R.random() < 0.9 else dict(fn, type="function")
def msg():
    role = R.choice(["system", "user", "user", "assistant", "assistant", "tool", "tool"])
    m = {"role": role, "content": text()}
    if role == "assistant":
        if R.random() < 0.4: m["reasoning_content"] = text()
        if R.random() < 0.2: m["content"] = None
        if R.random() < 0.4:
            m["tool_calls"] = [{"type": "function", "function": {"name": R.choice(["f", "g"]),
                "arguments": (json.dumps(a) if R.random() < 0.5 else a)}} for a in
                [{R.choice("xyz"): value(1) for _ in range(R.randint(0, 3))} for _ in range(R.randint(1, 3))]]
    if role in ("user", "system") and R.random() < 0.1:
        m["content"] = [{"type": "text", "text": text()} for _ in range(R.randint(0, 3))]
    return m
bad = 0
N = args.n
for i in range(N):
    req = {"messages": [msg() for _ in range(R.randint(1, 7))]}
    if R.random() < 0.4: req["tools"] = [tool() for _ in range(R.randint(0, 3))]
    if R.random() < 0.3: req["chat_template_kwargs"] = {"enable_thinking": R.random() < 0.5, "truncate_history_thinking": R.random() < 0.5}
    if R.random() < 0.2: req["add_generation_prompt"] = False
    if R.random() < 0.2: req["think"] = R.random() < 0.5
    try:
        want = tmpl.render(**rg.template_vars(req, "fuzz"))
    except ValueError:
        continue
    body = json.dumps(req, ensure_ascii=False)
    p = subprocess.run([args.bin, "render", "--renderer", "nemotron3"], input=body.encode(), capture_output=True)
    got = p.stdout.decode("utf-8", "replace")
    if p.returncode != 0 or got != want:
        bad += 1
        if bad <= 3:
            print("MISMATCH rc", p.returncode, p.stderr.decode()[:300]); print(body[:1500])
            k = next((j for j in range(min(len(got), len(want))) if got[j] != want[j]), min(len(got), len(want)))
            print("got ", repr(got[max(0,k-80):k+80])); print("want", repr(want[max(0,k-80):k+80]))
print(f"render_fuzz.py: {N} requests, {bad} mismatches")
sys.exit(1 if bad else 0)
