#!/usr/bin/env bash
# Build the outsider trainer on a machine with nvcc, the NVIDIA driver, NVRTC and cuBLAS (no
# cuBLAS or NVRTC header is needed: gpu_cuda.cpp declares what it calls). Usage:
#   bash tests/data/capture/outsider/build.sh [OUT_DIR]     (default: OUT_DIR = ./build here)
# Writes OUT_DIR/trainer. The kernels are read at run time from kernels/ beside this file
# (compiled in as the default of --kernels), so the binary runs from any folder.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$here/build}"
mkdir -p "$out"
cuda="${CUDA_HOME:-}"
if [ -z "$cuda" ]; then # the toolkit holding nvcc (nvcc on PATH may be a wrapper script)
  cuda="$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"
  [ -e "$cuda/include/cuda.h" ] || cuda=/usr/local/cuda
fi
# the NVIDIA wheels of this Python (nvidia/cu13/lib, nvidia/cublas/lib, ...), if any
mapfile -t wheels < <(python3 -c 'import glob, site
for p in site.getsitepackages(): print("\n".join(glob.glob(p + "/nvidia/*/lib")))' 2>/dev/null)

# find_lib NAME: "DIR FILE" of the first libNAME.so* in the toolkit, the wheels, the toolkit's
# stubs (libcuda only: the driver's own is found by the loader at run time), or ldconfig's cache
find_lib() {
  local d f
  for d in "$cuda/lib64" "$cuda/targets/x86_64-linux/lib" "${wheels[@]}" "$cuda/lib64/stubs"; do
    f="$(ls "$d/lib$1.so"* 2>/dev/null | head -n1 || true)"
    [ -n "$f" ] && { echo "$d $(basename "$f")"; return 0; }
  done
  f="$(ldconfig -p 2>/dev/null | awk -v n="lib$1.so" 'index($1, n) == 1 {print $NF; exit}')"
  [ -n "$f" ] && { echo "$(dirname "$f") $(basename "$f")"; return 0; }
  echo "build.sh: lib$1 not found (CUDA_HOME=$cuda)" >&2
  return 1
}

flags=(-std=c++17 -O2 -DOUTSIDER_KERNEL_DIR="\"$here/kernels\"")
for lib in cuda nvrtc cublas; do
  found="$(find_lib "$lib")" || exit 3
  read -r dir file <<<"$found"
  [ "$dir" != "$cuda/lib64/stubs" ] && flags+=(-Xlinker -rpath="$dir")
  flags+=(-L"$dir" -l:"$file")
done
nvcc "${flags[@]}" "$here/trainer.cu" "$here/gpu_cuda.cpp" -o "$out/trainer"
echo "built $out/trainer"

# TODO(lead): a variant for `egf-audit capture --cpu` once it exists: the same two sources,
# linked against the CPU libcuda/libnvrtc/libcublas that command provides (only the -L/-rpath
# folders above change; the trainer needs no source change). Left open: that command's
# library folder and flags are not documented yet.
