#!/bin/sh
# gpu_run.sh NAME MINUTES N_TRAIN N_CHECK [LR] - the whole training run on the GPU machine, results
# under $OUT: the weight shards, small.tgz (the model's json files and the tokenizer sample) and
# train.log. The run that made models/cobble: `sh gpu_run.sh cobble 10.5 500000 16 2e-3`.
set -e
cd "$(dirname "$0")"
W=/tmp/train-run
rm -rf $W
PYTHONUNBUFFERED=1 python3 train.py --model "$1" --out $W --minutes "$2" --n-train "$3" --n-check "$4" \
    --lr "${5:-3e-3}" 2>&1 | tee $OUT/train.log
cd $W && mv "$1"/*.safetensors $OUT/ && tar czf $OUT/small.tgz "$1" tok_sample.json
ls -la $OUT
