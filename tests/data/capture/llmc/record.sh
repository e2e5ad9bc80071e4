#!/usr/bin/env bash
# Capture karpathy/llm.c's train_gpt2_fp32.cu for two training steps, unmodified, and a copy with
# one token changed in matmul_backward (the dinp GEMM's K = OC becomes OC - 1), on a machine with
# an NVIDIA GPU, nvcc, cuBLAS, CUPTI and this checkout installed. llm.c is not part of this
# repository: LLMC_DIR is a copy of its train_gpt2_fp32.cu and llmc/ (utils.h, tokenizer.h,
# dataloader.h, rand.h). Usage:
#   bash tests/data/capture/llmc/record.sh LLMC_DIR OUT_DIR [CUBLAS_INCLUDE_DIR]
# OUT_DIR gets the shrunk captures (llmc, llmc-planted), timing.txt and log.txt; judge them
# with tests/data/capture/runtime/verdicts.py (no GPU needed).
set -uo pipefail
src="$(cd "${1:?usage: record.sh LLMC_DIR OUT_DIR}" && pwd)"
out="${2:?usage: record.sh LLMC_DIR OUT_DIR}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
work="$(mktemp -d)"
exec > >(tee -a "$out/log.txt") 2>&1
pids=() # the builds in the background; a bare `wait` would also wait for tee above, forever

cp -r "$src" "$work/clean"
cp -r "$src" "$work/planted"
python - "$work/planted/train_gpt2_fp32.cu" <<'PY'
import sys
path = sys.argv[1]
text = open(path).read()
# the one token: matmul_backward's dinp GEMM reads K = OC - 1 of dout's OC columns
old = "C, B*T, OC, &one, weight, C, dout, OC, &zero, dinp, C"
assert text.count(old) == 1, "matmul_backward's dinp GEMM moved"
open(path, "w").write(text.replace(old, "C, B*T, OC - 1, &one, weight, C, dout, OC, &zero, dinp, C"))
PY
diff "$work/clean/train_gpt2_fp32.cu" "$work/planted/train_gpt2_fp32.cu"
paths="$(python "$here/../cublas_paths.py" "${3:-}")"
inc="$(echo "$paths" | awk '$1 == "include" {print $2}')"
read -r _ libdir libblas libblas_lt < <(echo "$paths" | grep '^lib ')
for v in clean planted; do
  nvcc -O3 --use_fast_math -arch=sm_90 -I"$inc" -I"$work/$v" "$work/$v/train_gpt2_fp32.cu" \
    -L"$libdir" -Xlinker -rpath="$libdir" -l:"$libblas" -l:"$libblas_lt" -o "$work/$v/train" &
  pids+=($!)
done
python "$here/make_inputs.py" "$work/run"
wait "${pids[@]}"
args=(-i train.bin -j val.bin -b 4 -t 32 -v 100 -m 1 -s 100 -g 2)
cd "$work/run" || exit 1

capture() { # NAME BINARY
  rm -f layout-out.json
  local t0 t1
  t0=$(date +%s%N)
  timeout 45 egf-audit capture ${CAPTURE_FLAGS:-} --out "$work/cap/$1" --layout layout-out.json -- \
    sh -c 'cp layout.json layout-out.json && exec "$0" "$@"' "$2" "${args[@]}" >"$work/$1.stdout"
  local rc=$?
  echo "capture $1: exit $rc"
  [ "$rc" = 124 ] && { echo "capture $1 hung: stopping"; exit 124; }
  t1=$(date +%s%N)
  echo "$1 egf-audit capture $(((t1 - t0) / 1000000)) ms" >>"$out/timing.txt"
}
# plain and captured, alternating, twice each (the process's wall time)
for i in 1 2; do
  t0=$(date +%s%N)
  "$work/clean/train" "${args[@]}" >"$work/plain-$i.stdout"
  t1=$(date +%s%N)
  echo "plain $i process $(((t1 - t0) / 1000000)) ms" >>"$out/timing.txt"
  grep "^step" "$work/plain-$i.stdout" | sed "s/^/plain $i /" >>"$out/timing.txt"
  capture "llmc-$i" "$work/clean/train"
  python -c "import json,sys; print('captured', sys.argv[2], 'process', json.load(open(sys.argv[1]))['wall_s'], 's')" \
    "$work/cap/llmc-$i/manifest.json" "$i" >>"$out/timing.txt"
  grep "^step" "$work/llmc-$i.stdout" | sed "s/^/captured $i /" >>"$out/timing.txt"
done
capture llmc-planted "$work/planted/train"
names=(llmc-1 llmc-planted)
if [ -n "${DEEP:-}" ]; then # DEEP=1: also the clean trainer captured --deep
  CAPTURE_FLAGS=--deep capture llmc-deep "$work/clean/train"
  python -c "import json,sys; print('captured deep process', json.load(open(sys.argv[1]))['wall_s'], 's')" \
    "$work/cap/llmc-deep/manifest.json" >>"$out/timing.txt"
  names+=(llmc-deep)
fi
for name in "${names[@]}"; do
  # the folder's size as egf-audit capture wrote it, before shrink.py gzips it (.ci/gpu reads it)
  echo "raw ${name%-1} $(du -sb "$work/cap/$name" | cut -f1) bytes" >>"$out/timing.txt"
  short="${name%-1}"
  python "$here/../shrink.py" "$work/cap/$name" "$out/$short"
  sed -i "s#$work/##g" "$out/$short/manifest.json"
done
cat "$out/timing.txt"
rm -rf "$work"
