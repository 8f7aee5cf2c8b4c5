/* cmd_generate.c - `cairn generate`: one request through the engine (prefix cache included).
 *
 * Generation stops at max-tokens or at an end-of-sequence id from the model's generation config
 * (the stop token is not part of the output). Ctrl-C is a cancellation like a client disconnect:
 * the restore points the prefill crossed and the point it reached are kept in the cache (and
 * written to the disk tier when --cache-dir is given), so the same command run again resumes.
 * --json prints one object on stdout.
 *
 * On a model with an MTP head, decoding speculates by default (--no-speculate decodes plainly;
 * the draft cache is kept level either way); the output is the same tokens under greedy
 * sampling. --json then adds draft_proposed and draft_accepted. --speculate-depth fixes the
 * drafts per round instead of letting the controller choose.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/cli_util.h"
#include "cli/flags.h"
#include "engine/engine.h"
#include "text/tokenizer.h"

/* Set by the SIGINT handler, read by the engine's cancel poll: the one place a signal can reach. */
static volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
}

static int cancel_poll(void *ctx) {
    (void)ctx;
    return g_interrupted != 0;
}

typedef struct stream_ctx {
    int json;
    int n;
    cn_tok_stream *text; /* NULL: print ids */
    char *all;           /* the decoded text so far (for --json) */
    size_t len, cap;
} stream_ctx;

static int append(stream_ctx *s, const char *p, size_t n) {
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 256;
        while (cap < s->len + n + 1) cap *= 2;
        char *q = realloc(s->all, cap);
        if (!q) return CN_ENOMEM;
        s->all = q;
        s->cap = cap;
    }
    memcpy(s->all + s->len, p, n);
    s->len += n;
    s->all[s->len] = '\0';
    return CN_OK;
}

static int print_token(void *ctx, int32_t t) {
    stream_ctx *s = ctx;
    if (s->text) {
        const char *out;
        size_t n;
        if (cn_tok_stream_feed(s->text, t, &out, &n, NULL) == CN_OK && n) {
            if (append(s, out, n)) return 1;
            if (!s->json) {
                fwrite(out, 1, n, stdout);
                fflush(stdout);
            }
        }
    } else if (!s->json) {
        printf("%s%d", s->n ? "," : "", t);
        fflush(stdout);
    }
    s->n++;
    return 0;
}

