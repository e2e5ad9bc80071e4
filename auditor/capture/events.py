"""Read a capture folder's processes: each `events-<pid>.jsonl` line by line into one
`ProcessCapture`, with its snapshot regions and values file beside it.

Each line is checked against the event table (capture/schema.py) and handed to the handler of
its kind: a kernel launch decoded (capture/kernel_params.py), cuBLAS's log lines gathered per
thread into GEMM records (capture/cublas_log.py), cuBLASLt, memory calls, a deep capture's
effects and contents, snapshots. What spans lines is checked here: seqs increase strictly, a
snapshot follows its launch, an effect its call, contents their allocation, values never
overlap.

Fail closed: a capture is evidence, so a file that cannot be read whole and as the recorder
writes it is refused, never read in part: every problem is one UsageError (exit 2) naming the
file and the 1-based line (capture/files.py reads the bytes). A file that ends between two lines
without the recorder's exit event (the process was killed, or crashed) reads, with `ended`
False, and the audit calls the capture incomplete; one that ends inside a line is cut off:
`cut_off` names it, and the audit calls it incomplete too.

Memory stays bounded: lines are read one at a time, a plain snapshots file is mapped read-only
and every region's values are a view into it, and records keep the decoded arguments of a
cuBLAS call, never its log text.
"""

from __future__ import annotations

import contextlib
import re
import sys
from pathlib import Path
from typing import Any

from egf_audit.errors import UsageError, option_error
from egf_audit.kernels import KERNELS_BY_NAME
from egf_audit.trace.process import HASH_FNV1A, Contents, Effect, ProcessCapture, Record

from .cublas_log import cublas_record, inside_classic_call
from .files import CutOff, parse_line, refuse, text_lines
from .gemms import lt_gemm, operands_problem
from .kernel_params import abi_problem, decode_params, pointer_words, source_name
from .live_memory import DEEP_ROUND, LiveMemory
from .regions import Snapshot, snapshot_regions, values_reader
from .schema import event_problem

EVENTS_GLOB = "events-*.jsonl*"  # .jsonl as written, .jsonl.gz as committed fixtures keep it
EVENTS_NAME = re.compile(r"events-(\d+)\.jsonl(\.gz)?")
MAX_NOTES = 1024  # the recorder notes a handful of things a process (a logger, a budget)
MAX_CALL_LINES = 1024  # cuBLAS logs a call in one line per argument: a few dozen


