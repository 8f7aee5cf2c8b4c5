#!/bin/sh
# gpu_profile.sh - where a decode token's time goes on the GPU: builds build-cuda, then runs a short
# `cairn bench --backend cuda` on a nano-shape slice under nsys for each weight format given and
# writes the kernel summary (by total time), the API summary and the per-kernel trace to OUTDIR.
# Usage: sh tools/gpu_profile.sh OUTDIR [bf16 nvfp4 ...]
out=${1:?usage: gpu_profile.sh OUTDIR [weights...]}
shift
mkdir -p "$out"
nvidia-smi -L
make cuda JOBS="$(nproc)" >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
command -v nsys >/dev/null || { echo "no nsys here"; exit 1; }
for w in "$@"; do
    nsys profile --cuda-graph-trace=node --trace=cuda -o "$out/p_$w" --force-overwrite true \
        build-cuda/cairn bench --backend cuda --preset nano-shape --layers 6 --weights "$w" \
        --prompt 16 --prompt-short 16 --context 16 --gen 32 --probe-mb 256 >"$out/bench_$w.txt" 2>&1
    echo "profile $w: rc=$?"; tail -14 "$out/bench_$w.txt"
    for r in cuda_gpu_kern_sum cuda_api_sum cuda_gpu_trace; do
        nsys stats --report "$r" --format csv -o "$out/$w" "$out/p_$w.nsys-rep" >/dev/null 2>&1
    done
    head -25 "$out/${w}_cuda_gpu_kern_sum.csv" | cut -c1-220
    rm -f "$out/p_$w.sqlite"
done
ls -la "$out"
