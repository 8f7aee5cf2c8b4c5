/* cmd_run.c - `cairn run`: chat with a model in the terminal.
 *
 * With a PROMPT argument, one answer is streamed to stdout; without one, an interactive chat
 * reads messages from stdin until /bye, Ctrl-D or Ctrl-C at the prompt. Answers go through the
 * same text pipeline as the server's (reply.h): thinking is shown dimmed on a terminal and between
 * "Thinking..." / "...done thinking." lines otherwise; a tool call is shown as one line. While a
 * long prompt is prefilled, a spinner with its progress runs on stderr (terminals only).
 *
 * The conversation is kept as the token ids the model saw: the first prompt as the chat template
 * renders it, then each answer exactly as generated, then "<|im_end|>\n" and the next user turn
 * with its generation prompt, as the template writes them. So every prompt is a strict extension
 * of the previous prompt and answer, and the prefix cache restores all of it: only the new turn
 * is evaluated (--verbose prints the cached count). The one difference from re-rendering the
 * history with the template is that earlier answers keep their reasoning, as the model wrote it.
 *
 * Input: on a terminal, lines are edited with libedit (lineedit.h: arrow keys, history); a line
 * ending with `\` continues on the next line; a line starting with `"""` opens a block that the
 * next line ending with `"""` closes. Commands: /bye, /clear (forget the
 * conversation), /think and /no_think (reasoning on or off from the next message), /? (help).
 * Ctrl-C during an answer cancels it like a client disconnect (what the prefill absorbed stays in
 * the cache); the partial answer stays in the conversation, or the turn is dropped when nothing
 * was generated yet. --json prints one JSON object per answer instead of streaming.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli/cli.h"
#include "cli/cli_util.h"
#include "cli/flags.h"
#include "cli/lineedit.h"
#include "engine/ctx_plan.h"
#include "engine/engine.h"
#include "text/chat.h"
#include "text/reply.h"
#include "text/strbuf.h"
#include "text/text.h"


/* Set by the SIGINT handler: cancels the running answer, or ends the chat at the prompt. */
static volatile sig_atomic_t g_interrupted;

static void on_sigint(int sig) {
    (void)sig;
    g_interrupted = 1;
}

static int cancel_poll(void *ctx) {
    (void)ctx;
    return g_interrupted != 0;
}

/* ---- spinner: prefill progress on stderr ---------------------------------------------------- */

/* A thread redraws one stderr line every 100 ms, after a 250 ms delay so short prompts never
 * show it; it is stopped (and its line erased) before the answer's first byte reaches stdout. */
typedef struct spinner {
    int on; /* the thread runs */
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;        /* under mu: the thread should erase its line and end */
    int done, total; /* under mu: prefill progress in tokens (total 0: unknown) */
} spinner;

static void ts_add_ms(struct timespec *t, long ms) {
    t->tv_nsec += ms * 1000000L;
    while (t->tv_nsec >= 1000000000L) t->tv_nsec -= 1000000000L, t->tv_sec++;
}

static void *spin_main(void *arg) {
    static const char *frames[] = {"⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"};
    spinner *s = arg;
    struct timespec at;
    clock_gettime(CLOCK_REALTIME, &at);
    ts_add_ms(&at, 250);
    int drawn = 0;
    pthread_mutex_lock(&s->mu);
    for (unsigned i = 0; !s->stop; i++) {
        while (!s->stop && pthread_cond_timedwait(&s->cv, &s->mu, &at) != ETIMEDOUT) {}
        if (s->stop) break;
        if (s->total > 0 && s->done < s->total)
            fprintf(stderr, "\r\033[K%s prefill %d/%d tokens (%d%%)", frames[i % 10], s->done,
                    s->total, (int)(100.0 * s->done / s->total));
        else
            fprintf(stderr, "\r\033[K%s", frames[i % 10]);
        fflush(stderr);
        drawn = 1;
        ts_add_ms(&at, 100);
    }
    if (drawn) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Starts the spinner when stderr is a terminal and show is set; otherwise it stays off. */
static void spinner_start(spinner *s, int show) {
    memset(s, 0, sizeof *s);
    if (!show || !isatty(STDERR_FILENO)) return;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    if (pthread_create(&s->th, NULL, spin_main, s)) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
        return; /* no spinner: not worth failing the answer for */
    }
    s->on = 1;
}

