/* test_run_cli.c - `cairn run` and the script-facing flags of `cairn serve`, through the binary.
 *
 * The tiny synthetic model answers gibberish, so these tests hold the structure: exit codes, what
 * goes to stdout and stderr, one answer per message, the conversation reusing the prefix cache
 * (--verbose's cached count), /clear, multi-line input, Ctrl-C at the prompt; and serve's --json
 * ready line and --quiet. Everything runs without a terminal (pipes and files) except the line
 * editing, which runs on a pseudo-terminal; the other terminal-only extras (dimmed thinking,
 * spinner, loading line) are not exercised here. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cjson/cJSON.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include "test_util.h"

static char g_tmp[512], g_model[600];

/* A whole file as a string; the random model may write NUL bytes, which become '?' here. */
static char *read_text(const char *path) {
    size_t n = 0;
    char *s = tu_read_file(path, &n);
    for (size_t i = 0; s && i < n; i++)
        if (!s[i]) s[i] = '?';
    return s;
}

/* Runs a shell command with stdin from the string in (may be NULL: empty); returns its exit
 * status, stdout in *out and stderr in *err (optional, caller frees). */
static int run(const char *in, char **out, char **err, const char *fmt, ...) {
    char cmd[4096], pi[600], po[600], pe[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    snprintf(pi, sizeof pi, "%s/in.txt", g_tmp);
    snprintf(po, sizeof po, "%s/out.txt", g_tmp);
    snprintf(pe, sizeof pe, "%s/err.txt", g_tmp);
    FILE *f = fopen(pi, "w");
    assert_non_null(f);
    if (in) fputs(in, f);
    fclose(f);
    char full[6000];
    snprintf(full, sizeof full, "%s <'%s' >'%s' 2>'%s'", cmd, pi, po, pe);
    int st = system(full);
    if (out) *out = read_text(po);
    if (err) *err = read_text(pe);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The --verbose lines "cairn: prompt N tokens (C cached, E evaluated) in T ms, generated G ...":
 * up to max of them, in order. Returns how many there were. */
static int stats(const char *err, int *prompt, int *cached, int *gen, int max) {
    int n = 0;
    for (const char *p = err; (p = strstr(p, "cairn: prompt ")); p++) {
        int a, c, e, g;
        double t;
        assert_int_equal(sscanf(p, "cairn: prompt %d tokens (%d cached, %d evaluated) in %lf ms, generated %d",
                                &a, &c, &e, &t, &g), 5);
        if (n < max) prompt[n] = a, cached[n] = c, gen[n] = g;
        n++;
    }
    return n;
}

static void test_usage(void **st) {
    (void)st;
    char *e = NULL;
    assert_int_equal(run(NULL, NULL, &e, "%s run --model %s --bogus", tu_cairn_bin(), g_model), 2);
    assert_non_null(strstr(e, "--bogus"));
    free(e);
    assert_int_equal(run(NULL, NULL, &e, "%s run --model %s --max-tokens -5 hi", tu_cairn_bin(), g_model), 2);
    free(e);
    assert_int_equal(run(NULL, NULL, &e, "%s run --model %s one two", tu_cairn_bin(), g_model), 2);
    free(e);
    /* no --model, no CAIRN_MODEL, no models/cobble where it runs nor beside the binary (a copy
     * of it in a scratch folder): the message says what to pass */
    assert_int_equal(run(NULL, NULL, &e, "mkdir -p '%s/bin' && cp %s '%s/bin/cairn' && cd '%s' && "
                         "env -u CAIRN_MODEL ./bin/cairn run hi", g_tmp, tu_cairn_bin(), g_tmp, g_tmp), 2);
    assert_non_null(strstr(e, "--model"));
    assert_non_null(strstr(e, "CAIRN_MODEL"));
    assert_non_null(strstr(e, "models/cobble"));
    free(e);
    /* CAIRN_MODEL is used as given: a missing folder is an error naming it */
    assert_int_equal(run(NULL, NULL, &e, "cd '%s' && CAIRN_MODEL='%s/absent' %s run hi", g_tmp, g_tmp, tu_cairn_bin()), 1);
    assert_non_null(strstr(e, "absent"));
    free(e);
    /* from another folder, the repository's binary finds models/cobble beside its build folder */
    char *o0 = NULL;
    assert_int_equal(run(NULL, &o0, &e, "cd '%s' && env -u CAIRN_MODEL %s run --json --max-tokens 2 hi",
                         g_tmp, tu_cairn_bin()), 0);
    assert_non_null(strstr(o0, "\"model\":\"cobble\""));
    free(o0);
    free(e);
    assert_int_equal(run(NULL, NULL, &e, "%s run --model %s/none hi", tu_cairn_bin(), g_tmp), 1);
    assert_non_null(strstr(e, "none"));
    free(e);
    char *o = NULL;
    assert_int_equal(run(NULL, &o, NULL, "%s run --help", tu_cairn_bin()), 0);
    assert_non_null(strstr(o, "PROMPT"));
    free(o);
}

/* One answer: exit 0, text on stdout, thinking marked (not a terminal), nothing else. */
static void test_one_shot(void **st) {
    (void)st;
    char *o = NULL, *e = NULL;
    assert_int_equal(run(NULL, &o, &e, "%s run --model %s --max-tokens 24 'Why is the sky blue?'",
                         tu_cairn_bin(), g_model), 0);
    assert_true(strlen(o) > 1);
    assert_int_equal(o[strlen(o) - 1], '\n');
    assert_null(strstr(o, "\033[")); /* no terminal, no escapes */
    assert_null(strstr(e, "cairn: prompt")); /* counts only with --verbose */
    if (strstr(o, "Thinking...")) assert_non_null(strstr(o, "...done thinking."));
    free(o);
    free(e);
    /* without reasoning the answer is all content */
    assert_int_equal(run(NULL, &o, NULL, "%s run --model %s --no-think --max-tokens 24 hello",
                         tu_cairn_bin(), g_model), 0);
    assert_true(strlen(o) > 1);
    assert_null(strstr(o, "Thinking..."));
    free(o);
}

/* --json: one object with the text and the counts. */
static void test_one_shot_json(void **st) {
    (void)st;
    char *o = NULL;
    assert_int_equal(run(NULL, &o, NULL, "%s run --model %s --json --max-tokens 8 hello", tu_cairn_bin(),
                         g_model), 0);
    cJSON *j = cJSON_Parse(o);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItem(j, "model")->valuestring, "tiny");
    assert_true(cJSON_IsString(cJSON_GetObjectItem(j, "content")));
    assert_true(cJSON_IsString(cJSON_GetObjectItem(j, "thinking")));
    assert_true(cJSON_IsArray(cJSON_GetObjectItem(j, "tool_calls")));
    assert_true(cJSON_GetObjectItem(j, "prompt_tokens")->valueint > 5);
    assert_int_equal(cJSON_GetObjectItem(j, "cached_tokens")->valueint, 0);
    int n = cJSON_GetObjectItem(j, "eval_count")->valueint;
    const char *why = cJSON_GetObjectItem(j, "done_reason")->valuestring;
    assert_true(n <= 8);
    assert_string_equal(why, n == 8 ? "length" : "stop");
    cJSON_Delete(j);
    free(o);
}

/* Two turns then /bye (what follows it is never read); the second turn restores the first
 * prompt and answer from the cache: all of it, but for the last token of an answer cut by
 * --max-tokens, which is never forwarded (one ended by end-of-sequence was). */
static void test_chat(void **st) {
    (void)st;
    char *o = NULL, *e = NULL;
    assert_int_equal(run("hello\nand a second question\n/bye\nnever read\n", &o, &e,
                         "%s run --model %s --max-tokens 10 --verbose", tu_cairn_bin(), g_model), 0);
    int prompt[4], cached[4], gen[4];
    assert_int_equal(stats(e, prompt, cached, gen, 4), 2);
    assert_int_equal(cached[0], 0);
    assert_true(gen[0] >= 0 && gen[0] <= 10);
    assert_true(prompt[1] > prompt[0] + gen[0]);
    assert_true(cached[1] > 0);
    assert_int_equal(cached[1], prompt[0] + gen[0] - (gen[0] == 10));
    assert_null(strstr(o, ">>>")); /* no prompt without a terminal */
    free(o);
    free(e);
}

/* /clear starts over: the same message gives the first prompt again. End of input ends the
 * chat with 0. */
static void test_clear(void **st) {
    (void)st;
    char *o = NULL, *e = NULL;
    assert_int_equal(run("hello\nmore\n/clear\nhello\n", &o, &e,
                         "%s run --model %s --max-tokens 6 --verbose", tu_cairn_bin(), g_model), 0);
    int prompt[4], cached[4], gen[4];
    assert_int_equal(stats(e, prompt, cached, gen, 4), 3);
    assert_true(prompt[1] > prompt[0]);
    assert_int_equal(prompt[2], prompt[0]);
    assert_true(cached[2] < prompt[0]); /* the prefix is cached, never the whole prompt */
    assert_non_null(strstr(o, "Cleared"));
    free(o);
    free(e);
}

/* Multi-line input: a trailing backslash and a """ block are one message each; commands and
 * blank lines are not messages. */
static void test_multiline_and_commands(void **st) {
    (void)st;
    char *o = NULL, *e = NULL;
    const char *in = "first line \\\nsecond line\n\n\"\"\"\nblock one\n/bye inside a block\n\"\"\"\n"
                     "/no_think\n/what\n\"\"\"one-line block\"\"\"\n";
    assert_int_equal(run(in, &o, &e, "%s run --model %s --max-tokens 4 --verbose", tu_cairn_bin(), g_model), 0);
    int prompt[4], cached[4], gen[4];
    assert_int_equal(stats(e, prompt, cached, gen, 4), 3);
    assert_non_null(strstr(o, "Reasoning off."));
    assert_non_null(strstr(o, "Unknown command '/what'"));
    free(o);
    free(e);
    /* --json: one object per answer on stdout, feedback on stderr */
    assert_int_equal(run("hi\n/clear\nhi again\n", &o, &e, "%s run --model %s --json --max-tokens 4",
                         tu_cairn_bin(), g_model), 0);
    int lines = 0;
    for (char *line = strtok(o, "\n"); line; line = strtok(NULL, "\n"), lines++) {
        cJSON *j = cJSON_Parse(line);
        assert_non_null(j);
        cJSON_Delete(j);
    }
    assert_int_equal(lines, 2);
    assert_non_null(strstr(e, "Cleared"));
    free(o);
    free(e);
}

/* Ctrl-C at the prompt ends the chat with 0. */
static void test_interrupt_at_prompt(void **st) {
    (void)st;
    char err[600];
    snprintf(err, sizeof err, "%s/int-err.txt", g_tmp);
    unlink(err);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[0], 0);
        close(fds[0]);
        close(fds[1]);
        if (!freopen("/dev/null", "w", stdout) || !freopen(err, "w", stderr)) _exit(99);
        execl(tu_cairn_bin(), "cairn", "run", "--model", g_model, "--max-tokens", "4", "--verbose", (char *)NULL);
        _exit(98);
    }
    close(fds[0]);
    assert_int_equal(write(fds[1], "hello\n", 6), 6);
    int answered = 0; /* the stats line comes after the answer: the chat waits at the prompt */
    for (int i = 0; i < 3000 && !answered; i++) {
        char *text = tu_read_file(err, NULL);
        answered = text && strstr(text, "cairn: prompt");
        free(text);
        if (!answered) sleep_ms(10);
    }
    sleep_ms(50);
    kill(pid, SIGINT);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    close(fds[1]);
    assert_true(answered);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* Reads what the pty says into buf (appending, NUL-terminated) until needle appears n times in
 * it, or ms milliseconds pass. Returns 1 when it did. */
