/* The sparse arena (kernels.h: reserve, commit, decommit, commit_granule) through the front door.
 *
 * One contract check runs on the CPU, on the simulated GPU and, where the CUDA module is built
 * and a GPU is present, on CUDA, each with its own granule G: commit rounds out and zero-fills
 * what was not committed, keeps what was; decommit rounds in (the last granule ends with the
 * reservation) and gives the pages back; ranges outside one reservation are DDP_EINVAL; free
 * releases a reservation. On the sim, an op that touches a granule not committed is a hazard,
 * the same op on committed memory is not, and so is a decommit of a granule that another
 * stream's op still uses without a host sync.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <stdio.h>

#include "common/alloc.h"
#include "common/err.h"
#include "tests/sim/simdev.h"
#include "kernels/kernels.h"
#include "ktests.h"

/* Reads [p, p + n) of k into host memory h and checks it against want (NULL: all zero). */
static void expect_bytes(ddp_kernels_t *k, const char *what, const char *p, size_t n,
                         const unsigned char *want)
{
    unsigned char *h = malloc(n);
    assert_non_null(h);
    int rc = ddp_k_memcpy_d2h(k, h, p, n);
    if (rc) fail_msg("%s: %s: memcpy_d2h: %s", ddp_k_name(k), what, ddp_err_name(rc));
    for (size_t i = 0; i < n; i++)
        if (h[i] != (want ? want[i] : 0))
            fail_msg("%s: %s: byte %zu of %zu is %d, want %d", ddp_k_name(k), what, i, n, h[i],
                     want ? want[i] : 0);
    free(h);
}

static void expect_resident(ddp_kernels_t *k, const char *what, const char *p, size_t n,
                            long long want)
{
    long long got = ddp_mem_resident(p, n);
    if (got != want)
        fail_msg("%s: %s: %lld bytes resident, want %lld", ddp_k_name(k), what, got, want);
}

/* kernels.h's contract on k. host_pages: the arena's pages are this process's (cpu, sim), so
 * what decommit gives back shows in ddp_mem_resident. */
static void check_contract(ddp_kernels_t *k, int host_pages)
{
    size_t G = ddp_k_commit_granule(k);
    if (G < 4096 || (G & (G - 1))) fail_msg("%s: granule %zu", ddp_k_name(k), G);
    const size_t bytes = 3 * G + 1000; /* granule 3 is partial */
    char *p = NULL, *q = (char *)1, *other = NULL;
    assert_int_equal(ddp_k_reserve(k, (void **)&q, 0), 0);
    assert_null(q);
    assert_int_equal(ddp_k_reserve(k, (void **)&p, bytes), 0);
    assert_non_null(p);
    unsigned char *pat = malloc(2 * G);
    assert_non_null(pat);
    for (size_t i = 0; i < 2 * G; i++) pat[i] = (unsigned char)(i * 13 + 7);

    /* Two bytes across the boundary of granules 1 and 2 commit both, whole and zeroed. */
    assert_int_equal(ddp_k_commit(k, p + 2 * G - 1, 2), 0);
    expect_bytes(k, "granules 1-2 committed", p + G, 2 * G, NULL);
    assert_int_equal(ddp_k_memcpy_h2d(k, p + G, pat, 2 * G), 0);
    assert_int_equal(ddp_k_commit(k, p + G + 10, 20), 0); /* already committed: kept */
    expect_bytes(k, "granules 1-2 committed again", p + G, 2 * G, pat);
    if (host_pages) expect_resident(k, "granule 1 written", p + G, G, (long long)G);

    /* Granule 1 and half of granule 2: only granule 1 goes. */
    ddp_k_decommit(k, p + G, G + G / 2);
    assert_int_equal(ddp_k_sync(k), 0);
    if (host_pages) expect_resident(k, "granule 1 decommitted", p + G, G, 0);
    assert_int_equal(ddp_k_commit(k, p + G + G / 2, 1), 0);
    expect_bytes(k, "granule 1 recommitted", p + G, G, NULL);
    expect_bytes(k, "granule 2 partly decommitted", p + 2 * G, G, pat + G);

    /* The last granule ends with the reservation: a decommit to the end gives it back, one
     * that stops a byte short does not. */
    const size_t tail = bytes - 3 * G;
    assert_int_equal(ddp_k_commit(k, p + 3 * G, tail), 0);
    assert_int_equal(ddp_k_memcpy_h2d(k, p + 3 * G, pat, tail), 0);
    ddp_k_decommit(k, p + 3 * G, tail - 1);
    expect_bytes(k, "tail decommitted but its last byte", p + 3 * G, tail, pat);
    ddp_k_decommit(k, p + 2 * G + G / 2, tail + G / 2);
    assert_int_equal(ddp_k_commit(k, p + bytes - 1, 1), 0);
    expect_bytes(k, "tail decommitted to the end", p + 3 * G, tail, NULL);
    expect_bytes(k, "granule 2 partly decommitted", p + 2 * G, G, pat + G);

    /* Ranges outside one reservation. */
    assert_int_equal(ddp_k_commit(k, p + bytes - 1, 2), DDP_EINVAL);
    assert_int_equal(ddp_k_commit(k, p - 1, 2), DDP_EINVAL);
    assert_int_equal(ddp_k_commit(k, NULL, 1), DDP_EINVAL);
    assert_int_equal(ddp_k_alloc(k, (void **)&other, G), 0);
    assert_int_equal(ddp_k_commit(k, other, G), DDP_EINVAL);
    ddp_k_decommit(k, other, G);
    assert_int_equal(ddp_k_sync(k), DDP_EINVAL); /* reported once, as an op's error */
    ddp_k_decommit(k, p + G, bytes);
    assert_int_equal(ddp_k_sync(k), DDP_EINVAL);
    assert_int_equal(ddp_k_sync(k), 0);
    assert_int_equal(ddp_k_commit(k, p, 0), 0);
    ddp_k_free(k, other);

    /* free releases the reservation, committed granules included. */
    ddp_k_free(k, p);
    assert_int_equal(ddp_k_commit(k, p, 1), DDP_EINVAL);
    assert_int_equal(ddp_k_sync(k), 0);
    free(pat);
}

