#!/usr/bin/env python3
"""eval_server.py - cobble's held-out accuracy through the real server and its output parser.

Starts `cairn serve --model DIR --port 0 --json`, sends held-out conversations of data.py (never
trained on) to /v1/chat/completions with greedy sampling, thinking on or off as each conversation
asks, and scores what the server's parser returns:
  * answers: message.content must equal the expected answer exactly;
  * tool calls: a call is valid when it is well formed (the parser returned it in tool_calls with
    JSON arguments), names the right tool, and its arguments satisfy the tool's JSON schema
    (required keys present, no unknown keys, types and enums respected); exact when the arguments
    also equal the expected ones.

    python3 tools/train/eval_server.py [--model models/cobble] [--n 300] [--bin build/cairn]
Prints one line per category and a JSON summary on the last line. Pure standard library.
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import data  # noqa: E402

JSON_TYPES = {"string": str, "number": (int, float), "integer": int, "boolean": bool, "object": dict,
              "array": list}


def schema_ok(args, params):
    if not isinstance(args, dict):
        return False
    props = params.get("properties", {})
    if any(k not in args for k in params.get("required", [])):
        return False
    for k, v in args.items():
        if k not in props:
            return False
        p = props[k]
        t = JSON_TYPES.get(p.get("type"))
        if t and (not isinstance(v, t) or (isinstance(v, bool) and p.get("type") != "boolean")):
            return False
        if "enum" in p and v not in p["enum"]:
            return False
    return True


def post(url, body, timeout=120):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def score(ex, msg):
    """Returns (category, exact, valid) for one reply message."""
    t = ex["target"]
    if t["tool_calls"]:
        want = t["tool_calls"][0]["function"]
        calls = msg.get("tool_calls") or []
        if len(calls) != 1:
            return "tool_call", False, False
        f = calls[0].get("function", {})
        try:
            args = json.loads(f.get("arguments", ""))
        except (TypeError, json.JSONDecodeError):
            return "tool_call", False, False
        tools = {x["function"]["name"]: x["function"] for x in ex["request"].get("tools", [])}
        valid = f.get("name") == want["name"] and f.get("name") in tools and \
            schema_ok(args, tools[f["name"]]["parameters"])
        return "tool_call", valid and args == json.loads(want["arguments"]), valid
    got = (msg.get("content") or "").strip()
    return ex["kind"], got == t["content"] and not msg.get("tool_calls"), None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "cobble"))
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "cairn"))
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--show", type=int, default=5, help="print this many failures")
    args = ap.parse_args()
    srv = subprocess.Popen([args.bin, "serve", "--model", args.model, "--port", "0", "--json", "--quiet"],
                           stdout=subprocess.PIPE, text=True)
    try:
        ready = json.loads(srv.stdout.readline())
        url = ready["url"].rstrip("/") + "/v1/chat/completions"
        tot = collections.defaultdict(lambda: [0, 0])  # key -> [exact, n]
        valid = [0, 0]
        shown = 0
        t0 = time.time()
        for i in range(args.n):
            ex = data.example(args.seed, i, "heldout")
            body = dict(ex["request"], model="cobble", temperature=0, max_tokens=400)
            msg = post(url, body)["choices"][0]["message"]
            cat, exact, ok = score(ex, msg)
            mode = "think" if ex["think"] else "no_think"
            for k in (f"{mode}", f"{mode}/{cat}", "all"):
                tot[k][0] += exact
                tot[k][1] += 1
            if ok is not None:
                valid[0] += ok
                valid[1] += 1
            if not exact and shown < args.show:
                shown += 1
                print(f"MISS [{cat} {mode}] want {ex['target']['content'] or ex['target']['tool_calls']!r} "
                      f"got {msg.get('content')!r} {msg.get('tool_calls')!r}", file=sys.stderr)
        for k in sorted(tot):
            e, n = tot[k]
            print(f"{k:28s} {e:4d}/{n:<4d} {e / n:.3f}")
        print(f"{'tool-call validity':28s} {valid[0]:4d}/{valid[1]:<4d} {valid[0] / max(1, valid[1]):.3f}")
        summary = {"n": args.n, "seconds": round(time.time() - t0, 1),
                   "accuracy_think": tot["think"][0] / max(1, tot["think"][1]),
                   "accuracy_no_think": tot["no_think"][0] / max(1, tot["no_think"][1]),
                   "tool_call_validity": valid[0] / max(1, valid[1]),
                   "tool_call_exact": (tot["think/tool_call"][0] + tot["no_think/tool_call"][0]) / max(1, valid[1])}
        print(json.dumps(summary))
    finally:
        srv.terminate()
        srv.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
