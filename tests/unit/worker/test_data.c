/* Data order and schedule: the seeded permutation is a bijection; the samples of the first K
 * global batches are the same multiset for 1, 2 and 4 ranks; a token out of range names the
 * file and offset; 32-bit shards (ids past 65,535) read like 16-bit ones; the learning-rate
 * schedule's warmup and cosine ends. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "worker/data/loader.h"
#include "worker/optim/adamw.h"

#define T 8
#define N_TOKENS 4001 /* 500 windows of 8 (+1) tokens */

static char dir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/ddp-test-data-XXXXXX");
    if (!mkdtemp(dir)) return -1;
    uint16_t *tok = malloc(N_TOKENS * sizeof *tok);
    /* window w starts with tokens (w / 256, w % 256): every window is distinct */
    for (int i = 0; i < N_TOKENS; i++) tok[i] = (uint16_t)((i % T == 0) ? (i / T) / 256 : (i % T == 1) ? ((i / T) % 256) : 7);
    char path[128];
    snprintf(path, sizeof path, "%s/train_000000.bin", dir);
    int rc = ddp_shard_write(path, tok, 2000);
    snprintf(path, sizeof path, "%s/train_000001.bin", dir);
    rc |= ddp_shard_write(path, tok + 2000, N_TOKENS - 2000);
    free(tok);
    return rc;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd);
}

static void open_set(ddp_dataset_t *d, int vocab)
{
    char glob[128];
    snprintf(glob, sizeof glob, "%s/train_*.bin", dir);
    ddp_errinfo_t ei;
    int rc = ddp_dataset_open(d, glob, T, vocab, 42, &ei);
    if (rc) fail_msg("open: %s", ei.msg);
}

static void test_permutation_is_bijection(void **state)
{
    (void)state;
    ddp_dataset_t d;
    open_set(&d, 256);
    /* 1999/8 = 249 windows in the first shard, (2001-1)/8 = 250 in the second */
    assert_int_equal(d.n_windows, 249 + 250);
    char *seen = calloc(d.n_windows, 1);
    for (uint64_t j = 0; j < d.n_windows; j++) {
        size_t w = ddp_dataset_sample(&d, j);
        assert_true(w < d.n_windows);
        assert_false(seen[w]);
        seen[w] = 1;
    }
    /* the next epoch is a different order */
    int same = 0;
    for (uint64_t j = 0; j < 20; j++)
        same += ddp_dataset_sample(&d, j) == ddp_dataset_sample(&d, j + d.n_windows);
    assert_true(same < 20);
    free(seen);
    ddp_dataset_close(&d);
}

static int cmp_rows(const void *a, const void *b) { return memcmp(a, b, T * sizeof(int32_t)); }

/* Rows of the first `steps` global batches of G sequences as seen by `world` ranks. */
static int32_t *collect(ddp_dataset_t *d, int world, int G, int steps)
{
    int B = 2, n_micro = G / B;
    int32_t *rows = malloc((size_t)steps * G * T * sizeof *rows);
    size_t at = 0;
    for (int r = 0; r < world; r++) {
        ddp_loader_t l;
        assert_int_equal(ddp_loader_start(&l, d, B, r, world, n_micro), 0);
        int accum = ddp_loader_accum(n_micro, r, world);
        for (int s = 0; s < steps; s++)
            for (int a = 0; a < accum; a++) {
                const int32_t *in, *tg;
                assert_int_equal(ddp_loader_next(&l, s, a, &in, &tg, NULL), 0);
                memcpy(rows + at, in, (size_t)B * T * sizeof *in);
                at += (size_t)B * T;
                assert_int_equal(tg[0], in[1]);
            }
        ddp_loader_stop(&l);
    }
    assert_int_equal(at, (size_t)steps * G * T);
    qsort(rows, (size_t)steps * G, T * sizeof(int32_t), cmp_rows);
    return rows;
}

static void test_order_independent_of_world_size(void **state)
{
    (void)state;
    ddp_dataset_t d;
    open_set(&d, 256);
    int G = 8, steps = 70; /* 560 samples: crosses an epoch boundary */
    int32_t *one = collect(&d, 1, G, steps);
    int32_t *two = collect(&d, 2, G, steps);
    int32_t *four = collect(&d, 4, G, steps);
    int32_t *three = collect(&d, 3, G, steps); /* 4 micro-batches dealt 2, 1, 1 */
    size_t bytes = (size_t)steps * G * T * sizeof(int32_t);
    assert_memory_equal(one, two, bytes);
    assert_memory_equal(one, four, bytes);
    assert_memory_equal(one, three, bytes);
    assert_int_equal(ddp_loader_accum(4, 0, 3), 2);
    assert_int_equal(ddp_loader_accum(4, 2, 3), 1);
    free(three);
    free(one);
    free(two);
    free(four);
    ddp_dataset_close(&d);
}

