#!/usr/bin/env python3
"""ncu_tokens.py - one forward's kernels from a tools/gpu_profile.sh CSV, summed by kernel.

Usage: tools/ncu_tokens.py NCU_CSV [FORWARD]   (FORWARD: index of the forward, default 2)

A forward starts at its embedding's id check (k_ids_check). With the profile's bench flags the
forwards are: 0 the warm-up prefill of 16 tokens, 1 and 2 the warm-up decodes, then prefills of
16. Prints per kernel and grid: launches, microseconds and MB read from DRAM (as ncu measured
them: clocks locked, caches flushed per kernel), then the forward's total.
"""
import csv, sys

path = sys.argv[1]
want = int(sys.argv[2]) if len(sys.argv) > 2 else 2
rows = csv.DictReader(line for line in open(path) if line.startswith('"'))
kern = {}
for r in rows:
    k = kern.setdefault(int(r['ID']), {'name': r['Kernel Name'].split('(')[0].replace('void ', ''),
                                       'grid': r['Grid Size'].replace(' ', '')})
    k[r['Metric Name']] = float(r['Metric Value'].replace(',', ''))
forward, table = -1, {}
for i in sorted(kern):
    k = kern[i]
    if k['name'] == 'k_ids_check':
        forward += 1
    if forward != want:
        continue
    t = table.setdefault((k['name'], k['grid']), [0, 0.0, 0.0])
    t[0] += 1
    t[1] += k.get('gpu__time_duration.sum', 0) / 1e3
    t[2] += k.get('dram__bytes_read.sum', 0) / 1e6
if not table:
    sys.exit('ncu_tokens: no forward %d in %s' % (want, path))
print('%-28s %-12s %3s %9s %9s' % ('kernel', 'grid', 'n', 'us', 'MB'))
for (name, grid), (n, us, mb) in sorted(table.items(), key=lambda kv: -kv[1][1]):
    print('%-28s %-12s %3d %9.1f %9.1f' % (name[:28], grid, n, us, mb))
print('%-28s %-12s %3d %9.1f %9.1f' % ('total', '', sum(v[0] for v in table.values()),
                                       sum(v[1] for v in table.values()),
                                       sum(v[2] for v in table.values())))
