#!/bin/sh
# gpu_run.sh MINUTES N_TRAIN N_CHECK - the whole training run on the GPU machine, results under $OUT:
# the weight shards, small.tgz (the model's json files and the tokenizer sample) and train.log.
set -e
cd "$(dirname "$0")"
W=/tmp/pebble-run
rm -rf $W
PYTHONUNBUFFERED=1 python3 train.py --out $W --minutes "$1" --n-train "$2" --n-check "$3" 2>&1 | tee $OUT/train.log
cd $W && mv pebble/*.safetensors $OUT/ && tar czf $OUT/small.tgz pebble tok_sample.json
ls -la $OUT
