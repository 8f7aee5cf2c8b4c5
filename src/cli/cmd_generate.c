/* cmd_generate.c - `cairn generate`: prefill a prompt, then sample up to N tokens.
 *
 * Generation stops at max-tokens or at an end-of-sequence id from the model's generation config
 * (the stop token is not part of the output). --json prints one object on stdout.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "cli/cli_util.h"
#include "cli/flags.h"
#include "engine/sampler.h"
#include "model/state.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int is_eos(const cn_config *c, int32_t t) {
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_token_ids[i] == t) return 1;
    return 0;
}

int cn_cmd_generate(int argc, char **argv) {
    const char *model = NULL, *tokens_arg = NULL, *prompt = NULL;
    int max_tokens = 32, threads = 0, json = 0, ubatch = 0;
    cn_sampler_params sp;
    cn_sampler_params_default(&sp);
    sp.temperature = 0.0f; /* a command-line run is reproducible unless asked otherwise */
    cn_flag flags[] = {
        {"model", CN_FLAG_STR, &model, "DIR", "model directory", 1, 0},
        {"tokens", CN_FLAG_STR, &tokens_arg, "IDS", "prompt ids: comma-separated or @FILE", 0, 0},
        {"prompt", CN_FLAG_STR, &prompt, "TEXT", "prompt text (needs the model's tokenizer)", 0, 0},
        {"max-tokens", CN_FLAG_INT, &max_tokens, "N", "tokens to generate (default 32)", 0, 0},
        {"temperature", CN_FLAG_FLOAT, &sp.temperature, "T", "0 = greedy (default)", 0, 0},
        {"top-k", CN_FLAG_INT, &sp.top_k, "K", "keep the K most likely tokens", 0, 0},
        {"top-p", CN_FLAG_FLOAT, &sp.top_p, "P", "nucleus sampling", 0, 0},
        {"min-p", CN_FLAG_FLOAT, &sp.min_p, "M", "drop tokens below M x the most likely", 0, 0},
        {"repeat-penalty", CN_FLAG_FLOAT, &sp.repeat_penalty, "R", "penalise recent tokens", 0, 0},
        {"presence-penalty", CN_FLAG_FLOAT, &sp.presence_penalty, "P", "", 0, 0},
        {"frequency-penalty", CN_FLAG_FLOAT, &sp.frequency_penalty, "F", "", 0, 0},
        {"seed", CN_FLAG_U64, &sp.seed, "S", "sampling seed", 0, 0},
        {"threads", CN_FLAG_INT, &threads, "N", "CPU threads (default: all cores)", 0, 0},
        {"ubatch", CN_FLAG_INT, &ubatch, "N", "tokens per forward chunk (default 256)", 0, 0},
        {"json", CN_FLAG_BOOL, &json, NULL, "print one JSON object", 0, 0},
        {NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    const char *syn = "generate --model DIR (--tokens IDS | --prompt TEXT) --max-tokens N "
                      "[--temperature T --top-k K --top-p P --min-p M --seed S] [--json]";
    int rc = cn_flags_parse(flags, argc, argv, syn);
    if (rc) return rc > 0 ? 0 : 2;
    if (!!tokens_arg == !!prompt) {
        fprintf(stderr, "cairn: give exactly one of --tokens and --prompt\n");
        cn_flags_usage(flags, syn, stderr);
        return 2;
    }
    if (max_tokens < 0) {
        fprintf(stderr, "cairn: --max-tokens must be >= 0\n");
        return 2;
    }
    if (prompt) {
        fprintf(stderr, "cairn: --prompt needs the tokenizer, which this build does not have yet; "
                        "use --tokens\n");
        return 2;
    }
    int32_t *ids = NULL;
    int n = 0;
    if ((rc = cn_cli_parse_tokens(tokens_arg, &ids, &n))) return rc == CN_EUSAGE ? 2 : 1;
    cn_backend *b;
    cn_model *m;
    if (cn_cli_open_model(model, threads, ubatch, &b, &m)) {
        free(ids);
        return 1;
    }
    const cn_config *c = cn_model_config(m);
    int V = c->vocab_size, status = 1, n_out = 0;
    cn_state *s = NULL;
    cn_sampler smp;
    int smp_ok = 0;
    float *logits = malloc((size_t)V * sizeof *logits);
    int32_t *out = malloc(((size_t)max_tokens + 1) * sizeof *out);
    double t0 = 0, t1 = 0, t2 = 0;
    if (!logits || !out) {
        fprintf(stderr, "cairn: out of memory\n");
        goto done;
    }
    if ((rc = cn_sampler_init(&smp, &sp, V))) {
        fprintf(stderr, "cairn: invalid sampling parameters\n");
        status = 2;
        goto done;
    }
    smp_ok = 1;
    if ((rc = cn_state_create(&s, m, n + max_tokens + 1, 0))) {
        fprintf(stderr, "cairn: cannot allocate the state: %s\n", cn_strerror(rc));
        goto done;
    }
    for (int i = 0; i < n; i++) cn_sampler_accept(&smp, ids[i]);
    t0 = now_ms();
    cn_batch bt = {.tokens = ids, .n = n, .logits = logits};
    if ((rc = cn_model_forward(m, s, &bt))) {
        fprintf(stderr, "cairn: prefill failed: %s%s\n", cn_strerror(rc),
                rc == CN_EINVAL ? " (is every token id below the vocabulary size?)" : "");
        goto done;
    }
    t1 = now_ms();
    while (n_out < max_tokens) {
        int32_t t = cn_sampler_sample(&smp, logits);
        if (is_eos(c, t)) break;
        out[n_out++] = t;
        cn_sampler_accept(&smp, t);
        if (!json) {
            printf("%s%d", n_out > 1 ? "," : "", t);
            fflush(stdout);
        }
        if (n_out == max_tokens) break;
        if ((rc = cn_model_decode(m, s, t, logits))) {
            fprintf(stderr, "cairn: decode failed: %s\n", cn_strerror(rc));
            goto done;
        }
    }
    t2 = now_ms();
    if (json) {
        printf("{\"prompt_tokens\":%d,\"prompt_eval_count\":%d,\"eval_count\":%d,\"tokens\":[", n, n, n_out);
        for (int i = 0; i < n_out; i++) printf("%s%d", i ? "," : "", out[i]);
        printf("],\"prompt_eval_ms\":%.3f,\"eval_ms\":%.3f}\n", t1 - t0, t2 - t1);
    } else {
        printf("\n");
        fprintf(stderr, "cairn: prompt %d tokens in %.1f ms (%.1f tok/s), generated %d in %.1f ms (%.1f tok/s)\n",
                n, t1 - t0, n * 1e3 / (t1 - t0 + 1e-9), n_out, t2 - t1, n_out * 1e3 / (t2 - t1 + 1e-9));
    }
    status = 0;
done:
    if (smp_ok) cn_sampler_free(&smp);
    cn_state_free(s);
    free(logits);
    free(out);
    free(ids);
    cn_cli_close_model(b, m);
    return status;
}
