"""Which of the trainer's kernel files a failed verdict is to blame on, and where in them: the
kernels the verdict names, the kernel whose output the invariant judges, and for EGF010 the
kernels whose outputs disagree with the float64 oracle (found in the trace: the kernel launches
that wrote a disagreeing tensor). The annotations' `file=` and `line=` and the plain text's
"is blamed on FILE:LINE" both read `locations`."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from egf_audit.invariants import Result
from egf_audit.reports.json_report import jsonable
from egf_audit.reports.model import AuditReport, Gate
from egf_audit.runtime.kernel_sources import KernelSource
from egf_audit.trace.buffers import tensor_table
from egf_audit.trace.model import Trace

# The kernel whose output an invariant judges, for a failure whose evidence names no kernel.
KERNEL_JUDGED_BY = {
    "EGF002": "sp14_scale_wire_col",  # the scale must not reach the dW its SGEMM reads
    "EGF003": "sp14_scale_wire_col",
    "EGF004": "sp14_scale_wire_col",
    "EGF008": "sp14_scale_wire_col",
    "EGF006": "sp14_dir_concat_qaux",
    "EGF007": "accumulate_d_h_s2_from_concat",
    "EGF005": "polyak_ema",
    "EGF009": "adam_update",  # the Adam state's shapes, as its launches pass them
    "EGF012": "alpha_grad_compute",  # the gate's producer
}
# where EGF010's tensor kinds live (oracle/compare.py names a tensor "<kind> <name>")
ORACLE_KIND_BUFFER = {
    "grad": "grad_buf",
    "param": "params",
    "adam_m": "adam_m",
    "adam_v": "adam_v",
    "sn": "sn_state",
    "target": "target_params",
}


def _failing_tensors(evidence: Mapping[str, object]) -> set[tuple[str, str]]:
    """(buffer, tensor) of every tensor EGF010's evidence lists as disagreeing."""
    found: set[tuple[str, str]] = set()
    steps = evidence.get("steps")
    if not isinstance(steps, Mapping):
        return found
    for step in steps.values():
        failing = step.get("failing", []) if isinstance(step, Mapping) else []
        for facts in failing if isinstance(failing, list) else []:
            kind, _, name = str(facts.get("tensor", "")).partition(" ")
            if kind in ORACLE_KIND_BUFFER and name:
                found.add((ORACLE_KIND_BUFFER[kind], name))
    return found


def _writers(traces: list[Trace], tensors: set[tuple[str, str]]) -> list[str]:
    """Kernels (not cuBLAS) that wrote any element of the tensors, in launch order."""
    names: list[str] = []
    for trace in traces:
        for buffer, name in tensors:
            found = tensor_table(trace.layout, buffer).get(name)
            if found is None:
                continue
            offset, rows, cols = found
            start, end = offset, offset + rows * cols
            for launch in trace.launches:
                if launch.kind != "kernel" or launch.name in names:
                    continue
                for b in launch.bindings:
                    r = b.region
                    if (
                        b.writes
                        and r is not None
                        and r.buffer == buffer
                        and r.offset < end
                        and r.last > start
                    ):
                        names.append(launch.name)
                        break
    return names


def blamed_kernels(gate: Gate, result: Result) -> list[str]:
    """The kernel names a failed verdict involves, most specific first."""
    said = result.verdict.summary + " " + json.dumps(jsonable(result.verdict.evidence))
    kernels = gate.report.kernels
    known = [s.spec.name for s in kernels.sources] if kernels is not None else []
    named = [name for name in known if name in said]
    report = gate.report
    if result.code == "EGF010" and isinstance(report, AuditReport) and report.run is not None:
        traces = [t for key, t in report.run.traces.items() if key.startswith(result.mode)]
        writers = _writers(traces, _failing_tensors(result.verdict.evidence))
        named += [n for n in writers if n not in named]
    judged = KERNEL_JUDGED_BY.get(result.code)
    if not named and judged is not None:
        named = [judged]
    return named


def trainer_sources(gate: Gate, result: Result) -> Iterator[KernelSource]:
    """The trainer's own kernel files (under --kernels) to blame; a bundled kernel is no file
    of the pull request, and a capture reads no kernel source."""
    kernels = gate.report.kernels
    if kernels is None:
        return
    trainer = {s.spec.name: s for s in kernels.sources if s.origin == "kernels-dir"}
    for name in blamed_kernels(gate, result):
        if name in trainer:
            yield trainer[name]


MAX_FILES_PER_FAILURE = 3  # GitHub shows at most 10 error annotations a step


@dataclass(frozen=True)
class Location:
    """Where a failure is blamed: a file as the document shows it, its first and last line, and
    (when the pull request changed lines of it) which lines and where the entry point is."""

    file: str
    line: int
    end: int
    entry: int
    kernel: str
    changed: str = ""  # "lines 3, 7-9 changed by this pull request; entry point at line 5"

    def said(self) -> str:
        """`kernels/x.cu:5 (the entry point of x)`, as plain text names it."""
        span = f"{self.line}" if self.end == self.line else f"{self.line}-{self.end}"
        why = self.changed or f"the entry point of {self.kernel}"
        return f"{self.file}:{span} ({why})"


def entry_line(text: str, name: str) -> int:
    """The line that names the kernel in its `__global__ ... name(` definition (1 if none)."""
    m = re.search(r"__global__[^;{]*?\b" + re.escape(name) + r"\s*\(", text)
    return text.count("\n", 0, m.end()) + 1 if m else 1


def locations(
    gate: Gate, result: Result, changed: Mapping[str, Sequence[tuple[int, int]]]
) -> list[Location]:
    """Each trainer kernel file a failure is blamed on: the lines the pull request changed in
    it where there are any (`changed`: (first, last) lines per file as shown), else its entry
    line. When the pull request changed some of the blamed files, only those: the other kernels
    are downstream of them (EGF010 blames every kernel that wrote a disagreeing tensor)."""
    out = []
    sources = list(trainer_sources(gate, result))
    touched = [s for s in sources if changed.get(s.path)]
    for source in (touched or sources)[:MAX_FILES_PER_FAILURE]:
        name = source.spec.name
        entry = entry_line(source.text, name)
        hunks = changed.get(source.path)
        if hunks:
            first, last = hunks[0]
            lines = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in hunks)
            where = f"lines {lines} changed by this pull request; entry point at line {entry}"
            out.append(Location(source.path, first, last, entry, name, where))
        else:
            out.append(Location(source.path, entry, entry, entry, name))
    return out


def blame_lines(
    gate: Gate, changed: Mapping[str, Sequence[tuple[int, int]]] | None = None
) -> dict[tuple[str, str], list[str]]:
    """Per failed verdict (code, mode), its plain-text lines `EGF007[sentinel] is blamed on
    FILE:LINE (...)`; a verdict blamed on no trainer file has none."""
    found: dict[tuple[str, str], list[str]] = {}
    for r in gate.report.failures:
        said = [
            f"{r.code}[{r.mode}] is blamed on {at.said()}"
            for at in locations(gate, r, changed or {})
        ]
        if said:
            found[(r.code, r.mode)] = said
    return found