static int pty_wait(int fd, char *buf, size_t cap, const char *needle, int n, int ms) {
    size_t len = strlen(buf);
    for (int t = 0; t < ms / 10; t++) {
        int hits = 0;
        for (const char *p = buf; (p = strstr(p, needle)); p++) hits++;
        if (hits >= n) return 1;
        struct pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, 10) > 0) {
            ssize_t k = read(fd, buf + len, cap - 1 - len);
            if (k <= 0) return 0;
            len += (size_t)k;
            buf[len] = '\0';
        }
    }
    return 0;
}

/* On a terminal the prompt is libedit's: Up brings back earlier lines (history), Ctrl-A moves to
 * the start of the line, and what was edited is what the chat runs. */
static void test_line_editing_on_a_terminal(void **st) {
    (void)st;
    int fd;
    pid_t pid = forkpty(&fd, NULL, NULL, NULL);
    assert_true(pid >= 0);
    char hist[700];
    snprintf(hist, sizeof hist, "%s/.cairn/history", g_tmp);
    unlink(hist);
    if (pid == 0) {
        setenv("TERM", "xterm", 1);
        setenv("HOME", g_tmp, 1); /* the history file goes there */
        execl(tu_cairn_bin(), "cairn", "run", "--model", g_model, "--max-tokens", "4", (char *)NULL);
        _exit(98);
    }
    static char buf[1 << 16];
    buf[0] = '\0';
    assert_true(pty_wait(fd, buf, sizeof buf, ">>> ", 1, 60000));
    assert_int_equal(write(fd, "/think\r", 7), 7);
    assert_true(pty_wait(fd, buf, sizeof buf, "Reasoning on.", 1, 60000));
    assert_int_equal(write(fd, "/no_think\r", 10), 10);
    assert_true(pty_wait(fd, buf, sizeof buf, "Reasoning off.", 1, 60000));
    assert_int_equal(write(fd, "\x1b[A\x1b[A\r", 7), 7); /* Up, Up: /think again */
    assert_true(pty_wait(fd, buf, sizeof buf, "Reasoning on.", 2, 60000));
    assert_int_equal(write(fd, "bye\x01/\r", 6), 6); /* "bye", Ctrl-A, "/": /bye */
    int status;
    for (int t = 0; t < 6000 && waitpid(pid, &status, WNOHANG) == 0; t++) {
        pty_wait(fd, buf, sizeof buf, "\x01never", 1, 10); /* keep the pty drained */
    }
    close(fd);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    char *h = read_text(hist); /* the lines as run, kept for the next run */
    assert_non_null(h);
    assert_non_null(strstr(h, "/no_think"));
    assert_non_null(strstr(h, "/bye"));
    free(h);
}