void test_sparse_cpu(void **state)
{
    (void)state;
    ddp_kernels_t k;
    assert_int_equal(ddp_kernels_open(&k, "cpu", 0, 1), 0);
    check_contract(&k, 1);
    /* A reservation still held at close is the context's to release (ASan: no leak). */
    void *p = NULL;
    assert_int_equal(ddp_k_reserve(&k, &p, 12345), 0);
    ddp_kernels_close(&k);

    ddp_kernels_t none;
    memset(&none, 0, sizeof none);
    p = (void *)1;
    assert_int_equal(ddp_k_reserve(&none, &p, 64), DDP_EINVAL);
    assert_null(p);
    assert_int_equal(ddp_k_commit(NULL, NULL, 0), DDP_EINVAL);
    assert_int_equal(ddp_k_commit_granule(&none), 0);
    ddp_k_decommit(NULL, NULL, 1);
}

void test_sparse_sim(void **state)
{
    (void)state;
    ddp_kernels_t k;
    assert_int_equal(ddp_kernels_open(&k, "sim", 0, 1), 0);
    uint64_t hz = ddp_simdev_hazards();
    check_contract(&k, 1);
    assert_int_equal(ddp_simdev_hazards(), hz);
    ddp_kernels_close(&k);
}

/* Expects exactly one new hazard since *hz whose message holds `op` and `says`. */
static void expect_hazard(uint64_t *hz, const char *op, const char *says)
{
    char msg[600];
    ddp_simdev_last_hazard(msg, sizeof msg);
    if (ddp_simdev_hazards() != *hz + 1)
        fail_msg("%s: %llu new hazards, want 1 (last: %s)", op,
                 (unsigned long long)(ddp_simdev_hazards() - *hz), msg);
    if (!strstr(msg, op) || !strstr(msg, says))
        fail_msg("hazard message \"%s\" names no %s or no \"%s\"", msg, op, says);
    *hz = ddp_simdev_hazards();
}

static void touch(void *arg) { (void)arg; }

