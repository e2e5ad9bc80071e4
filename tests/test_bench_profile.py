"""The per-kernel GPU profile of `egf-audit bench --profile`: naming, grouping, per-step figures
and rendering, from device events as CUPTI reports them (name, microseconds)."""

from __future__ import annotations

import pytest

from egf_audit.bench.profile import StepProfile, aggregate, classify, markdown
from egf_audit.bench.report import Unavailable

# names as the H200's CUPTI trace spells them
CUTLASS = (
    "void cutlass::Kernel2<cutlass_80_simt_sgemm_64x128_8x5_nt_align1>"
    "(cutlass_80_simt_sgemm_64x128_8x5_nt_align1::Params)"
)
XMMA = (
    "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_aligna4_"
    "alignc4_execute_kernel__5x_cublas"
)
XMMA_SPLIT = XMMA.replace("execute_kernel", "execute_split_k_kernel")
SPLITK = "void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, false>"
GEMV = (
    "std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, float, float, "
    "float, float, false, true, true, false, 7, false, cublasGemvParamsEx<int>>(...)"
)


@pytest.mark.parametrize(
    ("name", "group", "short"),
    [
        ("sp14_dir_concat_qaux", "pipeline", "sp14_dir_concat_qaux"),
        ("adam_update", "pipeline", "adam_update"),
        (CUTLASS, "cuBLAS", "cutlass_80_simt_sgemm_64x128_8x5_nt_align1"),
        (XMMA, "cuBLAS", "sm80_xmma_gemm_nn_n_tilesize64x64x8"),
        (XMMA_SPLIT, "cuBLAS", "sm80_xmma_gemm_nn_n_tilesize64x64x8_split_k"),
        (SPLITK, "cuBLAS", "splitKreduce_kernel"),
        (GEMV, "cuBLAS", "gemvx::kernel"),
        ("Memset (Device)", "other", "Memset (Device)"),
        ("cupy_copy__float32_float32", "other", "cupy_copy__float32_float32"),
    ],
)
def test_device_operations_are_named_and_grouped(name, group, short):
    assert classify(name) == (group, short)


def test_aggregate_gives_per_step_launches_and_milliseconds_slowest_first():
    events = [
        ("sp14_dir_concat_qaux", 170.0),
        ("sp14_dir_concat_qaux", 172.0),
        (CUTLASS, 60.0),
        (CUTLASS, 61.0),
        (CUTLASS, 59.0),
        (CUTLASS, 60.0),
        ("Memset (Device)", 2.0),
    ]
    rows = aggregate(events, steps=2)
    assert [(r.name, r.group, r.launches) for r in rows] == [
        ("sp14_dir_concat_qaux", "pipeline", 1.0),
        ("cutlass_80_simt_sgemm_64x128_8x5_nt_align1", "cuBLAS", 2.0),
        ("Memset (Device)", "other", 0.5),
    ]
    assert [r.ms for r in rows] == pytest.approx([0.171, 0.120, 0.001])
    profile = StepProfile(4096, 2, rows)
    assert profile.busy_ms == pytest.approx(0.292)
    assert profile.as_dict()["by_group_ms"] == pytest.approx(
        {"pipeline": 0.171, "cuBLAS": 0.120, "other": 0.001}
    )


def test_markdown_lists_the_slowest_operations_and_what_is_missing():
    rows = aggregate([("sp14_dir_concat_qaux", 300.0), (SPLITK, 100.0)], steps=1)
    text = markdown([StepProfile(256, 1, rows), Unavailable("no CUPTI")])
    assert "GPU time of one plain step at B=256: 0.400 ms busy in 2 device operations" in text
    assert "| sp14_dir_concat_qaux | pipeline | 1 | 0.300 | 75% |" in text
    assert "| splitKreduce_kernel | cuBLAS | 1 | 0.100 | 25% |" in text
    assert "GPU profile unavailable: no CUPTI" in text
    assert markdown([]) == ""


# ---- where an instrumented run's time goes, by kind of work (runtime/costs.py) ----


def test_a_collector_times_every_kind_of_work_and_every_scenario(cpu_backend):
    from egf_audit.pipeline.config import preset_config
    from egf_audit.runtime import costs
    from egf_audit.scenarios.audit import Auditor

    with costs.collecting() as collected:
        run = Auditor(preset_config("ci"), cpu_backend, steps=1).run(("sentinel",))
    assert costs.current() is None  # only while collecting
    assert set(collected.scenarios) == set(run.traces)
    launches = sum(
        1 for t in run.traces.values() for x in t.launches if x.kind != "checkpoint" and x.executed
    )
    kernels = sum(
        1 for t in run.traces.values() for x in t.launches if x.kind == "kernel" and x.executed
    )
    assert collected.counts[costs.LAUNCH] == collected.counts[costs.COMPARISONS] == launches
    assert collected.counts[costs.GUARDS] == kernels
    assert collected.counts[costs.SHADOWS] == len(run.traces)  # one watch per recorder
    assert collected.counts[costs.SNAPSHOTS] == sum(len(t.snapshots) for t in run.traces.values())
    assert collected.counts[costs.READBACK] == 0
    assert all(v > 0 for k, v in collected.seconds.items() if k != costs.READBACK)


def test_a_process_named_costs_file_is_written_at_its_exit(tmp_path):
    import json
    import os
    import subprocess
    import sys

    from egf_audit.runtime import costs

    out = tmp_path / "costs.json"
    code = (
        "from egf_audit.runtime import costs; c = costs.current(); "
        "c.timed(costs.SNAPSHOTS, lambda: None, lambda: None); c.span('sentinel', 0.5)"
    )
    env = {**os.environ, costs.COSTS_VARIABLE: str(out)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    written = json.loads(out.read_text())
    assert written["counts"][costs.SNAPSHOTS] == 1
    assert written["scenarios"] == {"sentinel": 0.5}