/* Polls the file at path for needle, up to ms milliseconds. */
static int wait_for(const char *path, const char *needle, int ms) {
    for (int i = 0; i < ms / 10; i++) {
        char *text = read_text(path);
        int hit = text && strstr(text, needle);
        free(text);
        if (hit) return 1;
        sleep_ms(10);
    }
    return 0;
}

/* Ctrl-C during a long prefill cancels that answer only: the chat goes on, the dropped turn (no
 * token was generated) is not in the next prompt, and /bye ends it with 0. */
static void test_interrupt_answer(void **st) {
    (void)st;
    char err[600];
    snprintf(err, sizeof err, "%s/cancel-err.txt", g_tmp);
    unlink(err);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fds[0], 0);
        close(fds[0]);
        close(fds[1]);
        if (!freopen("/dev/null", "w", stdout) || !freopen(err, "w", stderr)) _exit(99);
        setenv("CAIRN_LOG", "debug", 1); /* the cache logs its lookup as the prefill starts */
        execl(tu_cairn_bin(), "cairn", "run", "--model", g_model, "--max-tokens", "4", "--verbose", "--chunk", "1",
              "--threads", "1", "--ctx", "16384", (char *)NULL);
        _exit(98);
    }
    close(fds[0]);
    signal(SIGPIPE, SIG_IGN);
    size_t n = 0;
    char *longmsg = malloc(40000);
    for (int i = 0; i < 2500; i++) n += (size_t)sprintf(longmsg + n, "w%d ", i % 97);
    longmsg[n++] = '\n';
    assert_int_equal(write(fds[1], longmsg, n), (ssize_t)n);
    free(longmsg);
    int started = wait_for(err, "cache: miss", 30000);
    sleep_ms(50);
    kill(pid, SIGINT);
    int cancelled = wait_for(err, "interrupted", 30000);
    assert_int_equal(write(fds[1], "short\n/bye\n", 11), 11);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    close(fds[1]);
    assert_true(started);
    assert_true(cancelled);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    char *e = read_text(err);
    int prompt[4], cached[4], gen[4];
    assert_int_equal(stats(e, prompt, cached, gen, 4), 2);
    assert_int_equal(gen[0], 0);
    assert_true(prompt[1] < 100); /* a first turn again */
    free(e);
}

