#!/bin/sh
# Builds tests/bench/allreduce.c with mpicc against an existing build directory's collectives and
# common libraries, then runs it (2 ranks: ring/shm, ring/TCP, Open MPI vader and tcp, memcpy).
#   tests/bench/allreduce.sh [build-dir]     (default: build)
set -e
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$src/build}
out=$build/allreduce_bench
mpicc -O2 -std=gnu11 -D_GNU_SOURCE -I"$src" "$src/tests/bench/allreduce.c" \
  "$build/collectives/libddp_coll.a" "$build/common/libddp_common.a" -lpthread -lm -ldl -o "$out"
exec "$out"