void test_sparse_sim_hazards(void **state)
{
    (void)state;
    ddp_kernels_t k;
    assert_int_equal(ddp_kernels_open(&k, "sim", 0, 1), 0);
    size_t G = ddp_k_commit_granule(&k);
    char *p = NULL;
    assert_int_equal(ddp_k_reserve(&k, (void **)&p, 4 * G), 0);
    float *h = malloc(G);
    assert_non_null(h);
    memset(h, 0xab, G);
    uint64_t hz = ddp_simdev_hazards();
    /* the collectives' staging asks where a buffer lives */
    assert_int_equal(ddp_k_on_device(&k, p, 4 * G), 1);
    assert_int_equal(ddp_k_on_device(&k, h, G), 0);
    assert_int_equal(ddp_k_on_device(&k, p, 5 * G), 0); /* leaves the reservation */

    /* Nothing committed: a copy and an op fault, as on a GPU. */
    assert_int_equal(ddp_k_memcpy_h2d(&k, p, h, 16), 0); /* queued: the sync reports it */
    assert_int_equal(ddp_k_sync(&k), DDP_EHAZARD);
    expect_hazard(&hz, "memcpy_h2d", "not committed");
    DDP_K(&k, scale, (float *)(p + G), 2.0f, 4);
    assert_int_equal(ddp_k_sync(&k), DDP_EHAZARD);
    expect_hazard(&hz, "scale", "not committed");

    /* Granule 1 committed: the same op is fine there, not across into granule 2. */
    assert_int_equal(ddp_k_commit(&k, p + G, G), 0);
    DDP_K(&k, scale, (float *)(p + G), 2.0f, G / sizeof(float));
    assert_int_equal(ddp_k_sync(&k), 0);
    assert_int_equal(ddp_simdev_hazards(), hz);
    assert_int_equal(ddp_k_memcpy_d2h(&k, h, p + G, G), 0);
    assert_int_equal(ddp_k_memcpy_d2h(&k, h, p + G + 8, G), DDP_EHAZARD);
    expect_hazard(&hz, "memcpy_d2h", "granule 2");

    /* Decommitted again: faults again. */
    ddp_k_decommit(&k, p + G, G);
    assert_int_equal(ddp_k_sync(&k), 0);
    assert_int_equal(ddp_k_memset0(&k, p + G, 4), 0); /* queued: reported at sync */
    assert_int_equal(ddp_k_sync(&k), DDP_EHAZARD);
    expect_hazard(&hz, "memset0", "not committed");

    /* Decommit waits for the compute stream, so an op queued there is no hazard; one queued on
     * another stream that the host has not synchronised with is. */
    assert_int_equal(ddp_k_commit(&k, p, 2 * G), 0);
    unsigned char back[16]; /* what the faulting copy wrote there is gone */
    assert_int_equal(ddp_k_memcpy_d2h(&k, back, p, sizeof back), 0);
    for (size_t i = 0; i < sizeof back; i++) assert_int_equal(back[i], 0);
    DDP_K(&k, scale, (float *)p, 0.5f, G / sizeof(float));
    ddp_k_decommit(&k, p, G);
    assert_int_equal(ddp_k_sync(&k), 0);
    assert_int_equal(ddp_simdev_hazards(), hz);
    ddp_simdev_stream_t *other = NULL;
    assert_int_equal(ddp_simdev_stream_new(0, "other", &other), 0);
    ddp_simdev_access_t acc = {p + G + 64, 64, DDP_SIMDEV_R};
    assert_int_equal(ddp_simdev_launch(other, "reader", touch, malloc(1), &acc, 1), 0);
    ddp_k_decommit(&k, p + G, G);
    assert_int_equal(ddp_k_sync(&k), DDP_EHAZARD);
    expect_hazard(&hz, "reader", "decommit");
    ddp_simdev_stream_free(other);

    ddp_k_free(&k, p);
    free(h);
    ddp_kernels_close(&k);
}

#ifdef DDP_TEST_CUDA_MODULE
void test_sparse_cuda(void **state)
{
    (void)state;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", DDP_TEST_CUDA_MODULE);
    char *slash = strrchr(dir, '/');
    assert_non_null(slash);
    *slash = '\0';
    setenv("DDP_KERNELS_PATH", dir, 1);
    ddp_kernels_t k;
    int rc = ddp_kernels_open(&k, "cuda", 0, 0);
    unsetenv("DDP_KERNELS_PATH");
    if (rc) { /* no GPU here: the module must say so */
        if (rc != DDP_ENODEV) fail_msg("open(cuda): got %s, want DDP_ENODEV", ddp_err_name(rc));
        printf("# no usable GPU: the sparse arena is not checked on cuda\n");
        return;
    }
    check_contract(&k, 0);
    ddp_kernels_close(&k);
}
#endif
