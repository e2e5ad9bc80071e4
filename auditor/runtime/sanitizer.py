"""`egf-audit run --sanitize`: the same audit again under NVIDIA compute-sanitizer (memcheck,
then initcheck), its findings parsed into data for the document.

The guard zones and shadow comparisons see writes; on the GPU a read past a buffer that lands in
other memory is only seen by memcheck, and a read of memory nothing wrote only by initcheck. The
audit is re-run as a child process (`python -m egf_audit run --device cuda ...`, without
--sanitize) so the sanitizer instruments every launch of it from the start.

A memcheck error fails the gate. An initcheck error fails it when it is in one of the audited
kernels (kernels/); one inside a library kernel (cuBLAS reading its own workspace) is reported
but does not fail: egf-audit cannot change it, and it says nothing about the trainer's wiring.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

TOOLS = ("memcheck", "initcheck")
PRINT_LIMIT = 100  # errors printed per tool; the summary still counts them all
MAX_LISTED = 10  # findings per tool kept for the document
TIMEOUT_S = 3600  # instrumented launches run 10-100x slower
# set in the child: no memory pool and no guard zones (runtime/backends/cuda_guard.py), so
# memcheck sees each buffer's own bounds rather than a pool block's or a guard zone's
SANITIZED_CHILD = "EGF_AUDIT_SANITIZED_CHILD"

_PREFIX = "========= "
_SUMMARY = re.compile(r"ERROR SUMMARY:\s+(\d+)\s+errors?")
_AT = re.compile(r"^\s*at\s+(?:0x[0-9a-fA-F]+\s+in\s+)?(?:[\w:]+::)?([A-Za-z_]\w*)")
_THREAD = re.compile(r"by thread \((\d+),(\d+),(\d+)\) in block \((\d+),(\d+),(\d+)\)")


@dataclass(frozen=True)
class Finding:
    tool: str
    what: str  # "Invalid __global__ write of size 4 bytes"
    kernel: str | None  # the kernel it happened in, when the report names one
    thread: str | None = None  # "thread (64,0,0) in block (0,0,0)"
    detail: str | None = None  # "Access to 0x... is out of bounds", "Address 0x..."

    def line(self) -> str:
        where = f" in {self.kernel}" if self.kernel else ""
        thread = f", {self.thread}" if self.thread else ""
        detail = f": {self.detail}" if self.detail else ""
        return f"{self.what}{where}{thread}{detail}"


@dataclass
class ToolReport:
    tool: str
    errors: int  # from the ERROR SUMMARY line
    findings: list[Finding] = field(default_factory=list)
    failure: str | None = None  # the sanitizer itself did not finish (no summary)

    def failing(self, audited_kernels: frozenset[str]) -> list[Finding]:
        if self.tool == "initcheck":
            return [f for f in self.findings if f.kernel in audited_kernels]
        return list(self.findings)

    def as_dict(self) -> dict:
        shown = [f.line() for f in self.findings[:MAX_LISTED]]
        return {
            "errors": self.errors,
            "findings": "; ".join(shown) if shown else "none",
            **({"failure": self.failure} if self.failure else {}),
        }


def find_sanitizer() -> str | None:
    """compute-sanitizer on PATH, else under $CUDA_HOME (or $CUDA_PATH)."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        candidate = Path(root) / "bin" / "compute-sanitizer" if root else None
        if candidate is not None and candidate.is_file():
            return str(candidate)
    return None


def audit_argv(run_args: list[str], out: Path) -> list[str]:
    """The child audit: this interpreter, the same options, the CUDA backend, a scratch document."""
    return [sys.executable, "-m", "egf_audit", "run", *run_args, "--device", "cuda", "--out",
            str(out), "--quiet"]  # fmt: skip


def sanitizer_command(exe: str, tool: str, child: list[str]) -> list[str]:
    return [
        exe,
        "--tool",
        tool,
        "--print-limit",
        str(PRINT_LIMIT),
        "--show-backtrace",
        "no",
        "--target-processes",
        "all",
        *child,
    ]


def parse(tool: str, output: str) -> ToolReport:
    """Findings from compute-sanitizer's report: a `========= <what>` line opens one, indented
    `=========     ...` lines describe it, `ERROR SUMMARY: N errors` closes the report."""
    findings: list[Finding] = []
    current: dict | None = None
    errors = None

    def close() -> None:
        if current is not None:
            findings.append(Finding(tool, **current))

    for raw in output.splitlines():
        if not raw.startswith(_PREFIX.rstrip()):
            continue
        body = raw[len(_PREFIX) :] if raw.startswith(_PREFIX) else ""
        summary = _SUMMARY.search(body)
        if summary:
            errors = int(summary.group(1))
            continue
        if not body.strip() or body.startswith("COMPUTE-SANITIZER"):
            continue
        if not body.startswith(" "):  # a new finding
            close()
            current = {"what": body.strip(), "kernel": None}
            continue
        if current is None:
            continue
        text = body.strip()
        at = _AT.match(text)
        thread = _THREAD.search(text)
        if at and current["kernel"] is None:
            current["kernel"] = at.group(1)
        elif thread:
            current["thread"] = thread.group(0).removeprefix("by ")
        elif text.startswith(("Address", "Access to")) and "detail" not in current:
            current["detail"] = text
    close()
    if errors is None:
        return ToolReport(tool, len(findings), findings, "no ERROR SUMMARY in its output")
    return ToolReport(tool, errors, findings)


def run_tool(exe: str, tool: str, child: list[str]) -> ToolReport:
    command = sanitizer_command(exe, tool, child)
    env = {**os.environ, SANITIZED_CHILD: "1"}
    try:
        proc = subprocess.run(
            command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False, env=env
        )
    except subprocess.TimeoutExpired:
        return ToolReport(tool, 0, [], f"did not finish within {TIMEOUT_S} s")
    except OSError as exc:
        return ToolReport(tool, 0, [], f"could not start: {exc}")
    return parse(tool, proc.stdout + "\n" + proc.stderr)
