#!/usr/bin/env python3
"""clients_bench.py - N streaming clients at once against a running `cairn serve` (or any server
speaking OpenAI's /v1/completions), Python's standard library only.

Each client sends its own prompt of about --prompt words (a head all share, then a tail of its
own) and streams --gen tokens, greedy, with ignore_eos; for each N the wall time from the first
request to the last token gives tok/s in all, and each client's first token its latency (median
and worst). Token counts are the server's (usage), not the words sent.

    python3 tools/clients_bench.py --url http://127.0.0.1:11435 --model cobble \\
        [--clients 1,4,16] [--prompt 600] [--gen 128] [--json]
"""
import argparse
import json
import statistics
import threading
import time
import urllib.request

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


def prompt(i, run, n):
    head = [WORDS[k % len(WORDS)] for k in range(int(n * 0.8))]
    tail = [f"client {i} of run {run}:"] + [WORDS[(k * 7 + i * 3) % len(WORDS)] for k in range(int(n * 0.2))]
    return " ".join(head + tail)


def one(a, i, run, t0, out):
    body = json.dumps({"model": a.model, "prompt": prompt(i, run, a.prompt), "max_tokens": a.gen,
                       "temperature": 0, "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(a.url + "/v1/completions", data=body,
                                 headers={"content-type": "application/json"})
    first, usage = 0.0, None
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            ev = json.loads(line[5:])
            if not first and ev.get("choices") and ev["choices"][0].get("text"):
                first = time.monotonic() - t0
            if ev.get("usage"):
                usage = ev["usage"]
    out[i] = (first, time.monotonic() - t0, usage or {})


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", default="http://127.0.0.1:11435")
    p.add_argument("--model", default="cobble")
    p.add_argument("--clients", default="1,4,16")
    p.add_argument("--prompt", type=int, default=600)
    p.add_argument("--gen", type=int, default=128)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    rows = []
    for run, n in enumerate(int(x) for x in a.clients.split(",")):
        out = [None] * n
        t0 = time.monotonic()
        th = [threading.Thread(target=one, args=(a, i, run, t0, out)) for i in range(n)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        if any(o is None for o in out):
            raise SystemExit(f"{n} clients: some requests failed")
        wall = max(o[1] for o in out)
        tokens = sum(o[2].get("completion_tokens", 0) for o in out)
        row = {"clients": n, "tok_s": tokens / wall, "tokens": tokens, "wall_s": wall,
               "prompt_tokens": round(sum(o[2].get("prompt_tokens", 0) for o in out) / n),
               "first_token_median_s": statistics.median(o[0] for o in out),
               "first_token_worst_s": max(o[0] for o in out)}
        rows.append(row)
        if not a.json:
            print(f"{n:4d} clients: {row['tok_s']:8.1f} tok/s in all, {tokens} tokens in {wall:.2f} s, "
                  f"prompts ~{row['prompt_tokens']} tokens; first token median "
                  f"{row['first_token_median_s']:.2f} s, worst {row['first_token_worst_s']:.2f} s", flush=True)
    if a.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