/* A JSON string literal of UTF-8 text (the decoder's output is valid UTF-8). */
static void print_json_string(const char *s, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c == '\n') fputs("\\n", stdout);
        else if (c == '\r') fputs("\\r", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

int cn_cmd_generate(int argc, char **argv) {
    const char *model = NULL, *tokens_arg = NULL, *prompt = NULL, *backend = NULL;
    int max_tokens = 32, threads = 0, json = 0, ubatch = 0, spec_on = 0, spec_off = 0;
    cn_engine_opts eo = {.cache = {.pre_end = 4}};
    uint64_t cache_gpu = CN_CLI_UNSET;
    cn_request rq = {0};
    cn_sampler_params_default(&rq.sampling);
    rq.sampling.temperature = 0.0f; /* a command-line run is reproducible unless asked otherwise */
    cn_flag flags[] = {
        {"model", CN_FLAG_STR, &model, "DIR", "model directory", 1, 0},
        {"tokens", CN_FLAG_STR, &tokens_arg, "IDS", "prompt ids: comma-separated or @FILE", 0, 0},
        {"prompt", CN_FLAG_STR, &prompt, "TEXT", "prompt text (needs the model's tokenizer)", 0, 0},
        {"max-tokens", CN_FLAG_INT, &max_tokens, "N", "tokens to generate (default 32)", 0, 0},
        {"temperature", CN_FLAG_FLOAT, &rq.sampling.temperature, "T", "0 = greedy (default)", 0, 0},
        {"top-k", CN_FLAG_INT, &rq.sampling.top_k, "K", "keep the K most likely tokens", 0, 0},
        {"top-p", CN_FLAG_FLOAT, &rq.sampling.top_p, "P", "nucleus sampling", 0, 0},
        {"min-p", CN_FLAG_FLOAT, &rq.sampling.min_p, "M", "drop tokens below M x the most likely", 0, 0},
        {"repeat-penalty", CN_FLAG_FLOAT, &rq.sampling.repeat_penalty, "R", "penalise recent tokens", 0, 0},
        {"presence-penalty", CN_FLAG_FLOAT, &rq.sampling.presence_penalty, "P", "", 0, 0},
        {"frequency-penalty", CN_FLAG_FLOAT, &rq.sampling.frequency_penalty, "F", "", 0, 0},
        {"seed", CN_FLAG_U64, &rq.sampling.seed, "S", "sampling seed", 0, 0},
        {"ctx", CN_FLAG_INT, &eo.ctx, "N", "context length (default: 4096 or what the request needs)", 0, 0},
        {"chunk", CN_FLAG_INT, &eo.chunk, "N", "prompt tokens per forward (default 512 on the CPU, --ubatch on a GPU)", 0, 0},
        {"cache-spacing", CN_FLAG_INT, &eo.cache.spacing, "N", "a restore point every N prompt tokens (default 1024)", 0, 0},
        {"cache-ram", CN_FLAG_SIZE, &eo.cache.ram_budget, "SIZE", "host RAM for restore points (default 4G)", 0, 0},
        {"cache-gpu", CN_FLAG_SIZE, &cache_gpu, "SIZE", CN_CLI_CACHE_GPU_HELP, 0, 0},
        {"cache-dir", CN_FLAG_STR, &eo.cache_dir, "DIR", "keep restore points on disk in DIR: a later run resumes from them", 0, 0},
        {"cache-disk", CN_FLAG_SIZE, &eo.disk_budget, "SIZE", "disk for restore points under --cache-dir (default 16G)", 0, 0},
        {"backend", CN_FLAG_STR, &backend, "NAME", "cpu, cuda or cuda:N (default: $CAIRN_BACKEND or cpu)", 0, 0},
        {"threads", CN_FLAG_INT, &threads, "N", "CPU threads (default: all cores)", 0, 0},
        {"ubatch", CN_FLAG_INT, &ubatch, "N", "tokens per forward chunk of scratch (default 1024 on the CPU, 2048 on a GPU)", 0, 0},
        {"speculate", CN_FLAG_BOOL, &spec_on, NULL, "draft with the model's MTP head (default when it has one)", 0, 0},
        {"no-speculate", CN_FLAG_BOOL, &spec_off, NULL, "decode plainly", 0, 0},
        {"speculate-depth", CN_FLAG_INT, &eo.spec_depth, "N", "exactly N drafts per round (default: the controller picks, up to 4)", 0, 0},
        {"json", CN_FLAG_BOOL, &json, NULL, "print one JSON object", 0, 0},
        {NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    const char *syn = "generate --model DIR (--tokens IDS | --prompt TEXT) --max-tokens N "
                      "[--temperature T --top-k K --top-p P --min-p M --seed S] "
                      "[--cache-dir DIR [--cache-disk SIZE]] [--speculate | --no-speculate] [--json] "
                      "[--backend NAME]";
    int rc = cn_flags_parse(flags, argc, argv, syn);
    if (rc) return rc > 0 ? 0 : 2;
    if (!!tokens_arg == !!prompt) {
        fprintf(stderr, "cairn: give exactly one of --tokens and --prompt\n");
        cn_flags_usage(flags, syn, stderr);
        return 2;
    }
    if (max_tokens < 0 || eo.ctx < 0 || eo.chunk < 0 || eo.cache.spacing < 0) {
        fprintf(stderr, "cairn: --max-tokens, --ctx, --chunk and --cache-spacing must be >= 0\n");
        return 2;
    }
    if (spec_on && spec_off) {
        fprintf(stderr, "cairn: give at most one of --speculate and --no-speculate\n");
        return 2;
    }
    if (eo.spec_depth < 0 || eo.spec_depth > CN_SPEC_MAX_DEPTH) {
        fprintf(stderr, "cairn: --speculate-depth must be between 1 and %d\n", CN_SPEC_MAX_DEPTH);
        return 2;
    }
    eo.spec_fixed = eo.spec_depth > 0;
    eo.no_speculate = spec_off;
    if (eo.disk_budget && !eo.cache_dir) {
        fprintf(stderr, "cairn: --cache-disk needs --cache-dir\n");
        return 2;
    }
    /* The model's tokenizer, when it ships one: needed for --prompt, used for text output. */
    cn_tokenizer *tok = NULL;
    cn_err err;
    cn_err_clear(&err);
    char tok_path[4096];
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", model);
    rc = cn_tok_load(&tok, tok_path, &err);
    if (rc && (prompt || rc != CN_ENOENT)) {
        fprintf(stderr, "cairn: %s%s\n", err.msg, prompt ? " (--prompt needs the tokenizer)" : "");
        return 1;
    }
    int32_t *ids = NULL;
    int n = 0;
    if (prompt) {
        size_t nn = 0;
        if ((rc = cn_tok_encode(tok, prompt, strlen(prompt), CN_TOK_PARSE_SPECIAL | CN_TOK_ADD_SPECIAL,
                                &ids, &nn, &err))) {
            fprintf(stderr, "cairn: --prompt: %s\n", err.msg);
            cn_tok_free(tok);
            return rc == CN_EFORMAT ? 2 : 1;
        }
        n = (int)nn;
        if (n == 0) {
            fprintf(stderr, "cairn: --prompt encodes to no tokens\n");
            free(ids);
            cn_tok_free(tok);
            return 2;
        }
    } else if ((rc = cn_cli_parse_tokens(tokens_arg, &ids, &n))) {
        cn_tok_free(tok);
        return rc == CN_EUSAGE ? 2 : 1;
    }
    if (eo.ctx == 0) eo.ctx = n + max_tokens + 1 > 4096 ? n + max_tokens + 1 : 4096;
    cn_backend *b;
    cn_model *m;
    if (cn_cli_open_model(model, backend, threads, ubatch, &b, &m)) {
        free(ids);
        cn_tok_free(tok);
        return 1;
    }
    int status = 1, handler = 0;
    struct sigaction sa, old;
    cn_engine *e = NULL;
    cn_tok_stream ts;
    int ts_ok = 0;
    stream_ctx sc = {json, 0, NULL, NULL, 0, 0};
    eo.cache.dev_budget = cn_cli_dev_budget(cache_gpu, b);
    if ((rc = cn_engine_open(&e, m, &eo, &err))) {
        fprintf(stderr, "cairn: %s\n", err.msg);
        goto done;
    }
    if (tok && cn_tok_stream_init(&ts, tok, CN_TOK_SKIP_SPECIAL) == CN_OK) {
        ts_ok = 1;
        sc.text = &ts;
    }
    rq.tokens = ids;
    rq.n_tokens = n;
    rq.max_tokens = max_tokens;
    rq.cancel = cancel_poll;
    rq.on_token = print_token;
    rq.ctx = &sc;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old);
    handler = 1;
    cn_result res;
    rc = cn_engine_generate(e, &rq, &res);
    if (rc && rc != CN_ECANCELED) {
        fprintf(stderr, "cairn: generation failed: %s%s\n", cn_strerror(rc),
                rc == CN_EINVAL ? " (is every token id below the vocabulary size?)" :
                rc == CN_ECONTEXT ? " (raise --ctx)" : "");
        free(res.tokens);
        goto done;
    }
    if (sc.text) {
        const char *tail;
        size_t tn;
        if (cn_tok_stream_flush(sc.text, &tail, &tn, NULL) == CN_OK && tn) {
            append(&sc, tail, tn);
            if (!json) fwrite(tail, 1, tn, stdout);
        }
    }
    if (json) {
        printf("{\"prompt_tokens\":%d,\"cached_tokens\":%d,\"prompt_eval_count\":%d,\"eval_count\":%d,"
               "\"tokens\":[", res.prompt_tokens, res.cached_tokens, res.prompt_eval_count, res.eval_count);
        for (int i = 0; i < res.eval_count; i++) printf("%s%d", i ? "," : "", res.tokens[i]);
        printf("]");
        if (sc.text) {
            printf(",\"text\":");
            print_json_string(sc.all ? sc.all : "", sc.len);
        }
        if (e->spec) printf(",\"draft_proposed\":%d,\"draft_accepted\":%d", res.draft_proposed, res.draft_accepted);
        printf(",\"done_reason\":\"%s\",\"prompt_eval_ms\":%.3f,\"eval_ms\":%.3f}\n",
               res.stop == CN_STOP_EOS ? "stop" : res.stop == CN_STOP_CANCELED ? "canceled" : "length",
               res.prompt_ms, res.eval_ms);
    } else {
        printf("\n");
        fprintf(stderr, "cairn: prompt %d tokens (%d cached, %d evaluated) in %.1f ms, generated %d in %.1f ms (%.1f tok/s)%s\n",
                res.prompt_tokens, res.cached_tokens, res.prompt_eval_count, res.prompt_ms,
                res.eval_count, res.eval_ms, res.eval_count * 1e3 / (res.eval_ms + 1e-9),
                rc == CN_ECANCELED ? " - interrupted" : "");
    }
    free(res.tokens);
    status = rc == CN_ECANCELED ? 130 : 0;
done:
    if (ts_ok) cn_tok_stream_free(&ts);
    free(sc.all);
    /* Closing the engine waits for the cache writer; the handler stays until then so that a
     * second Ctrl-C does not cut the restore points of the first one short. */
    cn_engine_close(e);
    if (handler) sigaction(SIGINT, &old, NULL);
    cn_tok_free(tok);
    free(ids);
    cn_cli_close_model(b, m);
    return status;
}
