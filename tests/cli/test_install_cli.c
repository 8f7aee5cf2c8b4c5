/* test_install_cli.c - what `make install` lays out works from any folder: `cairn --version`
 * names the version and the commit, and an installed binary (PREFIX/bin/cairn) finds the default
 * model in PREFIX/share/cairn/models/cobble without --model or $CAIRN_MODEL. The layout is made
 * by `cmake --install` into a scratch prefix, as `make install PREFIX=…` runs it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <unistd.h>

#include "test_util.h"

static char g_tmp[512];

static void test_version(void **st) {
    (void)st;
    char *o = NULL;
    assert_int_equal(tu_sh(g_tmp, 1, &o, "%s --version", tu_cairn_bin()), 0);
    assert_non_null(strstr(o, "cairn 0."));
    assert_non_null(strstr(o, "(commit "));
    assert_null(strstr(o, "(commit )"));
    free(o);
}

/* The build folder is the cairn binary's; cmake --install copies from it. */
static void test_installed_finds_its_model(void **st) {
    (void)st;
    char build[1024], *o = NULL;
    snprintf(build, sizeof build, "%s", tu_cairn_bin());
    char *slash = strrchr(build, '/');
    assert_non_null(slash);
    *slash = '\0';
    int rc = tu_sh(g_tmp, 1, &o, "cmake --install '%s' --prefix '%s/prefix'", build, g_tmp);
    if (rc) fprintf(stderr, "%s\n", o);
    assert_int_equal(rc, 0);
    free(o);
    /* from a folder with no models/ in it, and no CAIRN_MODEL */
    rc = tu_sh(g_tmp, 1, &o,
               "cd '%s' && env -u CAIRN_MODEL '%s/prefix/bin/cairn' run --max-tokens 2 --temperature 0 "
               "--ctx 256 'hi' </dev/null",
               g_tmp, g_tmp);
    if (rc) fprintf(stderr, "%s\n", o);
    assert_int_equal(rc, 0);
    free(o);
    char cfg[1100];
    snprintf(cfg, sizeof cfg, "%s/prefix/share/cairn/models/cobble/tokenizer.json", g_tmp);
    assert_int_equal(access(cfg, R_OK), 0);
}

int main(void) {
    char *t = tu_mkdtemp("install");
    snprintf(g_tmp, sizeof g_tmp, "%s", t);
    free(t);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_installed_finds_its_model),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tu_rmtree(g_tmp);
    return rc;
}
