"""Kernel sources as nvcc takes them (issue 11, Deliver 6): a header beside the kernel in the
--kernels folder (its text part of the build's identity), a UTF-8 byte-order mark, CRLF line
ends, and the CUDA built-ins a per-thread kernel may call without an include."""

from __future__ import annotations

import hashlib
from pathlib import Path

from typer.testing import CliRunner

from egf_audit.cli.app import app
from egf_audit.runtime.backends.cpu import compile_kernel
from egf_audit.runtime.kernel_sources import load_kernel_set

TERMINAL = {"NO_COLOR": "1", "TERM": "dumb", "COLUMNS": "120"}

HEADER = """#pragma once
// shared by the trainer's kernels: CUDA built-ins used without an include
__device__ __forceinline__ float blend(float tau, float online, float target) {
  float w = max(0.0f, min(tau, 1.0f));          // min/max on floats
  int check = __float2int_rn(2.5f) + __float2int_rz(-1.5f);  // 2 + -1
  if (check != 1) printf("rounding differs: %d\\n", check);
  return w * online + (1.0f - w) * target;
}
"""
KERNEL = """// Polyak through a helper in a header beside the kernel
#include "common.cuh"
extern "C" __global__ void polyak_ema(float* target, const float* online, float tau, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  target[i] = blend(tau, online[i], target[i]);
}
"""


def polyak(folder: Path):
    return next(s for s in load_kernel_set(folder).sources if s.spec.name == "polyak_ema")


def trainer_folder(root: Path, header: str = HEADER) -> Path:
    """The kernel saved as an editor on Windows would: BOM and CRLF."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "polyak_ema_kernel.cu").write_bytes(
        b"\xef\xbb\xbf" + KERNEL.replace("\n", "\r\n").encode()
    )
    (root / "common.cuh").write_text(header, encoding="utf-8")
    return root


def test_a_trainer_kernel_with_a_header_bom_crlf_and_builtins_audits_clean(tmp_path):
    folder = trainer_folder(tmp_path / "kernels")
    out = tmp_path / "audit.md"
    args = ["run", "--device", "cpu", "--kernels", str(folder), "--out", str(out)]
    result = CliRunner().invoke(app, args, env=TERMINAL)
    assert result.exit_code == 0, result.output
    assert "rounding differs" not in result.output
    document = out.read_text()
    assert "kernels/polyak_ema_kernel.cu" in document  # named relative to the document
    raw = (folder / "polyak_ema_kernel.cu").read_bytes()
    assert hashlib.sha256(raw).hexdigest() in document  # the file as written, BOM and CRLF
    header = hashlib.sha256((folder / "common.cuh").read_bytes()).hexdigest()
    assert f"| `kernels/common.cuh` | `{header}` |" in document  # code it includes, named too


def test_an_edited_header_makes_the_document_stale(tmp_path):
    """The header is audited code: the committed document must say which one it was."""
    folder = trainer_folder(tmp_path / "kernels")
    out = tmp_path / "audit.md"
    args = ["run", "--device", "cpu", "--mode", "sentinel", "--steps", "1"]
    args += ["--kernels", str(folder), "--out", str(out)]
    assert CliRunner().invoke(app, args, env=TERMINAL).exit_code == 0
    assert CliRunner().invoke(app, [*args, "--check"], env=TERMINAL).exit_code == 0
    trainer_folder(folder, HEADER.replace("// shared", "// an edit that changes no result; shared"))
    stale = CliRunner().invoke(app, [*args, "--check"], env=TERMINAL)
    assert stale.exit_code == 1, stale.output
    assert "STALE" in stale.stdout.splitlines()[-1]


def test_the_header_text_is_part_of_the_build(tmp_path, monkeypatch):
    monkeypatch.setenv("EGF_AUDIT_CACHE", str(tmp_path / "cache"))
    folder = trainer_folder(tmp_path / "kernels")
    first = polyak(folder)
    compile_kernel(first)
    trainer_folder(folder, HEADER.replace("1.0f - w", "1.0f - 0.5f * w"))
    second = polyak(folder)
    assert second.text == first.text and second.headers != first.headers
    compile_kernel(second)
    builds = sorted((tmp_path / "cache" / "cpu-kernels").glob("polyak_ema-*.so"))
    assert len(builds) == 2  # an edited header is a new build, never the cached one


def test_the_document_hash_is_of_the_file_as_written(tmp_path):
    """The byte-order mark is dropped for the compiler only: the sha256 in the document is the
    file's own."""
    folder = trainer_folder(tmp_path / "kernels")
    source = polyak(folder)
    raw = (folder / "polyak_ema_kernel.cu").read_bytes()
    assert source.sha256 == hashlib.sha256(raw).hexdigest()
    assert not source.code.startswith("\ufeff")
