"""The cuBLAS witness: cuBLAS's own API logger, asked to log every call to a file, is parsed and
matched one-to-one, in order, with the SGEMMs the recorder saw. The recorder could only lie to
itself; this is a second account of the same launches, written by the library.

The logger is switched on by environment variables that cuBLAS reads when it is loaded, so
`enable()` must run before the CUDA backend is first imported.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from egf_audit.runtime.gemm_rules import GEMM_ARGS
from egf_audit.runtime.trace import Launch

FIELDS = GEMM_ARGS  # what is matched: the arguments that fix a GEMM's shape
_CALL = re.compile(r"function\s+cublasStatus_t\s+(cublas\w+)\s*\(")
_ARG = re.compile(r"^\s*i!\s+(\w+):\s*type=[^;]*;\s*val=(.*)$")
_OP = re.compile(r"CUBLAS_OP_([NTC])")


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


def parse_log(text: str) -> list[dict[str, str]]:
    """Every logged GEMM call as {api, transa, transb, m, n, k, lda, ldb, ldc}, in order."""
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
        if arg and current is not None and arg.group(1) in FIELDS:
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
    ok: bool
    mismatches: list[WitnessMismatch]


@dataclass
class WitnessResult:
    logged: int
    recorded: int
    matched: int
    mismatches: list[WitnessMismatch] = field(default_factory=list)  # first few, for the report

    @property
    def ok(self) -> bool:
        return self.logged == self.recorded == self.matched

    def as_dict(self) -> WitnessDict:
        return {
            "logged": self.logged,
            "recorded": self.recorded,
            "matched": self.matched,
            "ok": self.ok,
            "mismatches": self.mismatches,
        }


def match(logged: list[dict[str, str]], recorded: Iterable[Launch], keep: int = 5) -> WitnessResult:
    """Pair the i-th logged GEMM with the i-th executed recorded SGEMM."""
    recorded = [x for x in recorded if x.kind == "sgemm" and x.executed]
    result = WitnessResult(len(logged), len(recorded), 0)
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
