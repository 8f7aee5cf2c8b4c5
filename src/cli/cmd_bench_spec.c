/* cmd_bench_spec.c - `cairn bench --speculate`: self-speculative decoding against plain decoding,
 * measured in one run on one model.
 *
 * Three engines over the same model, each decoding the same prompts greedily from a cold cache.
 * The prompts are short chat requests rendered through the model's own chat template (a built-in
 * dozen, or --chat FILE), so that a trained head drafts what it was trained on; a model without a
 * tokenizer or template (and --random) gets random token ids. The engines: plain (speculation off), the default (the depth controller decides: on random weights it
 * parks, which must cost plain decoding almost nothing), and forced (every round drafts --depth
 * tokens: acceptance per draft position and committed tokens per verify pass come from it). The
 * repetitions interleave the three, in rotating order, so that a slower moment of the machine hits all alike; the
 * median decode rate of each is reported (a best-of picks outliers on a model this fast). Greedy output must be identical across the three; a
 * difference is reported and fails the command. Without --model a tiny MTP checkpoint is made
 * in a temporary folder (`cairn make-model --preset tiny`) and removed after.
 *
 * --json prints one object: draft_acceptance (drafts kept / proposed, forced run),
 * speculative_speedup (default ÷ plain decode tokens per second), forced_speedup, the per-position
 * acceptance, tokens_per_verify, round_cost_steps (a depth-1 round in plain steps, as the default
 * run's controller measured it: a round pays when it is below tokens_per_verify) and the rates.
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/cli_util.h"
#include "cli/flags.h"
#include "engine/engine.h"
#include "model/synth.h"
#include "text/chat.h"
#include "text/render.h"
#include "text/text.h"

/* Removes the files of a folder this command made, then the folder. */
static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[4096];
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

#define MAX_REPS 64

typedef struct run_stats {
    double tok_s[MAX_REPS]; /* decode rate of each request */
    int n;
    double cpu_s;           /* process CPU seconds of every request (prefill included) */
    long proposed, accepted, rounds, tokens;
    long pos_proposed[CN_SPEC_MAX_DEPTH], pos_accepted[CN_SPEC_MAX_DEPTH];
} run_stats;

