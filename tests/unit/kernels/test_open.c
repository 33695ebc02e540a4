/* The backend loader (ddp_kernels_open/close) and the CPU backend's memory functions.
 *
 * The CUDA module is replaced by fake/ddp_kernels_cuda.so (built beside this test), found
 * through $DDP_KERNELS_PATH; $DDP_FAKE_KERNELS picks its behaviour (see fake_module.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <dlfcn.h>
#include <stdio.h>

#include "common/err.h"
#include "kernels/kernels.h"
#include "kref.h"
#include "ktests.h"

/* Opens `name`, expects rc (and on success, ops named `want`), then closes. */
static void expect_open(const char *name, int rc, const char *want)
{
    ddp_kernels_t k;
    int got = ddp_kernels_open(&k, name, 0, 1);
    if (got != rc)
        fail_msg("open(\"%s\"): got %s (%d), want %s (%d)", name, ddp_err_name(got), got,
                 ddp_err_name(rc), rc);
    if (rc == 0) {
        assert_non_null(k.ops);
        assert_non_null(k.ctx);
        assert_string_equal(k.ops->name, want);
        assert_int_equal(k.module != NULL, strcmp(want, "cpu") != 0);
        ddp_kernels_close(&k);
        assert_null(k.ops);
    } else {
        assert_null(k.ops);
    }
}

void test_open(void **state)
{
    ddp_kernels_close(NULL);
    expect_open("cpu", 0, "cpu");
    expect_open("bogus", DDP_EINVAL, NULL);

    /* No module anywhere: "cuda" is DDP_ENODEV and "auto" is the CPU. Skipped only when the
     * dynamic linker itself can find a real module (LD_LIBRARY_PATH: the tests set it only to
     * tests/sim, which holds the sim's modules and no CUDA one). */
    setenv("DDP_KERNELS_PATH", "/nonexistent-ddp-kernels", 1);
    void *real = dlopen("ddp_kernels_cuda.so", RTLD_NOW | RTLD_LOCAL);
    if (real) {
        dlclose(real);
        printf("# a ddp_kernels_cuda.so is on the linker path: absent-module case skipped\n");
    } else {
        expect_open("cuda", DDP_ENODEV, NULL);
        expect_open("auto", 0, "cpu");
        expect_open(NULL, 0, "cpu");
    }

    const char *root = getenv("DDP_BUILD_ROOT");
    assert_non_null(root);
    char dir[4096];
    snprintf(dir, sizeof(dir), "/nonexistent:%s/tests/unit/kernels/fake", root);
    setenv("DDP_KERNELS_PATH", dir, 1);

    setenv("DDP_FAKE_KERNELS", "ok", 1); /* probe 5 beats the CPU's 1 */
    expect_open("cuda", 0, "fake");
    expect_open("auto", 0, "fake");
    expect_open("cpu", 0, "cpu");

    setenv("DDP_FAKE_KERNELS", "probe0", 1); /* present but unusable */
    expect_open("cuda", DDP_ENODEV, NULL);
    expect_open("auto", 0, "cpu");

    setenv("DDP_FAKE_KERNELS", "null", 1); /* an op left NULL: refused */
    expect_open("cuda", DDP_ENODEV, NULL);
    expect_open("auto", 0, "cpu");

    /* An entry of DDP_KERNELS_PATH may name the file itself. */
    snprintf(dir, sizeof(dir), "%s/tests/unit/kernels/fake/ddp_kernels_cuda.so", root);
    setenv("DDP_KERNELS_PATH", dir, 1);
    setenv("DDP_FAKE_KERNELS", "ok", 1);
    expect_open("cuda", 0, "fake");

    unsetenv("DDP_FAKE_KERNELS");
    unsetenv("DDP_KERNELS_PATH");
}

