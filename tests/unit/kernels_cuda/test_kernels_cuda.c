/* The CUDA kernel module (when built) and ddp_kernels_selftest().
 *
 * - The self-test harness itself: with DDP_SELFTEST_BACKENDS=cpu it runs every case with the
 *   CPU as both oracle and subject and must pass (it exercises every op, shape and aliasing
 *   case, so ASan sees the whole harness).
 * - The real module (DDP_TEST_CUDA_MODULE, set by meson when it is built): it loads, exports a
 *   complete ops table named "cuda", and its probe agrees with ddp_kernels_open("cuda").
 * - The self-test against CUDA: 0 on a host with a GPU, 2 (and a clear line) without one;
 *   never 1.
 * - With a GPU, a profile window (kernels.h) counts its calls with cudaEvent marks, times
 *   >= 0 that add up to no more than the window.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <dlfcn.h>
#include <unistd.h>

#include "common/err.h"
#include "kernels/kernels.h"

/* The self-test reports on stdout (it is `ddp-worker --selftest`); here stdout carries TAP, so
 * its report goes to stderr. */
static int selftest_to_stderr(void)
{
    fflush(stdout);
    int saved = dup(STDOUT_FILENO);
    dup2(STDERR_FILENO, STDOUT_FILENO);
    int rc = ddp_kernels_selftest();
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    return rc;
}

static void test_harness_cpu(void **state)
{
    (void)state;
    setenv("DDP_SELFTEST_BACKENDS", "cpu", 1);
    int rc = selftest_to_stderr();
    unsetenv("DDP_SELFTEST_BACKENDS");
    if (rc != 0) fail_msg("selftest cpu vs cpu: got %d, want 0", rc);
}

#ifdef DDP_TEST_CUDA_MODULE
/* Points the loader at the module's build directory. */
static void use_built_module(void)
{
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s", DDP_TEST_CUDA_MODULE);
    char *slash = strrchr(dir, '/');
    assert_non_null(slash);
    *slash = '\0';
    setenv("DDP_KERNELS_PATH", dir, 1);
}

static void test_module_table(void **state)
{
    (void)state;
    void *h = dlopen(DDP_TEST_CUDA_MODULE, RTLD_NOW | RTLD_LOCAL);
    if (!h) fail_msg("dlopen(%s): %s", DDP_TEST_CUDA_MODULE, dlerror());
    ddp_kernels_module_fn fn = (ddp_kernels_module_fn)dlsym(h, DDP_KERNELS_MODULE_SYMBOL);
    assert_non_null(fn);
    const ddp_kernels_ops_t *ops = fn();
    assert_non_null(ops);
    assert_string_equal(ops->name, "cuda");
    /* Every member but the host_memory capability (0 here: device memory) is a pointer: none
     * may be NULL. */
    assert_int_equal(ops->host_memory, 0);
    const void *const *slot = (const void *const *)ops;
    size_t n = sizeof(*ops) / sizeof(void *);
    for (size_t i = 0; i < n; i++)
        if (i * sizeof(void *) != offsetof(ddp_kernels_ops_t, host_memory) && !slot[i])
            fail_msg("ops member %zu of %zu is NULL", i, n);
    int probe = ops->probe();
    if (probe != 0 && probe != 10) fail_msg("probe: got %d, want 0 or 10", probe);
    assert_int_equal(ops->probe(), probe); /* cheap and repeatable */

    use_built_module();
    ddp_kernels_t k;
    int rc = ddp_kernels_open(&k, "cuda", 0, 0);
    if (probe > 0) {
        if (rc != 0) fail_msg("probe %d but open(cuda): %s", probe, ddp_err_name(rc));
        /* Zero-sized work is a no-op and a fresh context has no error. */
        float ss = -1.0f;
        int bad = -1;
        ddp_krange_t none = {0, 0, 0};
        DDP_K(&k, sumsq_blocks, &ss, NULL, &none, 1, 16384);
        DDP_K(&k, nonfinite, &bad, NULL, 0);
        DDP_K(&k, gelu_fwd, NULL, NULL, 0);
        assert_true(ss == -1.0f); /* no blocks: nothing written */
        assert_int_equal(bad, 0);
        assert_int_equal(k.ops->sync(k.ctx), 0);
        /* a profile window timed by the stream's events */
        float *x = NULL;
        assert_int_equal(ddp_k_alloc(&k, (void **)&x, 1 << 20), 0);
        assert_int_equal(ddp_k_profile_start(&k), 0);
        for (int i = 0; i < 3; i++)
            DDP_K(&k, gelu_fwd, (ddp_act_t *)x, (ddp_act_t *)x, (size_t)1 << 18);
        assert_int_equal(ddp_k_sync(&k), 0);
        ddp_kprof_report_t r;
        assert_int_equal(ddp_k_profile_stop(&k, &r), 0);
        assert_int_equal(r.stream_marks, 1);
        assert_int_equal(r.op[DDP_KOP_gelu_fwd].calls, 3);
        assert_int_equal(r.op[DDP_KOP_sync].calls, 1);
        double sum = r.op[DDP_KOP_gelu_fwd].ms + r.op[DDP_KOP_sync].ms;
        if (!(r.op[DDP_KOP_gelu_fwd].ms > 0 && r.op[DDP_KOP_sync].ms >= 0 && sum <= r.wall_ms))
            fail_msg("profile: gelu_fwd %g ms, sync %g ms, window %g ms",
                     r.op[DDP_KOP_gelu_fwd].ms, r.op[DDP_KOP_sync].ms, r.wall_ms);
        ddp_k_free(&k, x);
        ddp_kernels_close(&k);
    } else if (rc != DDP_ENODEV) {
        fail_msg("no device but open(cuda): got %s, want DDP_ENODEV", ddp_err_name(rc));
    }
    dlclose(h);
}

static void test_selftest_cuda(void **state)
{
    (void)state;
    use_built_module();
    ddp_kernels_t k;
    int usable = ddp_kernels_open(&k, "cuda", 0, 0) == 0;
    ddp_kernels_close(&k);
    int rc = selftest_to_stderr();
    if (rc != (usable ? 0 : 2))
        fail_msg("selftest: got %d, want %d (cuda %s)", rc, usable ? 0 : 2,
                 usable ? "usable" : "unusable");
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_harness_cpu),
#ifdef DDP_TEST_CUDA_MODULE
        cmocka_unit_test(test_module_table),
        cmocka_unit_test(test_selftest_cuda),
#endif
    };
    return cmocka_run_group_tests_name("kernels_cuda", tests, NULL, NULL);
}
