/* test_error.c - the error table and message buffer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "base/error.h"

static void test_codes_have_messages(void **state) {
    (void)state;
    assert_string_equal(cn_strerror(CN_OK), "success");
    assert_string_equal(cn_strerror(CN_ENOTENSOR), "missing tensor");
    assert_string_equal(cn_strerror(12345), "unknown error");
}

static void test_set_formats_and_returns(void **state) {
    (void)state;
    cn_err e;
    cn_err_clear(&e);
    assert_int_equal(cn_err_set(&e, CN_ESHAPE, "%s: expected %d", "w", 3), CN_ESHAPE);
    assert_int_equal(e.code, CN_ESHAPE);
    assert_string_equal(e.msg, "w: expected 3");
    assert_int_equal(cn_err_set(NULL, CN_EIO, "x"), CN_EIO);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_codes_have_messages),
        cmocka_unit_test(test_set_formats_and_returns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