void test_memory(void **state)
{
    ddp_kernels_t k;
    assert_int_equal(ddp_kernels_open(&k, "cpu", 0, 0), 0); /* 0 = one thread per core */
    const size_t sizes[] = {0, 1, 63, 64, 1000003};
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        size_t n = sizes[s];
        unsigned char *p = NULL, *q = NULL;
        assert_int_equal(k.ops->alloc(k.ctx, (void **)&p, n), 0);
        assert_int_equal(k.ops->alloc(k.ctx, (void **)&q, n), 0);
        assert_int_equal((uintptr_t)p % 64, 0);
        assert_int_equal(ddp_k_on_device(&k, p, n), 0); /* the CPU has host memory only */
        for (size_t i = 0; i < n; i++)
            if (p[i] != 0) fail_msg("alloc(%zu): byte %zu is %d, want 0", n, i, p[i]);
        unsigned char *h = malloc(n + 1);
        for (size_t i = 0; i < n; i++) h[i] = (unsigned char)(i * 7 + 1);
        assert_int_equal(k.ops->memcpy_h2d(k.ctx, p, h, n), 0);
        assert_int_equal(k.ops->memcpy_d2d(k.ctx, q, p, n), 0);
        memset(h, 0, n + 1);
        assert_int_equal(k.ops->memcpy_d2h(k.ctx, h, q, n), 0);
        for (size_t i = 0; i < n; i++)
            if (h[i] != (unsigned char)(i * 7 + 1))
                fail_msg("copy(%zu): byte %zu is %d, want %d", n, i, h[i], (i * 7 + 1) & 255);
        assert_int_equal(k.ops->memset0(k.ctx, q, n), 0);
        for (size_t i = 0; i < n; i++) assert_int_equal(q[i], 0);
        assert_int_equal(k.ops->sync(k.ctx), 0);
        free(h);
        k.ops->free(k.ctx, p);
        k.ops->free(k.ctx, q);
    }
    k.ops->free(k.ctx, NULL);
    ddp_kernels_close(&k);
}

/* The front door (kernels/wrappers.c): an unopened backend, arguments against the contract (the
 * first error kept for ddp_k_sync), and the host_memory capability instead of a backend name. */
void test_front_door(void **state)
{
    (void)state;
    ddp_kernels_t none;
    memset(&none, 0, sizeof none);
    void *p = (void *)1;
    assert_int_equal(ddp_k_alloc(NULL, &p, 64), DDP_EINVAL);
    assert_null(p);
    assert_int_equal(ddp_k_alloc(&none, &p, 64), DDP_EINVAL);
    assert_int_equal(ddp_k_sync(NULL), DDP_EINVAL);
    assert_int_equal(ddp_k_memset0(&none, NULL, 0), DDP_EINVAL);
    ddp_k_free(NULL, NULL);
    ddp_k_free(&none, (void *)16); /* not opened: nothing to free with */
    float x = 1.0f;
    ddp_k_scale(NULL, &x, 2.0f, 1);
    ddp_k_scale(&none, &x, 2.0f, 1);
    assert_true(x == 1.0f);
    assert_string_equal(ddp_k_name(NULL), "none");
    assert_int_equal(ddp_k_host_memory(NULL), 0);

    ddp_kernels_t k;
    assert_int_equal(ddp_kernels_open(&k, "cpu", 0, 1), 0);
    assert_int_equal(ddp_k_host_memory(&k), 1);
    assert_string_equal(ddp_k_name(&k), "cpu");
    assert_string_equal(ddp_k_coll_backend(&k), "ring");
    float *buf = NULL;
    assert_int_equal(ddp_k_alloc(&k, (void **)&buf, 8 * sizeof(float)), 0);
    assert_int_equal(ddp_k_alloc(&k, NULL, 8), DDP_EINVAL);
    assert_int_equal(ddp_k_memcpy_h2d(&k, buf, NULL, 4), DDP_EINVAL);
    assert_int_equal(ddp_k_memcpy_h2d(&k, buf, &x, 0), 0); /* nothing to copy */
    ddp_k_add(&k, buf, buf, 0);                             /* a count of 0 is no error */
    assert_int_equal(ddp_k_sync(&k), 0);
    /* bad arguments: the op does not run, and ddp_k_sync reports the first error */
    ddp_k_matmul_fwd(&k, KA(buf), KA(buf), NULL, NULL, 2, 2, 2, 2, DDP_W_IN_OUT);
    ddp_k_attention_fwd(&k, KA(buf), buf, KA(buf), 1, 1, 6, 4, 4); /* C not a multiple of NH */
    buf[0] = 3.0f;
    ddp_k_scale(&k, NULL, 2.0f, 4);
    assert_true(buf[0] == 3.0f);
    assert_int_equal(ddp_k_sync(&k), DDP_EINVAL);
    ddp_k_free(&k, buf);
    ddp_kernels_close(&k);

    assert_int_equal(ddp_kernels_open(&k, "sim", 0, 1), 0);
    assert_int_equal(ddp_k_host_memory(&k), 0); /* device memory: the host may not touch it */
    assert_string_equal(ddp_k_coll_backend(&k), "sim");
    ddp_kernels_close(&k);
}
