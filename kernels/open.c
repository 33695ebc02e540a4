/* Opening a kernel backend: the built-in CPU backend, or a module loaded with dlopen().
 *
 * Every other backend is a shared module, ddp_kernels_<name>.so: the CUDA backend
 * (ddp_kernels_cuda.so), so that one binary runs on hosts with and without CUDA, and the
 * simulated GPU of the tests (ddp_kernels_sim.so, tests/sim/; never installed, so that no
 * production binary carries it). A module is looked up beside the executable (/proc/self/exe's
 * directory), then in each directory of $DDP_KERNELS_PATH (colon-separated; an entry may also
 * name the file itself), then through the dynamic linker's search path. It is used only when its
 * ops table has no NULL member and its probe is positive. "auto" picks the usable backend with
 * the highest probe among the CPU (1) and CUDA; it never loads another module.
 */
#include "kernels/kernels.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/log.h"
#include "kernels/kernels_int.h"

/* The modules ddp_kernels_open() may load, by backend name (the file is ddp_kernels_<name>.so). */
static const char *const module_names[] = {"cuda", "sim"};

/* Every member of ddp_kernels_ops_t that must be set: the ones written out in the table, then
 * every op of DDP_KERNEL_OPS. */
#define OPS_MEMBERS(X)                                                                       \
    X(name) X(probe) X(init) X(close) X(alloc) X(free) X(reserve) X(commit) X(decommit)     \
    X(commit_granule) X(on_device) X(memcpy_h2d) X(memcpy_d2h) X(memcpy_d2d) X(memset0)      \
    X(sync) X(device_count) X(prec_native) X(coll_backend) X(record_event)

/* Returns the name of the first NULL member, or NULL when the table is complete. */
static const char *missing_member(const ddp_kernels_ops_t *ops)
{
#define CHECK_MEMBER(m)                                                                      \
    if (!ops->m) return #m;
#define CHECK_OP(m, params) CHECK_MEMBER(m)
    OPS_MEMBERS(CHECK_MEMBER)
    DDP_KERNEL_OPS(CHECK_OP)
#undef CHECK_OP
#undef CHECK_MEMBER
    return NULL;
}

/* dlopen()s `path` and takes its ops table; 0 with *handle and *ops set, or DDP_ENODEV. */
static int load_from(const char *path, void **handle, const ddp_kernels_ops_t **ops)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        DDP_DEBUG("kernels: cannot load %s: %s", path, dlerror());
        return DDP_ENODEV;
    }
    ddp_kernels_module_fn fn = (ddp_kernels_module_fn)dlsym(h, DDP_KERNELS_MODULE_SYMBOL);
    const ddp_kernels_ops_t *t = fn ? fn() : NULL;
    if (!t) {
        DDP_WARN("kernels: %s has no ops table (%s)", path, DDP_KERNELS_MODULE_SYMBOL);
        dlclose(h);
        return DDP_ENODEV;
    }
    const char *miss = missing_member(t);
    if (miss) {
        DDP_WARN("kernels: %s: op '%s' is NULL; module not used", path, miss);
        dlclose(h);
        return DDP_ENODEV;
    }
    *handle = h;
    *ops = t;
    return 0;
}

static int exe_dir(char *buf, size_t len)
{
    ssize_t n = readlink("/proc/self/exe", buf, len - 1);
    if (n <= 0) return -1;
    buf[n] = '\0';
    char *slash = strrchr(buf, '/');
    if (!slash) return -1;
    *slash = '\0';
    return 0;
}

