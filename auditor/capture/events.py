"""Read a capture folder: the recorder's event lines and snapshot bytes, one process at a time.

The recorder writes raw facts (a kernel's parameter bytes, cuBLAS's own log text). Here they
are decoded: a kernel whose name is in egf-audit's kernel table gets its parameters by name and
C type; a `cublasSgemm_v2` log message becomes the SGEMM's arguments, with alpha and beta from
the bits the recorder read while the call was in progress.
"""

from __future__ import annotations

import gzip
import json
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np

from egf_audit.errors import UsageError
from egf_audit.kernels import KERNELS_BY_NAME
from egf_audit.runtime.capture_model import ProcessCapture, Record, SnapshotRegion

EVENTS_GLOB = "events-*.jsonl*"  # .jsonl as written, .jsonl.gz as committed fixtures keep it
_CALL = re.compile(r"function\s+cublasStatus_t\s+(cublas\w+)\s*\(")
_ARG = re.compile(r"^\s*i!\s+(\w+):\s*type=[^;]*;\s*val=(.*)$")
_OP = re.compile(r"CUBLAS_OP_([NTC])")
_HEX = re.compile(r"HEX:(?:0x)?0x([0-9a-fA-F]+)")
GEMM_INTS = ("m", "n", "k", "lda", "ldb", "ldc")


def _decode_params(name: str, raw: list[list[int]] | None) -> tuple[dict[str, Any], bool]:
    """Parameters by name and C type for a kernel egf-audit knows, else `p0..pN` raw values."""
    if raw is None:
        return {}, False
    spec = KERNELS_BY_NAME.get(name)
    if spec is None or len(spec.params) != len(raw):
        return {f"p{i}": value for i, (_, value) in enumerate(raw)}, False
    args: dict[str, Any] = {}
    for (pname, ctype), (size, value) in zip(spec.params, raw, strict=True):
        if ctype == "float":
            args[pname] = struct.unpack("<f", struct.pack("<I", value & 0xFFFFFFFF))[0]
        elif ctype == "int" and size == 4:
            args[pname] = struct.unpack("<i", struct.pack("<I", value & 0xFFFFFFFF))[0]
        elif ctype == "long long":
            args[pname] = struct.unpack("<q", struct.pack("<Q", value))[0]
        else:
            args[pname] = value
    return args, True


def _float_bits(bits: int | None) -> float | None:
    return None if bits is None else struct.unpack("<f", struct.pack("<I", bits))[0]


def parse_cublas(msg: str) -> tuple[str, dict[str, Any]] | None:
    """(function, arguments) of one cuBLAS log message, or None when it logs no call."""
    call = _CALL.search(msg)
    if not call:
        return None
    args: dict[str, Any] = {}
    for line in msg.splitlines():
        arg = _ARG.match(line)
        if not arg:
            continue
        key, raw = arg.group(1), arg.group(2).strip()
        if (op := _OP.search(raw)) is not None:
            args[key] = op.group(1)
        elif (ptr := _HEX.search(raw)) is not None:
            args[key] = int(ptr.group(1), 16)
        else:
            token = raw.split()[0] if raw else raw
            args[key] = int(token) if re.fullmatch(r"-?\d+", token) else token
    return call.group(1), args


def _record(event: dict[str, Any]) -> Record | None:
    ev, seq = event["ev"], event["seq"]
    if ev == "kernel":
        args, decoded = _decode_params(event["name"], event.get("params"))
        args |= {"grid": event["grid"], "block": event["block"]}
        return Record(seq, "kernel", event["name"], event["api"], args, decoded)
    if ev in ("memset", "copy", "alloc"):
        args = {k: event[k] for k in ("dst", "src", "bytes", "value") if k in event}
        return Record(seq, ev, ev, event["api"], args)
    return None


def _cublas_record(events: list[dict[str, Any]]) -> Record | None:
    """One cuBLAS call from the log messages it came in (a header, then argument lines)."""
    parsed = parse_cublas("\n".join(e["msg"] for e in events))
    if parsed is None or "gemm" not in parsed[0].lower():
        return None
    function, args = parsed
    merged = {
        k: v for e in events for k, v in e.items() if k.endswith("_bits") or k == "pointer_mode"
    }
    args["alpha"] = _float_bits(merged.get("alpha_bits"))
    args["beta"] = _float_bits(merged.get("beta_bits"))
    args["pointer_mode"] = merged.get("pointer_mode")
    kind = "sgemm" if function == "cublasSgemm_v2" else "gemm"
    if kind == "sgemm" and not all(
        k in args for k in (*GEMM_INTS, "transa", "transb", "A", "B", "C")
    ):
        kind = "gemm"  # a log without its arguments: kept, never bound
    return Record(events[0]["seq"], kind, function, function, args)


def _open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open()


def read_process(events_path: Path) -> ProcessCapture:
    pid = int(re.search(r"events-(\d+)", events_path.name).group(1))
    snap_path = next(iter(events_path.parent.glob(f"snapshots-{pid}.bin*")), None)
    blob = b""
    if snap_path is not None:
        opener = gzip.open if snap_path.suffix == ".gz" else open
        with opener(snap_path, "rb") as f:
            blob = f.read()
    proc = ProcessCapture(pid, {})
    open_calls: dict[int, list[dict[str, Any]]] = {}  # thread -> the cuBLAS call being logged

    def close(tid: int) -> None:
        if tid in open_calls and (record := _cublas_record(open_calls.pop(tid))) is not None:
            proc.records.append(record)

    with _open_text(events_path) as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                # the process died mid-line: what came before is still the record
                proc.notes.append(f"line {number} of {events_path.name} is cut off")
                break
            tid = event.get("tid", 0)
            if event["ev"] == "cublas":
                if "I! " in event["msg"] or tid not in open_calls:
                    close(tid)
                    open_calls[tid] = []
                open_calls[tid].append(event)
                continue
            close(tid)
            if event["ev"] == "init":
                proc.init = event
            elif event["ev"] == "note":
                proc.notes.append(event["msg"])
            elif event["ev"] == "snapshot":
                start, count = event["offset"], event["count"]
                values = np.frombuffer(blob, np.float32, count, start) if count else np.empty(0)
                proc.snapshots.append(
                    SnapshotRegion(
                        event["launch"],
                        event["when"],
                        event["region"],
                        event["ptr"],
                        event["elements"],
                        event["hash"],
                        values.astype(np.float32, copy=False),
                    )
                )
            elif (record := _record(event)) is not None:
                proc.records.append(record)
    for tid in list(open_calls):
        close(tid)
    proc.records.sort(key=lambda r: r.seq)
    return proc


def read_capture(folder: Path) -> list[ProcessCapture]:
    """Every recorded process of a capture folder, in pid order."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UsageError(f"--capture {folder}: no such folder")
    return [read_process(p) for p in sorted(folder.glob(EVENTS_GLOB))]
