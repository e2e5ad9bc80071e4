"""Write the stand-in's training steps as a plan that `trainer.cu` (beside this file) executes
from C++, launching every kernel with `<<<>>>` (the runtime API) instead of CuPy's driver-API
launches. The stand-in's own step (egf_audit.pipeline, the fault catalogue's wiring) runs on the
CPU backend behind a proxy that writes, in program order, one line per backend call:

    buffer NAME ELEMENTS DTYPE               an allocation (cudaMalloc), in the stand-in's order
    upload BUF OFFSET STRIDE COUNT HEX...    host to device (cudaMemcpy); values as 32-bit words
    memset BUF OFFSET COUNT                  cudaMemsetAsync of COUNT 4-byte elements
    gemm TA TB M N K ALPHA BETA A AOFF LDA B BOFF LDB C COFF LDC   one cuBLAS GEMM
    kernel NAME BLOCKS THREADS NARGS ARG...  a kernel of kernels/*.cu: p BUF OFF | i V | f HEX | l V
    end

and the layout file the trainer writes, with `@NAME` where NAME's device address goes. The
plan is data: the C++ program holds no SP14 logic of its own, so the launches it makes are the
stand-in's, wiring bugs included, and a capture of it is judged as the stand-in's is.

    python tests/data/capture/runtime/make_plan.py OUT_DIR [--fault NAME ...] [--steps 2]
        [--config tests/data/capture/runtime/small.toml]
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import json
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np

from egf_audit.kernels import KERNELS
from egf_audit.pipeline.config import load_config
from egf_audit.pipeline.step import SP14Pipeline
from egf_audit.pipeline.wiring import PRODUCTION
from egf_audit.runtime.backends import select_backend
from egf_audit.runtime.kernel_sources import load_kernel_set
from egf_audit.scenarios.faults import FAULTS_BY_NAME

MODE_SCHEDULE = ("sentinel", "live")  # as the stand-in: step 0 gate closed, step 1 live


class PlanBackend:
    """The CPU backend, every call also written as a plan line."""

    def __init__(self, inner: Any, out: list[str]):
        self._inner, self._out = inner, out
        self._bases: list[int] = []
        self._buffers: dict[int, tuple[str, int]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def where(self, ptr: int) -> tuple[str, int]:
        i = bisect.bisect_right(self._bases, ptr) - 1
        base = self._bases[i]
        name, size = self._buffers[base]
        offset, rest = divmod(ptr - base, 4)
        if i < 0 or rest or not 0 <= offset <= size:
            raise ValueError(f"pointer {ptr:#x} is in no buffer")
        return name, offset

    def alloc(self, spec: Any) -> int:
        ptr = self._inner.alloc(spec)
        bisect.insort(self._bases, ptr)
        self._buffers[ptr] = (spec.name, spec.size)
        self._out.append(f"buffer {spec.name} {spec.size} {spec.dtype}")
        return ptr

    def upload(self, ptr: int, values: np.ndarray, stride: int = 1) -> None:
        self._inner.upload(ptr, values, stride)
        name, offset = self.where(ptr)
        dtype = np.int32 if np.asarray(values).dtype.kind in "iu" else np.float32
        words = np.ascontiguousarray(values, dtype=dtype).ravel().view(np.uint32)
        hexes = " ".join(f"{w:08x}" for w in words)
        self._out.append(f"upload {name} {offset} {stride} {words.size} {hexes}")

    def memset_zero(self, ptr: int, count: int) -> None:
        self._inner.memset_zero(ptr, count)
        name, offset = self.where(ptr)
        self._out.append(f"memset {name} {offset} {count}")

    def sgemm(self, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) -> None:
        self._inner.sgemm(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
        ops = " ".join(
            f"{self.where(p)[0]} {self.where(p)[1]} {ld}"
            for p, ld in ((a, lda), (b, ldb), (c, ldc))
        )
        self._out.append(f"gemm {transa} {transb} {m} {n} {k} {alpha!r} {beta!r} {ops}")

    def launch(self, spec: Any, blocks: int, threads: int, args: list[Any]) -> None:
        self._inner.launch(spec, blocks, threads, args)
        words = []
        for (_, ctype), value in zip(spec.params, args, strict=True):
            if ctype.endswith("*"):
                name, offset = self.where(int(value))
                words.append(f"p {name} {offset}")
            elif ctype == "float":
                words.append(f"f {struct.unpack('<I', struct.pack('<f', float(value)))[0]:08x}")
            elif ctype == "long long":
                words.append(f"l {int(value)}")
            else:
                words.append(f"i {int(value)}")
        self._out.append(f"kernel {spec.name} {blocks} {threads} {len(words)} {' '.join(words)}")


def layout_template(pipe: SP14Pipeline) -> str:
    """The layout file as the stand-in writes it (standin.write_layout), addresses as @NAME."""
    params = pipe.layout.buffer("params")
    dims = {**dataclasses.asdict(pipe.dims), "tau": float(pipe.config.hyper.tau)}
    doc = {
        "format": "egf-audit-layout/1",
        "dims": dims,
        "param_offsets": {t.name: [t.offset, t.rows, t.cols] for t in params.tensors},
        "buffers": {
            spec.name: {
                "address": f"@{spec.name}",
                "bytes": spec.size * 4,
                "tensors": {t.name: [t.offset, t.rows, t.cols] for t in spec.tensors},
            }
            for spec in pipe.layout.buffers
        },
    }
    return json.dumps(doc, sort_keys=True) + "\n"


def dispatch_source() -> str:
    """`dispatch.inc` for trainer.cu: every kernel source of the kernel table (egf_audit.kernels),
    and one typed `<<<>>>` launch per kernel, by name, from a plan line's arguments."""
    cast = {"float": "a[{i}].f", "int": "a[{i}].i", "long long": "a[{i}].l"}
    lines = ["// generated by make_plan.py from egf_audit.kernels: one <<<>>> launch per kernel"]
    lines += [f'#include "{spec.file}"' for spec in KERNELS]  # from the build's -I folder
    lines.append("static bool launch_kernel(const std::string &name, unsigned blocks,")
    lines.append("                          unsigned threads, const std::vector<Arg> &a) {")
    for spec in KERNELS:
        values = ", ".join(
            f"({ctype})a[{i}].p" if ctype.endswith("*") else cast[ctype].format(i=i)
            for i, (_, ctype) in enumerate(spec.params)
        )
        lines.append(f'  if (name == "{spec.name}" && a.size() == {len(spec.params)}) {{')
        lines.append(f"    {spec.name}<<<blocks, threads>>>({values});")
        lines.append("    return true;")
        lines.append("  }")
    lines.append("  return false;")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make_plan.py")
    parser.add_argument("out", type=Path)
    parser.add_argument("--fault", action="append", help="repeatable; 'clean' for no fault")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--preset", default="ci")
    parser.add_argument("--config", type=Path, default=None, help="a TOML config (small.toml)")
    parser.add_argument("--dispatch", action="store_true", help="write dispatch.inc only")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.dispatch:
        (args.out / "dispatch.inc").write_text(dispatch_source())
        return 0
    names = args.fault or [None]  # one process writes every plan asked for: imports once
    for name in names:
        fault = FAULTS_BY_NAME[name] if name not in (None, "clean") else None
        if fault is not None and fault.patch is not None:
            print(f"{name} patches a kernel: the plan carries wiring only", file=sys.stderr)
            return 2
    config = load_config(args.config, args.preset, 0)
    kernels = load_kernel_set()
    for name in names:
        fault = FAULTS_BY_NAME[name] if name not in (None, "clean") else None
        lines: list[str] = []
        backend = PlanBackend(select_backend("cpu", kernels), lines)
        wiring = fault.wiring if fault is not None else PRODUCTION
        pipe = SP14Pipeline(config, backend, wiring, instrumented=False, scenario="standin")
        pipe.initialize()
        for k in range(args.steps):
            pipe.step(MODE_SCHEDULE[k % len(MODE_SCHEDULE)])
        lines.append("end")
        (args.out / f"{name or 'clean'}.plan").write_text("\n".join(lines) + "\n")
        (args.out / f"{name or 'clean'}.layout").write_text(layout_template(pipe))
    return 0


if __name__ == "__main__":
    sys.exit(main())