static void spinner_progress(spinner *s, int done, int total) {
    if (!s->on) return;
    pthread_mutex_lock(&s->mu);
    s->done = done;
    s->total = total;
    pthread_mutex_unlock(&s->mu);
}

/* Erases the line and joins the thread; a no-op when it is off. */
static void spinner_stop(spinner *s) {
    if (!s->on) return;
    pthread_mutex_lock(&s->mu);
    s->stop = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->th, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    s->on = 0;
}

/* ---- an answer on the terminal -------------------------------------------------------------- */

typedef struct answer {
    int tty;         /* stdout is a terminal: thinking dimmed, not marked */
    int json;        /* collect for one JSON object; print nothing while streaming */
    int in_thinking; /* a thinking block is open on stdout */
    char last;       /* the last byte written to stdout ('\n' at start) */
    cn_strbuf thinking, content; /* --json: the text */
    cJSON *calls;    /* --json: [{name, arguments}] */
    spinner *sp;
    cn_reply reply;
} answer;

/* Writes model text. On a terminal, control bytes other than tab and newline become '?': the
 * model must not move the cursor or change colours. */
static void out(answer *a, const char *s, size_t n) {
    if (!n) return;
    size_t start = 0;
    for (size_t i = 0; a->tty && i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) {
            fwrite(s + start, 1, i - start, stdout);
            fputc('?', stdout);
            start = i + 1;
        }
    }
    fwrite(s + start, 1, n - start, stdout);
    a->last = s[n - 1];
}

static void end_thinking(answer *a) {
    if (!a->in_thinking) return;
    a->in_thinking = 0;
    if (a->tty) fputs("\033[0m", stdout);
    out(a, a->last == '\n' ? "" : "\n", a->last == '\n' ? 0 : 1);
    out(a, a->tty ? "\n" : "...done thinking.\n\n", a->tty ? 1 : 20);
}

static int on_event(const cn_parse_event *ev, void *ctx) {
    answer *a = ctx;
    if (a->json) {
        if (ev->kind == CN_EV_TOOL_CALL) {
            cJSON *c = cJSON_CreateObject();
            if (!c) return CN_ENOMEM;
            cJSON_AddItemToArray(a->calls, c);
            cJSON_AddStringToObject(c, "name", ev->name);
            cJSON_AddItemToObject(c, "arguments", cJSON_Duplicate(ev->arguments, 1));
        } else {
            cn_strbuf_put(ev->kind == CN_EV_THINKING ? &a->thinking : &a->content, ev->text, ev->len);
        }
        return a->thinking.oom || a->content.oom ? CN_ENOMEM : CN_OK;
    }
    switch (ev->kind) {
    case CN_EV_THINKING:
        if (!a->in_thinking) {
            a->in_thinking = 1;
            if (a->tty) fputs("\033[2m", stdout);
            else out(a, "Thinking...\n", 12);
        }
        out(a, ev->text, ev->len);
        break;
    case CN_EV_CONTENT:
        end_thinking(a);
        out(a, ev->text, ev->len);
        break;
    case CN_EV_TOOL_CALL:
        end_thinking(a);
        if (a->last != '\n') out(a, "\n", 1);
        printf("[tool call] %s %s\n", ev->name, ev->arguments_json);
        a->last = '\n';
        break;
    }
    fflush(stdout);
    return CN_OK;
}

typedef struct gen_ctx {
    answer *a;
    int failed; /* a text error: stop generating */
} gen_ctx;

static int gen_token(void *ctx, int32_t t) {
    gen_ctx *g = ctx;
    spinner_stop(g->a->sp);
    int rc = cn_reply_token(&g->a->reply, t);
    if (rc) g->failed = rc;
    return rc != 0;
}

static void gen_progress(void *ctx, int done, int total) {
    gen_ctx *g = ctx;
    spinner_progress(g->a->sp, done, total);
}

/* ---- the conversation ----------------------------------------------------------------------- */

