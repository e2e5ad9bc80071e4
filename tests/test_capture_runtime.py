"""The H200 recordings of the stand-in (tests/data/capture/), re-expressed as a trainer that
launches with `<<<>>>` and calls `cublasGemmEx`: every egf-audit kernel launch becomes a
`cudaLaunchKernel_v7000` launch under a C++-mangled symbol, every `cublasSgemm_v2` call the
`cublasGemmEx` call cuBLAS 13.1 logs for the same arguments (void scalars, element types,
compute type; alpha's and beta's bits on the computeType line, where the recorder writes them
for an Ex call). Every verdict must be the one the recording itself gets: the runtime-API and
the Ex paths of the reader are the driver-API and SGEMM paths' equals, kill matrix included.

The recorder's decoding of real runtime launches and Ex and cuBLASLt calls on a GPU is shown by
their H200 recordings (tests/test_capture_h200_programs.py); this file keeps the rewrite as a
check that needs no recording: the same verdicts for every recorded fault, whichever the launch
API and the GEMM entry point."""

from __future__ import annotations

import gzip
import json
import shutil
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from egf_audit.capture.events import read_capture
from egf_audit.cli.capture_audit import CaptureAudit, audit_capture
from egf_audit.kernels import KERNELS_BY_NAME

DATA = Path(__file__).parent / "data" / "capture"
# the stand-in's H200 recordings: clean and each capture-visible fault (tests/test_capture.py)
RECORDINGS = (
    "clean",
    "fwd-k-sh2",
    "dw-k-sh2",
    "dx-k-sh2",
    "cql-site-ungated",
    "skip-scale",
    "skip-rebuild",
    "no-zero-d-h-s2",
    "scale-wrong-col",
    "target-grad-leak",
    "wrapper-on-main",
    "accumulate-wire-col",
    "polyak-tau-swap",
)
_ITANIUM = {
    "float*": "Pf",
    "const float*": "PKf",
    "int*": "Pi",
    "const int*": "PKi",
    "int": "i",
    "float": "f",
    "long long": "x",
}
EX_HEADER = (
    "I! cuBLAS (v13.1.0) function cublasStatus_t cublasGemmEx(cublasHandle_t, "
    "cublasOperation_t, cublasOperation_t, int, int, int, const void*, const void*, cudaDataType, "
    "int, const void*, cudaDataType, int, const void*, void*, cudaDataType, int, "
    "cublasComputeType_t, cublasGemmAlgo_t) called:\n"
)
SCALARS = ("pointer_mode", "alpha_bits", "beta_bits")


def mangled(name: str) -> str:
    """The kernel's C++ symbol (Itanium, without the substitutions a compiler would use for a
    repeated type: the reader reads the identifier alone)."""
    types = "".join(_ITANIUM[t] for _, t in KERNELS_BY_NAME[name].params)
    return f"_Z{len(name)}{name}{types}"


def _line(name: str, ctype: str, value: str) -> str:
    return f"i!  {name}: type={ctype}; val={value}\n"


def _as_gemm_ex(call: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A logged cublasSgemm_v2 call's messages as cuBLAS logs the cublasGemmEx call with the
    same arguments."""
    out = [dict(call[0], msg=EX_HEADER)]
    scalars: dict[str, Any] = {}
    for event in call[1:]:
        msg = event["msg"]
        name = msg.split(":")[0].replace("i!", "").strip()
        bare = {k: v for k, v in event.items() if k not in SCALARS}
        scalars |= {k: v for k, v in event.items() if k in SCALARS}
        if name in ("alpha", "beta", "A", "B", "C"):
            bare["msg"] = msg.replace("type=float;", "type=void;")
        out.append(bare)
        if name in ("A", "B", "C"):
            out.append({**bare, "msg": _line(f"{name}type", "cudaDataType_t", "CUDA_R_32F(0)")})
    last = out[-1]
    out.append(
        {
            **last,
            "msg": _line("computeType", "cublasComputeType_t", "CUBLAS_COMPUTE_32F(68)"),
            **scalars,
            "scalar_bytes": 4,
        }
    )
    out.append({**last, "msg": _line("algo", "SOME TYPE", "CUBLAS_GEMM_DEFAULT(-1)")})
    return out


def as_runtime_trainer(src: Path, dst: Path) -> Path:
    """The recording `src`, re-expressed (module docstring), written to `dst`; seqs renumbered
    and every snapshot's launch following its launch."""
    shutil.copytree(src, dst)
    (path,) = dst.glob("events-*.jsonl.gz")
    events = [json.loads(line) for line in gzip.decompress(path.read_bytes()).splitlines()]
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(events):
        e = events[i]
        if e["ev"] == "kernel" and e["name"] in KERNELS_BY_NAME:
            out.append(e | {"api": "cudaLaunchKernel_v7000", "name": mangled(e["name"])})
        elif e["ev"] == "cublas" and "cublasSgemm_v2(" in e["msg"]:
            j = i + 1
            while j < len(events) and events[j]["ev"] == "cublas" and "I! " not in events[j]["msg"]:
                j += 1
            out += _as_gemm_ex(events[i:j])
            i = j
            continue
        else:
            out.append(e)
        i += 1
    seqs = {}
    for new, e in enumerate(out):
        seqs.setdefault(e["seq"], new)
        e["seq"] = new
    for e in out:
        if e["ev"] == "snapshot":
            e["launch"] = seqs[e["launch"]]
    text = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in out)
    path.write_bytes(gzip.compress(text.encode()))
    return dst


@cache
def _statuses(folder: Path, use_layout: bool) -> dict[str, str]:
    audit: CaptureAudit = audit_capture(folder, use_layout=use_layout)
    assert not audit.incomplete and not audit.missing
    (process,) = audit.processes
    return {code: v.status for code, v in process.verdicts}


@pytest.fixture(scope="module")
def runtime_captures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runtime-trainer")
    return {name: as_runtime_trainer(DATA / name, root / name) for name in RECORDINGS}


def test_the_rewritten_capture_reads_as_runtime_launches_and_gemm_ex_calls(runtime_captures):
    (proc,) = read_capture(runtime_captures["clean"])
    (recorded,) = read_capture(DATA / "clean")
    ours = [r for r in proc.kernels() if r.name in KERNELS_BY_NAME]
    assert ours and all(r.api == "cudaLaunchKernel_v7000" and r.decoded for r in ours)
    assert all(r.args["symbol"] == mangled(r.name) for r in ours)
    gemms = [r for r in proc.records if r.kind in ("sgemm", "gemm")]
    assert {r.name for r in gemms} == {"cublasGemmEx"}
    assert len(gemms) == sum(r.kind == "sgemm" for r in recorded.records) == 213
    sgemms = [r for r in recorded.records if r.kind == "sgemm"]
    keys = ("transa", "transb", "m", "n", "k", "lda", "ldb", "ldc", "A", "B", "C", "alpha", "beta")
    assert [[g.args[k] for k in keys] for g in gemms] == [[s.args[k] for k in keys] for s in sgemms]
    assert len(proc.snapshots) == len(recorded.snapshots)


@pytest.mark.parametrize("use_layout", [True, False], ids=["layout-file", "inferred"])
@pytest.mark.parametrize("name", RECORDINGS)
def test_a_runtime_launching_gemm_ex_trainer_gets_the_recordings_verdicts(
    runtime_captures, name, use_layout
):
    assert _statuses(runtime_captures[name], use_layout) == _statuses(DATA / name, use_layout)
