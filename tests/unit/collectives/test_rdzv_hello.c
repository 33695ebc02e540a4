/* Unit tests of rank 0's check of a rendezvous hello (collectives/rdzv_hello.c): a rank's own
 * hello is accepted as that rank, a partial one waits, and each way a hello can be wrong is
 * refused with its reason, garbage as soon as its first 8 bytes are in. One cmocka group.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "collectives/rdzv_hello.h"

static const int FDS[4] = {-1, -1, 9, -1}; /* rank 2 has joined */
static const ddp__rdzv_expect_t E = {.token = "job-token", .size = 4, .generation = 3,
                                     .fds = FDS};

static void test_accepts(void **state)
{
    (void)state;
    ddp__rdzv_hello_t h;
    ddp__rdzv_verdict_t v;
    ddp__rdzv_hello_make(&h, 3, 4, 3, "job-token");
    assert_int_equal(ddp__rdzv_hello_check(&h, sizeof h, &E, &v), 3);
    assert_int_equal(v.rank, 3);
    assert_null(v.why);
    assert_int_equal(v.claimed_rank, 3);
    assert_int_equal(v.claimed_generation, 3);
    /* every prefix waits for the rest */
    for (size_t len = 0; len < sizeof h; len++) {
        assert_int_equal(ddp__rdzv_hello_check(&h, len, &E, &v), 0);
        assert_null(v.why);
    }
    /* no joined ranks given: none is taken */
    ddp__rdzv_expect_t e = E;
    e.fds = NULL;
    ddp__rdzv_hello_make(&h, 2, 4, 3, "job-token");
    assert_int_equal(ddp__rdzv_hello_check(&h, sizeof h, &e, &v), 2);
}

typedef struct {
    int rank, size;
    uint64_t generation;
    const char *token;
    const char *why;
} bad_t;

static void test_refuses(void **state)
{
    (void)state;
    const bad_t bad[] = {
        {1, 4, 3, "job-tokem", "wrong job token"},
        {1, 4, 3, "job-token-and-more", "wrong job token"},
        {1, 4, 3, "", "wrong job token"},
        {1, 4, 4, "job-token", "wrong generation"},
        {1, 5, 3, "job-token", "wrong world size"},
        {0, 4, 3, "job-token", "rank out of range"},
        {4, 4, 3, "job-token", "rank out of range"},
        {-1, 4, 3, "job-token", "rank out of range"},
        {2, 4, 3, "job-token", "rank already joined"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ddp__rdzv_hello_t h;
        ddp__rdzv_verdict_t v;
        ddp__rdzv_hello_make(&h, bad[i].rank, bad[i].size, bad[i].generation, bad[i].token);
        int rk = ddp__rdzv_hello_check(&h, sizeof h, &E, &v);
        if (rk >= 0 || !v.why || strcmp(v.why, bad[i].why) != 0)
            fail_msg("case %zu: rank %d, why \"%s\", want \"%s\"", i, rk, v.why ? v.why : "",
                     bad[i].why);
        assert_int_equal(v.claimed_rank, (uint32_t)bad[i].rank);
    }
}

static void test_garbage(void **state)
{
    (void)state;
    ddp__rdzv_verdict_t v;
    const char http[] = "GET / HTTP/1.1\r\n\r\n";
    assert_int_equal(ddp__rdzv_hello_check(http, 7, &E, &v), 0); /* 7 bytes: cannot tell yet */
    assert_int_equal(ddp__rdzv_hello_check(http, 8, &E, &v), -1);
    assert_string_equal(v.why, "not a ddpd rendezvous hello (garbage bytes)");
    /* a whole hello and then more is not a hello */
    unsigned char two[2 * sizeof(ddp__rdzv_hello_t)];
    ddp__rdzv_hello_make((ddp__rdzv_hello_t *)two, 1, 4, 3, "job-token");
    assert_int_equal(ddp__rdzv_hello_check(two, sizeof two, &E, &v), -1);
    assert_string_equal(v.why, "more bytes than a hello");
    /* a token that fills all 128 bytes (no NUL) is compared, not overrun */
    ddp__rdzv_hello_t h;
    ddp__rdzv_hello_make(&h, 1, 4, 3, "");
    memset(h.token, 'j', sizeof h.token);
    assert_int_equal(ddp__rdzv_hello_check(&h, sizeof h, &E, &v), -1);
    assert_string_equal(v.why, "wrong job token");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accepts),
        cmocka_unit_test(test_refuses),
        cmocka_unit_test(test_garbage),
    };
    return cmocka_run_group_tests_name("rdzv_hello", tests, NULL, NULL);
}
