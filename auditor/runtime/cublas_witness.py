"""The cuBLAS witness: cuBLAS's own API logger, asked to log every call to a file, is parsed and
matched one-to-one, in order, with the SGEMMs the recorder saw. The recorder could only lie to
itself; this is a second account of the same launches, written by the library.

The logger is switched on by environment variables that cuBLAS reads when it is loaded, so
`enable()` must run before the CUDA backend is first imported. It logs every handle of the
process: torch's start-up, which overlaps the scenarios on the CUDA backend
(egf_audit.oracle.warmup), runs GEMMs of its own on torch's handle. The witness therefore pairs
only the calls made on the pipeline's handle (each logged call names its `handle`) and counts
the others as foreign; a call whose handle cannot be read is paired, so it cannot hide.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from egf_audit.runtime.gemm_rules import GEMM_ARGS
from egf_audit.runtime.trace import Launch

FIELDS = GEMM_ARGS  # what is matched: the arguments that fix a GEMM's shape
_CALL = re.compile(r"function\s+cublasStatus_t\s+(cublas\w+)\s*\(")
_ARG = re.compile(r"^\s*i!\s+(\w+):\s*type=[^;]*;\s*val=(.*)$")
_OP = re.compile(r"CUBLAS_OP_([NTC])")
# cuBLAS 13 prints a pointer as "POINTER (IN HEX:0x0x1881fee0)": the prefix twice
_POINTER = re.compile(r"IN HEX:(?:0x)+([0-9a-fA-F]+)\)")


CHILD_MARKER = "EGF_AUDIT_CUBLAS_LOG"  # set when the logger was switched on at process start
LOG_PREFIX = "egf-audit-cublas-"


def enable(log_file: str | Path) -> None:
    """Ask cuBLAS to log every API call (with its arguments) to `log_file`. Takes effect only
    if cuBLAS is not loaded yet in this process."""
    os.environ["CUBLAS_LOGINFO_DBG"] = "1"
    os.environ["CUBLAS_LOGDEST_DBG"] = str(log_file)


def logger_environment() -> dict[str, str]:
    """The environment for a process whose cuBLAS logs every call to a fresh temporary file."""
    log = Path(tempfile.mkdtemp(prefix=LOG_PREFIX)) / "cublas_api.log"
    return {
        **os.environ,
        "CUBLAS_LOGINFO_DBG": "1",
        "CUBLAS_LOGDEST_DBG": str(log),
        CHILD_MARKER: str(log),
    }


def cublas_loaded() -> bool:
    """Whether this process has loaded libcublas already (after which its logger is fixed)."""
    try:
        with open("/proc/self/maps") as maps:
            return any(re.search(r"/libcublas\.so[.\d]*$", line.strip()) for line in maps)
    except OSError:
        return False


def _value(raw: str) -> str:
    raw = raw.strip()
    op = _OP.search(raw)
    if op:
        return op.group(1)
    return raw.split()[0] if raw else raw


def handle_value(raw: str) -> int | None:
    """The handle a logged call names, as an integer; None where the line shows none."""
    found = _POINTER.search(raw)
    return int(found.group(1), 16) if found else None


def parse_log(text: str) -> list[dict[str, str]]:
    """Every logged GEMM call as {api, handle, transa, transb, m, n, k, lda, ldb, ldc}, in
    order (`handle` in hexadecimal, absent where the log shows none)."""
    calls: list[dict[str, str]] = []
    current: dict[str, str] | None = None
    for line in text.splitlines():
        call = _CALL.search(line)
        if call:
            current = {"api": call.group(1)} if "gemm" in call.group(1).lower() else None
            if current is not None:
                calls.append(current)
            continue
        arg = _ARG.match(line)
        if arg and current is not None and arg.group(1) == "handle":
            handle = handle_value(arg.group(2))
            if handle is not None:
                current["handle"] = hex(handle)
        elif arg and current is not None and arg.group(1) in FIELDS:
            current[arg.group(1)] = _value(arg.group(2))
    return calls


def _recorded_key(launch: Launch) -> tuple[str, ...]:
    return tuple(str(launch.args[f]) for f in FIELDS)


def _logged_key(call: dict[str, str]) -> tuple[str, ...]:
    return tuple(call.get(f, "?") for f in FIELDS)


class WitnessMismatch(TypedDict):
    """A recorded SGEMM whose logged call differs: its index, label and both argument sets."""

    index: int
    label: str
    recorded: dict[str, str]
    logged: dict[str, str]


class WitnessDict(TypedDict):
    """`WitnessResult.as_dict()`: what the report, `--json` and the document read."""

    logged: int
    recorded: int
    matched: int
    foreign: int
    ok: bool
    mismatches: list[WitnessMismatch]


@dataclass
class WitnessResult:
    logged: int  # the calls paired: on the pipeline's handle, or on no handle the log shows
    recorded: int
    matched: int
    foreign: int = 0  # calls on another handle of the process (torch's), not paired
    mismatches: list[WitnessMismatch] = field(default_factory=list)  # first few, for the report

    @property
    def ok(self) -> bool:
        return self.logged == self.recorded == self.matched

    def as_dict(self) -> WitnessDict:
        return {
            "logged": self.logged,
            "recorded": self.recorded,
            "matched": self.matched,
            "foreign": self.foreign,
            "ok": self.ok,
            "mismatches": self.mismatches,
        }


def match(
    logged: list[dict[str, str]],
    recorded: Iterable[Launch],
    handles: Collection[int] | None = None,
    keep: int = 5,
) -> WitnessResult:
    """Pair the i-th logged GEMM with the i-th executed recorded SGEMM. With `handles` (the
    pipeline's cuBLAS handles), a call logged on another handle is foreign: counted, not
    paired; a call whose handle the log does not show is paired all the same."""
    recorded = [x for x in recorded if x.kind == "sgemm" and x.executed]
    ours = [
        call
        for call in logged
        if handles is None or "handle" not in call or int(call["handle"], 16) in handles
    ]
    result = WitnessResult(len(ours), len(recorded), 0, foreign=len(logged) - len(ours))
    logged = ours
    for i, (call, launch) in enumerate(zip(logged, recorded, strict=False)):
        if _logged_key(call) == _recorded_key(launch):
            result.matched += 1
        elif len(result.mismatches) < keep:
            result.mismatches.append(
                {
                    "index": i,
                    "label": launch.label,
                    "recorded": dict(zip(FIELDS, _recorded_key(launch), strict=True)),
                    "logged": dict(zip(FIELDS, _logged_key(call), strict=True)),
                }
            )
    return result