typedef struct run_opts {
    const char *name;   /* shown in --json */
    const char *system; /* (optional) system message */
    int think;          /* 1: the generation prompt opens <think> */
    int max_tokens;     /* -1: until end of sequence or the context is full */
    int verbose, json, quiet;
    cn_sampler_params sampling;
} run_opts;

typedef struct convo {
    int32_t *ids; /* [n] every token the model saw: prompts and answers */
    int n, cap;
} convo;

/* The prompt text of one user turn. On the first turn, the whole rendered chat (system turn
 * included); later, "<|im_end|>\n" closing the previous answer, then the user turn and the
 * generation prompt as the template renders them. *thinking: the prompt opened <think>. */
static int turn_text(const run_opts *o, const cn_text *t, const char *msg, int first, char **text,
                     int *thinking, cn_err *err) {
    cJSON *root = cJSON_CreateObject();
    cJSON *msgs = cJSON_AddArrayToObject(root, "messages");
    if (first && o->system && *o->system) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddItemToArray(msgs, m);
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", o->system);
    }
    cJSON *m = cJSON_CreateObject();
    cJSON_AddItemToArray(msgs, m);
    cJSON_AddStringToObject(m, "role", "user");
    cJSON_AddStringToObject(m, "content", msg);
    cJSON_AddBoolToObject(root, "think", o->think);
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!json) return cn_err_set(err, CN_ENOMEM, "out of memory");
    cn_chat chat;
    int rc = cn_chat_parse(&chat, json, strlen(json), err);
    free(json);
    char *p = NULL;
    if (!rc) rc = cn_render(cn_text_renderer(t), &chat, &p, NULL, err);
    if (!rc) *thinking = cn_chat_thinking(&chat, 1);
    cn_chat_free(&chat);
    if (rc) return rc;
    if (first) {
        *text = p;
        return CN_OK;
    }
    /* The render opens with the (empty) system turn; what follows it is this turn. */
    static const char end[] = "<|im_end|>\n";
    const char *rest = strstr(p, end);
    rest = rest ? rest + strlen(end) : p;
    size_t n = strlen(rest);
    char *s = malloc(sizeof end + n);
    if (s) {
        memcpy(s, end, sizeof end - 1);
        memcpy(s + sizeof end - 1, rest, n + 1);
    }
    free(p);
    if (!s) return cn_err_set(err, CN_ENOMEM, "out of memory");
    *text = s;
    return CN_OK;
}

static void print_json_answer(const run_opts *o, answer *a, const cn_result *res, int rc) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", o->name);
    cJSON_AddStringToObject(j, "thinking", a->thinking.p ? a->thinking.p : "");
    cJSON_AddStringToObject(j, "content", a->content.p ? a->content.p : "");
    cJSON_AddItemToObject(j, "tool_calls", a->calls);
    a->calls = NULL;
    cJSON_AddStringToObject(j, "done_reason", rc == CN_ECANCELED ? "canceled"
                                              : res->stop == CN_STOP_LENGTH ? "length" : "stop");
    cJSON_AddNumberToObject(j, "prompt_tokens", res->prompt_tokens);
    cJSON_AddNumberToObject(j, "cached_tokens", res->cached_tokens);
    cJSON_AddNumberToObject(j, "prompt_eval_count", res->prompt_eval_count);
    cJSON_AddNumberToObject(j, "eval_count", res->eval_count);
    cJSON_AddNumberToObject(j, "prompt_eval_ms", res->prompt_ms);
    cJSON_AddNumberToObject(j, "eval_ms", res->eval_ms);
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (s) printf("%s\n", s);
    fflush(stdout);
    cJSON_free(s);
}

/* One user message and its answer. Returns 0 (answered), CN_ECANCELED (Ctrl-C; the partial
 * answer is kept in the conversation, or the turn dropped if nothing was generated),
 * CN_ECONTEXT (the conversation no longer fits; unchanged), or another error (unchanged). */
