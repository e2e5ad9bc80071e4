"""Turn a capture folder into a committed fixture: gzip every file, and drop the cuBLAS log
messages egf-audit never reads (calls other than GEMMs, and each call's Time/Process/
COMPILED WITH/streamId lines). Kernel, memset, copy, snapshot and GEMM events stay as the
recorder wrote them. Usage: python shrink.py CAPTURE_DIR FIXTURE_DIR
"""

import gzip
import json
import shutil
import sys
from pathlib import Path

IGNORED = ("i! Time:", "i!Process=", "i! COMPILED WITH", "i!  streamId:")


def shrink(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for events in src.glob("events-*.jsonl"):
        kept, gemm = [], False
        for line in events.read_text().splitlines():
            event = json.loads(line)
            if event["ev"] == "cublas":
                msg = event["msg"]
                if msg.startswith("I! "):
                    gemm = "gemm" in msg.split("(")[1].lower() if "(" in msg else False
                if not gemm or msg.lstrip().startswith(IGNORED):
                    continue
            kept.append(line)
        with gzip.open(dst / f"{events.name}.gz", "wt") as f:
            f.write("\n".join(kept) + "\n")
    for name in [*src.glob("snapshots-*.bin"), *src.glob("values-*.bin"), src / "layout.json"]:
        if name.exists():
            with open(name, "rb") as f, gzip.open(dst / f"{name.name}.gz", "wb") as g:
                shutil.copyfileobj(f, g)
    manifest = src / "manifest.json"
    if manifest.exists():
        shutil.copy(manifest, dst / "manifest.json")


if __name__ == "__main__":
    shrink(Path(sys.argv[1]), Path(sys.argv[2]))
