#!/usr/bin/env bash
# Builds the GPU tree on this machine for a GPU machine that has the NVIDIA driver, CUDA's
# runtime, cuBLAS and NCCL but none of the -dev packages ddpd builds against (a cloud image, a
# lent machine): BUILD_DIR with -Dcuda=enabled for GPU_ARCH (default 90: H100, H200), and
# LIB_DIR with every other shared library its programs link (jansson, libyaml, OpenBLAS, Open MPI,
# liburing ...), glibc and CUDA's own left out. Copy both (with the source tree) and run there:
#   LD_LIBRARY_PATH=<cuda, cublas and nccl lib dirs>:$PWD/LIB_DIR GPU_SH_PREBUILT=1 tests/gpu.sh BUILD_DIR
# glibc there must be at least this machine's (Debian 12: 2.36).
#
#   tests/gpu/bundle.sh [BUILD_DIR] [LIB_DIR]      defaults build-gpu and .gpu-libs
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
bdir=${1:-$src/build-gpu} libs=${2:-$src/.gpu-libs}
[ -f "$bdir/build.ninja" ] ||
    meson setup "$bdir" "$src" -Dcuda=enabled -Dgpu_arch="${GPU_ARCH:-90}" -Dbuildtype=release \
        -Dwerror=false >/dev/null
ninja -C "$bdir" >/dev/null
programs=("$bdir/worker/ddp-worker" "$bdir/worker/ddp-prep" "$bdir/worker/ddp_kernels_cuda.so"
          "$bdir"/collectives/*.so "$bdir"/tests/gpu/{nccl_allreduce,gemm_shapes,attention_times})
mkdir -p "$libs"
# every resolved library but the C library's own and CUDA's (the GPU machine has those)
ldd "${programs[@]}" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*|libgcc_s|libstdc\+\+)\.so|/cuda|libcublas|libcudart|libnccl' |
    while read -r lib; do cp -L "$lib" "$libs/"; done
echo "built $bdir (gpu_arch ${GPU_ARCH:-90}); $(find "$libs" -name '*.so*' | wc -l) libraries in $libs ($(du -sh "$libs" | cut -f1))"
