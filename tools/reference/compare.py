#!/usr/bin/env python3
"""Compare two float32 little-endian logit files of shape [rows x V] (standard library only).

    python3 tools/reference/compare.py A.f32 B.f32 V [--bar 1e-4]

Prints max|a-b| / max|b| over all values (B is the reference), the worst row, and whether each
row's argmax agrees. Exit status 0 when the ratio is within the bar (default 1e-4), else 1.
"""

import array
import sys


def load(path):
    a = array.array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
    return a


def main(argv):
    args = [x for x in argv[1:] if not x.startswith("--")]
    bar = 1e-4
    if "--bar" in argv:
        bar = float(argv[argv.index("--bar") + 1])
        args.remove(argv[argv.index("--bar") + 1])
    if len(args) != 3:
        print(__doc__.strip())
        return 2
    a, b, v = load(args[0]), load(args[1]), int(args[2])
    if len(a) != len(b) or len(a) % v:
        print(f"size mismatch: {len(a)} vs {len(b)} values, V={v}")
        return 2
    rows = len(a) // v
    maxb = max(abs(x) for x in b)
    maxd, worst, argmax_bad = 0.0, -1, []
    for r in range(rows):
        ra, rb = a[r * v:(r + 1) * v], b[r * v:(r + 1) * v]
        d = max(abs(x - y) for x, y in zip(ra, rb))
        if d > maxd or d != d:
            maxd, worst = d, r
        if max(range(v), key=ra.__getitem__) != max(range(v), key=rb.__getitem__):
            argmax_bad.append(r)
    ratio = maxd / maxb if maxb else float("inf")
    print(f"rows {rows} V {v}: max|a-b| {maxd:.3e}  max|b| {maxb:.3e}  max|a-b|/max|b| {ratio:.3e}"
          f"  (worst row {worst}; bar {bar:g}: {'PASS' if ratio <= bar else 'FAIL'})")
    print(f"argmax differs in {len(argmax_bad)} rows{': ' + str(argmax_bad[:20]) if argmax_bad else ''}")
    return 0 if ratio <= bar else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
