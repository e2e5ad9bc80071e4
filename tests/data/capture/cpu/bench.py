"""Time `egf-audit capture --cpu` on the runtime stand-in at the ci preset, two steps: five
runs each of the default capture and of --deep, each the whole command under /usr/bin/time
(its wall time and peak RSS), then the medians. The stand-in and its plan are built (or taken
from the cache) by tests/cpu_standins.py first, outside the timed runs; so are the fake
libraries and the kernels, by a first untimed capture.

    python tests/data/capture/cpu/bench.py [RUNS]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # tests/: cpu_standins
from cpu_standins import KERNELS, artifact, plan


def timed(command: list[str]) -> tuple[float, int]:
    """(wall seconds, peak RSS in KiB) of one run, as /usr/bin/time reports them."""
    proc = subprocess.run(
        ["/usr/bin/time", "-f", "%e %M", *command], capture_output=True, text=True, check=True
    )
    wall, rss = proc.stderr.strip().splitlines()[-1].split()
    return float(wall), int(rss)


def main(runs: int = 5) -> None:
    trainer, plans = artifact("trainer") / "trainer", artifact("plans-ci")
    with tempfile.TemporaryDirectory() as tmp:
        layout = Path(tmp) / "layout.json"
        for deep in ([], ["--deep"]):
            command = ["egf-audit", "capture", "--cpu", *deep, "--kernels", str(KERNELS)]
            command += ["--out", f"{tmp}/cap", "--layout", str(layout), "--"]
            command += [str(trainer), *plan(plans, "clean", layout)]
            timed(command)  # builds what is not cached yet
            results = [timed(command) for _ in range(runs)]
            walls = [w for w, _ in results]
            each = ", ".join(f"{w:.2f}" for w in walls)
            print(
                f"capture --cpu {' '.join(deep) or '(default)'}: {each} s; "
                f"median {statistics.median(walls):.2f} s, "
                f"peak RSS {max(r for _, r in results) / 1024:.0f} MiB"
            )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
