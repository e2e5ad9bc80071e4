"""GPU proof that the recorder reads a cuBLASLt matmul's epilogue and its bias pointer from the
real cuBLASLt (descriptor attributes 7 and 8, docs/capture.md): the probe of `capture --cpu`
(tests/data/capture/cpu/cpu_probe.cu) built with nvcc against this machine's cuBLAS, its
RELU_BIAS matmul captured, the bias vector bound as a read of one float a row of D, and the
same vector starting two floats before its allocation's end failing EGF001.
Run with `python -m pytest -m gpu tests/test_capture_gpu_epilogue.py` on a machine with a GPU."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from egf_audit.capture.events import read_capture
from egf_audit.cli.capture_audit import audit_capture
from egf_audit.invariants.registry import FAIL, PASS
from egf_audit.trace.gemm_operands import gemm_operands

pytestmark = pytest.mark.gpu
DATA = Path(__file__).parent / "data" / "capture"
EGF = [sys.executable, "-m", "egf_audit"]


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    found = subprocess.run(
        [sys.executable, str(DATA / "cublas_paths.py")], capture_output=True, text=True
    ).stdout.split("\n")
    lib = next((line.split() for line in found if line.startswith("lib ")), None)
    assert lib is not None, "no libcublas.so and libcublasLt.so found (cublas_paths.py)"
    _, folder, blas, blas_lt = lib
    out = tmp_path_factory.mktemp("probe") / "cpu_probe"
    flags = ["-O2", "-std=c++17", "-cudart", "shared", f"-L{folder}", "-Xlinker",
             f"-rpath={folder}", f"-l:{blas}", f"-l:{blas_lt}", "-l:libcuda.so.1"]  # fmt: skip
    built = subprocess.run(
        [nvcc, *flags, str(DATA / "cpu" / "cpu_probe.cu"), "-o", str(out)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    return out


def _captured(probe: Path, mode: str, tmp: Path) -> Path:
    out = tmp / mode
    done = subprocess.run(
        [*EGF, "capture", "--out", str(out), "--", str(probe), mode],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def test_the_recorder_reads_a_bias_epilogue_from_cublaslt(probe, tmp_path):
    """The probe checks max(A·B + bias, 0) bit for bit itself (exit 0); the capture binds the
    bias vector as a read of 3 floats and EGF001 holds."""
    folder = _captured(probe, "lt-bias", tmp_path)
    (gemm,) = [r for r in read_capture(folder)[0].records if r.kind == "gemm"]
    assert "unbound" not in gemm.args, gemm.args
    assert (gemm.args["bias_length"], gemm.args["bias_access"]) == (3, "r")
    assert "bias" in {op.role for op in gemm_operands(gemm.args)}
    (process,) = audit_capture(folder, use_layout=False).processes
    assert dict(process.verdicts)["EGF001"].status == PASS


def test_a_bias_vector_past_its_allocation_fails_egf001_on_the_gpu(probe, tmp_path):
    folder = _captured(probe, "lt-bias-past", tmp_path)
    (process,) = audit_capture(folder, use_layout=False).processes
    verdict = dict(process.verdicts)["EGF001"]
    assert verdict.status == FAIL and "operand bias" in verdict.summary, verdict.summary
