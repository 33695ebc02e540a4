/* A stand-in for ddp_kernels_cuda.so, for the loader tests in test_kernels.c.
 *
 * It exports the module symbol and returns the CPU backend's table renamed "fake", altered as
 * $DDP_FAKE_KERNELS says: "ok" (probe 5, so "auto" prefers it), "probe0" (probe 0: unusable
 * here), "null" (one op left NULL: the loader must refuse it). It lives in its own folder so
 * that the test can point $DDP_KERNELS_PATH at it.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

static int fake_probe(void)
{
    const char *mode = getenv("DDP_FAKE_KERNELS");
    return mode && strcmp(mode, "probe0") == 0 ? 0 : 5;
}

static ddp_kernels_ops_t table;

/* The module entry point: the table as $DDP_FAKE_KERNELS asks. Not thread-safe (tests only). */
const ddp_kernels_ops_t *ddp_kernels_module(void)
{
    const char *mode = getenv("DDP_FAKE_KERNELS");
    table = ddp_kernels_cpu;
    table.name = "fake";
    table.probe = fake_probe;
    if (mode && strcmp(mode, "null") == 0) table.gelu_bwd = NULL;
    return &table;
}
