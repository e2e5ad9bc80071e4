"""The kernel registry: every kernel's file, C signature, launch shape and declared accesses.

This table is the ABI. Both backends launch from it, the recorder turns a launch's arguments into
read/write regions with it, and `--kernels DIR` sources are checked against its signatures.
Launch shape for every kernel: 1-D, 256 threads a block, ceil(threads / 256) blocks.

Longer than most files here on purpose: the table is one flat registry (as the invariants and
faults are), read top to bottom; splitting it would scatter the ABI over several files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from pathlib import Path

THREADS_PER_BLOCK = 256

# (offset from the pointer in elements, rows, width, row stride)
Box = tuple[int, int, int, int]


@dataclass(frozen=True)
class Access:
    param: str  # a pointer parameter
    mode: str  # "r", "w" or "rw"
    box: Callable[[dict], Box]  # from the launch's argument values


@dataclass(frozen=True)
class KernelSpec:
    name: str
    params: tuple[tuple[str, str], ...]  # (name, C type) in signature order
    threads: Callable[[dict], int]  # threads the launch must cover
    accesses: tuple[Access, ...]
    abi: bool = False  # one of the four fixed ABI kernels (CONTRACT.md, section 3)

    @property
    def file(self) -> str:
        return f"{self.name}_kernel.cu"

    @property
    def pointer_params(self) -> list[str]:
        return [n for n, t in self.params if t.endswith("*")]

    @cached_property
    def layout_params(self) -> tuple[str, ...]:
        """The parameters a launch's accessed regions can depend on: pointers and integers."""
        return tuple(n for n, t in self.params if t != "float")


def _row(n: str) -> Callable[[dict], Box]:
    """A [rows, a[n]] box with row stride a[n]."""
    return lambda a: (0, a["rows"], a[n], a[n])


def _vec(n: str) -> Callable[[dict], Box]:
    return lambda a: (0, 1, a[n], a[n])


def _one(index: str | None = None) -> Callable[[dict], Box]:
    return lambda a: (a[index] if index else 0, 1, 1, 1)


def _column(col: str, ld: str) -> Callable[[dict], Box]:
    return lambda a: (a[col], a["rows"], 1, a[ld])


def _rows(a: dict) -> int:
    return a["rows"]


F, CF, I, CI = "float*", "const float*", "int*", "const int*"

