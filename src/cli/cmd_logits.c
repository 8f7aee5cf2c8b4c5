/* cmd_logits.c - `cairn logits`: all-position logits of a token sequence, float32 LE, [T x V]. */
#include <stdio.h>
#include <stdlib.h>

#include "cli/cli.h"
#include "cli/cli_util.h"
#include "cli/flags.h"
#include "model/state.h"

int cn_cmd_logits(int argc, char **argv) {
    const char *model = NULL, *tokens_arg = NULL, *out_path = NULL, *backend = NULL;
    int threads = 0, ubatch = 0;
    cn_flag flags[] = {
        {"model", CN_FLAG_STR, &model, "DIR", "model directory", 1, 0},
        {"tokens", CN_FLAG_STR, &tokens_arg, "IDS", "comma-separated ids or @FILE", 1, 0},
        {"out", CN_FLAG_STR, &out_path, "FILE", "where to write the logits", 1, 0},
        {"backend", CN_FLAG_STR, &backend, "NAME", "cpu, cuda or cuda:N (default: $CAIRN_BACKEND or cpu)", 0, 0},
        {"threads", CN_FLAG_INT, &threads, "N", "CPU threads (default: all cores)", 0, 0},
        {"ubatch", CN_FLAG_INT, &ubatch, "N", "tokens per forward chunk (default 1024 on the CPU, 2048 on a GPU)", 0, 0},
        {NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    int rc = cn_flags_parse(flags, argc, argv, "logits --model DIR --tokens IDS --out FILE [--backend NAME]");
    if (rc) return rc > 0 ? 0 : 2;
    int32_t *ids = NULL;
    int n = 0;
    if ((rc = cn_cli_parse_tokens(tokens_arg, &ids, &n))) return rc == CN_EUSAGE ? 2 : 1;
    cn_backend *b;
    cn_model *m;
    if (cn_cli_open_model(model, backend, threads, ubatch, &b, &m)) {
        free(ids);
        return 1;
    }
    int V = cn_model_config(m)->vocab_size, status = 1;
    cn_state *s = NULL;
    float *logits = malloc((size_t)n * V * sizeof *logits);
    FILE *f = NULL;
    if (!logits) {
        fprintf(stderr, "cairn: out of memory for %d x %d logits\n", n, V);
        goto done;
    }
    if ((rc = cn_state_create(&s, m, n, 0))) {
        fprintf(stderr, "cairn: cannot allocate the state: %s\n", cn_strerror(rc));
        goto done;
    }
    cn_batch bt = {.tokens = ids, .n = n, .all_logits = 1, .logits = logits};
    if ((rc = cn_model_forward(m, s, &bt))) {
        fprintf(stderr, "cairn: forward failed: %s%s\n", cn_strerror(rc),
                rc == CN_EINVAL ? " (is every token id below the vocabulary size?)" : "");
        goto done;
    }
    if (!(f = fopen(out_path, "wb"))) {
        perror(out_path);
        goto done;
    }
    /* Little-endian hosts only (x86-64, arm64): the floats go out as they are. */
    if (fwrite(logits, sizeof *logits, (size_t)n * V, f) != (size_t)n * V || fclose(f) != 0) {
        f = NULL;
        fprintf(stderr, "cairn: %s: write failed\n", out_path);
        goto done;
    }
    f = NULL;
    status = 0;
done:
    if (f) fclose(f);
    cn_state_free(s);
    free(logits);
    free(ids);
    cn_cli_close_model(b, m);
    return status;
}