/* Starts `serve --json` (and --quiet when quiet), waits for its ready line on stdout, stops it
 * with SIGTERM. Returns the exit status; *out and *err get stdout and stderr (caller frees). */
static int serve_once(int quiet, char **out, char **err) {
    char po[600], pe[600];
    snprintf(po, sizeof po, "%s/serve-out.txt", g_tmp);
    snprintf(pe, sizeof pe, "%s/serve-err.txt", g_tmp);
    unlink(po); /* the last run's ready line must not pass for this one's */
    unlink(pe);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (!freopen(po, "w", stdout) || !freopen(pe, "w", stderr)) _exit(99);
        unsetenv("CAIRN_LOG");
        execl(tu_cairn_bin(), "cairn", "serve", "--model", g_model, "--port", "0", "--threads", "1", "--json",
              quiet ? "--quiet" : (char *)NULL, (char *)NULL);
        _exit(98);
    }
    int ready = 0;
    for (int i = 0; i < 6000 && !ready; i++) {
        char *text = read_text(po);
        ready = text && strchr(text, '\n');
        free(text);
        if (!ready) sleep_ms(10);
    }
    kill(pid, SIGTERM);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(ready);
    *out = read_text(po);
    *err = read_text(pe);
    if (!WIFEXITED(status)) fprintf(stderr, "serve: signal %d; stderr:\n%s\n", WTERMSIG(status), *err);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