class _Reader:
    """The state of one events file as it is read, line by line."""

    def __init__(self, path: Path, pid: int):
        self.name = path.name
        self.proc = ProcessCapture(pid, {}, events_file=self.name)
        self.open_calls: dict[int, tuple[int, list[dict[str, Any]]]] = {}  # tid -> line, messages
        self.kernel_seqs: set[int] = set()
        self.snaps: list[Snapshot] = []
        # step_start snapshots of a recorder before it named their launch: (tid -> waiting)
        self.waiting_launch: dict[int, list[Snapshot]] = {}
        self.last_record: dict[int, Record] = {}  # tid -> the last call recorded on that thread
        # tid -> the seq of the GEMM record of the last cuBLAS call on that thread, -1 for a call
        # that is no GEMM: a launch cuBLAS made (deep captures say so) belongs to that call
        self.cublas_call: dict[int, int] = {}
        self.observed_seqs: set[int] = set()  # kernel launches, memsets, copies: effects follow
        self.allocated: dict[int, tuple[int, int]] = {}  # alloc seq -> address, bytes
        self.values_end = 0  # the bytes of values-<pid>.bin the events so far have named
        self.live = LiveMemory()  # the allocations live at the line being read

    def record(self, tid: int, record: Record) -> None:
        self.proc.records.append(record)
        self.last_record[tid] = record

    def values_at(self, where: str, event: dict[str, Any]) -> int | None:
        """An effect's or contents' offset into values-<pid>.bin, in a capture whose init says
        it records values: at or after where the previous event's bytes end (a gap is the
        bytes of an event missing from the file)."""
        offset = event.get("values")
        if offset is None:
            return None
        if not self.proc.values:
            refuse(where, '"values", and the init event does not say the capture records them')
        if offset < self.values_end:
            refuse(
                where,
                f'"values" {offset}: the values before it end at byte {self.values_end} of the '
                "values file (each event's bytes follow the previous event's, never overlap them)",
            )
        self.values_end = offset + sum(n for _, n in event["changed"])
        return offset

    def close(self, tid: int) -> None:
        """The cuBLAS call logged on this thread is whole: its record, if it is a GEMM."""
        if tid in self.open_calls:
            line, messages = self.open_calls.pop(tid)
            record = cublas_record(self.name, line, messages)
            self.cublas_call[tid] = -1 if record is None else record.seq
            if record is not None:
                self.record(tid, record)

    # ---- one handler per kind of event ----
    def on_init(self, where: str, event: dict[str, Any]) -> None:
        proc = self.proc
        proc.init = event
        proc.deep = event.get("deep") is True
        proc.guarded = not proc.deep and event.get("guard") is True
        proc.values = proc.deep and event.get("values") is True

    def on_kernel(self, where: str, event: dict[str, Any], number: int) -> None:
        seq, tid = event["seq"], event["tid"]
        symbol = event["name"]
        kname = source_name(symbol)
        if kname not in KERNELS_BY_NAME:
            kname = symbol  # a kernel egf-audit does not know keeps its symbol
        rc = event.get("param_info_rc")
        if (problem := abi_problem(kname, event["params"], rc)) is not None:
            refuse(where, problem)
        args, decoded = decode_params(kname, event["params"])
        args |= {"grid": event["grid"], "block": event["block"]}
        if event.get("captured"):
            args["captured"] = True
        if kname != symbol:
            args["symbol"] = symbol
        # one string per kernel name, not one per launch; the API the trainer called (a runtime
        # launch reaches the driver's cuLaunchKernel "via" it)
        kernel, api = sys.intern(kname), sys.intern(event.get("via") or event["api"])
        by = event.get("by", "")
        within = self.cublas_call.get(tid, -1) if by.startswith("libcublas") else None
        pointers = () if decoded else pointer_words(event["params"], event.get("blobs"))
        record = Record(seq, "kernel", kernel, api, args, decoded, number, within, pointers)
        self.record(tid, record)
        self.observed_seqs.add(seq)
        self.kernel_seqs.add(seq)
        for snap in self.waiting_launch.pop(tid, []):
            snap.launch = seq

    def on_memory(self, where: str, event: dict[str, Any], number: int) -> None:
        ev, seq = event["ev"], event["seq"]
        args = {k: event[k] for k in ("dst", "src", "bytes", "value")}
        self.record(event["tid"], Record(seq, ev, ev, sys.intern(event["api"]), args, True, number))
        if ev in ("memset", "copy"):
            self.observed_seqs.add(seq)
        elif ev == "alloc":
            if (problem := self.live.alloc(event["dst"], event["bytes"], number)) is not None:
                refuse(where, problem)
            self.allocated[seq] = (event["dst"], event["bytes"])
        elif ev == "free":
            self.live.free(event["dst"])

    def on_contents(self, where: str, event: dict[str, Any]) -> None:
        made = self.allocated.pop(event["alloc"], None)
        if made is None:
            refuse(
                where,
                f"contents of allocation {event['alloc']}: no allocation of that seq without its "
                "contents comes before it",
            )
        address, size = made
        end = address + -(-size // DEEP_ROUND) * DEEP_ROUND
        changed = event["changed"]
        if changed and not (address <= changed[0][0] and sum(changed[-1]) <= end):
            refuse(
                where, f"contents of allocation {event['alloc']} outside its {end - address} bytes"
            )
        self.proc.contents[event["alloc"]] = Contents(
            event["alloc"], tuple((a, n) for a, n in changed), self.values_at(where, event)
        )

    def on_effect(self, where: str, event: dict[str, Any]) -> None:
        launch = event["launch"]
        if launch not in self.observed_seqs:
            refuse(
                where,
                f"an effect of call {launch}: no kernel launch, memset or copy of that seq comes "
                "before it",
            )
        if launch in self.proc.effects:
            refuse(where, f"a second effect of call {launch}")
        if (problem := self.live.compared_problem(event["changed"])) is not None:
            refuse(where, f"an effect of call {launch}: {problem}")
        self.proc.effects[launch] = Effect(
            launch,
            event["allocations"],
            event["bytes"],
            tuple((a, n) for a, n in event["changed"]),
            self.values_at(where, event),
        )

    def on_guard(self, where: str, event: dict[str, Any]) -> None:
        """A guard: the allocations a launch was handed, each compared whole around it, and
        the bytes it changed in them (rec_guard.c)."""
        launch = event["launch"]
        if not self.proc.guarded:
            refuse(where, "a guard event, and the init event does not say the capture guards")
        if launch not in self.kernel_seqs:
            refuse(where, f"a guard of launch {launch}: no kernel launch of that seq before it")
        if launch in self.proc.guards:
            refuse(where, f"a second guard of launch {launch}")
        compared = [(a, n) for a, n in event["compared"]]
        for base, size in compared:
            if self.live.compared_extent(base) != size:
                refuse(
                    where,
                    f"a guard of launch {launch} compared {size} bytes at {base}, which is not "
                    "a live allocation compared whole (up to its 256-byte-rounded end)",
                )
        for start, size in event["changed"]:
            if not any(b <= start and start + size <= b + n for b, n in compared):
                refuse(
                    where,
                    f"a guard of launch {launch}: changed bytes {start} to {start + size} "
                    "outside the allocations it compared",
                )
        changed = tuple((a, n) for a, n in event["changed"])
        self.proc.guards[launch] = Effect(
            launch, len(compared), sum(n for _, n in compared), changed, compared=tuple(compared)
        )

    def on_ltmatmul(self, where: str, event: dict[str, Any], number: int) -> None:
        seq, tid = event["seq"], event["tid"]
        args = lt_gemm(event)
        if (problem := operands_problem(args)) is not None:
            refuse(where, f"cublasLtMatmul call: {problem}")
        if inside_classic_call(self.last_record.get(tid), args):
            self.proc.internal_lt += 1
            return
        record = Record(seq, "gemm", "cublasLtMatmul", "cublasLtMatmul", args, True, number)
        self.record(tid, record)
        self.cublas_call[tid] = seq

    def on_snapshot(self, where: str, event: dict[str, Any], number: int) -> None:
        region = self.live.region_problem(event["ptr"], 4 * event["elements"])
        if region is not None:
            refuse(where, f"a {event['region']} region of {event['elements']} elements: {region}")
        snap = Snapshot(number, event, event["launch"])
        if event["when"] == "step_start" and event["launch"] == event["seq"]:
            # written by a recorder that took the step's start before its first launch and
            # named it by its own seq: the launch is the next one
            self.waiting_launch.setdefault(event["tid"], []).append(snap)
        elif event["launch"] not in self.kernel_seqs:
            refuse(
                where,
                f"a snapshot of launch {event['launch']}: no kernel launch of that seq comes "
                "before it",
            )
        self.snaps.append(snap)

    def on_line(self, where: str, event: dict[str, Any], number: int) -> None:
        ev, tid = event["ev"], event["tid"]
        if ev == "cublas":
            if "I! " in event["msg"] or tid not in self.open_calls:
                self.close(tid)
                self.open_calls[tid] = (number, [])
            first, messages = self.open_calls[tid]
            if len(messages) >= MAX_CALL_LINES:
                refuse(
                    where,
                    f"a cuBLAS call (line {first}) logged in more than {MAX_CALL_LINES} lines",
                )
            messages.append(event)
            return
        self.close(tid)
        if ev in ("init", "exit") and event["pid"] != self.proc.pid:
            pid = self.proc.pid
            refuse(where, f'"pid" {event["pid"]} is not the pid {pid} the file is named by')
        if ev == "init":
            self.on_init(where, event)
        elif ev == "note":
            if len(self.proc.notes) >= MAX_NOTES:
                refuse(where, f"more than {MAX_NOTES} notes in one process")
            self.proc.notes.append(event["msg"])
        elif ev == "kernel":
            self.on_kernel(where, event, number)
        elif ev == "graph":
            self.proc.graph_launches += 1
        elif ev in ("memset", "copy", "alloc", "free"):
            self.on_memory(where, event, number)
        elif ev == "contents":
            self.on_contents(where, event)
        elif ev == "effect":
            self.on_effect(where, event)
        elif ev == "guard":
            self.on_guard(where, event)
        elif ev == "ltmatmul":
            self.on_ltmatmul(where, event, number)
        elif ev == "snapshot":
            self.on_snapshot(where, event, number)

    def finish(self, folder: Path, last_ev: str) -> ProcessCapture:
        proc = self.proc
        for tid in list(self.open_calls):
            if last_ev == "exit":
                self.close(tid)  # a process that ended: every call it logged is whole, or refused
                continue
            # the process died while cuBLAS logged this call: the rest of its log was never
            # written; the capture is incomplete (no exit event) and the audit says so
            with contextlib.suppress(UsageError):
                self.close(tid)
        if self.waiting_launch:
            first = min(s.line for waiting in self.waiting_launch.values() for s in waiting)
            refuse(
                f"{self.name} line {first}", "a step_start snapshot that no kernel launch follows"
            )
        hash_kind = proc.init.get("hash", HASH_FNV1A)
        proc.snapshots = snapshot_regions(folder, self.name, proc.pid, self.snaps, hash_kind)
        if proc.effects and not proc.deep:
            first = min(proc.effects)
            refuse(
                self.name,
                f"an effect of call {first}, and the init event does not say the capture is deep",
            )
        if proc.values:
            proc.values_bytes = self.values_end
            proc.read_values = values_reader(folder, proc.pid, self.values_end)
        proc.ended = last_ev == "exit"
        proc.records.sort(key=lambda r: r.seq)
        return proc


def read_process(events_path: Path) -> ProcessCapture:
    """One recorded process, from its events file and its snapshots file beside it."""
    events_path = Path(events_path)
    name = events_path.name
    match = EVENTS_NAME.fullmatch(name)
    if match is None:
        refuse(name, "not a capture file name (events-<pid>.jsonl)")
    reader = _Reader(events_path, int(match.group(1)))
    last_seq, last_ev = -1, ""
    with text_lines(events_path) as lines:
        for number, line in lines:
            where = f"{name} line {number}"
            try:
                event = parse_line(where, line)
            except CutOff:
                reader.proc.cut_off = where  # the last line: nothing follows it
                break
            if (problem := event_problem(event)) is not None:
                refuse(where, problem)
            seq = event["seq"]
            if seq <= last_seq:
                refuse(
                    where,
                    f'"seq" {seq} is not above {last_seq}, the seq of line {number - 1}: seqs '
                    "increase strictly within a file",
                )
            last_seq, last_ev = seq, event["ev"]
            reader.on_line(where, event, number)
    return reader.finish(events_path.parent, last_ev)


def read_capture(folder: Path) -> list[ProcessCapture]:
    """Every recorded process of a capture folder, in pid order."""
    folder = Path(folder)
    if not folder.is_dir():
        problem = "is a file, not a folder" if folder.exists() else "no such folder"
        raise option_error(UsageError, "capture", folder, problem)
    try:
        paths = sorted(folder.glob(EVENTS_GLOB))
    except OSError as exc:
        problem = f"cannot list it ({exc.strerror or exc})"
        raise option_error(UsageError, "capture", folder, problem) from None
    by_pid: dict[int, Path] = {}
    for path in paths:
        match = EVENTS_NAME.fullmatch(path.name)
        if match is None:
            refuse(path.name, "not a capture file name (events-<pid>.jsonl or .jsonl.gz)")
        pid = int(match.group(1))
        if pid in by_pid:
            refuse(path.name, f"{by_pid[pid].name} beside it: two events files of one process")
        by_pid[pid] = path
    return [read_process(by_pid[pid]) for pid in sorted(by_pid)]