static int one(cn_engine *e, const int32_t *prompt, int n, int gen, run_stats *st, int32_t *out,
               int *n_out) {
    cn_request r = {.tokens = prompt, .n_tokens = n, .max_tokens = gen};
    cn_sampler_params_default(&r.sampling);
    r.sampling.temperature = 0;
    cn_result res;
    struct timespec a, b;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
    int rc = cn_engine_generate(e, &r, &res);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
    st->cpu_s += (double)(b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
    if (rc) {
        fprintf(stderr, "cairn: generation failed: %s\n", cn_strerror(rc));
        free(res.tokens);
        return rc;
    }
    /* the first token comes from the prefill's logits: the decode rate counts the others */
    double tok_s = res.eval_count > 1 ? (res.eval_count - 1) * 1e3 / (res.eval_ms + 1e-9) : 0;
    if (st->n < MAX_REPS) st->tok_s[st->n++] = tok_s;
    st->proposed += res.draft_proposed;
    st->accepted += res.draft_accepted;
    st->rounds += res.spec_rounds;
    st->tokens += res.eval_count;
    for (int j = 0; j < CN_SPEC_MAX_DEPTH; j++) {
        st->pos_proposed[j] += res.pos_proposed[j];
        st->pos_accepted[j] += res.pos_accepted[j];
    }
    memcpy(out, res.tokens, (size_t)res.eval_count * sizeof *out);
    *n_out = res.eval_count;
    free(res.tokens);
    return CN_OK;
}

/* The default prompts when the model has a chat template: short, generic requests of the kind a
 * chat model answers every day, rendered with the template's defaults (thinking as the template
 * decides). Random token ids say nothing about a trained head's acceptance: a trained model soon
 * ends such an "answer" and drafts from noise. */
static const char *const builtin_chats[] = {
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi! How are you today?\"}]}",
    "{\"messages\":[{\"role\":\"user\",\"content\":\"What is 47 + 38?\"}]}",
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Why is the sky blue?\"}]}",
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Sort these numbers: 42, 7, 19, 3.\"}]}",
    "{\"messages\":[{\"role\":\"user\",\"content\":\"How many letters are in the word \\\"banana\\\"?\"}]}",
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Convert 5 km to meters.\"}]}",
    "{\"messages\":[{\"role\":\"system\",\"content\":\"You are a helpful assistant.\"},"
    "{\"role\":\"user\",\"content\":\"Write a short poem about the sea.\"}]}",
    "{\"messages\":[{\"role\":\"user\",\"content\":\"What is 12 times 7?\"}]}",
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Give me three tips for sleeping better.\"}]}",
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Reverse the word \\\"planet\\\".\"}]}",
    "{\"messages\":[{\"role\":\"system\",\"content\":\"Keep answers short.\"},"
    "{\"role\":\"user\",\"content\":\"How many minutes are in 3 hours?\"}]}",
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Explain what a prime number is.\"}]}",
};
#define N_BUILTIN (int)(sizeof builtin_chats / sizeof builtin_chats[0])

/* One chat request (JSON) rendered and tokenized into *ids (malloc'd). Returns 0, or a CN_E code
 * with err saying what is wrong with it. */
static int chat_ids(const char *json, size_t len, const cn_text *t, int32_t **ids, int *n, cn_err *err) {
    cn_chat chat;
    char *prompt = NULL;
    size_t plen = 0;
    int rc = cn_chat_parse(&chat, json, len, err);
    if (rc) return rc;
    rc = cn_render(cn_text_renderer(t), &chat, &prompt, &plen, err);
    if (!rc) rc = cn_text_encode(t, prompt, plen, ids, n, err);
    free(prompt);
    cn_chat_free(&chat);
    return rc;
}

/* Appends ids (taking it) to the prompt list. Returns 0, or 1 with the message printed. */
static int push_prompt(int32_t ***ids, int **lens, int *n, int32_t *p, int np) {
    int32_t **ni = realloc(*ids, (size_t)(*n + 1) * sizeof *ni);
    if (ni) *ids = ni;
    int *nl = ni ? realloc(*lens, (size_t)(*n + 1) * sizeof *nl) : NULL;
    if (nl) *lens = nl;
    if (!ni || !nl) {
        fprintf(stderr, "cairn: out of memory\n");
        free(p);
        return 1;
    }
    (*ids)[*n] = p;
    (*lens)[(*n)++] = np;
    return 0;
}

/* The prompts of --chat: every non-empty line of path, rendered and tokenized; path NULL: the
 * built-in requests. Returns 0, or 1 with the message printed (the line number and what is wrong
 * with it). */
static int load_chats(const char *path, const cn_text *t, int32_t ***ids, int **lens, int *n) {
    *ids = NULL, *lens = NULL, *n = 0;
    if (!path) {
        for (int i = 0; i < N_BUILTIN; i++) {
            cn_err err;
            cn_err_clear(&err);
            int32_t *p = NULL;
            int np = 0;
            if (chat_ids(builtin_chats[i], strlen(builtin_chats[i]), t, &p, &np, &err)) {
                fprintf(stderr, "cairn: built-in chat %d: %s\n", i + 1, err.msg);
                return 1;
            }
            if (push_prompt(ids, lens, n, p, np)) return 1;
        }
        return 0;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cairn: --chat %s: cannot open\n", path);
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int lineno = 0, rc = 0;
    while (!rc && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r' || line[len - 1] == ' ')) line[--len] = 0;
        if (!len) continue;
        cn_err err;
        cn_err_clear(&err);
        int32_t *p = NULL;
        int np = 0;
        if (chat_ids(line, (size_t)len, t, &p, &np, &err)) {
            fprintf(stderr, "cairn: --chat %s:%d: %s\n", path, lineno, err.msg);
            rc = 1;
        } else {
            rc = push_prompt(ids, lens, n, p, np);
        }
    }
    free(line);
    fclose(f);
    if (!rc && !*n) {
        fprintf(stderr, "cairn: --chat %s: no requests\n", path);
        rc = 1;
    }
    return rc;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(run_stats *st) {
    if (!st->n) return 0;
    qsort(st->tok_s, (size_t)st->n, sizeof *st->tok_s, cmp_double);
    return st->n % 2 ? st->tok_s[st->n / 2] : 0.5 * (st->tok_s[st->n / 2 - 1] + st->tok_s[st->n / 2]);
}

int cn_bench_speculate(int argc, char **argv) {
    const char *model = NULL, *chat_file = NULL;
    int json = 0, threads = 0, prompt_len = 64, gen = 256, depth = 4, reps = 0, random_ids = 0;
    uint64_t seed = 1;
    cn_flag flags[] = {
        {"speculate", CN_FLAG_BOOL, &(int){0}, NULL, "this benchmark", 0, 0},
        {"model", CN_FLAG_STR, &model, "DIR", "a model with an MTP head (default: a tiny one made now)", 0, 0},
        {"prompt", CN_FLAG_INT, &prompt_len, "N", "prompt tokens of a random prompt (default 64)", 0, 0},
        {"tokens", CN_FLAG_INT, &gen, "N", "tokens generated per request (default 256)", 0, 0},
        {"depth", CN_FLAG_INT, &depth, "D", "drafts per round of the forced run (default 4)", 0, 0},
        {"reps", CN_FLAG_INT, &reps, "N", "requests per engine, median rate reported (default: one per chat prompt, 7 random)", 0, 0},
        {"seed", CN_FLAG_U64, &seed, "S", "random prompt seed (default 1)", 0, 0},
        {"chat", CN_FLAG_STR, &chat_file, "FILE",
         "prompts: chat requests, one JSON object per line (default: 12 built-in short chat requests through "
         "the model's chat template; random ids when it has none)", 0, 0},
        {"random", CN_FLAG_BOOL, &random_ids, NULL, "random token ids as prompts, even with a chat template", 0, 0},
        {"threads", CN_FLAG_INT, &threads, "N", "CPU threads (default: all cores)", 0, 0},
        {"json", CN_FLAG_BOOL, &json, NULL, "print one JSON object", 0, 0},
        {NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    int rc = cn_flags_parse(flags, argc, argv, "bench --speculate [--model DIR] [--chat FILE] [--depth D] [--json]");
    if (rc) return rc > 0 ? 0 : 2;
    if (prompt_len < 1 || gen < 2 || reps < 0 || reps > MAX_REPS || depth < 1 || depth > CN_SPEC_MAX_DEPTH) {
        fprintf(stderr, "cairn: --prompt >= 1, --tokens >= 2, --reps in 1..%d, --depth in 1..%d\n", MAX_REPS,
                CN_SPEC_MAX_DEPTH);
        return 2;
    }
    if (chat_file && random_ids) {
        fprintf(stderr, "cairn: --chat and --random exclude each other\n");
        return 2;
    }
    char tmp[] = "/tmp/cairn-bench-spec-XXXXXX";
    int made = 0;
    if (!model) {
        if (!mkdtemp(tmp)) {
            fprintf(stderr, "cairn: cannot make a temporary folder\n");
            return 1;
        }
        made = 1;
        cn_synth_opts so;
        cn_synth_opts_init(&so);
        cn_err err;
        cn_err_clear(&err);
        if (cn_synth_write(tmp, &so, &err)) {
            fprintf(stderr, "cairn: %s\n", err.msg);
            remove_dir(tmp);
            return 1;
        }
        model = tmp;
    }
    cn_backend *b = NULL;
    cn_model *m = NULL;
    int status = 1;
    cn_engine *eng[3] = {NULL, NULL, NULL};
    int32_t *prompt = NULL, *outs = NULL, **chats = NULL;
    int *chat_len = NULL, n_chats = 0;
    cn_text *text = NULL;
    if (cn_cli_open_model(model, NULL, threads, 0, &b, &m)) goto done;
    if (!cn_model_has_mtp(m)) {
        fprintf(stderr, "cairn: %s has no MTP head: nothing to speculate with\n", model);
        goto done;
    }
    const cn_config *c = cn_model_config(m);
    cn_err err;
    cn_err_clear(&err);
    if (chat_file) {
        if (cn_text_open(&text, model, c->model_type, &err)) {
            fprintf(stderr, "cairn: %s\n", err.msg);
            goto done;
        }
    } else if (!random_ids && cn_text_open(&text, model, c->model_type, &err)) {
        text = NULL; /* no tokenizer or template: random ids, as the output says */
    }
    if (text) {
        if (load_chats(chat_file, text, &chats, &chat_len, &n_chats)) goto done;
        prompt_len = 0;
        for (int i = 0; i < n_chats; i++)
            if (chat_len[i] > prompt_len) prompt_len = chat_len[i];
    }
    if (!reps) reps = n_chats ? (n_chats < MAX_REPS ? n_chats : MAX_REPS) : 7;
    const char *source = chat_file ? chat_file : n_chats ? "built-in" : "random";
    /* plain, default (controller), forced depth; cold caches so that every request decodes alike */
    for (int k = 0; k < 3; k++) {
        cn_engine_opts o = {.ctx = prompt_len + gen + 8, .no_cache = 1, .no_speculate = k == 0,
                            .spec_depth = k == 2 ? depth : 0, .spec_fixed = k == 2};
        if (cn_engine_open(&eng[k], m, &o, &err)) {
            fprintf(stderr, "cairn: %s\n", err.msg);
            goto done;
        }
        if (!eng[k]->spec) {
            fprintf(stderr, "cairn: the MTP head of %s cannot draft (recurrent layers)\n", model);
            goto done;
        }
    }
    prompt = malloc((size_t)prompt_len * sizeof *prompt);
    outs = malloc((size_t)3 * gen * sizeof *outs);
    if (!prompt || !outs) goto done;
    run_stats st[3];
    memset(st, 0, sizeof st);
    int identical = 1;
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int rep = 0; rep < reps; rep++) {
        const int32_t *pr = prompt;
        int pn = prompt_len;
        if (n_chats) {
            pr = chats[rep % n_chats];
            pn = chat_len[rep % n_chats];
        } else {
            for (int i = 0; i < prompt_len; i++) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                prompt[i] = (int32_t)(20 + x % (uint64_t)(c->vocab_size - 20));
            }
        }
        int n_out[3];
        /* the order rotates: whichever runs second in a row tends to run faster (warm caches) */
        for (int i = 0; i < 3; i++) {
            int k = (rep + i) % 3;
            if (one(eng[k], pr, pn, gen, &st[k], outs + (size_t)k * gen, &n_out[k])) goto done;
        }
        for (int k = 1; k < 3; k++)
            if (n_out[k] != n_out[0] || memcmp(outs, outs + (size_t)k * gen, (size_t)n_out[0] * sizeof *outs))
                identical = 0;
    }
    double plain = median(&st[0]), dflt = median(&st[1]), forced = median(&st[2]);
    double acc = st[2].proposed ? (double)st[2].accepted / st[2].proposed : 0;
    double per_verify = st[2].rounds ? (double)(st[2].accepted + st[2].rounds) / st[2].rounds : 0;
    double speedup = plain > 0 ? dflt / plain : 0, fspeedup = plain > 0 ? forced / plain : 0;
    /* CPU time is what the process itself spent: on a machine shared with other work it is the
     * steadier figure (same tokens in every run, so the ratio of times is the ratio of rates) */
    double cpu_speedup = st[1].cpu_s > 0 ? st[0].cpu_s / st[1].cpu_s : 0;
    /* what the default run's controller measured (speculate.h): a round of depth 1 in plain
     * steps, its catch-up of the head's work for plain steps left out; 0 until both are known */
    const cn_spec_ctl *ctl = &eng[1]->spec->ctl;
    double round_steps = ctl->plain_ms > 0 && ctl->has_extra ? (ctl->plain_ms + ctl->extra_ms) / ctl->plain_ms : 0;
    if (json) {
        printf("{\"prompts\":\"%s\",", source);
        if (chat_file) printf("\"chat\":\"%s\",", chat_file);
        printf("\"model\":\"%s\",\"prompt_tokens\":%d,\"tokens\":%d,\"reps\":%d,\"depth\":%d,", made ? "tiny (made now)" : model,
               prompt_len, gen, reps, depth);
        printf("\"plain_tok_s\":%.2f,\"speculative_tok_s\":%.2f,\"forced_tok_s\":%.2f,", plain, dflt, forced);
        printf("\"draft_acceptance\":%.4f,\"acceptance_per_position\":[", acc);
        for (int j = 0; j < depth; j++)
            printf("%s%.4f", j ? "," : "",
                   st[2].pos_proposed[j] ? (double)st[2].pos_accepted[j] / st[2].pos_proposed[j] : 0.0);
        printf("],\"tokens_per_verify\":%.3f,\"draft_proposed\":%ld,\"draft_accepted\":%ld,", per_verify,
               st[2].proposed, st[2].accepted);
        printf("\"default_rounds\":%ld,\"round_cost_steps\":%.3f,\"speculative_speedup\":%.4f,"
               "\"forced_speedup\":%.4f,\"speculative_speedup_cpu\":%.4f,\"identical\":%s}\n",
               st[1].rounds, round_steps, speedup, fspeedup, cpu_speedup, identical ? "true" : "false");
    } else {
        printf("model        %s (vocab %d, hidden %d)\n", made ? "tiny, made now" : model, c->vocab_size, c->hidden_size);
        if (n_chats)
            printf("requests     %d x (%s chat prompts, at most %d tokens + up to %d generated), greedy, cold cache\n",
                   reps, source, prompt_len, gen);
        else
            printf("requests     %d x (%d prompt + %d generated tokens), greedy, cold cache\n", reps, prompt_len, gen);
        printf("plain        %10.1f tokens/s\n", plain);
        printf("speculative  %10.1f tokens/s  (controller: %ld verify rounds)  speedup %.3f\n", dflt, st[1].rounds,
               speedup);
        printf("forced d=%d   %10.1f tokens/s  speedup %.3f\n", depth, forced, fspeedup);
        if (round_steps > 0)
            printf("round        a depth-1 round costs %.2f plain steps (the controller's medians)\n", round_steps);
        printf("cpu time     speculative / plain: speedup %.3f (whole requests, process CPU time)\n", cpu_speedup);
        printf("acceptance   %.4f overall, per position:", acc);
        for (int j = 0; j < depth; j++)
            printf(" %.3f", st[2].pos_proposed[j] ? (double)st[2].pos_accepted[j] / st[2].pos_proposed[j] : 0.0);
        printf("\ncommitted    %.3f tokens per verify pass\n", per_verify);
        printf("output       %s\n", identical ? "identical across the three" : "DIFFERS");
    }
    status = identical ? 0 : 1;
done:
    for (int k = 0; k < 3; k++) cn_engine_close(eng[k]);
    free(prompt);
    free(outs);
    for (int i = 0; i < n_chats; i++) free(chats[i]);
    free(chats);
    free(chat_len);
    cn_text_close(text);
    if (m) cn_cli_close_model(b, m);
    if (made) remove_dir(tmp);
    return status;
}
