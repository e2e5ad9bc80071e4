#!/usr/bin/env bash
# Record the committed capture fixtures on a machine with an NVIDIA GPU, CUPTI and this checkout
# installed (`pip install -e .`). Every fixture is one `egf-audit capture` of a real process, with
# every snapshot value kept (no --values-max), shrunk by shrink.py. Usage:
#   bash tests/data/capture/record.sh OUT_DIR
# then copy OUT_DIR/* over tests/data/capture/ (README.md says what each folder is).
set -uo pipefail
out="${1:?usage: record.sh OUT_DIR}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
raw="$(mktemp -d)"
layout="$raw/layout.json"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
# from the repository root, so each manifest records the stand-in's command as docs/capture.md
# spells it (tests/standin/trainer.py, a script of the tests), not this machine's path to it
cd "$here/../../.."

capture() { # NAME, then the command
  local name="$1"
  shift
  rm -f "$layout"
  egf-audit capture --out "$raw/$name" --layout "$layout" -- "$@"
  echo "capture $name: exit $?"
  python "$here/shrink.py" "$raw/$name" "$out/$name"
}

standin=(python tests/standin/trainer.py --layout-out "$layout")
capture clean "${standin[@]}"
for fault in fwd-k-sh2 dw-k-sh2 dx-k-sh2 cql-site-ungated skip-scale skip-rebuild \
  no-zero-d-h-s2 scale-wrong-col target-grad-leak wrapper-on-main polyak-tau-swap \
  accumulate-wire-col; do
  capture "$fault" "${standin[@]}" --fault "$fault"
done

# a process that is no trainer: one matrix product through torch
rm -f "$layout"
egf-audit capture --out "$raw/not-a-trainer" -- python -c \
  "import torch; a = torch.randn(64, 64, device='cuda'); print(float((a @ a).sum()))"
python "$here/shrink.py" "$raw/not-a-trainer" "$out/not-a-trainer"

# a launcher that uses CUDA itself, then runs the trainer as its child: two processes
capture two-processes python -c "
import subprocess, sys, torch
torch.ones(8, device='cuda').sum().item()
sys.exit(subprocess.call([sys.executable, 'tests/standin/trainer.py', '--layout-out', '$layout']))"

# a trainer killed by a signal after its first step: no exit event, the manifest says so
capture killed python -c "
import os, signal, sys
sys.path.insert(0, 'tests/standin')
import trainer
trainer.main(['--steps', '1', '--layout-out', '$layout'])
os.kill(os.getpid(), signal.SIGKILL)"
rm -rf "$raw"