/* Finds and loads the module of backend `name`; DDP_ENODEV when none loads. */
static int load_module(const char *name, void **handle, const ddp_kernels_ops_t **ops)
{
    char file[64];
    snprintf(file, sizeof(file), "ddp_kernels_%s.so", name);
    char path[PATH_MAX + sizeof(file) + 2];
    char dir[PATH_MAX];
    if (exe_dir(dir, sizeof(dir)) == 0) {
        snprintf(path, sizeof(path), "%s/%s", dir, file);
        if (access(path, F_OK) == 0 && load_from(path, handle, ops) == 0) return 0;
    }
    const char *env = getenv("DDP_KERNELS_PATH");
    if (env && *env) {
        const char *p = env;
        while (*p) {
            size_t n = strcspn(p, ":");
            if (n > 0 && n < PATH_MAX) {
                memcpy(dir, p, n);
                dir[n] = '\0';
                size_t dl = strlen(dir);
                size_t sl = strlen(file);
                if (dl >= sl && strcmp(dir + dl - sl, file) == 0)
                    snprintf(path, sizeof(path), "%s", dir); /* the file itself */
                else
                    snprintf(path, sizeof(path), "%s/%s", dir, file);
                if (access(path, F_OK) == 0 && load_from(path, handle, ops) == 0) return 0;
            }
            p += n;
            if (*p == ':') p++;
        }
    }
    return load_from(file, handle, ops);
}

/* Initialises k with ops/module on device (modulo the backend's devices, when it has any); on
 * failure unloads the module. */
static int start(ddp_kernels_t *k, const ddp_kernels_ops_t *ops, void *module, int device,
                 int threads)
{
    int devices = ops->device_count();
    if (devices > 0 && device >= 0) device %= devices;
    ddp_kctx_t *ctx = NULL;
    int rc = ops->init(&ctx, device, threads);
    if (rc < 0) {
        if (module) dlclose(module);
        return rc;
    }
    k->ops = ops;
    k->ctx = ctx;
    k->module = module;
    k->device = device;
    return 0;
}

int ddp_kernels_open(ddp_kernels_t *k, const char *name, int device, int threads)
{
    memset(k, 0, sizeof(*k));
    if (!name) name = "auto";
    int want_cpu = strcmp(name, "cpu") == 0;
    int want_auto = strcmp(name, "auto") == 0;
    const char *mod = want_auto ? "cuda" : NULL; /* the module to load: auto considers CUDA */
    for (size_t i = 0; i < sizeof(module_names) / sizeof(module_names[0]); i++)
        if (strcmp(name, module_names[i]) == 0) mod = module_names[i];
    if (!want_cpu && !mod) {
        DDP_ERROR("kernels: unknown backend '%s' (cpu, cuda, sim or auto)", name);
        return DDP_EINVAL;
    }
    if (threads < 0) return DDP_EINVAL;
    if (want_cpu) return start(k, &ddp_kernels_cpu, NULL, device, threads);
    /* auto on a host without an NVIDIA device node: the CPU, without loading the module, whose
     * CUDA libraries cost every rank ~150 MB of resident memory (measured) that it never uses
     * ("cuda" still loads it and says why it is unusable; so does auto when DDP_KERNELS_PATH
     * names where to look, as for a module that needs no device node) */
    if (want_auto && !getenv("DDP_KERNELS_PATH") && access("/dev/nvidiactl", F_OK) != 0 &&
        access("/dev/nvidia0", F_OK) != 0 && access("/dev/dxg", F_OK) != 0)
        return start(k, &ddp_kernels_cpu, NULL, device, threads);

    void *module = NULL;
    const ddp_kernels_ops_t *ops = NULL;
    int rc = load_module(mod, &module, &ops);
    int probe = rc == 0 ? ops->probe() : 0;
    if (rc == 0 && probe > 0 && (!want_auto || probe > ddp_kernels_cpu.probe()))
        return start(k, ops, module, device, threads);
    if (module) dlclose(module);
    if (!want_auto) return DDP_ENODEV;
    return start(k, &ddp_kernels_cpu, NULL, device, threads);
}

void ddp_kernels_close(ddp_kernels_t *k)
{
    if (!k) return;
    if (k->ops && k->ctx) k->ops->close(k->ctx);
    if (k->module) dlclose(k->module);
    ddp__kprof_free(k->prof);
    memset(k, 0, sizeof(*k));
}
