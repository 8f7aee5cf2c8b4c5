/* cmd_serve.c - `cairn serve`: load one model and serve the Ollama, OpenAI and Anthropic APIs
 * until SIGINT or SIGTERM.
 *
 * The signals are blocked before any thread starts and taken with sigwait() here, so no handler
 * and no global flag is needed; every server thread inherits the blocked mask. The listening
 * address comes from --host/--port, else CAIRN_HOST ("HOST" or "HOST:PORT"), else 127.0.0.1:11435:
 * loopback unless told otherwise. The line "cairn: serving NAME on http://HOST:PORT" on stderr
 * says the server is ready (tests read the port from it when --port 0 picks one). On a terminal,
 * a progress line shows the model loading first. For scripts: --json also prints one line on
 * stdout when ready, {"status":"ready","host":…,"port":…,"url":…,"model":…,"pid":…,"load_ms":…};
 * --quiet prints nothing but errors (and logs only errors unless CAIRN_LOG says otherwise).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/log.h"
#include "cli/cli.h"
#include "cli/cli_util.h"
#include "cli/flags.h"
#include "engine/ctx_plan.h"
#include "engine/engine.h"
#include "server/server.h"
#include "text/text.h"

/* The basename of dir, without trailing slashes, into buf. */
static void base_name(const char *dir, char *buf, size_t n) {
    size_t len = strlen(dir);
    while (len > 1 && dir[len - 1] == '/') len--;
    size_t start = len;
    while (start > 0 && dir[start - 1] != '/') start--;
    snprintf(buf, n, "%.*s", (int)(len - start), dir + start);
}

/* CAIRN_HOST "HOST" or "HOST:PORT" (IPv6 as "[::1]:PORT") into host / port. */
static int parse_host_env(const char *v, char *host, size_t hn, int *port) {
    const char *colon = strrchr(v, ':');
    if (v[0] == '[') {
        const char *close = strchr(v, ']');
        if (!close) return -1;
        snprintf(host, hn, "%.*s", (int)(close - v - 1), v + 1);
        if (close[1] == ':') *port = atoi(close + 2);
        return 0;
    }
    if (colon && strchr(v, ':') == colon) {
        snprintf(host, hn, "%.*s", (int)(colon - v), v);
        *port = atoi(colon + 1);
        return 0;
    }
    snprintf(host, hn, "%s", v);
    return 0;
}

/* The --json ready line on stdout. Returns 0, CN_ENOMEM or CN_EIO. */
static int print_ready(const char *host, int port, const char *url, const char *name, double load_ms) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return CN_ENOMEM;
    cJSON_AddStringToObject(o, "status", "ready");
    cJSON_AddStringToObject(o, "host", host);
    cJSON_AddNumberToObject(o, "port", port);
    cJSON_AddStringToObject(o, "url", url);
    cJSON_AddStringToObject(o, "model", name);
    cJSON_AddNumberToObject(o, "pid", (double)getpid());
    cJSON_AddNumberToObject(o, "load_ms", (double)(int64_t)(load_ms * 1000) / 1000);
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!text) return CN_ENOMEM;
    int ok = printf("%s\n", text) > 0 && fflush(stdout) == 0;
    cJSON_free(text);
    return ok ? CN_OK : CN_EIO;
}

/* --alias PATTERN=MODEL: the patterns into pats (copies of at most 255 bytes), MODEL checked
 * against the served name. Returns 0 or 2 (message printed). */
static int read_aliases(const cn_flag_list *l, const char *name, char pats[][256], const char **out) {
    for (int i = 0; i < l->n; i++) {
        const char *eq = strrchr(l->v[i], '=');
        if (!eq || eq == l->v[i] || strcmp(eq + 1, name) || eq - l->v[i] > 255) {
            fprintf(stderr, "cairn: --alias %s: give PATTERN=%s (PATTERN: a model name, '*' matches "
                            "any run; the model: the one served)\n", l->v[i], name);
            return 2;
        }
        snprintf(pats[i], 256, "%.*s", (int)(eq - l->v[i]), l->v[i]);
        out[i] = pats[i];
    }
    return 0;
}

