#!/bin/sh
# gpu_profile.sh - where a decode token's time goes on the GPU: runs a short `cairn bench --backend
# cuda` on a nano-shape slice under Nsight Compute for each weight format given, profiling only the
# decode-path kernels (not the probes or the prefill GEMMs), and writes one CSV per format with each
# kernel's time and DRAM bytes read (ncu locks clocks and flushes caches per kernel, so times are
# an upper bound: compare them with each other, not with the bench). Needs build-cuda built.
# Usage: sh tools/gpu_profile.sh OUTDIR [bf16 nvfp4 ...]   (CSVs in OUTDIR)
out=${1:?usage: gpu_profile.sh OUTDIR [weights...]}
shift
mkdir -p "$out"
command -v ncu >/dev/null || { echo "gpu_profile: no ncu on PATH"; exit 1; }
kernels='regex:k_gemv|k_gather|k_rmsnorm|k_gated|k_ssm|k_conv|k_route|k_ew|k_combine|k_attention|k_get_rows|k_ids'
for w in "$@"; do
    timeout "${PROFILE_TIMEOUT:-120}" ncu --kernel-name "$kernels" --launch-count "${PROFILE_LAUNCHES:-400}" \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --log-file "$out/ncu_$w.csv" \
        build-cuda/cairn bench --backend cuda --preset nano-shape --layers 6 --weights "$w" \
        --prompt 16 --prompt-short 16 --context 16 --gen 2 --probe-mb 64 >"$out/profile_$w.txt" 2>&1
    echo "profile $w: rc=$? ($(grep -c gpu__time_duration "$out/ncu_$w.csv") kernels)"
done
