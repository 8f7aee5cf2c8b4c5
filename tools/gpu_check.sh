#!/bin/sh
# gpu_check.sh - issue 8's checks on a machine with an NVIDIA GPU, in one go (device time is scarce):
# build-cuda, the GPU tests with graphs and without, compute-sanitizer memcheck on the per-op test
# and on the snapshot paging test (copy stream, fences),
# then `cairn bench --backend cuda` on a nano-shape slice for each weight format given.
# Usage: sh tools/gpu_check.sh OUTDIR [bf16 nvfp4 ...]   (logs and bench JSON land in OUTDIR)
out=${1:?usage: gpu_check.sh OUTDIR [weights...]}
shift
mkdir -p "$out"
nvidia-smi -L
make cuda JOBS="$(nproc)" >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
mkdir -p build-cuda/tmp
tests='^(tensor/test_cuda_ops|model/test_forward|cache/|engine/test_speculate|cli/test_cli)'
(cd build-cuda && CAIRN_BACKEND=cuda ctest --output-on-failure -j 1 -R "$tests") >"$out/test_graphs.log" 2>&1
echo "graphs: rc=$?"; tail -12 "$out/test_graphs.log"
(cd build-cuda && CAIRN_BACKEND=cuda CAIRN_CUDA_GRAPHS=0 ctest --output-on-failure -j 1 \
    -R '^(tensor/test_cuda_ops|model/test_forward|engine/test_speculate)$') >"$out/test_eager.log" 2>&1
echo "eager: rc=$?"; tail -6 "$out/test_eager.log"
for w in "$@"; do
    timeout 240 build-cuda/cairn bench --backend cuda --preset nano-shape --layers 6 --weights "$w" \
        >"$out/bench_$w.txt" 2>&1
    echo "bench $w: rc=$?"; tail -14 "$out/bench_$w.txt"
done
if command -v compute-sanitizer >/dev/null; then
    (cd build-cuda && compute-sanitizer --tool memcheck ./tensor_test_cuda_ops) >"$out/memcheck.log" 2>&1
    echo "memcheck: rc=$?"; tail -4 "$out/memcheck.log"
    CAIRN_BACKEND=cuda CAIRN_TMP=build-cuda/tmp CAIRN_DATA=tests/data compute-sanitizer --tool memcheck \
        build-cuda/cache_test_snapshot_paging >"$out/memcheck_paging.log" 2>&1
    echo "memcheck paging: rc=$?"; tail -4 "$out/memcheck_paging.log"
fi
