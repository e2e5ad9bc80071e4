"""The tables of kernels/CONTRACT.md (the contract egf-audit ships with the wheel), drawn from
the code that holds them, so the file a trainer reads cannot drift from what is audited: the
presets' dims, the hyper-parameters, the trainer's buffers and its named-offset table, the
tensors each GEMM of the step reads and writes, the four fixed ABI signatures and the
invariants' one-line messages.

    python tests/contract_doc.py            # print every region
    python tests/contract_doc.py --write    # rewrite the regions in kernels/CONTRACT.md
    python tests/contract_doc.py --check    # exit 1 and print a diff when the file is stale

tests/test_contract_doc.py fails when a region is stale.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "kernels" / "CONTRACT.md"
REGION = re.compile(
    r"(<!-- BEGIN (?P<name>[a-z]+): drawn by `python tests/contract_doc.py --write`; "
    r"do not edit -->\n)(?P<body>.*?)(<!-- END (?P=name) -->)",
    re.DOTALL,
)


def _table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _shape(rows: int, cols: int) -> str:
    return f"[{rows}, {cols}]" if rows != 1 else f"[{cols}]"


def dims() -> str:
    from egf_audit.pipeline.config import PRESETS, Dims

    names = [f.name for f in dataclasses.fields(Dims)]
    rows = [[f"`{n}`", *(getattr(PRESETS[p], n) for p in PRESETS)] for n in names]
    for row in rows:
        row[1:] = [", ".join(map(str, v)) if isinstance(v, tuple) else v for v in row[1:]]
    return _table(["dim", *(f"`{p}`" for p in PRESETS)], rows)


def hyper() -> str:
    from egf_audit.trace.hyper import Hyper

    rows = [[f"`{f.name}`", f.default] for f in dataclasses.fields(Hyper)]
    return _table(["hyper-parameter", "value"], rows)


def buffers() -> str:
    from egf_audit.pipeline.config import PRESETS
    from egf_audit.pipeline.layout import build_layout

    ci, prod = (build_layout(PRESETS[p]) for p in ("ci", "prod"))
    rows = []
    for small, large in zip(ci.buffers, prod.buffers, strict=True):
        if small.tensors[0].name == "w_s1":
            held = ["the named-offset table (below)"] * 2
        elif len(small.tensors) > 1:
            held = [
                ", ".join(f"`{t.name}` {_shape(t.rows, t.cols)}" for t in buffer.tensors)
                for buffer in (small, large)
            ]
        else:
            held = [_shape(b.tensors[0].rows, b.tensors[0].cols) for b in (small, large)]
        rows.append([f"`{small.name}`", small.dtype, *held])
    return _table(["buffer", "dtype", "at `ci`", "at `prod`"], rows)


def params() -> str:
    from egf_audit.pipeline.config import PRESETS
    from egf_audit.pipeline.layout import build_layout

    ci, prod = (build_layout(PRESETS[p]).buffer("params") for p in ("ci", "prod"))
    rows = [
        [f"`{s.name}`", s.offset, _shape(s.rows, s.cols), _shape(b.rows, b.cols)]
        for s, b in zip(ci.tensors, prod.tensors, strict=True)
    ]
    return _table(["tensor", "offset at `ci`", "`[rows, cols]` at `ci`", "at `prod`"], rows)


def abi() -> str:
    from egf_audit.kernels import KERNELS
    from egf_audit.runtime.kernel_sources import expected_signature

    lines = [f"{expected_signature(k)};  // {k.file}" for k in KERNELS if k.abi]
    return "```c\n" + "\n".join(lines) + "\n```\n"


def invariants() -> str:
    from egf_audit.invariant_text import read_texts

    rows = [[t.code, f"`{t.slug}`", t.message] for t in read_texts()]
    return _table(["code", "invariant", "what it requires"], rows)


def gemms() -> str:
    from egf_audit.trace.contract_gemms import CONTRACT_GEMMS

    rows = [[f"`{g.label}`", f"`{g.a}`", f"`{g.b}`", f"`{g.c}`"] for g in CONTRACT_GEMMS]
    return _table(["GEMM (label stem)", "reads (A)", "reads (B)", "writes (C)"], rows)


REGIONS = {
    "dims": dims,
    "hyper": hyper,
    "buffers": buffers,
    "params": params,
    "abi": abi,
    "gemms": gemms,
    "invariants": invariants,
}


def render(text: str) -> str:
    """`text` with every region redrawn; a region named in REGIONS but absent is an error."""
    seen: set[str] = set()

    def redraw(m: re.Match[str]) -> str:
        name = m.group("name")
        if name not in REGIONS:
            raise SystemExit(f"{DOC.name}: unknown region {name!r}")
        seen.add(name)
        return m.group(1) + REGIONS[name]() + m.group(4)

    out = REGION.sub(redraw, text)
    missing = sorted(set(REGIONS) - seen)
    if missing:
        raise SystemExit(f"{DOC.name}: regions missing: {', '.join(missing)}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    if not (args.write or args.check):
        print("".join(REGIONS[name]() for name in REGIONS))
        return 0
    current = DOC.read_text(encoding="utf-8")
    drawn = render(current)
    if args.write:
        DOC.write_text(drawn, encoding="utf-8")
        return 0
    diff = difflib.unified_diff(current.splitlines(True), drawn.splitlines(True))
    sys.stdout.writelines(diff)
    return 0 if drawn == current else 1


if __name__ == "__main__":
    sys.exit(main())
