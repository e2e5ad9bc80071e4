"""`egf-audit run --capture DIR`: every invariant a capture can decide, judged on every process
of the capture folder that launched an ABI kernel; a process that launched none but ran cuBLAS
GEMMs gets the checks that need no SP14 name, the rest not applicable (and the gate still fails
a capture in which no process is an SP14 trainer, unless `trainer="generic"` says the program
is no SP14 trainer by design). An UNDECIDED verdict fails the gate unless it is allowed
(invariants/undecided.py): by default what the capture's mode structurally cannot decide, plus
the codes the user names.

The judging itself lives in the invariant registry (each entry's `capture` check, beside its
rebuild check, egf_audit.invariants); this module reads the folder, names each process's
pointers (the layout file, or inference), cuts its launches into steps and call sites, and says
what makes the capture incomplete. Rendering and the gate are the rebuild's
(egf_audit.reports), reached from cli/capture_commands.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from egf_audit.capture.convert import to_trace
from egf_audit.capture.folder import CaptureFolder, read_folder
from egf_audit.capture.inference import infer_layout
from egf_audit.capture.kernel_params import ABI_KERNELS
from egf_audit.capture.layout import load_layout_file, place
from egf_audit.capture.manifest import audited_process, exit_words
from egf_audit.errors import UsageError
from egf_audit.invariants import INVARIANTS
from egf_audit.invariants.registry import FAIL, Verdict
from egf_audit.invariants.undecided import allowed_by_default, capture_mode, not_allowed
from egf_audit.trace.buffers import CaptureLayout
from egf_audit.trace.model import Trace
from egf_audit.trace.process import ProcessCapture


@dataclass(frozen=True)
class ProcessAudit:
    """One audited process: its place among the folder's processes (never its pid, which
    changes from capture to capture), what it recorded, and one verdict per invariant."""

    section: str  # "process 1"
    trace: Trace
    verdicts: tuple[tuple[str, Verdict], ...]  # (code, verdict) in registry order
    layout_note: str = ""  # why the layout file was not used for it, if it was not
    mode: str = "capture"  # its capture mode (invariants/undecided.py): "capture --deep" if deep
    allowed: frozenset[str] = frozenset()  # the codes that may stay UNDECIDED in it

    @property
    def undecided_failing(self) -> list[str]:
        """Its UNDECIDED verdicts that are not allowed: each fails the gate."""
        return not_allowed(self.verdicts, self.allowed)

    @property
    def unresolved_gemms(self) -> list[int]:
        return [
            x.index
            for x in self.trace.sgemms()
            if not x.bindings or any(b.region is None for b in x.bindings)
        ]


@dataclass
class CaptureAudit:
    folder: Path
    processes: list[ProcessAudit] = field(default_factory=list)
    not_audited: list[str] = field(default_factory=list)  # processes with no ABI launch
    incomplete: list[str] = field(default_factory=list)  # the capture cannot be complete
    missing: list[str] = field(default_factory=list)  # what makes it no SP14 trainer
    trainer: str = "sp14"  # "generic": no process need be an SP14 trainer

    @property
    def ok(self) -> bool:
        undecided = any(p.undecided_failing for p in self.processes)
        return not (self.incomplete or self.missing or self.failed_codes() or undecided)

    def failed_codes(self) -> set[str]:
        """The invariants that fail in any audited process."""
        return {code for p in self.processes for code, v in p.verdicts if v.status == FAIL}


def abi_launches(proc: ProcessCapture) -> int:
    return sum(r.name in ABI_KERNELS for r in proc.kernels())


def _foreign(section: str, what: str, pointers: list[int]) -> UsageError:
    return UsageError(
        f"the layout file names none of {section}'s {what} (the first at {pointers[0]:#x}): it "
        "is no layout of the process the capture audited, and a named layout file is never "
        "replaced by inference"
    )


def _layout_for(
    proc: ProcessCapture, section: str, given: CaptureLayout | None, audited: bool
) -> tuple[CaptureLayout, str]:
    """The layout file where it names this process's ABI pointers, else inference; the dims
    the file leaves out are taken from the concat launches. The process the layout file was
    written for (`audited`) must be named by it: for that one, a file naming none of its ABI
    pointers is refused, never replaced by inference."""
    inferred = infer_layout(proc)
    if given is None:
        return inferred, ""
    given, note = place(given, proc)
    pointers = [
        v
        for r in proc.kernels()
        if r.name in ABI_KERNELS
        for k, v in r.args.items()
        if isinstance(v, int) and k in ("dx_concat", "concat", "d_h_s2", "target")
    ]
    if pointers and not any(given.resolve(p) is not None for p in pointers):
        if audited:
            raise _foreign(section, "ABI pointers", pointers)
        return inferred, "the layout file names none of its pointers: names inferred"
    layout = CaptureLayout(dict(given.buffers), {**inferred.dims, **given.dims}, from_file=True)
    return layout, note


def audit_process(
    proc: ProcessCapture, section: str, given: CaptureLayout | None, audited: bool = False
) -> ProcessAudit:
    layout, note = _layout_for(proc, section, given, audited)
    ct = to_trace(proc, layout, scenario=section)
    verdicts = tuple((inv.code, inv.capture_verdict(ct)) for inv in INVARIANTS)
    return ProcessAudit(section, ct, verdicts, note)


def gemm_count(proc: ProcessCapture) -> int:
    return sum(r.kind in ("sgemm", "gemm") for r in proc.records)


def audit_other_process(
    proc: ProcessCapture, section: str, given: CaptureLayout | None, audited: bool = False
) -> ProcessAudit:
    """A process that launched no ABI kernel but ran cuBLAS GEMMs: judged by the checks that
    need no SP14 name (EGF001's operand, memset and copy spans: `Invariant.any_process`), every
    other invariant not applicable. The layout file names its buffers where it names any of its
    GEMMs' pointers; for the process the file was written for (`audited`), a file naming none
    is refused."""
    layout, note = CaptureLayout(), ""
    if given is not None:
        given, note = place(given, proc)
    operands = [
        op
        for r in proc.records
        if r.kind in ("sgemm", "gemm")
        for op in (r.args.get("A"), r.args.get("B"), r.args.get("C"))
        if isinstance(op, int)
    ]
    if given is not None and any(given.resolve(op) is not None for op in operands):
        layout = CaptureLayout(dict(given.buffers), dict(given.dims), from_file=True)
    elif given is not None and audited and operands:
        raise _foreign(section, "GEMM operands", operands)
    ct = to_trace(proc, layout, scenario=section)
    ct.capture.sp14 = False
    verdicts = tuple((inv.code, inv.capture_verdict(ct)) for inv in INVARIANTS)
    return ProcessAudit(section, ct, verdicts, note)


def graph_words(proc: ProcessCapture) -> str | None:
    """Why a process that runs CUDA graphs cannot be followed, or None: a graph's kernels are
    recorded once, while a stream is captured into it (when they do not run), and each launch of
    the graph runs them again unseen, so the recorded order is not the order they ran in."""
    captured = sum(bool(r.args.get("captured")) for r in proc.kernels())
    if not captured and not proc.graph_launches:
        return None
    return (
        f"it runs CUDA graphs ({proc.graph_launches} graph launches; {captured} kernel launches "
        "recorded while a stream was captured into a graph, not when they ran): the capture "
        "cannot follow a graph's launches, so what it recorded is not what ran (docs/capture.md, "
        "Limits)"
    )


def _incomplete(proc: ProcessCapture, section: str, found: CaptureFolder) -> list[str]:
    """What makes one process's record incomplete, audited or not: a launcher killed or cut off
    mid-line means the run did not end as a finished one does."""
    out = []
    if found.manifest is not None and found.manifest.deep and not proc.deep:
        out.append(
            f"{section}: --deep was asked for and its recorder did not record deep (its notes "
            "say why)"
        )
    if proc.cut_off:
        out.append(
            f"{section}: {proc.cut_off} is cut off mid-write: the process died while the "
            "recorder wrote it"
        )
    elif not proc.ended:
        out.append(
            f"{section}: {proc.events_file or 'its events'} ends without the recorder's exit "
            "event: the process did not end through exit() (killed, crashed, or the file was "
            "cut off)"
        )
    return out


TRAINERS = ("sp14", "generic")


def audit_capture(
    folder: Path,
    use_layout: bool = True,
    allow: frozenset[str] = frozenset(),
    trainer: str = "sp14",
) -> CaptureAudit:
    """Read a capture folder and decide. `use_layout=False` ignores a layout file (inference).
    `allow`: the codes the user allows undecided, beside what the capture's mode cannot decide.
    `trainer="generic"`: a program that is no SP14 trainer by design, judged by the checks that
    need no SP14 name; a process that launched ABI kernels is still judged as one. A file that
    cannot be read whole, or a folder that disagrees with its manifest, is refused (UsageError,
    exit 2)."""
    if trainer not in TRAINERS:
        raise UsageError(f"trainer {trainer!r}: choose from {', '.join(TRAINERS)}")
    found = read_folder(Path(folder))
    procs, manifest = found.processes, found.manifest
    given = load_layout_file(found.layout) if use_layout and found.layout else None
    audited_pid = found.audited_pid if manifest is not None else audited_process(procs).pid
    audit = CaptureAudit(found.folder, trainer=trainer)
    if manifest is None:
        audit.incomplete.append("no manifest.json: the command and how it ended are unknown")
    elif manifest.exit_code != 0:
        audit.incomplete.append(
            f"the captured command {exit_words(manifest.exit_code)} (manifest.json): the "
            "trainer did not finish its steps"
        )
    for number, proc in enumerate(procs, 1):
        section, audited = f"process {number}", proc.pid == audited_pid
        if not abi_launches(proc) and not gemm_count(proc):
            audit.not_audited.append(
                f"{section}: {len(proc.kernels())} kernel launches and no cuBLAS GEMM, no ABI "
                "kernel: not audited"
            )
            audit.incomplete += _incomplete(proc, section, found)
            continue
        judge = audit_process if abi_launches(proc) else audit_other_process
        judged = judge(proc, section, given, audited)
        # a capture asked for --deep allows nothing by default, recorded deep or not
        mode = capture_mode(proc.deep or (manifest is not None and manifest.deep))
        allowed = allowed_by_default(mode) | allow
        audit.processes.append(replace(judged, mode=mode, allowed=allowed))
        if (graphs := graph_words(proc)) is not None:
            audit.incomplete.append(f"{section}: {graphs}")
        audit.incomplete += _incomplete(proc, section, found)
    if trainer == "generic" and not audit.processes:
        audit.missing.append(
            f"no process ran a cuBLAS GEMM or an ABI kernel in the {len(procs)} recorded "
            f"process{'es' * (len(procs) != 1)}: nothing for the generic checks to judge"
        )
    elif trainer == "sp14" and not any(p.trace.capture.sp14 for p in audit.processes):
        audit.missing.append(
            f"no process is an SP14 trainer: none of the ABI kernels ({', '.join(ABI_KERNELS)}) "
            f"was launched in the {len(procs)} recorded process{'es' * (len(procs) != 1)} (a "
            "program that is no SP14 trainer by design is audited with --trainer generic)"
        )
    return audit
