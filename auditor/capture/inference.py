"""Which pointer is which buffer, without a layout file: inference from the capture itself.

The four ABI kernels name their pointer arguments (kernels/CONTRACT.md, section 3) and GEMM
operand identity carries names on: the weight the forward GEMM on the concat scratch reads is
`w_b0fc`; the GEMM that reads the scratch contracting over its rows writes `w_b0fc`'s gradient;
the GEMM that reads `w_b0fc` and writes a [B, SH2+1] box writes `sp14_d_dir_qaux_concat`
(docs/capture.md, "Without a layout file"). Used only where the capture names no layout file: a
named layout that cannot be read, or names none of the trainer's pointers, is refused, never
replaced by this. The one shape a GEMM's own arguments imply, the [R, ld] slices a strided
batch reads where its stride is R rows, is judged by EGF001 from the call itself
(invariants/gemm_spans.py, `implied_slice_problem`), not named here.
"""

from __future__ import annotations

from egf_audit.trace.buffers import ELEMENT_BYTES, Buffer, CaptureLayout
from egf_audit.trace.contract import (
    ACCUMULATE_KERNEL,
    CONCAT_KERNEL,
    DIR_CONCAT,
    DIR_DX,
    ISV,
    POLYAK_KERNEL,
    SCALE_KERNEL,
    TARGET,
)
from egf_audit.trace.gemm_rules import contraction
from egf_audit.trace.process import ProcessCapture, Record


def _single(name: str, base: int, rows: int, cols: int, source: str) -> Buffer:
    return Buffer(name, base, rows * cols, {name: (0, rows, cols)}, source)


def _reads_scratch(r: Record, scratch: int) -> str | None:
    """How a GEMM reads the concat scratch ("columns" or "rows"), or None."""
    a = r.args
    role = next((role for role in ("A", "B") if a.get(role) == scratch), None)
    return None if role is None else contraction(role, a["transa"], a["transb"])


def infer_layout(proc: ProcessCapture) -> CaptureLayout:
    """Name what the capture itself proves (module docstring); the rest stays unresolved."""
    layout = CaptureLayout()
    concat = proc.kernels(CONCAT_KERNEL)
    decoded = [r for r in concat if "concat" in r.args]
    if decoded:
        first = decoded[0].args
        B, S2, auxk = first["rows"], first["sh2"], first["auxk"]
        layout.dims.update(B=B, SH2=S2, AUXK=auxk)
        how = f"{CONCAT_KERNEL}(concat)"
        layout.add(_single(DIR_CONCAT, first["concat"], B, S2 + 1, how))
        layout.add(_single("save_h_s2", first["h_s2"], B, S2, f"first {CONCAT_KERNEL}(h_s2)"))
        layout.add(
            _single("aux_nb_softmax_buf", first["aux_softmax"], B, auxk, f"first {CONCAT_KERNEL}")
        )
        for r in decoded[1:]:
            if r.args["h_s2"] != first["h_s2"]:
                layout.add(
                    _single("tgt_h_s2", r.args["h_s2"], B, S2, f"second {CONCAT_KERNEL}(h_s2)")
                )
                break
    for r in proc.kernels(ACCUMULATE_KERNEL):
        a = r.args
        if "d_h_s2" in a:
            layout.add(
                _single("d_h_s2", a["d_h_s2"], a["rows"], a["sh2"], f"{ACCUMULATE_KERNEL}(d_h_s2)")
            )
    for r in proc.kernels(POLYAK_KERNEL):
        a = r.args
        if "target" in a:
            n = a["n"]
            layout.add(
                Buffer(
                    TARGET, a["target"], n, {TARGET: (0, 1, n)}, f"{POLYAK_KERNEL}(target)", False
                )
            )
            layout.add(
                Buffer(
                    "params",
                    a["online"],
                    n,
                    {"params": (0, 1, n)},
                    f"{POLYAK_KERNEL}(online)",
                    False,
                )
            )
    for r in proc.kernels(SCALE_KERNEL):
        a = r.args
        if "isv" in a:
            n = a["isv_index"] + 1
            layout.add(
                Buffer(
                    ISV,
                    a["isv"],
                    n,
                    {ISV: (0, 1, n)},
                    f"{SCALE_KERNEL}(isv), up to isv_index",
                    shaped=False,
                    bounded=False,
                )
            )
    if decoded:
        _infer_from_gemms(proc, layout)
    # the scale's own target, when no GEMM named the dX buffer (the scale then names it)
    for r in proc.kernels(SCALE_KERNEL):
        a = r.args
        if "dx_concat" in a and layout.resolve(a["dx_concat"]) is None:
            layout.add(
                _single(DIR_DX, a["dx_concat"], a["rows"], a["ld"], f"{SCALE_KERNEL}(dx_concat)")
            )
    return layout


def _infer_from_gemms(proc: ProcessCapture, layout: CaptureLayout) -> None:
    scratch = layout.buffers[DIR_CONCAT]
    B, width = layout.dims["B"], layout.dims["SH2"] + 1
    gemms = [r for r in proc.records if r.kind in ("sgemm", "gemm") and "unbound" not in r.args]
    w_b0fc = None
    for r in gemms:
        if _reads_scratch(r, scratch.base) == "columns":
            w_b0fc, adv = r.args["A"], r.args["m"]  # y = x . W^T: W is cuBLAS's A
            layout.dims["ADV"] = adv
            how = "A operand of the forward GEMM on the concat scratch"
            _add_param(layout, "w_b0fc", w_b0fc, adv, width, how)
            break
    for r in gemms:
        if _reads_scratch(r, scratch.base) == "rows" and w_b0fc is not None:
            how = "C operand of the GEMM contracting the concat scratch over its rows"
            layout.add(_single("goff_w_b0fc", r.args["C"], layout.dims["ADV"], width, how))
            break
    for r in gemms:
        dx = r.args.get("A") == w_b0fc and r.args["n"] == B and r.args["transa"] == "N"
        if w_b0fc is not None and dx and layout.resolve(r.args["C"]) is None:
            how = "C operand of the GEMM reading w_b0fc into a batch-row box (dX)"
            layout.add(_single(DIR_DX, r.args["C"], B, width, how))
            break


def _add_param(layout: CaptureLayout, name: str, ptr: int, rows: int, cols: int, how: str) -> None:
    """A parameter tensor: inside `params` (as its tensor) when the Polyak launch named the
    flat buffer, else a buffer of its own."""
    params = layout.buffers.get("params")
    if params is not None and params.contains(ptr):
        offset = (ptr - params.base) // ELEMENT_BYTES
        params.tensors = {name: (offset, rows, cols), **params.tensors}
        params.source += f"; {name} at element {offset}: {how}"
    else:
        layout.add(_single(name, ptr, rows, cols, how))
