"""The cuBLAS witness: cuBLAS's own API logger, asked to hand every line it logs to a callback,
is parsed and matched one-to-one, in order, with the SGEMMs the recorder saw. The recorder could
only lie to itself; this is a second account of the same launches, written by the library.

The logger is switched on in this process, after the CUDA backend has loaded cuBLAS
(`LoggerTap.attach`). It logs every handle and every thread of the process: torch's start-up,
which overlaps the scenarios on the CUDA backend (egf_audit.oracle.warmup), runs GEMMs of its own
in a thread of its own, on the same library. cuBLAS hands its logger one line at a time, so two
threads' calls interleave line by line (a log file of such a run tears records apart: that is
why the witness once matched 234 of 1449). The callback runs in the thread that made the call,
so each line is kept with its thread; the pipeline's thread's lines are read as one log, and of
those only the calls on the pipeline's handle are paired. Calls of other threads or handles are
counted as foreign; a call whose handle cannot be read is paired, so it cannot hide.
"""

from __future__ import annotations

import ctypes
import re
import threading
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import TypedDict

from egf_audit.trace.gemm_rules import GEMM_ARGS
from egf_audit.trace.model import Launch

FIELDS = GEMM_ARGS  # what is matched: the arguments that fix a GEMM's shape
_CALL = re.compile(r"function\s+cublasStatus_t\s+(cublas\w+)\s*\(")
_ARG = re.compile(r"^\s*i!\s+(\w+):\s*type=[^;]*;\s*val=(.*)$")
_OP = re.compile(r"CUBLAS_OP_([NTC])")
# cuBLAS 13 prints a pointer as "POINTER (IN HEX:0x0x1881fee0)": the prefix twice
_POINTER = re.compile(r"IN HEX:(?:0x)+([0-9a-fA-F]+)\)")
_LIBCUBLAS = re.compile(r"/libcublas\.so[.\d]*$")  # not libcublasLt: its calls are no SGEMMs
_LOG_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_char_p)  # cublasLogCallback


def loaded_cublas() -> list[str]:
    """The libcublas files this process has loaded, from its memory map."""
    try:
        with open("/proc/self/maps") as maps:
            found = {line.split()[-1] for line in maps if _LIBCUBLAS.search(line.strip())}
    except OSError:
        return []
    return sorted(found)


class LoggerTap:
    """cuBLAS's API logger, switched on with a callback in every libcublas the process has
    loaded; each logged line is kept with the thread that made the call."""

    def __init__(self) -> None:
        self.lines: list[tuple[int, str]] = []
        self._libraries: list[ctypes.CDLL] = []
        self._callback = _LOG_CALLBACK(self._on_line)  # kept alive while cuBLAS may call it

    def _on_line(self, message: bytes | None) -> None:
        if message:
            text = message.decode("utf-8", errors="replace")
            self.lines.append((threading.get_ident(), text if text.endswith("\n") else text + "\n"))

    def attach(self) -> None:
        """Switch the logger on; OSError where no libcublas is loaded or cuBLAS refuses."""
        paths = loaded_cublas()
        if not paths:
            raise OSError("no libcublas is loaded in this process")
        for path in paths:
            library = ctypes.CDLL(path)  # the loaded library itself: dlopen of a loaded path
            for status in (
                library.cublasLoggerConfigure(1, 0, 0, None),
                library.cublasSetLoggerCallback(self._callback),
            ):
                if status != 0:
                    raise OSError(f"{path} refused its logger (cuBLAS status {status})")
            self._libraries.append(library)

    def detach(self) -> None:
        for library in self._libraries:
            library.cublasSetLoggerCallback(None)
            library.cublasLoggerConfigure(0, 0, 0, None)
        self._libraries.clear()

    def text_of(self, thread: int) -> str:
        """What cuBLAS logged for the calls made in `thread`, in order, as one log."""
        return "".join(line for t, line in self.lines if t == thread)

    def other_threads(self, thread: int) -> list[int]:
        return sorted({t for t, _ in self.lines if t != thread})


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


def match_tap(
    tap: LoggerTap, thread: int, recorded: Iterable[Launch], handles: Collection[int] | None
) -> WitnessResult:
    """Pair the calls `thread` made (the pipeline's) with the recorded SGEMMs; every GEMM another
    thread logged is foreign."""
    result = match(parse_log(tap.text_of(thread)), recorded, handles)
    result.foreign += sum(len(parse_log(tap.text_of(t))) for t in tap.other_threads(thread))
    return result