/* The ready line: one line of JSON naming the address and the model. */
static void check_ready_line(const char *line) {
    assert_non_null(line);
    assert_non_null(strchr(line, '\n'));
    assert_int_equal(strchr(line, '\n')[1], '\0'); /* one line, nothing else on stdout */
    cJSON *j = cJSON_Parse(line);
    assert_non_null(j);
    assert_string_equal(cJSON_GetObjectItem(j, "status")->valuestring, "ready");
    assert_string_equal(cJSON_GetObjectItem(j, "host")->valuestring, "127.0.0.1");
    assert_string_equal(cJSON_GetObjectItem(j, "model")->valuestring, "tiny");
    int port = cJSON_GetObjectItem(j, "port")->valueint;
    assert_true(port > 0 && port < 65536);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
    assert_string_equal(cJSON_GetObjectItem(j, "url")->valuestring, url);
    cJSON_Delete(j);
}

/* serve --json prints one ready line on stdout; --quiet leaves stderr empty; without it stderr
 * keeps its usual lines (scripts and the e2e harness read the serving line). */
static void test_serve_json_quiet(void **st) {
    (void)st;
    char *o = NULL, *e = NULL;
    assert_int_equal(serve_once(1, &o, &e), 0);
    check_ready_line(o);
    assert_string_equal(e, "");
    free(o);
    free(e);
    assert_int_equal(serve_once(0, &o, &e), 0);
    check_ready_line(o);
    assert_non_null(strstr(e, "cairn: serving tiny on http://127.0.0.1:"));
    assert_non_null(strstr(e, "shutting down"));
    assert_null(strstr(e, "loading")); /* no terminal, no progress line */
    free(o);
    free(e);
}

static int setup(void **st) {
    (void)st;
    char *d = tu_mkdtemp("run-cli");
    if (!d) return -1;
    snprintf(g_tmp, sizeof g_tmp, "%s", d);
    free(d);
    snprintf(g_model, sizeof g_model, "%s/tiny", g_tmp);
    char cmd[2000];
    snprintf(cmd, sizeof cmd, "%s make-model --preset tiny --out %s >/dev/null", tu_cairn_bin(), g_model);
    return system(cmd) == 0 ? 0 : -1;
}

static int teardown(void **st) {
    (void)st;
    tu_rmtree(g_tmp);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_usage),
        cmocka_unit_test(test_one_shot),
        cmocka_unit_test(test_one_shot_json),
        cmocka_unit_test(test_chat),
        cmocka_unit_test(test_clear),
        cmocka_unit_test(test_multiline_and_commands),
        cmocka_unit_test(test_interrupt_at_prompt),
        cmocka_unit_test(test_line_editing_on_a_terminal),
        cmocka_unit_test(test_interrupt_answer),
        cmocka_unit_test(test_serve_json_quiet),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
