"""`egf-audit capture -- CMD`: run CMD with the recorder injected and write the capture folder.

The folder holds, per recorded process, `events-<pid>.jsonl` and `snapshots-<pid>.bin` as the
recorder wrote them; `trace.jsonl` (the audited process as `--trace` writes traces);
`layout.json` when `--layout` named the file the trainer writes; and `manifest.json`.
"""

from __future__ import annotations

import ctypes
import json
import os
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from egf_audit.errors import AuditEnvironmentError, UsageError
from egf_audit.reports.atomic import write_atomic

from .build import build_recorder
from .convert import to_trace
from .events import ProcessCapture, read_capture
from .layout import LAYOUT_FILE, infer_layout, load_layout_file

DEFAULT_SNAPSHOT = ("sp14_scale_wire_col", "accumulate_d_h_s2_from_concat", "polyak_ema")
MULTIPLE_SUBSCRIBERS = 39  # CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
_OWN_FILES = ("events-*.jsonl*", "snapshots-*.bin*", "trace.jsonl", "manifest.json", LAYOUT_FILE)


@dataclass
class CaptureOutcome:
    exit_code: int  # CMD's own
    wall_s: float
    processes: list[dict] = field(default_factory=list)
    written: list[Path] = field(default_factory=list)


def audited_process(procs: list[ProcessCapture]) -> ProcessCapture:
    """The process that ran the trainer step: the most ABI kernel launches, then the most
    records (a launcher script and its trainer child are both recorded)."""
    abi = ("sp14_dir_concat_qaux", *DEFAULT_SNAPSHOT)
    return max(procs, key=lambda p: (sum(r.name in abi for r in p.kernels()), len(p.records)))


def _environment(lib: Path, out: Path, snapshot: tuple[str, ...], values_max: int | None) -> dict:
    env = dict(os.environ)
    env["CUDA_INJECTION64_PATH"] = str(lib)
    env["EGF_CAPTURE_DIR"] = str(out.resolve())
    env["EGF_CAPTURE_SNAPSHOT"] = ",".join(snapshot)
    if values_max is not None:
        env["EGF_CAPTURE_VALUES_MAX"] = str(values_max)
    return env


def _clear(out: Path) -> None:
    for pattern in _OWN_FILES:
        for old in out.glob(pattern):
            old.unlink()


def _diagnose(procs: list[ProcessCapture], code: int) -> None:
    """The exit-3 line when the capture recorded nothing usable."""
    if not procs:
        raise AuditEnvironmentError(
            f"the recorder was not loaded into the command (exit {code}): it initialised no "
            "CUDA driver (no GPU, or no CUDA use), or the driver refused the injected library"
        )
    for p in procs:
        status = p.init.get("subscribe", 0)
        if status == MULTIPLE_SUBSCRIBERS:
            raise AuditEnvironmentError(
                f"process {p.pid}: CUPTI already has a subscriber (error 39): a profiler, "
                "compute-sanitizer or Nsight holds this process; a capture cannot run beside them"
            )
        if status:
            raise AuditEnvironmentError(f"process {p.pid}: cuptiSubscribe failed ({p.notes[-1:]})")
    if not any(p.records for p in procs):
        raise AuditEnvironmentError(
            f"the command recorded no launch at all (exit {code}): it never ran GPU work"
        )


def run_capture(
    command: list[str],
    out: Path,
    layout: Path | None = None,
    snapshot: tuple[str, ...] = DEFAULT_SNAPSHOT,
    values_max: int | None = None,
) -> CaptureOutcome:
    if not command:
        raise UsageError("capture needs a command after `--`")
    lib = build_recorder()
    try:
        ctypes.CDLL(str(lib))  # the driver would refuse it silently; refuse it loudly here
    except OSError as exc:
        raise AuditEnvironmentError(f"the capture recorder does not load: {exc}") from None
    try:
        out.mkdir(parents=True, exist_ok=True)
        _clear(out)
    except OSError as exc:
        raise AuditEnvironmentError(f"cannot write {out}: {exc.strerror}") from None
    if layout is not None and layout.exists():
        layout.unlink()  # a stale file from an earlier run would name stale addresses
    start = time.perf_counter()
    try:
        proc = subprocess.run(command, env=_environment(lib, out, snapshot, values_max))
    except OSError as exc:
        raise UsageError(f"cannot run {shlex.join(command)}: {exc.strerror}") from None
    wall = time.perf_counter() - start
    procs = read_capture(out)
    _diagnose(procs, proc.returncode)
    outcome = CaptureOutcome(proc.returncode, wall)
    if layout is not None:
        if not layout.exists():
            raise UsageError(f"--layout {layout}: the command wrote no layout file there")
        load_layout_file(layout)  # refuse a malformed file now, not at `run --capture`
        write_atomic(out / LAYOUT_FILE, layout.read_text(encoding="utf-8"))
        outcome.written.append(out / LAYOUT_FILE)
    main = audited_process(procs)
    used = load_layout_file(out / LAYOUT_FILE) if layout is not None else infer_layout(main)
    trace = to_trace(main, used, scenario="capture").trace
    write_atomic(out / "trace.jsonl", "\n".join(trace.to_jsonl()) + "\n")
    outcome.processes = [
        {
            "pid": p.pid,
            "audited": p is main,
            "kernels": len(p.kernels()),
            "gemms": sum(r.kind in ("sgemm", "gemm") for r in p.records),
            "memsets": sum(r.kind == "memset" for r in p.records),
            "copies": sum(r.kind == "copy" for r in p.records),
            "snapshots": len(p.snapshots),
            "notes": p.notes,
        }
        for p in procs
    ]
    manifest = {
        "command": command,
        "exit_code": proc.returncode,
        "wall_s": round(wall, 3),
        "layout": LAYOUT_FILE if layout is not None else None,
        "snapshot_kernels": list(snapshot),
        "processes": outcome.processes,
    }
    write_atomic(out / "manifest.json", json.dumps(manifest, indent=1) + "\n")
    outcome.written += [out / "trace.jsonl", out / "manifest.json"]
    return outcome
