"""The document's terms: every name from the trainer's history that its text uses, defined once,
so a reader who never saw the trainer's change log can follow it."""

from __future__ import annotations

GLOSSARY = (
    (
        "the wire",
        "`aux_softmax_diff = p[:, up] - p[:, down]`, the aux head's softmax difference "
        "that the direction branch (d = 0) reads as its last input column, column SH2 of the "
        "concat `[h_s2 | wire]` of width SH2 + 1.",
    ),
    (
        "ISV[393], the gate",
        "element 393 (`ALPHA_GRAD_SMOOTHED_INDEX`) of `isv_signals`: the "
        "factor `sp14_scale_wire_col` multiplies the wire's gradient by before it flows back into "
        "the aux head.",
    ),
    (
        "the sentinel",
        "the value 0.0 that ISV[393] holds while no producer writes it: the gate "
        "is closed and the wire's gradient is exactly +0.0. Mode `sentinel` audits that state, "
        "mode `live` the producer `alpha_grad_compute_kernel` writing α in [0, 1].",
    ),
    (
        "B.8",
        "the trainer change that grew `w_b0fc` to `[ADV, SH2 + 1]` (one weight column for "
        "the wire), with its Adam m/v and spectral-norm vector.",
    ),
    ("B.9", "the change that made the forward d = 0 SGEMM read K = SH2 + 1 columns."),
    (
        "B.10",
        "the change that made the backward d = 0 dW and dX SGEMMs use SH2 + 1 (dW from "
        "the concat, dX into `sp14_d_dir_qaux_concat`) and added the wire scale at both call "
        "sites. Before it they used K = SH2 and silently dropped the wire column.",
    ),
    (
        "B.11",
        "the change that wires the live gate producer into every step; before it ISV[393] "
        "holds the sentinel.",
    ),
    (
        "call sites",
        "the two calls of `backward_full` per step: `cql` (the CQL aux loss) and "
        "`main` (the TD loss and the aux CE). A checkpoint is a snapshot named by its call "
        "site: `main:after_scale` is taken at `main` right after the wire scale.",
    ),
)


def glossary() -> list[str]:
    return [
        "## Terms",
        "",
        *[f"- **{term}**: {text}" for term, text in GLOSSARY],
    ]
