/* cmd_make_model.c - `cairn make-model`: write a synthetic NemotronH checkpoint directory.
 *
 * Parses flags, validates them through cn_synth_describe (a bad preset, dtype or layer count is a
 * usage error, exit 2), writes with cn_synth_write (a failure is exit 1 with cn_err's message)
 * and prints one summary of what was written. Never exits; all output goes to stdout/stderr.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/flags.h"
#include "model/synth.h"

static const char kSynopsis[] =
    "make-model --preset " CN_SYNTH_PRESETS " --out DIR [--seed N] [--no-mtp] [--layers N] [--pattern PAT] [--window W]"
    " [--dtype bf16|f32|fp8|nvfp4] [--shard-size MB]";

int cn_cmd_make_model(int argc, char **argv) {
    const char *preset = NULL, *out = NULL, *dtype = "bf16";
    uint64_t seed = 0, shard_mb = 0;
    const char *pattern = NULL;
    int window = 0;
    int no_mtp = 0, layers = -1; /* -1: not given, so an explicit 0 can be refused */
    cn_flag flags[] = {
        {"preset", CN_FLAG_STR, &preset, "NAME", CN_SYNTH_PRESETS, 1, 0},
        {"out", CN_FLAG_STR, &out, "DIR", "model directory to write (created if missing)", 1, 0},
        {"seed", CN_FLAG_U64, &seed, "N", "random seed (default 0)", 0, 0},
        {"no-mtp", CN_FLAG_BOOL, &no_mtp, NULL, "leave out the multi-token-prediction block", 0, 0},
        {"layers", CN_FLAG_INT, &layers, "N", "keep the first N layers of the preset's pattern", 0, 0},
        {"pattern", CN_FLAG_STR, &pattern, "PAT", "layer pattern of M, *, S, E, - instead of the preset's (S: sliding-window attention)", 0, 0},
        {"window", CN_FLAG_INT, &window, "W", "sliding window of the S layers (default 16)", 0, 0},
        {"dtype", CN_FLAG_STR, &dtype, "T", "weight dtype: bf16 (default), f32, fp8, nvfp4", 0, 0},
        {"shard-size", CN_FLAG_U64, &shard_mb, "MB", "split weights into shards of at most MB MiB", 0, 0},
        {NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    int rc = cn_flags_parse(flags, argc, argv, kSynopsis);
    if (rc == 1) return 0; /* --help */
    if (rc != 0) return 2;

    cn_synth_opts o;
    cn_synth_opts_init(&o);
    o.preset = preset;
    o.seed = seed;
    o.mtp = !no_mtp;
    o.layers = layers < 0 ? 0 : layers;
    o.pattern = pattern;
    o.sliding_window = window;
    o.shard_bytes = shard_mb << 20;
    if (!strcmp(dtype, "bf16")) o.dtype = CN_BF16;
    else if (!strcmp(dtype, "f32")) o.dtype = CN_F32;
    else if (!strcmp(dtype, "fp8")) o.dtype = CN_F8_E4M3;
    else if (!strcmp(dtype, "nvfp4")) o.dtype = CN_NVFP4;
    else {
        fprintf(stderr, "cairn: invalid value '%s' for --dtype (bf16, f32, fp8, nvfp4)\n", dtype);
        cn_flags_usage(flags, kSynopsis, stderr);
        return 2;
    }
    if (shard_mb > (UINT64_MAX >> 20)) {
        fprintf(stderr, "cairn: --shard-size %llu is too large\n", (unsigned long long)shard_mb);
        return 2;
    }

    cn_err err;
    cn_err_clear(&err);
    cn_synth_info info;
    if (layers == 0 || cn_synth_describe(&o, &info, &err) != 0) {
        if (layers == 0) snprintf(err.msg, sizeof err.msg, "--layers must be at least 1");
        fprintf(stderr, "cairn: %s\n", err.msg);
        cn_flags_usage(flags, kSynopsis, stderr);
        return 2;
    }
    if (cn_synth_write(out, &o, &err) != 0) {
        fprintf(stderr, "cairn: make-model: %s\n", err.msg);
        return 1;
    }
    printf("wrote %s: preset %s, %d layers \"%s\"%s, %s weights, seed %llu\n", out, preset,
           info.n_layers, info.pattern, o.mtp ? " + MTP \"*E\"" : "", dtype,
           (unsigned long long)seed);
    printf("  %llu parameters (%llu in MTP), hidden %d, vocab %d\n",
           (unsigned long long)info.params, (unsigned long long)info.mtp_params, info.hidden_size,
           info.vocab_size);
    printf("  %d tensors, %llu bytes of tensor data in %d safetensors file%s\n", info.n_tensors,
           (unsigned long long)info.tensor_bytes, info.n_files, info.n_files == 1 ? "" : "s");
    return 0;
}
