#!/usr/bin/env bash
# The trainer's own checks on a machine without a GPU (g++ only):
#  1. fd_check: reference.h's float64 backward against finite differences of its loss;
#  2. the trainer on host/sim_gpu.cpp (gpu.h on the CPU): --self-check for 3 steps, clean;
#     then every fault with --self-check, which must disagree with the contract's math except
#     gate-no-clamp (this trainer's raw gate, an accuracy, never leaves [0, 1]);
#  3. 200 steps: the loss must fall.
# Usage: bash tests/data/capture/outsider/host/check.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
g++ -O2 -std=c++17 -Wall -Wextra -I"$here" "$here/host/fd_check.cpp" -o "$work/fd_check"
"$work/fd_check"
g++ -O2 -std=c++17 -Wall -Wextra -I"$here" -DOUTSIDER_KERNEL_DIR="\"$here/kernels\"" \
  -x c++ "$here/trainer.cu" -x none "$here/host/sim_gpu.cpp" -o "$work/trainer"
"$work/trainer" --self-check --steps 3
"$work/trainer" --layout-out "$work/layout.json" --steps 1 >/dev/null
python3 -c "import json, sys; json.load(open(sys.argv[1]))" "$work/layout.json"
echo "the layout file parses as JSON"
status=0
while read -r fault _; do
  if "$work/trainer" --self-check --fault "$fault" >"$work/out.txt" 2>&1; then
    case "$fault" in
    gate-no-clamp) echo "fault $fault: agrees with the contract's math (expected)" ;;
    *) echo "fault $fault: NOT seen by --self-check"; status=1 ;;
    esac
  else
    echo "fault $fault: --self-check fails ($(grep -c -E 'differs|ISV|not [+]0.0' "$work/out.txt") findings)"
  fi
done < <("$work/trainer" --list-faults)
"$work/trainer" --steps 200 >"$work/long.txt"
first="$(awk '/^step 0 /{print $11}' "$work/long.txt")"
last="$(awk '/^step 199 /{print $11}' "$work/long.txt")"
echo "total loss: step 0 $first, step 199 $last"
python3 -c "import sys; sys.exit(0 if float(sys.argv[2]) < 0.5 * float(sys.argv[1]) else 1)" "$first" "$last" ||
  { echo "the loss did not halve in 200 steps"; status=1; }
exit "$status"
