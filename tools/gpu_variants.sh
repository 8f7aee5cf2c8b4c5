#!/bin/sh
# gpu_variants.sh - several candidate changes measured in one go on a machine with an NVIDIA GPU
# (device time is scarce): the tree as sent and one copy of it per PATCH, each copy with its
# PATCH reversed (so each variant lacks one change: its share in the presence of the others; a
# patch of every change gives the tree before them all), built side by side, then `cairn bench
# --backend cuda` of each binary in turn, ROUNDS rounds, so every figure comes from one run on
# one machine; last the GPU op, forward and speculation tests on the tree as sent. The copies come
# from the files, never from git (the device's copy of .git can lag the tree, so a stash there
# could revert commits the tree holds). For one change: PATCH is `git diff` of it, the tree
# holding it.
# Usage: sh tools/gpu_variants.sh OUTDIR ROUNDS PATCH...   (WEIGHTS=nvfp4; LAYERS=0, the whole
# model; BENCH_ARGS for more; the preset is kept in /tmp/gv-WEIGHTS-LAYERS between runs)
# KNOBS="NAME:VAR=VAL,VAR=VAL ..." (NAME not a number) also benches the sent binary under each
# NAME's environment in every round (knobs an experiment reads with getenv: no build per
# candidate, so several fit in one run), and runs the op test under each
# (KNOB_TESTS=0: not; each takes about a minute on the H200). Lines report decode at context 0
# and, when BENCH_ARGS gives a --context, decode_8k's context and tok/s, each with its median token's.
out=${1:?usage: gpu_variants.sh OUTDIR ROUNDS PATCH...}
rounds=${2:?usage: gpu_variants.sh OUTDIR ROUNDS PATCH...}
shift 2
w=${WEIGHTS:-nvfp4}
layers=${LAYERS:-0}
mkdir -p "$out"
nvidia-smi -L
t0=$(date +%s)
jobs=$(($(nproc) / ($# + 1)))
[ "$jobs" -ge 1 ] || jobs=1
build() { # DIR TARGETS...
    d=$1
    shift
    log="$out/build_$(basename "$d").log"
    cmake -S "$d" -B "$d/build-cuda" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCAIRN_CUDA=ON \
        >"$log" 2>&1 && cmake --build "$d/build-cuda" -j "$jobs" --target "$@" >>"$log" 2>&1 ||
        echo "build $d failed: $log"
}
names="sent"
i=0
for p in "$@"; do
    i=$((i + 1))
    d=/tmp/gv$i
    rm -rf "$d" && mkdir -p "$d"
    tar --exclude='./build*' --exclude='./.git' -cf - . | (cd "$d" && tar xf -)
    (cd "$d" && patch -s -R -p1 <"$OLDPWD/$p") ||
        { echo "gpu_variants: $p does not reverse"; exit 1; }
    names="$names $i"
    build "$d" cairn &
done
build "$PWD" cairn tensor_test_cuda_ops model_test_forward engine_test_speculate &
wait
echo "builds: $(($(date +%s) - t0)) s"
for k in $KNOBS; do names="$names ${k%%:*}"; done
bin() { # numbers are the patch variants; sent and the knobs run the sent binary
    case $1 in
    sent | *[!0-9]*) echo build-cuda/cairn ;;
    *) echo "/tmp/gv$1/build-cuda/cairn" ;;
    esac
}
knob() { for k in $KNOBS; do [ "${k%%:*}" = "$1" ] && echo "${k#*:}" | tr ',' ' '; done; }
lflag=
[ "$layers" -gt 0 ] && lflag="--layers $layers"
r=1
while [ "$r" -le "$rounds" ]; do
    for v in $names; do
        f="$out/bench_${v}_$r.txt"
        env $(knob "$v") timeout 300 "$(bin "$v")" bench --backend cuda --preset nano-shape $lflag \
            --weights "$w" --work-dir "/tmp/gv-$w-$layers" $BENCH_ARGS >"$f" 2>&1
        echo "$v $r: rc=$? prefill $(awk '/^prefill +[0-9]+ tokens/ {print $2 ": " $7}' "$f")" \
            "decode $(awk '/^decode +[0-9]+ tokens at context +0:/ {print $7 " (median " $(NF - 1) ")"}' "$f") tok/s" \
            "8k $(awk '/^decode_8k +[0-9]+ tokens at context/ {print $6 " " $7 " (median " $(NF - 1) ")"}' "$f")"
    done
    r=$((r + 1))
done
mkdir -p build-cuda/tmp
(cd build-cuda && CAIRN_BACKEND=cuda ctest --output-on-failure -j 1 \
    -R '^(tensor/test_cuda_ops|model/test_forward|engine/test_speculate)$') >"$out/test.log" 2>&1
echo "tests (sent): rc=$?"
grep -E "FAILED|PASSED|rel err|tests passed|Failed" "$out/test.log" | tail -12
[ "${KNOB_TESTS:-1}" = 1 ] || KNOBS= # the op test takes about a minute a knob on the H200
for k in $KNOBS; do # each knob's code path through the op test too
    (cd build-cuda && env $(knob "${k%%:*}") CAIRN_BACKEND=cuda ctest --output-on-failure -j 1 \
        -R '^tensor/test_cuda_ops$') >"$out/test_${k%%:*}.log" 2>&1
    echo "test_cuda_ops (${k%%:*}): rc=$?"
done
