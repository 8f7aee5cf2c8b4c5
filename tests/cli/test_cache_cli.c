/* test_cache_cli.c - the disk tier end to end through the `cairn` command: a repeated generate
 * resumes from --cache-dir, a run interrupted by SIGINT (Ctrl-C) resumes in the next process
 * exactly where it stopped, `cairn cache` lists the nodes, and a corrupted file is reported by
 * `cairn cache` and skipped with a warning by generate. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include "test_util.h"

static char g_tmp[512];

/* Runs a shell command; returns its exit status, stdout in *out and stderr in *err (optional,
 * caller frees). */
static int run(char **out, char **err, const char *fmt, ...) {
    char cmd[4096], po[600], pe[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    snprintf(po, sizeof po, "%s/out.txt", g_tmp);
    snprintf(pe, sizeof pe, "%s/err.txt", g_tmp);
    char full[6000];
    snprintf(full, sizeof full, "%s >'%s' 2>'%s'", cmd, po, pe);
    int st = system(full);
    if (out) *out = tu_read_file(po, NULL);
    if (err) *err = tu_read_file(pe, NULL);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* A prompt of n ids in a file (for --tokens @FILE); returns its path. */
static char *prompt_file(const char *name, int n, uint32_t seed) {
    char *path = malloc(600);
    snprintf(path, 600, "%s/%s", g_tmp, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        fprintf(f, "%s%u", i ? "," : "", 20 + (seed >> 8) % 400);
    }
    fprintf(f, "\n");
    fclose(f);
    return path;
}

static int json_int(const char *text, const char *key) {
    cJSON *j = cJSON_Parse(text);
    assert_non_null(j);
    cJSON *v = cJSON_GetObjectItem(j, key);
    assert_non_null(v);
    int r = v->valueint;
    cJSON_Delete(j);
    return r;
}

/* The first node file under cache/<model>/ (the only model folder there). */
static char *some_node_file(const char *cache) {
    DIR *d = opendir(cache);
    assert_non_null(d);
    struct dirent *e;
    char model[1200] = "";
    while ((e = readdir(d)))
        if (strlen(e->d_name) == 16) snprintf(model, sizeof model, "%s/%s", cache, e->d_name);
    closedir(d);
    assert_true(model[0]);
    d = opendir(model);
    assert_non_null(d);
    char *path = NULL;
    while ((e = readdir(d)) && !path)
        if (strstr(e->d_name, ".cnsnap") && !strstr(e->d_name, ".bad")) {
            path = malloc(2000);
            snprintf(path, 2000, "%s/%s", model, e->d_name);
        }
    closedir(d);
    assert_non_null(path);
    return path;
}

/* A repeated run resumes from the folder; `cairn cache` lists its nodes; a spoiled file is
 * reported by `cairn cache` and skipped by generate, which still succeeds. */
static void test_repeat_and_list(void **st) {
    (void)st;
    char *ids = prompt_file("p200.txt", 200, 1), cache[600];
    snprintf(cache, sizeof cache, "%s/cache1", g_tmp);
    char *o = NULL, *e = NULL;
    const char *gen = "%s generate --model %s/nh-mix-f32 --tokens @%s --max-tokens 0 --json --cache-dir %s";
    assert_int_equal(run(&o, NULL, gen, tu_cairn_bin(), tu_data_dir(), ids, cache), 0);
    assert_int_equal(json_int(o, "cached_tokens"), 0);
    free(o);
    assert_int_equal(run(&o, NULL, gen, tu_cairn_bin(), tu_data_dir(), ids, cache), 0);
    assert_int_equal(json_int(o, "cached_tokens"), 196); /* the restore point 4 before the end */
    assert_int_equal(json_int(o, "prompt_eval_count"), 4);
    free(o);

    assert_int_equal(run(&o, NULL, "%s cache --cache-dir %s", tu_cairn_bin(), cache), 0);
    assert_non_null(strstr(o, "2 nodes")); /* [0, 196) and the frontier [196, 200) */
    assert_non_null(strstr(o, "   196     200"));
    assert_non_null(strstr(o, "total: 2 nodes in 1 model"));
    free(o);
    assert_int_equal(run(&o, NULL, "%s cache --cache-dir %s --model %s/nh-mix-f32", tu_cairn_bin(), cache, tu_data_dir()), 0);
    assert_non_null(strstr(o, "2 nodes"));
    free(o);
    assert_int_equal(run(&o, NULL, "%s cache --cache-dir %s --model %s/nh-fp8", tu_cairn_bin(), cache, tu_data_dir()), 0);
    assert_non_null(strstr(o, "no restore points"));
    free(o);

    /* spoil one file: listed as failing, skipped with a warning, moved aside by the next run */
    char *f = some_node_file(cache);
    size_t n = 0;
    char *b = tu_read_file(f, &n);
    assert_non_null(b);
    b[n / 2] ^= 0x10;
    FILE *fp = fopen(f, "wb");
    fwrite(b, 1, n, fp);
    fclose(fp);
    free(b);
    assert_int_equal(run(&o, NULL, "%s cache --cache-dir %s", tu_cairn_bin(), cache), 0);
    assert_non_null(strstr(o, "FAILS"));
    assert_non_null(strstr(o, "checksum mismatch"));
    assert_non_null(strstr(o, "1 failing verification"));
    free(o);
    assert_int_equal(run(&o, &e, gen, tu_cairn_bin(), tu_data_dir(), ids, cache), 0);
    assert_non_null(strstr(e, "skipping"));
    assert_non_null(strstr(e, "checksum mismatch"));
    assert_int_equal(json_int(o, "prompt_tokens"), 200);
    free(o);
    free(e);
    assert_int_equal(run(&o, NULL, "%s cache --cache-dir %s", tu_cairn_bin(), cache), 0);
    assert_non_null(strstr(o, "1 file set aside"));
    assert_non_null(strstr(o, "0 failing verification"));
    free(o);
    /* and the run rewrote what it lost: the next one resumes at 196 again */
    assert_int_equal(run(&o, NULL, gen, tu_cairn_bin(), tu_data_dir(), ids, cache), 0);
    assert_int_equal(json_int(o, "cached_tokens"), 196);
    free(o);
    free(f);
    free(ids);
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Starts `generate` on an n-token prompt, one token per forward, and sends it SIGINT once the
 * prefill is under way. Returns the exit status (130 when interrupted); *stopped gets the prompt
 * tokens it evaluated. */
static int interrupt_run(const char *model, const char *ids, const char *cache, int *stopped) {
    char out[600], err[600], tokens[700];
    snprintf(out, sizeof out, "%s/int-out.txt", g_tmp);
    snprintf(err, sizeof err, "%s/int-err.txt", g_tmp);
    snprintf(tokens, sizeof tokens, "@%s", ids);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (!freopen(out, "w", stdout) || !freopen(err, "w", stderr)) _exit(99);
        setenv("CAIRN_LOG", "debug", 1); /* the cache logs its lookup at debug level */
        execl(tu_cairn_bin(), "cairn", "generate", "--model", model, "--tokens", tokens, "--max-tokens", "0",
              "--chunk", "1", "--threads", "1", "--json", "--cache-dir", cache, (char *)NULL);
        _exit(98);
    }
    /* The prefill has started once the cache logs its lookup (the handler is in place by then). */
    int started = 0;
    for (int i = 0; i < 6000 && !started; i++) {
        char *text = tu_read_file(err, NULL);
        started = text && strstr(text, "cache: miss");
        free(text);
        if (!started) sleep_ms(10);
    }
    sleep_ms(50);
    kill(pid, SIGINT);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(started);
    assert_true(WIFEXITED(status));
    char *o = tu_read_file(out, NULL);
    assert_non_null(o);
    *stopped = json_int(o, "prompt_eval_count");
    if (WEXITSTATUS(status) == 130) assert_non_null(strstr(o, "\"done_reason\":\"canceled\""));
    free(o);
    return WEXITSTATUS(status);
}

/* Ctrl-C during the prefill: the process exits 130 after writing what it absorbed; the next
 * process resumes exactly there. */
static void test_interrupt_resumes(void **st) {
    (void)st;
    char model[600], cache[600];
    snprintf(model, sizeof model, "%s/nh-mix-f32", tu_data_dir());
    int n = 1500, stopped = 0, status = 0;
    char *ids = NULL;
    /* A loaded machine could let the prefill finish before the signal lands: try longer. */
    for (int attempt = 0; attempt < 3; attempt++, n *= 2) {
        free(ids);
        ids = prompt_file("long.txt", n, 2 + (uint32_t)attempt);
        snprintf(cache, sizeof cache, "%s/cache-int%d", g_tmp, attempt);
        status = interrupt_run(model, ids, cache, &stopped);
        if (status != 0) break;
        fprintf(stderr, "the prefill of %d tokens ended before the signal; trying a longer one\n", n);
    }
    assert_int_equal(status, 130);
    assert_true(stopped > 0 && stopped < n);
    char *o = NULL;
    /* on disk: a node ends where the interrupted run stopped (the next run merges it away) */
    assert_int_equal(run(&o, NULL, "%s cache --cache-dir %s", tu_cairn_bin(), cache), 0);
    char end[32];
    snprintf(end, sizeof end, " %d ", stopped);
    assert_non_null(strstr(o, end));
    assert_null(strstr(o, "FAILS"));
    free(o);
    assert_int_equal(run(&o, NULL, "%s generate --model %s --tokens @%s --max-tokens 0 --json --cache-dir %s",
                         tu_cairn_bin(), model, ids, cache), 0);
    assert_int_equal(json_int(o, "cached_tokens"), stopped);
    assert_int_equal(json_int(o, "prompt_eval_count"), n - stopped);
    free(o);
    free(ids);
}

static void test_usage(void **st) {
    (void)st;
    char *e = NULL;
    assert_int_equal(run(NULL, &e, "%s cache", tu_cairn_bin()), 2);
    assert_non_null(strstr(e, "--cache-dir"));
    free(e);
    assert_int_equal(run(NULL, &e, "%s generate --model x --tokens 1 --cache-disk 1G", tu_cairn_bin()), 2);
    assert_non_null(strstr(e, "--cache-dir"));
    free(e);
    assert_int_equal(run(NULL, &e, "%s generate --model x --tokens 1 --cache-dir /tmp --cache-disk 12Q", tu_cairn_bin()), 2);
    free(e);
    assert_int_equal(run(NULL, &e, "%s cache --cache-dir %s/none", tu_cairn_bin(), g_tmp), 1);
    assert_non_null(strstr(e, "none"));
    free(e);
}

static int setup(void **st) {
    (void)st;
    char *d = tu_mkdtemp("cache-cli");
    if (!d) return -1;
    snprintf(g_tmp, sizeof g_tmp, "%s", d);
    free(d);
    return 0;
}

static int teardown(void **st) {
    (void)st;
    tu_rmtree(g_tmp);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_usage),
        cmocka_unit_test(test_repeat_and_list),
        cmocka_unit_test(test_interrupt_resumes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
