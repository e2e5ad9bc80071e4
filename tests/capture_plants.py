"""Captures edited the way one token changed in the trainer's source would have recorded them,
for tests/test_capture_tensors.py and the mutation harness (tests/test_mutation_survivors.py):
llm.c's GEMMs with K one short (the committed H200 recordings' cuBLAS log lines edited, nothing
else: llm.c keeps no snapshots), and the stand-in's step with one GEMM moved ahead of the GEMM
that writes its input (lies.py's way: the events edited, the recorder replayed over them)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data" / "capture"
LLMC = DATA / "llmc" / "recorded"
BT, T = 4 * 32, 32  # the recordings' B * T and T (make_inputs.py's defaults)


def load_lies() -> Any:
    if "capture_lies" in sys.modules:  # another test module loaded it in this worker
        return sys.modules["capture_lies"]
    spec = importlib.util.spec_from_file_location("capture_lies", DATA / "lies.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module's annotations there
    spec.loader.exec_module(module)
    return module


lies = load_lies()
Chooser = Callable[[Any, dict[str, dict[str, Any]]], bool]


def dweight(_capture: Any, call: dict[str, dict[str, Any]]) -> bool:
    """matmul_backward's dweight GEMM: (N, T) with K = B*T, not batched."""
    ops = (lies.gemm_arg(call, "transa"), lies.gemm_arg(call, "transb"))
    return "Batched" not in call[""]["msg"] and ops == ("N", "T") and lies.gemm_arg(call, "k") == BT


def attention_dq(capture: Any, call: dict[str, dict[str, Any]]) -> bool:
    """attention_backward's dq GEMM: strided-batched (N, N) over the heads, its B the backward's
    scratch (dpreatt, in grads_acts_memory), K = T."""
    ops = (lies.gemm_arg(call, "transa"), lies.gemm_arg(call, "transb"))
    size = capture.layout["buffers"]["grads_acts_memory"]["allocation"]["bytes"]
    start = next(e["dst"] for e in capture.main.events if e["ev"] == "alloc" and e["bytes"] == size)
    inside = start <= lies.gemm_arg(call, "B") < start + size
    batched = "StridedBatched" in call[""]["msg"]
    return batched and ops == ("N", "N") and inside and lies.gemm_arg(call, "k") == T


def k_short(src: Path, chosen: Chooser) -> Callable[[Path, bool], Path]:
    """A builder (folder, with_layout) of the capture `src` with K one short on every GEMM call
    `chosen` picks, as the one-token change in llm.c's source would have recorded it."""

    def build(folder: Path, with_layout: bool) -> Path:
        capture = lies.read(src)
        calls = [c for c in lies.gemm_calls(capture.main) if chosen(capture, c)]
        assert calls, f"no GEMM of {src} is the one to plant"
        for call in calls:
            lies.set_gemm_int(call, "k", lies.gemm_arg(call, "k") - 1)
        return lies.write(capture, folder, with_layout)

    return build


