#!/usr/bin/env bash
# Record the outsider trainer's captures on a machine with an NVIDIA GPU, nvcc, NVRTC, cuBLAS,
# CUPTI and this checkout installed (`pip install -e .`). Usage:
#   bash tests/data/capture/outsider/record.sh OUT_DIR
# First the trainer runs plain with --self-check (driver and runtime API): its gradients and
# update against its own float64 reference. Then, for each mode of MODES (default: all three),
# the clean trainer and every fault of `trainer --list-faults` are captured with the layout
# file the trainer writes (--layout-out), each shrunk into OUT_DIR/NAME by shrink.py:
#   default  out-NAME       egf-audit capture --layout ...        (driver-API launches)
#   deep     out-deep-NAME  egf-audit capture --deep --layout ... (every call's effect, values)
#   runtime  out-rt-NAME    the same as default, the trainer run with --api runtime
#                           (cudaLibraryLoadData / cudaLaunchKernel, cudaMalloc, cudaMemsetAsync)
# ONLY="clean dw-k-sh2 ..." records those alone; MODES=deep (say) one mode, so a long recording
# can be split into several runs into the same OUT_DIR. Each folder is judged as soon as it is
# recorded, with and without its layout file, one line each appended to OUT_DIR/verdicts.jsonl
# (tests/data/capture/runtime/verdicts.py); OUT_DIR/log.txt keeps the whole output.
set -uo pipefail
out="${1:?usage: record.sh OUT_DIR}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../../../.." && pwd)"
work="$(mktemp -d)"
mkdir -p "$out"
exec > >(tee -a "$out/log.txt") 2>&1

bash "$here/build.sh" "$work" || exit 3
trainer="$work/trainer"
"$trainer" --self-check || echo "SELF-CHECK FAILED (driver API)"
"$trainer" --self-check --api runtime || echo "SELF-CHECK FAILED (runtime API)"
mapfile -t faults < <("$trainer" --list-faults | awk '{print $1}')

layout="$work/layout.json"
capture() { # NAME, then the trainer's arguments; CAPTURE_FLAGS go to egf-audit capture
  local name="$1"
  shift
  rm -f "$layout"
  timeout 120 egf-audit capture ${CAPTURE_FLAGS:-} --out "$work/cap/$name" --layout "$layout" \
    -- "$trainer" --layout-out "$layout" "$@"
  local rc=$?
  echo "capture $name: exit $rc"
  [ "$rc" = 124 ] && { echo "capture $name hung: stopping"; exit 124; }
  python "$repo/tests/data/capture/shrink.py" "$work/cap/$name" "$out/$name"
  # the manifest names the scratch folder's files by their names alone
  sed -i "s#$work/##g" "$out/$name/manifest.json"
  python "$repo/tests/data/capture/runtime/verdicts.py" "$out/$name" "$name" >>"$out/verdicts.jsonl"
}

for mode in ${MODES:-default deep runtime}; do
  for fault in clean "${faults[@]}"; do
    [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $fault "* ]] && continue
    args=()
    [ "$fault" != clean ] && args=(--fault "$fault")
    case "$mode" in
    default) capture "out-$fault" "${args[@]}" ;;
    deep) CAPTURE_FLAGS=--deep capture "out-deep-$fault" "${args[@]}" ;;
    runtime) capture "out-rt-$fault" --api runtime "${args[@]}" ;;
    *) echo "unknown mode $mode"; exit 2 ;;
    esac
  done
done

echo "verdicts: $out/verdicts.jsonl ($(wc -l <"$out/verdicts.jsonl") audits so far)"
rm -rf "$work"
