#!/usr/bin/env bash
# Record the runtime-launch and GEMM-entry-point captures on a machine with an NVIDIA GPU, nvcc,
# cuBLAS, CUPTI and this checkout installed (`pip install -e .`). Usage:
#   bash tests/data/capture/runtime/record.sh OUT_DIR
# OUT_DIR gets one shrunk capture folder per run (shrink.py) and `log.txt`; README.md beside
# this file says which folders are committed as fixtures. Judge them anywhere (no GPU needed):
#   for d in OUT_DIR/*/; do python tests/data/capture/runtime/verdicts.py "$d" "$(basename "$d")"; done
set -uo pipefail
out="${1:?usage: record.sh OUT_DIR}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../../.." && pwd)"
work="$(mktemp -d)"
mkdir -p "$out"
exec > >(tee -a "$out/log.txt") 2>&1
pids=() # the builds in the background; a bare `wait` would also wait for tee above, forever

# ---- build: the trainer with extern "C" kernels, with C++ (mangled) ones, with a shared
# runtime; the driver-API trainer (NVRTC); the GEMM probe. cuBLAS links from wherever cublas_paths.py finds it; no cuBLAS
# header is needed (the sources declare the few prototypes they call).
python "$here/make_plan.py" "$work" --dispatch
cp -r "$repo/kernels" "$work/kernels-cxx"
sed -i 's/extern "C" //' "$work"/kernels-cxx/*.cu
read -r _ libdir libblas libblas_lt < <(python "$here/../cublas_paths.py" | grep '^lib ')
flags=(-O2 -std=c++17 -arch=sm_90 -L"$libdir" -Xlinker -rpath="$libdir" -l:"$libblas"
  -l:"$libblas_lt")
nvcc "${flags[@]}" -I"$repo/kernels" -I"$work" "$here/trainer.cu" -o "$work/trainer-c" &
pids+=($!)
nvcc "${flags[@]}" -I"$work/kernels-cxx" -I"$work" "$here/trainer.cu" -o "$work/trainer-cxx" &
pids+=($!)
nvcc "${flags[@]}" -cudart shared -I"$repo/kernels" -I"$work" "$here/trainer.cu" \
  -o "$work/trainer-shared" &
pids+=($!)
nvcc "${flags[@]}" "$here/gemm_probe.cu" -o "$work/gemm_probe" &
pids+=($!)
# the driver-API stand-in: NVRTC compiles each kernel from its source at run time (no nvcc);
# libcuda and libnvrtc from the driver's and the toolkit's folders the loader knows
nvcc -O2 -std=c++17 -x c++ -I"$here" "$here/trainer_driver.cpp" -o "$work/trainer-driver" \
  -L"$libdir" -Xlinker -rpath="$libdir" -l:"$libblas" -l:"$libblas_lt" \
  -L"$(dirname "$(command -v nvcc)")/../lib64/stubs" -lcuda -lnvrtc &
pids+=($!)
faults=(fwd-k-sh2 dw-k-sh2 dx-k-sh2 cql-site-ungated skip-scale skip-rebuild no-zero-d-h-s2
  scale-wrong-col target-grad-leak wrapper-on-main polyak-tau-swap accumulate-wire-col)
small="$here/small.toml"
python "$here/make_plan.py" "$work" --config "$small" &
pids+=($!)
printf '%s\n' "${faults[@]}" | xargs -P 8 -I{} python "$here/make_plan.py" "$work" \
  --config "$small" --fault {}
wait "${pids[@]}"
ls -la "$work"

layout="$work/layout.json"
capture() { # NAME, then the command (which writes $layout); ONLY="NAME ..." records those alone
  local name="$1"
  shift
  [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]] && return 0
  rm -f "$layout"
  timeout 45 egf-audit capture ${CAPTURE_FLAGS:-} --out "$work/cap/$name" --layout "$layout" -- "$@"
  local rc=$?
  echo "capture $name: exit $rc"
  [ "$rc" = 124 ] && { echo "capture $name hung: stopping"; exit 124; }
  python "$repo/tests/data/capture/shrink.py" "$work/cap/$name" "$out/$name"
  # the manifest names the scratch folder's files by their names alone
  sed -i "s#$work/##g" "$out/$name/manifest.json"
}

plan() { echo "$work/${1}.plan" "$work/${1}.layout" --layout-out "$layout"; }
# shellcheck disable=SC2046
"$work/trainer-c" $(plan clean)  # plain: the program runs without the recorder
rm -f "$layout"
# shellcheck disable=SC2046
capture rt-clean "$work/trainer-c" $(plan clean)
capture rt-clean-mangled "$work/trainer-cxx" $(plan clean)
capture rt-clean-shared-cudart "$work/trainer-shared" $(plan clean)
capture rt-gemm-ex "$work/trainer-c" $(plan clean) --gemm ex
capture rt-gemm-lt "$work/trainer-c" $(plan clean) --gemm lt
capture rt-gemm-lt-device "$work/trainer-c" $(plan clean) --gemm lt --device-scalars
for fault in "${faults[@]}"; do
  capture "rt-$fault" "$work/trainer-c" $(plan "$fault")
done
drv=(--kernel-sources "$repo/kernels")
capture drv-clean "$work/trainer-driver" $(plan clean) "${drv[@]}"
capture drv-dw-k-sh2 "$work/trainer-driver" $(plan dw-k-sh2) "${drv[@]}"
capture drv-gemm-lt-device "$work/trainer-driver" $(plan clean) "${drv[@]}" --gemm lt --device-scalars
if [ -n "${DEEP:-}" ]; then # DEEP=1: also these captured --deep
  CAPTURE_FLAGS=--deep capture rt-deep-clean "$work/trainer-c" $(plan clean)
  CAPTURE_FLAGS=--deep capture rt-deep-dw-k-sh2 "$work/trainer-c" $(plan dw-k-sh2)
fi
capture probe "$work/gemm_probe" --layout-out "$layout"
capture probe-k-short "$work/gemm_probe" --layout-out "$layout" --plant k-short
capture probe-ld-long "$work/gemm_probe" --layout-out "$layout" --plant ld-long
rm -rf "$work"