KERNELS: tuple[KernelSpec, ...] = (
    # ---- the fixed ABI (CONTRACT.md, section 3) ----
    KernelSpec(
        "sp14_dir_concat_qaux",
        (
            ("concat", F),
            ("h_s2", CF),
            ("aux_softmax", CF),
            ("rows", "int"),
            ("sh2", "int"),
            ("auxk", "int"),
            ("up_idx", "int"),
            ("down_idx", "int"),
        ),
        _rows,
        (
            Access("concat", "w", lambda a: (0, a["rows"], a["sh2"] + 1, a["sh2"] + 1)),
            Access("h_s2", "r", _row("sh2")),
            Access("aux_softmax", "r", _row("auxk")),
        ),
        abi=True,
    ),
    KernelSpec(
        "sp14_scale_wire_col",
        (
            ("dx_concat", F),
            ("isv", CF),
            ("rows", "int"),
            ("ld", "int"),
            ("wire_col", "int"),
            ("isv_index", "int"),
        ),
        _rows,
        (
            Access("dx_concat", "rw", _column("wire_col", "ld")),
            Access("isv", "r", _one("isv_index")),
        ),
        abi=True,
    ),
    KernelSpec(
        "accumulate_d_h_s2_from_concat",
        (("d_h_s2", F), ("d_concat", CF), ("rows", "int"), ("sh2", "int"), ("ld_concat", "int")),
        lambda a: a["rows"] * a["sh2"],
        (
            Access("d_h_s2", "rw", _row("sh2")),
            Access("d_concat", "r", lambda a: (0, a["rows"], a["sh2"], a["ld_concat"])),
        ),
        abi=True,
    ),
    KernelSpec(
        "polyak_ema",
        (("target", F), ("online", CF), ("tau", "float"), ("n", "long long")),
        lambda a: a["n"],
        (Access("target", "rw", _vec("n")), Access("online", "r", _vec("n"))),
        abi=True,
    ),
    # ---- the rest of the pipeline ----
    KernelSpec(
        "bias_act",
        (("y", F), ("bias", CF), ("rows", "int"), ("cols", "int"), ("relu", "int")),
        lambda a: a["rows"] * a["cols"],
        (Access("y", "rw", _row("cols")), Access("bias", "r", _vec("cols"))),
    ),
    KernelSpec(
        "softmax_rows",
        (("p", F), ("logits", CF), ("rows", "int"), ("cols", "int")),
        _rows,
        (Access("p", "w", _row("cols")), Access("logits", "r", _row("cols"))),
    ),
    KernelSpec(
        "concat_context",
        (
            ("out", F),
            ("h", CF),
            ("ctx", CF),
            ("rows", "int"),
            ("h_cols", "int"),
            ("ctx_cols", "int"),
        ),
        lambda a: a["rows"] * (a["h_cols"] + a["ctx_cols"]),
        (
            Access(
                "out",
                "w",
                lambda a: (0, a["rows"], a["h_cols"] + a["ctx_cols"], a["h_cols"] + a["ctx_cols"]),
            ),
            Access("h", "r", _row("h_cols")),
            Access("ctx", "r", _row("ctx_cols")),
        ),
    ),
    KernelSpec(
        "dueling_combine",
        (("q", F), ("value", CF), ("adv", CF), ("rows", "int"), ("nact", "int")),
        _rows,
        (
            Access("q", "w", _row("nact")),
            Access("value", "r", lambda a: (0, a["rows"], 1, 1)),
            Access("adv", "r", _row("nact")),
        ),
    ),
    KernelSpec(
        "td_target",
        (
            ("y", F),
            ("argmax", I),
            ("q_next", CF),
            ("reward", CF),
            ("done", CF),
            ("rows", "int"),
            ("nact", "int"),
            ("ld_out", "int"),
            ("col", "int"),
            ("gamma", "float"),
        ),
        _rows,
        (
            Access("y", "w", _column("col", "ld_out")),
            Access("argmax", "w", _column("col", "ld_out")),
            Access("q_next", "r", _row("nact")),
            Access("reward", "r", lambda a: (0, a["rows"], 1, 1)),
            Access("done", "r", lambda a: (0, a["rows"], 1, 1)),
        ),
    ),
    KernelSpec(
        "td_huber_grad",
        (
            ("dq", F),
            ("q", CF),
            ("y", CF),
            ("actions", CI),
            ("rows", "int"),
            ("nact", "int"),
            ("ld_y", "int"),
            ("col", "int"),
            ("kappa", "float"),
            ("scale", "float"),
        ),
        _rows,
        (
            Access("dq", "w", _row("nact")),
            Access("q", "r", _row("nact")),
            Access("y", "r", _column("col", "ld_y")),
            Access("actions", "r", _column("col", "ld_y")),
        ),
    ),
    KernelSpec(
        "cql_grad",
        (
            ("dq", F),
            ("q", CF),
            ("actions", CI),
            ("rows", "int"),
            ("nact", "int"),
            ("ld_act", "int"),
            ("col", "int"),
            ("scale", "float"),
        ),
        _rows,
        (
            Access("dq", "w", _row("nact")),
            Access("q", "r", _row("nact")),
            Access("actions", "r", _column("col", "ld_act")),
        ),
    ),
    KernelSpec(
        "aux_ce_grad",
        (
            ("d_logits", F),
            ("p", CF),
            ("labels", CI),
            ("rows", "int"),
            ("auxk", "int"),
            ("scale", "float"),
        ),
        _rows,
        (
            Access("d_logits", "w", _row("auxk")),
            Access("p", "r", _row("auxk")),
            Access("labels", "r", lambda a: (0, a["rows"], 1, 1)),
        ),
    ),
    KernelSpec(
        "dueling_backward",
        (("d_adv", F), ("d_value", F), ("dq", CF), ("rows", "int"), ("nact", "int")),
        _rows,
        (
            Access("d_adv", "w", _row("nact")),
            Access("d_value", "rw", lambda a: (0, a["rows"], 1, 1)),
            Access("dq", "r", _row("nact")),
        ),
    ),
    KernelSpec(
        "relu_backward",
        (("dy", F), ("act", CF), ("n", "long long")),
        lambda a: a["n"],
        (Access("dy", "rw", _vec("n")), Access("act", "r", _vec("n"))),
    ),
    KernelSpec(
        "aux_wire_backward",
        (
            ("d_logits", F),
            ("p", CF),
            ("d_concat", CF),
            ("rows", "int"),
            ("auxk", "int"),
            ("ld", "int"),
            ("wire_col", "int"),
            ("up_idx", "int"),
            ("down_idx", "int"),
        ),
        _rows,
        (
            Access("d_logits", "rw", _row("auxk")),
            Access("p", "r", _row("auxk")),
            Access("d_concat", "r", _column("wire_col", "ld")),
        ),
    ),
    KernelSpec(
        "aux_label_prob",
        (("prob", F), ("p", CF), ("labels", CI), ("rows", "int"), ("auxk", "int")),
        _rows,
        (
            Access("prob", "w", lambda a: (0, 1, a["rows"], a["rows"])),
            Access("p", "r", _row("auxk")),
            Access("labels", "r", lambda a: (0, a["rows"], 1, 1)),
        ),
    ),
    KernelSpec(
        "alpha_grad_compute",
        (
            ("isv", F),
            ("prob_sum", CF),
            ("rows", "int"),
            ("auxk", "int"),
            ("isv_index", "int"),
            ("ema", "float"),
        ),
        lambda a: 1,
        (Access("isv", "rw", _one("isv_index")), Access("prob_sum", "r", _one())),
    ),
    KernelSpec(
        "adam_update",
        (
            ("param", F),
            ("grad", CF),
            ("m", F),
            ("v", F),
            ("n", "long long"),
            ("lr", "float"),
            ("beta1", "float"),
            ("beta2", "float"),
            ("eps", "float"),
            ("bc1", "float"),
            ("bc2", "float"),
        ),
        lambda a: a["n"],
        (
            Access("param", "rw", _vec("n")),
            Access("grad", "r", _vec("n")),
            Access("m", "rw", _vec("n")),
            Access("v", "rw", _vec("n")),
        ),
    ),
    KernelSpec(
        "sn_normalize",
        (("out", F), ("in", CF), ("norm2", CF), ("n", "int")),
        lambda a: a["n"],
        (Access("out", "w", _vec("n")), Access("in", "r", _vec("n")), Access("norm2", "r", _one())),
    ),
    KernelSpec(
        "sn_scale",
        (("w", F), ("norm2", CF), ("n", "long long"), ("sigma_max", "float")),
        lambda a: a["n"],
        (Access("w", "rw", _vec("n")), Access("norm2", "r", _one())),
    ),
)

KERNELS_BY_NAME = {k.name: k for k in KERNELS}
KERNELS_BY_FILE = {k.file: k for k in KERNELS}
SHIM_HEADER = "cpu_shim.h"


def bundled_dir() -> Path:
    """The folder holding the bundled .cu sources (inside the installed package)."""
    return Path(str(resources.files(__name__)))


def bundled_source(file: str) -> str:
    return (bundled_dir() / file).read_text(encoding="utf-8")


def blocks_for(threads: int) -> int:
    return max(1, -(-threads // THREADS_PER_BLOCK))