static void test_token_out_of_range_named(void **state)
{
    (void)state;
    ddp_dataset_t d;
    open_set(&d, 5); /* window starts hold values up to 255 */
    int32_t in[T * 4], tg[T * 4];
    ddp_errinfo_t ei;
    ddp_errinfo_clear(&ei);
    int rc = ddp_dataset_fill(&d, 300, 4, 0, in, tg, &ei);
    assert_int_equal(rc, DDP_EFORMAT);
    assert_non_null(strstr(ei.path, "train_00000"));
    assert_non_null(strstr(ei.msg, "vocab_size 5"));
    assert_true(ei.offset >= 1024);
    ddp_dataset_close(&d);
}

/* 32-bit shards feed the loader like 16-bit ones (mixed in one glob): ids past 65,535 arrive
 * intact, and an id >= vocab_size is named with its 4-byte offset. */
static void test_32bit_shards(void **state)
{
    (void)state;
    char sub[128], path[160], glob[160];
    snprintf(sub, sizeof sub, "%s/w32", dir);
    assert_int_equal(mkdir(sub, 0755), 0);
    enum { N = 3 * T + 1 };
    uint32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = 70000u + (uint32_t)i;
    snprintf(path, sizeof path, "%s/train_000000.bin", sub);
    assert_int_equal(ddp_shard_write32(path, tok, N), 0);
    uint16_t small[T + 1] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    snprintf(path, sizeof path, "%s/train_000001.bin", sub);
    assert_int_equal(ddp_shard_write(path, small, T + 1), 0);
    snprintf(glob, sizeof glob, "%s/train_*.bin", sub);
    ddp_dataset_t d;
    ddp_errinfo_t ei;
    if (ddp_dataset_open(&d, glob, T, 128256, 1, &ei)) fail_msg("open: %s", ei.msg);
    assert_int_equal(d.n_windows, 4);
    int32_t in[T * 4], tg[T * 4];
    assert_int_equal(ddp_dataset_fill(&d, 0, 4, 0, in, tg, &ei), 0);
    for (int w = 0; w < 3; w++)
        for (int t = 0; t < T; t++) {
            assert_int_equal(in[w * T + t], 70000 + w * T + t);
            assert_int_equal(tg[w * T + t], 70000 + w * T + t + 1);
        }
    assert_int_equal(in[3 * T], 1);
    assert_int_equal(tg[4 * T - 1], 9);
    ddp_dataset_close(&d);

    if (ddp_dataset_open(&d, glob, T, 70005, 1, &ei)) fail_msg("open: %s", ei.msg);
    ddp_errinfo_clear(&ei);
    assert_int_equal(ddp_dataset_fill(&d, 0, 1, 0, in, tg, &ei), DDP_EFORMAT);
    assert_non_null(strstr(ei.path, "w32/train_000000.bin"));
    assert_non_null(strstr(ei.msg, "token 70005 at index 5"));
    assert_int_equal(ei.offset, 1024 + 4 * 5);
    ddp_dataset_close(&d);
}

static void test_lr_schedule(void **state)
{
    (void)state;
    ddp_spec_t s;
    ddp_spec_defaults(&s);
    s.lr = 1e-3;
    s.min_lr = 1e-4;
    s.warmup = 10;
    s.steps = 110;
    s.schedule = DDP_SCHED_COSINE;
    assert_float_equal(ddp_lr_at(&s, 0), 1e-4, 1e-12);
    assert_float_equal(ddp_lr_at(&s, 9), 1e-3, 1e-12);
    assert_float_equal(ddp_lr_at(&s, 10), 1e-3, 1e-12);
    assert_float_equal(ddp_lr_at(&s, 60), 5.5e-4, 1e-12);
    assert_float_equal(ddp_lr_at(&s, 110), 1e-4, 1e-12);
    s.schedule = DDP_SCHED_CONSTANT;
    assert_float_equal(ddp_lr_at(&s, 100), 1e-3, 1e-12);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_permutation_is_bijection),
        cmocka_unit_test(test_order_independent_of_world_size),
        cmocka_unit_test(test_token_out_of_range_named),
        cmocka_unit_test(test_32bit_shards),
        cmocka_unit_test(test_lr_schedule),
    };
    return cmocka_run_group_tests_name("data", tests, setup, teardown);
}
