#!/bin/sh
# gpu_ab.sh - one candidate change against the tree as it is, on a machine with an NVIDIA GPU, in
# one go (device time is scarce): builds `cairn` from the tree (the base), applies PATCH and builds
# again (the candidate, with the GPU op and forward tests), then runs `cairn bench --backend cuda`
# on a nano-shape slice alternately with the two binaries ROUNDS times, so the comparison comes
# from one run on one machine, and last the GPU tests on the candidate.
# The base is built before the patch is applied, never by `git stash` on the device: the copy the
# device gets can diff against an older commit than the checkout's, and stashing there reverted a
# whole session's commits (session 11).
# Usage: sh tools/gpu_ab.sh OUTDIR PATCH [ROUNDS]   (WEIGHTS=nvfp4, LAYERS=6, BENCH_ARGS for more)
# PATCH: `git diff > out/x.patch` of the candidate against the tree being sent, reverted there.
out=${1:?usage: gpu_ab.sh OUTDIR PATCH [ROUNDS]}
patch=${2:?usage: gpu_ab.sh OUTDIR PATCH [ROUNDS]}
rounds=${3:-2}
w=${WEIGHTS:-nvfp4}
mkdir -p "$out"
nvidia-smi -L
t0=$(date +%s)
cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCAIRN_CUDA=ON >"$out/build.log" 2>&1 &&
    cmake --build build-cuda -j "$(nproc)" --target cairn >>"$out/build.log" 2>&1 ||
    { tail -30 "$out/build.log"; exit 1; }
cp build-cuda/cairn build-cuda/cairn.base
git apply "$patch" || { echo "gpu_ab: $patch does not apply"; exit 1; }
cmake --build build-cuda -j "$(nproc)" --target cairn tensor_test_cuda_ops model_test_forward \
    >>"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
echo "builds: $(($(date +%s) - t0)) s"
i=1
while [ "$i" -le "$rounds" ]; do
    for v in base new; do
        b=build-cuda/cairn.base
        [ "$v" = new ] && b=build-cuda/cairn
        timeout 120 "$b" bench --backend cuda --preset nano-shape --layers "${LAYERS:-6}" \
            --weights "$w" --work-dir "/tmp/gpu-ab-$w" --gen 64 --prompt 2048 --prompt-short 512 \
            $BENCH_ARGS >"$out/bench_${v}_$i.txt" 2>&1
        echo "$v $i: prefill $(awk '/^prefill +2048 tokens/ {print $7}' "$out/bench_${v}_$i.txt")" \
            "decode $(awk '/^decode +[0-9]+ tokens at context +0:/ {print $7}' "$out/bench_${v}_$i.txt")" \
            "tok/s"
    done
    i=$((i + 1))
done
mkdir -p build-cuda/tmp
(cd build-cuda && CAIRN_BACKEND=cuda ctest --output-on-failure -j 1 \
    -R '^(tensor/test_cuda_ops|model/test_forward)$') >"$out/test.log" 2>&1
echo "tests (candidate): rc=$?"
tail -4 "$out/test.log"