def _call_events(proc: Any, call: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """A logged GEMM call's events: its log lines, then the kernels cuBLAS launched for it
    (C++-named: the trainer's own kernels are extern "C")."""
    events = proc.events
    start = events.index(call[""])
    end = max(events.index(e) for e in call.values()) + 1
    while end < len(events) and events[end].get("ev") == "kernel":
        if not events[end]["name"].startswith("_Z"):
            break
        end += 1
    return events[start:end]


def trunk_dw_before_the_forward(capture: Any) -> Any:
    """Step 0's first dW of the trunk's first layer (reads obs and d_h_s1, writes grad_buf's
    w_s1) moved to just after the step's first GEMM (the forward's first layer), with the
    kernels cuBLAS ran for it: it reads d_h_s1 before any launch of its step wrote it. grad_buf,
    which it adds into, is in no snapshot; nothing the replay computes reads it."""
    proc = capture.main
    calls = lies.gemm_calls(proc)
    w_s1 = capture.base("grad_buf") + 4 * capture.offset("w_s1")
    (dw, *_) = [c for c in calls if lies.gemm_arg(c, "C") == w_s1]
    moved = _call_events(proc, dw)
    lies.remove(proc, moved)
    lies.insert(proc, proc.events.index(calls[1][""]), moved)
    return capture


def _edit_one(chosen: Chooser, edit: Callable[[Any, dict[str, dict[str, Any]]], None]) -> Any:
    """A builder of llm.c's capture with `edit` applied to the first GEMM call `chosen` picks."""

    def build(folder: Path, with_layout: bool) -> Path:
        capture = lies.read(LLMC / "llmc")
        call = next(c for c in lies.gemm_calls(capture.main) if chosen(capture, c))
        edit(capture, call)
        return lies.write(capture, folder, with_layout)

    return build


def _reads_ln1_layer_1(capture: Any, call: dict[str, dict[str, Any]]) -> bool:
    """The layer-1 QKV dweight GEMM: its A is the start of slice [1] of ln1 [L, B*T, C]."""
    acts = capture.layout["buffers"]["acts_memory"]
    start = next(
        e["dst"]
        for e in capture.main.events
        if e["ev"] == "alloc" and e["bytes"] == acts["allocation"]["bytes"]
    )
    offset = acts["tensors"]["ln1"][0] + BT * 128  # C = 128
    return dweight(capture, call) and lies.gemm_arg(call, "A") == start + 4 * offset


def _shift_a(elements: int) -> Callable[[Any, dict[str, dict[str, Any]]], None]:
    return lambda _c, call: lies.set_gemm_pointer(
        call, "A", lies.gemm_arg(call, "A") + 4 * elements
    )


def _add(key: str, by: int) -> Callable[[Any, dict[str, dict[str, Any]]], None]:
    return lambda _c, call: lies.set_gemm_int(call, key, lies.gemm_arg(call, key) + by)


# one GEMM operand off a whole slice of ln1 [L, B*T, C], each way EGF001's slice rule names
SLICE_EDITS = {
    "columns-cut": _edit_one(_reads_ln1_layer_1, _add("m", -1)),  # A spans C - 1 columns
    "row-stride-long": _edit_one(_reads_ln1_layer_1, _add("lda", 1)),
    "one-row-in": _edit_one(_reads_ln1_layer_1, _shift_a(128)),  # starts at row 1 of slice [1]
    "one-element-in": _edit_one(_reads_ln1_layer_1, _shift_a(1)),
    "past-the-last-slice": _edit_one(_reads_ln1_layer_1, _add("k", BT)),  # slices [1] and [2]
    "one-row-only": _edit_one(_reads_ln1_layer_1, _add("k", 1 - BT)),  # K = 1: 1 of 128 rows
    # rows 1 to 127 of slice [1]: it ends where the slice ends, its first row left out
    "first-row-left-out": _edit_one(
        _reads_ln1_layer_1, lambda c, call: (_shift_a(128)(c, call), _add("k", -1)(c, call))
    ),
}


def flat_layout(build: Callable[[Path, bool], Path]) -> Callable[[Path, bool], Path]:
    """The capture `build` makes, its layout's tensors declared without leading axes ([offset,
    rows, cols]: each stacked tensor as one matrix of all its rows), as the layout files written
    before stacked shapes were."""

    def flat(folder: Path, with_layout: bool) -> Path:
        out = build(folder, with_layout)
        path = out / "layout.json"
        if path.exists():
            doc = json.loads(path.read_text(encoding="utf-8"))
            for buffer in doc["buffers"].values():
                tensors = buffer.get("tensors", {})
                for name, (offset, *shape) in tensors.items():
                    tensors[name] = [offset, math.prod(shape[:-1]), shape[-1]]
            path.write_text(json.dumps(doc), encoding="utf-8")
        return out

    return flat


def copied(src: Path) -> Callable[[Path, bool], Path]:
    """A builder of the committed capture `src` as it is."""
    return lambda folder, with_layout: lies.write(lies.read(src), folder, with_layout)


def layout_edited(
    src: Path, change: Callable[[dict[str, Any]], None]
) -> Callable[[Path, bool], Path]:
    """A builder of the committed capture `src` with its layout file changed by `change`."""

    def build(folder: Path, with_layout: bool) -> Path:
        capture = lies.read(src)
        change(capture.layout)
        return lies.write(capture, folder, with_layout)

    return build


def qkvr_as(value: list[int]) -> Callable[[dict[str, Any]], None]:
    """llm.c's qkvr declared as `value` ([offset, axes...])."""
    return lambda doc: doc["buffers"]["acts_memory"]["tensors"].update(qkvr=value)


# ---- a deep capture's evidence made short (trace/observed.py) ----
DEEP = DATA / "deep" / "clean"


def deep_edited(edit: Callable[[Any], None]) -> Callable[[Path, bool], Path]:
    """A builder of the committed deep capture of the clean stand-in with `edit` applied to its
    process (recorded seqs kept: an inserted event takes a seq the recording left free)."""

    def build(folder: Path, with_layout: bool) -> Path:
        capture = lies.read(DEEP)
        edit(capture.main)
        return lies.write(capture, folder, with_layout)

    return build


def _scale_effect(proc: Any) -> dict[str, Any]:
    scale = next(e for e in proc.events if lies.is_kernel(e, "sp14_scale_wire_col"))
    return next(e for e in proc.events if e["ev"] == "effect" and e["launch"] == scale["seq"])


def zero_byte_allocation(proc: Any) -> None:
    """cudaMalloc(&p, 0) as the runtime answers it (success, p = NULL), early in the run: a
    zero-byte allocation, of which the recorder keeps no copy, so no effect counts it."""
    seqs = [e["seq"] for e in proc.events]
    frees = [i for i, e in enumerate(proc.events) if e["ev"] == "free" and e["dst"] == 0]
    # a seq the recording left free, after the cudaFree(NULL) CuPy makes first (it would free
    # an allocation at NULL)
    gap = next(i for i in range(frees[0] + 1, len(seqs)) if seqs[i] > seqs[i - 1] + 1)
    zero = lies.memory_event(proc, "alloc", "cudaMalloc_v3020", 0, 0, 0, 0)
    lies.insert(proc, gap, [zero])


def one_byte_allocation(proc: Any) -> None:
    """cudaMalloc(&p, 1), past every other allocation, live to the end: the recorder compares
    its one byte after every call, so every later effect counts it."""
    zero_byte_allocation(proc)
    (made,) = [e for e in proc.events if e["ev"] == "alloc" and e.get("_new")]
    top = max(e["dst"] + e["bytes"] for e in proc.events if e["ev"] == "alloc")
    made |= {"dst": (top + (1 << 20)) & ~0xFFF, "bytes": 1}
    after = proc.events.index(made)
    for e in proc.events[after:]:
        if e["ev"] == "effect":
            e["allocations"] += 1
            e["bytes"] += 1


def scale_effect_missing(proc: Any) -> None:
    """The first scale launch's effect gone: what it changed is unknown."""
    lies.remove(proc, [_scale_effect(proc)])


def scale_effect_compared_short(proc: Any) -> None:
    """The first scale launch's effect compared one allocation fewer than were live."""
    _scale_effect(proc)["allocations"] -= 1


def first_sgemm_unbound(proc: Any) -> None:
    """The first cublasSgemm_v2 logged as a cublasGemmEx that names no element types: its
    operands cannot be placed, so what its kernels may write is unknown."""
    header = next(e for e in proc.events if "cublasSgemm_v2(" in e.get("msg", ""))
    header["msg"] = header["msg"].replace("cublasSgemm_v2(", "cublasGemmEx(")


def _live(events: list[dict[str, Any]]) -> tuple[int, int]:
    """(count, bytes) of the non-empty allocations the events leave live, as a deep recorder's
    effect counts what it compared."""
    live: dict[int, int] = {}
    for e in events:
        if e["ev"] == "alloc" and e["bytes"] > 0:
            live[e["dst"]] = e["bytes"]
        elif e["ev"] == "free":
            live.pop(e["dst"], None)
    return len(live), sum(live.values())


def own_kernel_on_the_target(where: str) -> Callable[[Any], None]:
    """A kernel of the trainer's own (no ABI name) handed a pointer to target_params after the
    first scale launch, with the deep effect the recorder would write: 4 bytes changed just past
    the target's end ("end"), just before its start ("before"; both in the allocation the target
    lies in, CuPy's pool), or its first element ("inside"). Two free seqs hold the launch and its
    effect, so every recorded seq stays."""

    def edit(proc: Any) -> None:
        capture = lies.read(DEEP)  # the layout's address of target_params
        target = capture.layout["buffers"]["target_params"]
        start, end = target["address"], target["address"] + target["bytes"]
        run = {"end": [end, 4], "before": [start - 4, 4], "inside": [start, 4]}[where]
        events = proc.events
        first = next(i for i, e in enumerate(events) if lies.is_kernel(e, "sp14_scale_wire_col"))
        at = next(
            i for i in range(first, len(events)) if events[i]["seq"] > events[i - 1]["seq"] + 2
        )
        seq = events[at - 1]["seq"] + 1
        kernel = lies.unknown_kernel(proc, "trainer_own_helper", start) | {"seq": seq}
        count, nbytes = _live(events[:at])
        effect = {"ev": "effect", "seq": seq + 1, "tid": kernel["tid"], "launch": seq}
        effect |= {"allocations": count, "bytes": nbytes, "changed": [run]}
        events[at:at] = [kernel, effect]

    return edit
