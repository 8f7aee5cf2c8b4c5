#!/bin/sh
# gpu_decode.sh - the decode path's checks on a machine with an NVIDIA GPU, in one go: build-cuda,
# the GPU tests of the decode ops and the forward (graphs on), the per-kernel profile of decode
# (tools/kprof.c: CUPTI, where Nsight Systems is missing), then `cairn bench --backend cuda` on a
# nano-shape slice for each weight format given, with the fused decode ops and without them
# (CAIRN_CUDA_FUSED=0: the plain op sequence and the logits downloaded, the figure before them),
# back to back in the same run.
# Usage: sh tools/gpu_decode.sh OUTDIR [bf16 nvfp4 ...]   (logs in OUTDIR; GEN=48 by default;
# the profile runs for the format PROF, nvfp4 by default, its second decode side at KPROF_CONTEXT
# tokens of context, 16 by default (8192 against 16: what a long context adds to each kernel),
# with PDL and lanes off (CAIRN_CUDA_PDL=0 CAIRN_CUDA_LANES=0: with them a kernel's span includes
# its wait for the one before and overlaps its neighbours, so the spans do not add up);
# PLAIN lists the formats also benched without the fused ops, all by default; presets are kept in
# /tmp between runs)
out=${1:?usage: gpu_decode.sh OUTDIR [weights...]}
shift
gen=${GEN:-48}
mkdir -p "$out"
nvidia-smi -L
cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCAIRN_CUDA=ON >"$out/build.log" 2>&1 &&
    cmake --build build-cuda -j "$(nproc)" --target cairn tensor_test_cuda_ops model_test_forward \
        engine_test_speculate >>"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
mkdir -p build-cuda/tmp
(cd build-cuda && CAIRN_BACKEND=cuda ctest --output-on-failure -j 1 \
    -R '^(tensor/test_cuda_ops|model/test_forward|engine/test_speculate)$') >"$out/test.log" 2>&1
echo "tests: rc=$?"; tail -6 "$out/test.log"
cupti=$(dirname "$(find /usr/local/cuda/ -name 'libcupti.so' 2>/dev/null | head -1)")
if cc -O2 -shared -fPIC -I/usr/local/cuda/include tools/kprof.c -o build-cuda/kprof.so -L"$cupti" \
    -lcupti 2>"$out/kprof_build.log"; then
    for w in ${PROF:-nvfp4}; do # decode dominates: short prompts, a long generation
        for f in 1 0; do
            CAIRN_CUDA_PDL=0 CAIRN_CUDA_LANES=0 CAIRN_CUDA_FUSED=$f KPROF_OUT="$out/kprof_${w}_fused$f.txt" \
                CUDA_INJECTION64_PATH="$PWD/build-cuda/kprof.so" LD_LIBRARY_PATH="$cupti:$LD_LIBRARY_PATH" \
                timeout 120 build-cuda/cairn bench --backend cuda --preset nano-shape --layers 6 \
                --weights "$w" --prompt 16 --prompt-short 16 --context "${KPROF_CONTEXT:-16}" \
                --gen 400 --probe-mb 64 \
                --work-dir "/tmp/gpu-decode-$w" \
                >"$out/kprof_bench_${w}_fused$f.txt" 2>&1
            echo "kprof $w fused=$f: rc=$?"; head -12 "$out/kprof_${w}_fused$f.txt"
        done
    done
fi
for w in "$@"; do
    case " ${PLAIN-$*} " in *" $w "*) plain=0 ;; *) plain= ;; esac # also without the fused ops
    for f in 1 $plain; do
        CAIRN_CUDA_FUSED=$f timeout 150 build-cuda/cairn bench --backend cuda --preset nano-shape \
            --layers 6 --weights "$w" --gen "$gen" --prompt 512 --prompt-short 128 \
            --work-dir "/tmp/gpu-decode-$w" >"$out/bench_${w}_fused$f.txt" 2>&1
        echo "bench $w fused=$f: rc=$?"; grep -E '^(decode|projected)' "$out/bench_${w}_fused$f.txt"
    done
done