static int turn(const run_opts *o, cn_engine *e, const cn_text *t, convo *cv, const char *msg) {
    cn_err err;
    cn_err_clear(&err);
    char *text = NULL;
    int thinking = 0;
    int rc = turn_text(o, t, msg, cv->n == 0, &text, &thinking, &err);
    int32_t *ids = NULL, *prompt = NULL;
    int n_ids = 0;
    if (!rc) rc = cn_text_encode(t, text, strlen(text), &ids, &n_ids, &err);
    free(text);
    if (rc) {
        fprintf(stderr, "cairn: %s\n", err.msg[0] ? err.msg : cn_strerror(rc));
        return rc;
    }
    int n = cv->n + n_ids, ctx = e->o.ctx;
    if (n >= ctx) {
        if (cv->n)
            fprintf(stderr, "cairn: the conversation would be %d tokens, past the context (--ctx %d): "
                            "/clear to start over\n", n, ctx);
        else
            fprintf(stderr, "cairn: the prompt is %d tokens, past the context (--ctx %d)\n", n, ctx);
        free(ids);
        return CN_ECONTEXT;
    }
    if (!(prompt = malloc((size_t)n * sizeof *prompt))) {
        free(ids);
        fprintf(stderr, "cairn: out of memory\n");
        return CN_ENOMEM;
    }
    if (cv->n) memcpy(prompt, cv->ids, (size_t)cv->n * sizeof *prompt);
    memcpy(prompt + cv->n, ids, (size_t)n_ids * sizeof *prompt);
    free(ids);

    spinner sp;
    answer a = {.tty = isatty(STDOUT_FILENO), .json = o->json, .last = '\n', .sp = &sp,
                .thinking = CN_STRBUF_INIT, .content = CN_STRBUF_INIT};
    if (o->json && !(a.calls = cJSON_CreateArray())) {
        free(prompt);
        return CN_ENOMEM;
    }
    if ((rc = cn_reply_init(&a.reply, t, NULL, 1, thinking, NULL, on_event, &a, &err))) {
        fprintf(stderr, "cairn: %s\n", err.msg);
        cn_reply_free(&a.reply);
        cJSON_Delete(a.calls);
        free(prompt);
        return rc;
    }
    gen_ctx g = {&a, 0};
    int room = ctx - n;
    cn_request rq = {
        .tokens = prompt,
        .n_tokens = n,
        .max_tokens = o->max_tokens >= 0 && o->max_tokens < room ? o->max_tokens : room,
        .sampling = o->sampling,
        .cancel = cancel_poll,
        .on_token = gen_token,
        .on_progress = gen_progress,
        .ctx = &g,
    };
    cn_result res;
    spinner_start(&sp, !o->json);
    rc = cn_engine_generate(e, &rq, &res);
    spinner_stop(&sp);
    if (!rc && g.failed) rc = g.failed;
    int frc = rc && rc != CN_ECANCELED ? CN_OK : cn_reply_finish(&a.reply);
    if (!rc && frc) rc = frc;
    if (!o->json) {
        end_thinking(&a);
        if (a.last != '\n') out(&a, "\n", 1);
        fflush(stdout);
    }
    if (rc && rc != CN_ECANCELED) {
        fprintf(stderr, "cairn: the answer failed: %s\n", cn_strerror(rc));
    } else {
        if (o->json) print_json_answer(o, &a, &res, rc);
        if (o->verbose)
            fprintf(stderr, "cairn: prompt %d tokens (%d cached, %d evaluated) in %.1f ms, "
                            "generated %d in %.1f ms (%.1f tok/s)%s\n",
                    res.prompt_tokens, res.cached_tokens, res.prompt_eval_count, res.prompt_ms,
                    res.eval_count, res.eval_ms, res.eval_count * 1e3 / (res.eval_ms + 1e-9),
                    rc == CN_ECANCELED ? " - interrupted" : "");
        /* the conversation grows by this turn: the prompt, then the answer as generated */
        if (!rc || res.eval_count > 0) {
            int need = n + res.eval_count;
            if (need > cv->cap) {
                int32_t *p = realloc(cv->ids, (size_t)need * sizeof *p);
                if (!p) {
                    rc = CN_ENOMEM;
                    goto done;
                }
                cv->ids = p;
                cv->cap = need;
            }
            memcpy(cv->ids, prompt, (size_t)n * sizeof *prompt);
            memcpy(cv->ids + n, res.tokens, (size_t)res.eval_count * sizeof *prompt);
            cv->n = need;
        }
    }
done:
    free(res.tokens);
    cn_reply_free(&a.reply);
    cn_strbuf_free(&a.thinking);
    cn_strbuf_free(&a.content);
    cJSON_Delete(a.calls);
    free(prompt);
    return rc;
}

