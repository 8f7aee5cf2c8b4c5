#!/bin/sh
# kprof_diff.sh - what one kernel profile (tools/kprof.c) spends beyond another, kernel by kernel:
# two runs of one bench that differ in one thing (--context 16 against --context 8192, say, with
# the same KPROF_GRID in both), rows keyed by kernel (and launch shape), the largest differences
# first: milliseconds and launches in each, and with TOKENS (the tokens the difference is spread
# over) microseconds a token.
# Usage: sh tools/kprof_diff.sh A.txt B.txt [TOKENS] [ROWS]   (ROWS: 25 by default)
a=${1:?usage: kprof_diff.sh A.txt B.txt [TOKENS] [ROWS]}
b=${2:?usage: kprof_diff.sh A.txt B.txt [TOKENS] [ROWS]}
awk -v tok="${3:-0}" '
    FNR == 1 { f++ }
    $1 ~ /^[0-9.]+$/ && $3 ~ /^[0-9]+$/ && NF >= 5 {
        k = $5; for (i = 6; i <= NF; i++) k = k " " $i
        ms[f, k] = $1; n[f, k] = $3; keys[k] = 1
    }
    END {
        for (k in keys) {
            d = ms[2, k] - ms[1, k]
            printf "%10.3f %10.3f %8d %10.3f %8d", d, ms[1, k], n[1, k], ms[2, k], n[2, k]
            if (tok > 0) printf " %9.2f", d * 1000 / tok
            printf "  %s\n", k
        }
    }' "$a" "$b" | sort -g -r -k1 | {
    echo "   diff_ms       A_ms      A_n       B_ms      B_n$( [ "${3:-0}" -gt 0 ] && echo "  us/token")  kernel"
    head -n "${4:-25}"
}
