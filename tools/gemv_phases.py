#!/usr/bin/env python3
"""gemv_phases.py - reads the records tools/gemv_phases.patch makes k_gemv_fp4 write and prints,
per launch of the run's second half (warmed up), how long its blocks spent in each phase.

Usage: python3 tools/gemv_phases.py PHASES.bin [GHZ]   (GHZ: the SM clock, 1.98 on the H200)

A launch is a run of records of one shape (K, N, rows) in start order; its span runs from its
first block's start to its last block's end (globaltimer plus the block's own clock). Phases are
block means in microseconds; `max` is the slowest block's, which ends the launch."""
import collections
import struct
import sys

FMT = '<Q5Q4Q6i'  # g0, c[5], s[4], sm, bx, by, K, N, rows


def main():
    data = open(sys.argv[1], 'rb').read()
    ghz = float(sys.argv[2]) if len(sys.argv) > 2 else 1.98
    size = struct.calcsize(FMT)
    recs = sorted((struct.unpack_from(FMT, data, i * size) for i in range(len(data) // size)),
                  key=lambda r: r[0])
    launches = []
    for r in recs:
        key = (r[13], r[14], r[15])
        if not launches or launches[-1][0] != key or r[0] - launches[-1][1] > 200000:
            launches.append([key, r[0], []])
        launches[-1][2].append(r)
    us = lambda cycles: cycles / ghz / 1e3
    names = ['pre', 'stage', 'loop', 'epilogue', 'x load', 'gate sync', 'norm', 'sync', 'convert']
    per_shape = collections.defaultdict(list)
    for key, g0, rs in launches[len(launches) // 2:]:
        n = len(rs)
        end = max(r[0] + us(r[5] - r[1]) * 1e3 for r in rs)
        phases = [[us(r[i + 2] - r[i + 1]) for r in rs] for i in range(4)]
        sub = [[us(b - a) for a, b in ((r[2], r[6]), (r[6], r[7]), (r[7], r[8]), (r[8], r[9]),
                                       (r[9], r[3]))] for r in rs]
        per_shape[key].append(((end - g0) / 1e3, [sum(p) / n for p in phases],
                               [max(p) for p in phases], [sum(col) / n for col in zip(*sub)]))
    print(f'{len(recs)} records, {len(launches)} launches')
    for (K, N, rows), v in per_shape.items():
        m = len(v)
        span = sum(x[0] for x in v) / m
        mean = [sum(x[1][i] for x in v) / m for i in range(4)]
        mx = [sum(x[2][i] for x in v) / m for i in range(4)]
        sub = [sum(x[3][i] for x in v) / m for i in range(5)]
        print(f'K={K} N={N} rows={rows}: {m} launches, span {span:.2f} us')
        print('  mean ' + ', '.join(f'{names[i]} {mean[i]:.2f}' for i in range(4)))
        print('  max  ' + ', '.join(f'{names[i]} {mx[i]:.2f}' for i in range(4)))
        print('  stage: ' + ', '.join(f'{names[4 + i]} {sub[i]:.2f}' for i in range(5)))


if __name__ == '__main__':
    main()
