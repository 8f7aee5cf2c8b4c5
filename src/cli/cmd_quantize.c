/* cmd_quantize.c - `cairn quantize`: a BF16/F32 checkpoint into an NVFP4, MXFP8 or FP8 one.
 *
 * Parses flags (a bad --type or a missing directory flag is a usage error, exit 2), runs
 * cn_quantize_dir (a failure is exit 1 with cn_err's message) and prints one summary. --keep takes
 * module globs: several after one --keep, or comma-separated. Never exits.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/flags.h"
#include "model/quantize.h"

static const char kSynopsis[] =
    "quantize --in DIR --out DIR --type nvfp4|mxfp8|fp8 [--keep PATTERN...] [--shard-size MB] [--threads N]";

#define MAX_KEEP 64

int cn_cmd_quantize(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *type = NULL, *keep1 = NULL;
    uint64_t shard_mb = 0;
    int threads = 0;
    cn_flag flags[] = {
        {"in", CN_FLAG_STR, &in, "DIR", "BF16/F32 checkpoint directory to read", 1, 0},
        {"out", CN_FLAG_STR, &out, "DIR", "directory to write (created if missing)", 1, 0},
        {"type", CN_FLAG_STR, &type, "T", "nvfp4, mxfp8 or fp8", 1, 0},
        {"keep", CN_FLAG_STR, &keep1, "PATTERN...",
         "module globs to keep as stored, besides the defaults (several, or comma-separated)", 0, 0},
        {"shard-size", CN_FLAG_U64, &shard_mb, "MB", "split weights into shards of at most MB MiB", 0, 0},
        {"threads", CN_FLAG_INT, &threads, "N", "rows quantized in parallel (default: all cores)", 0, 0},
        {NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    char *pos[MAX_KEEP];
    int n_pos = 0;
    int rc = cn_flags_parse_pos(flags, argc, argv, kSynopsis, pos, MAX_KEEP, &n_pos);
    if (rc == 1) return 0; /* --help */
    if (rc != 0) return 2;
    if (n_pos && !keep1) {
        fprintf(stderr, "cairn: unexpected argument '%s'\n", pos[0]);
        cn_flags_usage(flags, kSynopsis, stderr);
        return 2;
    }
    if (threads < 0) {
        fprintf(stderr, "cairn: --threads must be >= 0\n");
        return 2;
    }
    cn_quantize_opts o = {.in_dir = in, .out_dir = out, .shard_bytes = shard_mb << 20, .threads = threads};
    if (!strcmp(type, "nvfp4")) o.algo = CN_QALGO_NVFP4;
    else if (!strcmp(type, "mxfp8")) o.algo = CN_QALGO_MXFP8;
    else if (!strcmp(type, "fp8")) o.algo = CN_QALGO_FP8;
    else {
        fprintf(stderr, "cairn: invalid value '%s' for --type (nvfp4, mxfp8, fp8)\n", type);
        cn_flags_usage(flags, kSynopsis, stderr);
        return 2;
    }
    if (shard_mb > (UINT64_MAX >> 20)) {
        fprintf(stderr, "cairn: --shard-size %llu is too large\n", (unsigned long long)shard_mb);
        return 2;
    }
    /* --keep a,b c d: split the flag's value on commas, then the positionals after it */
    char buf[4096];
    const char *keep[MAX_KEEP * 2];
    int n_keep = 0;
    if (keep1) {
        snprintf(buf, sizeof buf, "%s", keep1);
        for (char *s = strtok(buf, ","); s && n_keep < MAX_KEEP; s = strtok(NULL, ","))
            if (*s) keep[n_keep++] = s;
    }
    for (int i = 0; i < n_pos; i++) keep[n_keep++] = pos[i];
    o.keep = keep;
    o.n_keep = n_keep;

    cn_err err;
    cn_err_clear(&err);
    cn_quantize_stats st;
    if (cn_quantize_dir(&o, &st, &err) != 0) {
        fprintf(stderr, "cairn: quantize: %s\n", err.msg);
        return 1;
    }
    printf("wrote %s: %s, %d matrices quantized, %d kept as stored\n", out, type, st.n_quantized,
           st.n_kept);
    printf("  %llu bytes of tensor data (from %llu)\n", (unsigned long long)st.bytes_out,
           (unsigned long long)st.bytes_in);
    return 0;
}
