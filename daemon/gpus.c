/* GPUs on this node, for ddpd's slots, without loading the kernels: the CUDA driver library
 * (libcuda.so.1, the one every CUDA program uses) is dlopen()ed only where an NVIDIA device node
 * exists, asked cuDeviceGetCount (which honours CUDA_VISIBLE_DEVICES) and unloaded. ddpd so
 * links neither the kernel backends nor OpenBLAS to count its slots.
 */
#include "daemon/gpus.h"

#include <dlfcn.h>
#include <unistd.h>

int ddpd_gpu_count(void)
{
    if (access("/dev/nvidiactl", F_OK) != 0 && access("/dev/nvidia0", F_OK) != 0 &&
        access("/dev/dxg", F_OK) != 0)
        return 0;
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return 0;
    typedef int (*init_fn)(unsigned);
    typedef int (*count_fn)(int *);
    init_fn cu_init = (init_fn)dlsym(lib, "cuInit");
    count_fn cu_count = (count_fn)dlsym(lib, "cuDeviceGetCount");
    int n = 0;
    if (!cu_init || !cu_count || cu_init(0) != 0 || cu_count(&n) != 0) n = 0;
    dlclose(lib);
    return n;
}
