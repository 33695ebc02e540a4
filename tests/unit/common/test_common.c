/* common/: error names and messages, errinfo formatting, allocation fault injection. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/alloc.h"
#include "common/err.h"

static void test_err_names(void **state)
{
    (void)state;
    assert_string_equal(ddp_err_name(DDP_EFORMAT), "DDP_EFORMAT");
    assert_string_equal(ddp_strerror(DDP_ETIMEDOUT), "deadline expired");
    assert_string_equal(ddp_err_name(-ENOENT), "ENOENT");
    assert_string_equal(ddp_strerror(-ENOENT), "No such file or directory");
    assert_string_equal(ddp_err_name(0), "OK");
    assert_string_equal(ddp_err_name(-999999), "EUNKNOWN");
}

static void test_errinfo_format(void **state)
{
    (void)state;
    ddp_errinfo_t ei;
    char buf[600];
    int rc = ddp_errinfo_set(&ei, DDP_ESPEC, "must be > 0, got %d", -3);
    assert_int_equal(rc, DDP_ESPEC);
    ddp_errinfo_path(&ei, "train.%s", "lr");
    ei.line = 4;
    ei.column = 7;
    assert_string_equal(ddp_errinfo_str(&ei, buf, sizeof buf), "train.lr:4:7: must be > 0, got -3");
    ddp_errinfo_clear(&ei);
    assert_string_equal(ddp_errinfo_str(&ei, buf, sizeof buf), "");
    assert_int_equal(ddp_errinfo_set(NULL, DDP_EIO, "x"), DDP_EIO);
}

static void test_alloc_fail_injection(void **state)
{
    (void)state;
    ddp_alloc_fail_at(2);
    void *a = ddp_malloc(8);
    void *b = ddp_malloc(8);
    void *c = ddp_malloc(8);
    assert_non_null(a);
    assert_null(b);
    assert_non_null(c);
    free(a);
    free(c);
    ddp_alloc_fail_at(0);
    char *s = ddp_strdup("abc");
    assert_string_equal(s, "abc");
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_err_names),
        cmocka_unit_test(test_errinfo_format),
        cmocka_unit_test(test_alloc_fail_injection),
    };
    return cmocka_run_group_tests_name("common", tests, NULL, NULL);
}