/* ---- interactive input ---------------------------------------------------------------------- */

static int ends_with(const char *s, size_t n, const char *suffix) {
    size_t k = strlen(suffix);
    return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

/* Reads one message: a line, lines joined by a trailing `\`, or a """ block. Returns 1 with the
 * text in *msg (the caller's buffer, reset here), 0 at end of input or Ctrl-C. On a terminal each
 * line typed enters the line editor's history, so Up brings back any line of a block too. */
static int read_message(cn_lineedit *le, cn_strbuf *msg, int prompt) {
    int block = 0, more = 0, got = 0;
    cn_strbuf_reset(msg);
    for (;;) {
        const char *line;
        size_t n;
        errno = 0;
        int ok = cn_lineedit_read(le, prompt ? (block || more ? "... " : ">>> ") : NULL, &line, &n);
        if (!ok || g_interrupted) {
            if (prompt) fputs("\n", stdout);
            break;
        }
        if (prompt) cn_lineedit_remember(le, line);
        const char *s = line;
        if (!block && !more) {
            size_t lead = strspn(s, " \t");
            if (strncmp(s + lead, "\"\"\"", 3) == 0) { /* a block opens */
                s += lead + 3;
                n -= lead + 3;
                block = 1;
                if (ends_with(s, n, "\"\"\"")) { /* and closes on the same line */
                    cn_strbuf_put(msg, s, n - 3);
                    got = 1;
                    break;
                }
                if (n) cn_strbuf_put(msg, s, n), cn_strbuf_putc(msg, '\n');
                continue;
            }
        }
        if (block) {
            if (ends_with(s, n, "\"\"\"")) {
                cn_strbuf_put(msg, s, n - 3);
                got = 1;
                break;
            }
            cn_strbuf_put(msg, s, n);
            cn_strbuf_putc(msg, '\n');
            continue;
        }
        more = ends_with(s, n, "\\");
        cn_strbuf_put(msg, s, n - (size_t)more);
        if (more) {
            cn_strbuf_putc(msg, '\n');
            continue;
        }
        got = 1;
        break;
    }
    return got && !msg->oom;
}

static void help(FILE *f) {
    fputs("Commands:\n"
          "  /bye       leave\n"
          "  /clear     forget the conversation\n"
          "  /think     reasoning on from the next message\n"
          "  /no_think  reasoning off from the next message\n"
          "  /?         this help\n"
          "End a line with \\ to continue on the next one, or wrap several lines in \"\"\".\n"
          "Ctrl-C stops an answer; Ctrl-C or Ctrl-D at the prompt leaves.\n",
          f);
}

/* The chat loop. Returns the exit status. */
static int chat(run_opts *o, cn_engine *e, const cn_text *t) {
    int tty_in = isatty(STDIN_FILENO);
    FILE *say = o->json ? stderr : stdout; /* command feedback; stdout keeps --json lines only */
    cn_lineedit *le;
    if (cn_lineedit_open(&le, tty_in && isatty(STDOUT_FILENO))) {
        fputs("cairn: out of memory\n", stderr);
        return 1;
    }
    if (tty_in && !o->quiet) fputs("Type /? for help, /bye to leave.\n", say);
    convo cv = {0};
    cn_strbuf msg = CN_STRBUF_INIT;
    while (read_message(le, &msg, tty_in)) {
        const char *s = msg.p ? msg.p + strspn(msg.p, " \t\n") : "";
        if (!*s) continue;
        if (*s == '/') {
            size_t k = strcspn(s, " \t\n");
            if (k == 4 && !strncmp(s, "/bye", 4)) break;
            if (k == 6 && !strncmp(s, "/clear", 6)) {
                cv.n = 0;
                if (!o->quiet) fputs("Cleared the conversation.\n", say);
            } else if (k == 6 && !strncmp(s, "/think", 6)) {
                o->think = 1;
                if (!o->quiet) fputs("Reasoning on.\n", say);
            } else if (k == 9 && !strncmp(s, "/no_think", 9)) {
                o->think = 0;
                if (!o->quiet) fputs("Reasoning off.\n", say);
            } else if ((k == 2 && !strncmp(s, "/?", 2)) || (k == 5 && !strncmp(s, "/help", 5))) {
                help(say);
            } else {
                fprintf(say, "Unknown command '%.*s'. Type /? for help.\n", (int)k, s);
            }
            fflush(say);
            continue;
        }
        turn(o, e, t, &cv, msg.p); /* errors are reported; the chat goes on */
        g_interrupted = 0;         /* a Ctrl-C stopped that answer only */
    }
    cn_strbuf_free(&msg);
    free(cv.ids);
    cn_lineedit_close(le);
    return 0;
}

/* ---- the command ---------------------------------------------------------------------------- */

/* The basename of dir, without trailing slashes, into buf. */
static void base_name(const char *dir, char *buf, size_t n) {
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/') len--;
    size_t start = len;
    while (start > 0 && dir[start - 1] != '/') start--;
    snprintf(buf, n, "%.*s", (int)(len - start), dir + start);
}

int cn_cmd_run(int argc, char **argv) {
    const char *model = NULL;
    int threads = 0, ubatch = 0, no_think = 0;
    run_opts o = {.think = 1, .max_tokens = -1};
    cn_sampler_params_default(&o.sampling);
    cn_engine_opts eo = {.cache = {.pre_end = 4}};
    uint64_t cache_gpu = CN_CLI_UNSET;
    cn_flag flags[] = {
        {"model", CN_FLAG_STR, &model, "DIR", "model directory (default: $CAIRN_MODEL, else " CN_CLI_DEFAULT_MODEL ")", 0, 0},
        {"system", CN_FLAG_STR, &o.system, "TEXT", "system message", 0, 0},
        {"no-think", CN_FLAG_BOOL, &no_think, NULL, "answer without reasoning (/think turns it back on)", 0, 0},
        {"max-tokens", CN_FLAG_INT, &o.max_tokens, "N", "tokens per answer (default: until the model stops)", 0, 0},
        {"temperature", CN_FLAG_FLOAT, &o.sampling.temperature, "T", "0 = greedy (default 0.8)", 0, 0},
        {"top-k", CN_FLAG_INT, &o.sampling.top_k, "K", "keep the K most likely tokens (default 40)", 0, 0},
        {"top-p", CN_FLAG_FLOAT, &o.sampling.top_p, "P", "nucleus sampling (default 0.9)", 0, 0},
        {"min-p", CN_FLAG_FLOAT, &o.sampling.min_p, "M", "drop tokens below M x the most likely", 0, 0},
        {"repeat-penalty", CN_FLAG_FLOAT, &o.sampling.repeat_penalty, "R", "penalise recent tokens", 0, 0},
        {"presence-penalty", CN_FLAG_FLOAT, &o.sampling.presence_penalty, "P", "", 0, 0},
        {"frequency-penalty", CN_FLAG_FLOAT, &o.sampling.frequency_penalty, "F", "", 0, 0},
        {"seed", CN_FLAG_U64, &o.sampling.seed, "S", "sampling seed (default 0)", 0, 0},
        {"ctx", CN_FLAG_INT, &eo.ctx, "N", "context length in tokens: the whole conversation (default: the model's max_position_embeddings, lowered to fit memory)", 0, 0},
        {"chunk", CN_FLAG_INT, &eo.chunk, "N", "prompt tokens per forward (default 512 on the CPU, --ubatch on a GPU)", 0, 0},
        {"cache-ram", CN_FLAG_SIZE, &eo.cache.ram_budget, "SIZE", "host RAM for restore points (default 4G)", 0, 0},
        {"cache-gpu", CN_FLAG_SIZE, &cache_gpu, "SIZE", CN_CLI_CACHE_GPU_HELP, 0, 0},
        {"cache-dir", CN_FLAG_STR, &eo.cache_dir, "DIR", "keep restore points on disk in DIR", 0, 0},
        {"cache-disk", CN_FLAG_SIZE, &eo.disk_budget, "SIZE", "disk for restore points under --cache-dir (default 16G)", 0, 0},
        {"threads", CN_FLAG_INT, &threads, "N", "CPU threads (default: all cores)", 0, 0},
        {"ubatch", CN_FLAG_INT, &ubatch, "N", "tokens per forward chunk of scratch (default 1024 on the CPU, 2048 on a GPU)", 0, 0},
        {"verbose", CN_FLAG_BOOL, &o.verbose, NULL, "print token counts and timings after each answer", 0, 0},
        {"quiet", CN_FLAG_BOOL, &o.quiet, NULL, "print nothing but answers and errors", 0, 0},
        {"json", CN_FLAG_BOOL, &o.json, NULL, "one JSON object per answer instead of streamed text", 0, 0},
        {NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    const char *syn = "run [--model DIR] [--system TEXT] [--no-think] [--max-tokens N] "
                      "[--temperature T --top-k K --top-p P --min-p M --seed S] [--verbose] "
                      "[--quiet] [--json] [PROMPT]";
    char *pos[1];
    int n_pos = 0;
    int rc = cn_flags_parse_pos(flags, argc, argv, syn, pos, 1, &n_pos);
    if (rc) return rc > 0 ? 0 : 2;
    if (o.max_tokens < -1 || eo.ctx < 0 || eo.chunk < 0) {
        fprintf(stderr, "cairn: --max-tokens, --ctx and --chunk must be >= 0\n");
        return 2;
    }
    if (eo.disk_budget && !eo.cache_dir) {
        fprintf(stderr, "cairn: --cache-disk needs --cache-dir\n");
        return 2;
    }
    char model_buf[4096];
    if (!model) {
        if (cn_cli_default_model(model_buf, sizeof model_buf)) return 2;
        model = model_buf;
    }
    if (no_think) o.think = 0;
    char name[256];
    base_name(model, name, sizeof name);
    o.name = name;

    cn_backend *b = NULL;
    cn_model *m = NULL;
    cn_engine *e = NULL;
    cn_text *t = NULL;
    cn_err err;
    cn_err_clear(&err);
    int status = 1, handler = 0;
    struct sigaction sa, old;
    cn_cli_progress prog;
    cn_cli_progress_begin(&prog, name, !o.quiet);
    if (cn_cli_open_model_progress(model, NULL, threads, ubatch, &prog, &b, &m)) return 1;
    cn_cli_progress_stage(&prog, "loading the tokenizer");
    if ((rc = cn_text_open(&t, model, cn_model_config(m)->model_type, &err))) {
        cn_cli_progress_clear(&prog);
        fprintf(stderr, "cairn: %s\n", err.msg);
        goto done;
    }
    eo.cache.dev_budget = cn_cli_dev_budget(cache_gpu, b);
    cn_ctx_plan plan;
    if ((rc = cn_ctx_plan_make(cn_model_config(m), eo.ctx, cn_ctx_budget(m, &eo.cache), &plan))) goto done;
    eo.ctx = plan.ctx;
    cn_cli_progress_stage(&prog, "state for %d tokens", eo.ctx);
    if ((rc = cn_engine_open(&e, m, &eo, &err))) {
        cn_cli_progress_clear(&prog);
        fprintf(stderr, "cairn: %s\n", err.msg);
        goto done;
    }
    cn_model_stats st;
    cn_model_stats_get(m, &st);
    cn_cli_progress_done(&prog, st.params);
    char plan_line[400];
    if (o.verbose && !o.quiet) fprintf(stderr, "cairn: %s\n", cn_ctx_plan_line(&plan, plan_line, sizeof plan_line));

    /* No SA_RESTART: a Ctrl-C at the prompt interrupts the read, and the chat ends. */
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old);
    handler = 1;
    if (n_pos == 1) {
        convo cv = {0};
        rc = turn(&o, e, t, &cv, pos[0]);
        free(cv.ids);
        status = rc == CN_ECANCELED ? 130 : rc ? 1 : 0;
    } else {
        status = chat(&o, e, t);
    }
done:
    /* Closing the engine waits for the cache writer; the handler stays until then. */
    cn_engine_close(e);
    if (handler) sigaction(SIGINT, &old, NULL);
    cn_text_close(t);
    cn_cli_close_model(b, m);
    return status;
}
