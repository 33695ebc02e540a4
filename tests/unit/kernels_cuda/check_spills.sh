#!/usr/bin/env bash
# No register spills in the CUDA kernels (TAP): compiles the kernel files of kernels/cuda (the
# attention kernels and the activation-typed ones) with the module's nvcc flags and -Xptxas -v
# for sm_80 and sm_90, and fails when any function reports spill stores or loads (a spill in a
# tiled kernel is a silent slowdown: registers overflow to local memory), or when ptxas reports
# nothing to check.
# Skips when meson found no nvcc (the build's have_cuda_kernels is false): a TAP skip plan and
# status 0, since meson's TAP protocol counts any other status, 77 included, as an error.
#   check_spills.sh                            skip
#   check_spills.sh NVCC SRCROOT [NVCC_FLAGS...]  the flags without -gencode
set -uo pipefail
[ $# -ge 2 ] || { echo "1..0 # SKIP nvcc not found (the CUDA module is not built)"; exit 0; }
nvcc=$1 root=$2
shift 2
files=(flash_attention.cu attention.cu norm.cu rope.cu matmul.cu pointwise.cu xent.cu)
archs=(80 90)
tmp=$(mktemp -d /tmp/ddp-spills.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

gencode=()
for a in "${archs[@]}"; do gencode+=(-gencode "arch=compute_$a,code=sm_$a"); done

echo "1..$((${#files[@]} * ${#archs[@]}))"
n=0 failed=0
for f in "${files[@]}"; do
  log=$tmp/$f.log
  if ! "$nvcc" "$@" "${gencode[@]}" -Xptxas -v -c "$root/kernels/cuda/$f" -o "$tmp/$f.o" \
      >"$log" 2>&1; then
    for a in "${archs[@]}"; do
      n=$((n + 1)) failed=$((failed + 1))
      echo "not ok $n - $f sm_$a: nvcc failed"
    done
    sed 's/^/# /' "$log" | tail -n 30
    continue
  fi
  for a in "${archs[@]}"; do
    n=$((n + 1))
    # ptxas: "Compiling entry function 'F' for 'sm_XX'", then "Function properties for F",
    # then "N bytes stack frame, S bytes spill stores, L bytes spill loads" (also for device
    # functions that were not inlined, under the arch of the last entry line).
    report=$(awk -v arch="sm_$a" '
      /Compiling entry function/ { split($0, q, "'"'"'"); cur_arch = q[4] }
      /Function properties for/ { fn = $NF }
      /bytes spill stores/ && cur_arch == arch {
        checked++
        spilled = 0
        for (i = 1; i + 2 <= NF; i++)
          if ($(i + 1) == "bytes" && $(i + 2) == "spill" && $i + 0 != 0) spilled = 1
        if (spilled) { sub(/^ +/, ""); print "spill: " fn ": " $0; bad++ }
      }
      END { print "checked " checked + 0 " bad " bad + 0 }' "$log")
    checked=$(echo "$report" | awk '/^checked/ { print $2 }')
    bad=$(echo "$report" | awk '/^checked/ { print $4 }')
    if [ "$checked" -gt 0 ] && [ "$bad" -eq 0 ]; then
      echo "ok $n - $f sm_$a: $checked functions, no spill stores or loads"
    else
      failed=$((failed + 1))
      echo "not ok $n - $f sm_$a: $bad of $checked functions spill"
      echo "$report" | grep '^spill' | sed 's/^/# /'
    fi
  done
done
[ $failed -eq 0 ]