int cn_cmd_serve(int argc, char **argv) {
    const char *model = NULL, *name = NULL, *host = NULL, *api_key = NULL, *cache_dir = NULL;
    const char *backend = NULL;
    int port = 11435, threads = 0, ubatch = 0, max_queue = 64, quiet = 0, json = 0, parallel = 1;
    float finish_cancelled = 120, keepalive = 5, header_timeout = 30;
    uint64_t max_body = 32u << 20;
    cn_engine_opts eo = {.cache = {.pre_end = 4}};
    uint64_t cache_gpu = CN_CLI_UNSET;
    cn_flag_list alias = {{0}, 0};
    char alias_pat[CN_FLAG_LIST_MAX][256];
    const char *alias_v[CN_FLAG_LIST_MAX];
    cn_flag flags[] = {
        {"model", CN_FLAG_STR, &model, "DIR", "model directory (default: $CAIRN_MODEL, else " CN_CLI_DEFAULT_MODEL ")", 0, 0},
        {"name", CN_FLAG_STR, &name, "NAME", "served model name (default: the directory's basename)", 0, 0},
        {"host", CN_FLAG_STR, &host, "ADDR", "listen address (default 127.0.0.1, or CAIRN_HOST)", 0, 0},
        {"port", CN_FLAG_INT, &port, "N", "listen port (default 11435; 0 picks a free one)", 0, 0},
        {"ctx", CN_FLAG_INT, &eo.ctx, "N", "context length in tokens (default: the model's max_position_embeddings, lowered to fit memory)", 0, 0},
        {"cache-ram", CN_FLAG_SIZE, &eo.cache.ram_budget, "SIZE", "host RAM for restore points (default 4G)", 0, 0},
        {"cache-gpu", CN_FLAG_SIZE, &cache_gpu, "SIZE", CN_CLI_CACHE_GPU_HELP, 0, 0},
        {"cache-dir", CN_FLAG_STR, &cache_dir, "DIR", "disk tier for restore points (survives restarts)", 0, 0},
        {"cache-disk", CN_FLAG_SIZE, &eo.disk_budget, "SIZE", "disk for restore points (default 16G)", 0, 0},
        {"api-key", CN_FLAG_STR, &api_key, "KEY", "require Authorization: Bearer KEY (or x-api-key: KEY)", 0, 0},
        {"alias", CN_FLAG_LIST, &alias, "PATTERN=MODEL", "serve requests for names matching PATTERN ('claude-*') with the model (repeatable)", 0, 0},
        {"parallel", CN_FLAG_INT, &parallel, "N", "requests that run at once, their steps batched into one forward (default 1); the context is per request", 0, 0},
        {"max-queue", CN_FLAG_INT, &max_queue, "N", "requests that may wait before 503 (default 64)", 0, 0},
        {"finish-cancelled", CN_FLAG_FLOAT, &finish_cancelled, "SECONDS",
         "keep prefilling a prompt whose client left, while idle, up to SECONDS (default 120; 0: off)", 0, 0},
        {"keepalive", CN_FLAG_FLOAT, &keepalive, "SECONDS", "idle seconds before keep-alive bytes (default 5)", 0, 0},
        {"max-body", CN_FLAG_SIZE, &max_body, "SIZE", "largest request body (default 32M)", 0, 0},
        {"header-timeout", CN_FLAG_FLOAT, &header_timeout, "SECONDS",
         "seconds a connection has to send a request's headers, idle keep-alive included (default 30)", 0, 0},
        {"chunk", CN_FLAG_INT, &eo.chunk, "N", "prompt tokens per forward (default 512 on the CPU, --ubatch on a GPU)", 0, 0},
        {"cache-spacing", CN_FLAG_INT, &eo.cache.spacing, "N", "a restore point every N prompt tokens (default 1024)", 0, 0},
        {"no-speculate", CN_FLAG_BOOL, &eo.no_speculate, NULL, "decode plainly even with an MTP head (requests may also set options.speculate)", 0, 0},
        {"threads", CN_FLAG_INT, &threads, "N", "CPU threads (default: all cores)", 0, 0},
        {"backend", CN_FLAG_STR, &backend, "NAME", "cpu, cuda or cuda:N (default: $CAIRN_BACKEND or cpu)", 0, 0},
        {"ubatch", CN_FLAG_INT, &ubatch, "N", "tokens per forward chunk of scratch (default 1024 on the CPU, 2048 on a GPU)", 0, 0},
        {"quiet", CN_FLAG_BOOL, &quiet, NULL, "print nothing but errors", 0, 0},
        {"json", CN_FLAG_BOOL, &json, NULL, "print one JSON line on stdout when ready (host, port, model)", 0, 0},
        {NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    const char *syn = "serve [--model DIR] [--name NAME] [--host 127.0.0.1] [--port 11435] [--ctx N] "
                      "[--cache-ram SIZE] [--cache-dir DIR] [--api-key KEY] [--parallel N] [--max-queue N] "
                      "[--finish-cancelled SECONDS] [--quiet] [--json]";
    int rc = cn_flags_parse(flags, argc, argv, syn);
    if (rc) return rc > 0 ? 0 : 2;
    /* A server logs one line per request unless CAIRN_LOG (or --quiet) says otherwise. */
    if (!getenv("CAIRN_LOG")) cn_log_set_level(quiet ? CN_LOG_ERROR : CN_LOG_INFO);
    eo.cache_dir = cache_dir;
    if (eo.disk_budget && !cache_dir) {
        fprintf(stderr, "cairn: --cache-disk needs --cache-dir\n");
        return 2;
    }
    if (port < 0 || port > 65535 || eo.ctx < 0 || eo.chunk < 0 || eo.cache.spacing < 0 ||
        max_queue < 1 || max_queue > 100000 || parallel < 1 || parallel > 64 || finish_cancelled < 0 ||
        finish_cancelled > 3600 ||
        keepalive <= 0 || header_timeout <= 0 || max_body < 1024) {
        fprintf(stderr, "cairn: out of range: --port 0..65535, --ctx/--chunk/--cache-spacing >= 0, "
                        "--max-queue 1..100000, --parallel 1..64, --finish-cancelled 0..3600, --keepalive > 0, "
                        "--header-timeout > 0, --max-body >= 1K\n");
        return 2;
    }
    char host_buf[256];
    const char *env_host = getenv("CAIRN_HOST");
    if (!host && env_host && *env_host) {
        int p = -1;
        parse_host_env(env_host, host_buf, sizeof host_buf, &p);
        host = host_buf;
        if (p >= 0 && !flags[3].seen) port = p;
    }
    if (!host) host = "127.0.0.1";
    char model_buf[4096];
    if (!model) {
        if (cn_cli_default_model(model_buf, sizeof model_buf)) return 2;
        model = model_buf;
    }
    char name_buf[256];
    if (!name) {
        base_name(model, name_buf, sizeof name_buf);
        name = name_buf;
    }
    if (read_aliases(&alias, name, alias_pat, alias_v)) return 2;

    /* SIGINT/SIGTERM are taken by sigwait below; block them before any thread exists. */
    sigset_t sigs, old;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, &old);
    signal(SIGPIPE, SIG_IGN); /* a vanished client must not kill the server */

    cn_backend *b = NULL;
    cn_model *m = NULL;
    cn_engine *e = NULL;
    cn_text *t = NULL;
    cn_server *srv = NULL;
    cn_err err;
    cn_err_clear(&err);
    int status = 1;
    cn_cli_progress prog;
    cn_cli_progress_begin(&prog, name, !quiet);
    if (cn_cli_open_model_progress(model, backend, threads, ubatch, &prog, &b, &m)) goto done;
    const cn_config *c = cn_model_config(m);
    cn_cli_progress_stage(&prog, "loading the tokenizer");
    if ((rc = cn_text_open(&t, model, c->model_type, &err))) {
        cn_cli_progress_clear(&prog);
        fprintf(stderr, "cairn: %s\n", err.msg);
        goto done;
    }
    eo.cache.dev_budget = cn_cli_dev_budget(cache_gpu, b);
    /* every lane holds a whole state: each gets its share of the memory */
    cn_ctx_plan plan;
    uint64_t budget = cn_ctx_budget(m, &eo.cache);
    if (budget != CN_CTX_UNKNOWN) budget /= (uint64_t)parallel;
    if ((rc = cn_ctx_plan_make(c, eo.ctx, budget, &plan))) goto done;
    eo.ctx = plan.ctx;
    eo.lanes = parallel;
    if (cache_dir) cn_cli_progress_stage(&prog, "state for %d tokens, restore points in %s", eo.ctx, cache_dir);
    else cn_cli_progress_stage(&prog, "state for %d tokens", eo.ctx);
    if ((rc = cn_engine_open(&e, m, &eo, &err))) {
        cn_cli_progress_clear(&prog);
        fprintf(stderr, "cairn: %s\n", err.msg);
        goto done;
    }
    cn_model_stats st;
    cn_model_stats_get(m, &st);
    cn_cli_progress_done(&prog, st.params);
    char plan_line[400];
    if (!quiet && parallel > 1)
        fprintf(stderr, "cairn: %s, for each of %d requests at once\n", cn_ctx_plan_line(&plan, plan_line, sizeof plan_line),
                parallel);
    else if (!quiet)
        fprintf(stderr, "cairn: %s\n", cn_ctx_plan_line(&plan, plan_line, sizeof plan_line));
    uint64_t bytes = 0, most = 0;
    int qd = 0;
    for (int i = 0; i < CN_DTYPE_COUNT; i++) {
        bytes += st.bytes[i];
        if (st.bytes[i] > most) most = st.bytes[i], qd = i;
    }
    char cfg[1200];
    snprintf(cfg, sizeof cfg, "%s/config.json", model);
    struct stat sb;
    cn_model_card card = {
        .name = name,
        .family = c->model_type,
        .size_bytes = bytes,
        .params = st.params,
        .quantization = cn_dtype_name((cn_dtype)qd),
        .modified = stat(cfg, &sb) == 0 ? (int64_t)sb.st_mtime : 0,
        .ctx = eo.ctx,
        .max_ctx = c->max_position_embeddings,
    };
    const char *canned = getenv("CAIRN_TEST_CANNED_OUTPUT");
    if (canned && *canned)
        fprintf(stderr, "cairn: CAIRN_TEST_CANNED_OUTPUT is set: every answer is that canned text "
                        "(for tests only)\n");
    else
        canned = NULL;
    /* TESTS ONLY: the answer to a request whose last message is a tool result (an agent's tool
     * round trip: the canned call, then this final text); unset, such requests get the above. */
    const char *after_tool = getenv("CAIRN_TEST_CANNED_AFTER_TOOL");
    if (after_tool && *after_tool)
        fprintf(stderr, "cairn: CAIRN_TEST_CANNED_AFTER_TOOL is set: an answer after a tool result "
                        "is that canned text (for tests only)\n");
    else
        after_tool = NULL;
    cn_server_opts so = {
        .host = host,
        .port = port,
        .api_key = api_key,
        .aliases = alias_v,
        .n_aliases = alias.n,
        .max_body = (size_t)max_body,
        .max_queue = max_queue,
        .finish_cancelled_s = finish_cancelled,
        .keepalive_s = keepalive,
        .header_timeout_s = header_timeout,
        .test_canned_output = canned,
        .test_canned_after_tool = after_tool,
    };
    if ((rc = cn_server_open(&srv, &so, e, t, &card, &err))) {
        fprintf(stderr, "cairn: %s\n", err.msg);
        goto done;
    }
    char url[400];
    snprintf(url, sizeof url, "http://%s%s%s:%d", strchr(host, ':') ? "[" : "", host,
             strchr(host, ':') ? "]" : "", cn_server_port(srv));
    if (!quiet) fprintf(stderr, "cairn: serving %s on %s\n", name, url);
    if (json && (rc = print_ready(host, cn_server_port(srv), url, name, cn_cli_progress_ms(&prog)))) {
        fprintf(stderr, "cairn: cannot write the ready line: %s\n", cn_strerror(rc));
        goto done;
    }
    int sig = 0;
    sigwait(&sigs, &sig);
    if (!quiet) fprintf(stderr, "cairn: %s, shutting down\n", sig == SIGINT ? "interrupted" : "terminated");
    status = 0;
done:
    cn_server_close(srv);
    cn_engine_close(e);
    cn_text_close(t);
    if (m) cn_cli_close_model(b, m);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return status;
}
