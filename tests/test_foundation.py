"""The foundation: config validation, pointer resolution, the recorder, both SGEMM paths, the
kernel-source checks, plain vs instrumented mode and bit-exact replay (CPU backend)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from egf_audit.errors import AuditEnvironmentError
from egf_audit.kernels import KERNELS, KERNELS_BY_NAME
from egf_audit.pipeline.config import (
    Config,
    ConfigError,
    config_from_mapping,
    load_config,
    preset_config,
)
from egf_audit.pipeline.layout import build_layout
from egf_audit.pipeline.step import SP14Pipeline
from egf_audit.runtime.kernel_sources import check_source, load_kernel_set
from egf_audit.runtime.memory import AddressMap, BufferSpec, Layout, Tensor
from egf_audit.runtime.recorder import Recorder


# ---- config ----
def test_presets_match_the_spec():
    ci, prod = preset_config("ci").dims, preset_config("prod").dims
    assert (ci.B, ci.OBS, ci.SH1, ci.SH2, ci.ADV, ci.VALH) == (64, 32, 64, 48, 32, 32)
    assert (prod.B, prod.OBS, prod.SH1, prod.SH2, prod.ADV, prod.VALH) == (
        4096,
        128,
        1024,
        512,
        256,
        256,
    )
    assert ci.A == prod.A == (3, 5, 3, 3) and ci.E == prod.E == (1, 2, 1, 1)
    assert (ci.SH2 + 1) % 4 != 0  # catches alignment assumptions


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"dims": {"B": 0}}, "dims.B must be >= 1"),
        ({"dims": {"SH2": -3}}, "dims.SH2 must be >= 1"),
        ({"dims": {"SH2": 1.5}}, "dims.SH2 must be an integer"),
        ({"dims": {"B": 10**9}}, "absurdly large"),
        ({"dims": {"WIDTH": 3}}, "unknown config key dims.WIDTH"),
        ({"dims": {"A": [3, 5]}}, "dims.A must be a list of 4 integers"),
        ({"hyper": {"gamma": "high"}}, "hyper.gamma must be a number"),
        ({"hyper": {"tau": 2.0}}, "hyper.tau must lie in [0, 1]"),
        ({"colour": "red"}, "unknown config key colour"),
        ({"preset": "huge"}, "unknown preset 'huge'"),
    ],
)
def test_bad_config_is_one_line_naming_the_key(data, fragment):
    with pytest.raises(ConfigError) as info:
        config_from_mapping(data)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_config_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[dims\nB = 3\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_config(bad)
    good = tmp_path / "good.toml"
    good.write_text(
        'preset = "ci"\nseed = 7\n[dims]\nB = 5\nA = [2, 2, 2, 2]\n[hyper]\ngamma = 0.9\n'
    )
    cfg = load_config(good)
    assert (cfg.seed, cfg.dims.B, cfg.dims.A, cfg.hyper.gamma) == (7, 5, (2, 2, 2, 2), 0.9)


# ---- memory ----
def test_pointer_resolution_names_buffer_and_offset():
    layout = Layout(
        (
            BufferSpec("a", "f32", (Tensor("x", 0, 2, 3), Tensor("y", 6, 1, 4))),
            BufferSpec("b", "i32", (Tensor("b", 0, 4, 1),)),
        )
    )
    amap = AddressMap(layout)
    amap.register("a", 1000)
    amap.register("b", 2000)
    assert amap.resolve(1000 + 4 * 7) == ("a", 7)
    assert layout.buffer("a").tensor_at(7).name == "y"
    assert amap.resolve(2000 + 4 * 3) == ("b", 3)
    assert amap.resolve(2000 + 4 * 4) is None  # one past the end
    assert amap.resolve(1002) is None  # misaligned
    assert amap.resolve(10) is None


def test_param_layout_is_shared_and_w_b0fc_is_grown():
    dims = preset_config("ci").dims
    layout = build_layout(dims)
    w = layout.buffer("params").tensor("w_b0fc")
    assert (w.rows, w.cols) == (dims.ADV, dims.SH2 + 1)
    for name in ("grad_buf", "adam_m", "adam_v", "target_params"):
        assert layout.buffer(name).tensors == layout.buffer("params").tensors
    assert layout.buffer("sn_state").tensor("v_b0fc").cols == dims.SH2 + 1


# ---- SGEMM on the CPU backend: k = lda - 1 silently drops the last column ----
def _tiny_recorder(backend):
    layout = Layout(
        (
            BufferSpec("w", "f32", (Tensor("w", 0, 4, 5),)),
            BufferSpec("x", "f32", (Tensor("x", 0, 3, 5),)),
            BufferSpec("y", "f32", (Tensor("y", 0, 3, 4),)),
        )
    )
    amap = AddressMap(layout)
    for spec in layout.buffers:
        amap.register(spec.name, backend.alloc(spec))
    return Recorder(backend, amap, layout, instrumented=True), amap


def test_cpu_sgemm_with_k_one_short_drops_the_last_column(cpu_backend):
    rec, amap = _tiny_recorder(cpu_backend)
    w = np.arange(20, dtype=np.float32).reshape(4, 5)
    x = np.arange(15, dtype=np.float32).reshape(3, 5) + 1
    rec.upload("w", amap.ptr("w"), w)
    rec.upload("x", amap.ptr("x"), x)
    # y[3, 4] = x[3, :k] . w[4, :k]^T, cuBLAS (T, N), lda = ldb = 5
    for k, expected in ((5, x @ w.T), (4, x[:, :4] @ w[:, :4].T)):
        rec.sgemm(
            f"k={k}",
            "T",
            "N",
            4,
            3,
            k,
            1.0,
            amap.ptr("w"),
            5,
            amap.ptr("x"),
            5,
            0.0,
            amap.ptr("y"),
            4,
        )
        assert np.array_equal(rec.read("y").reshape(3, 4), expected)
    short = rec.trace.by_label("k=4")[0]
    a = short.binding("A")
    assert (a.tensor, a.region.width, a.tensor_shape[2]) == ("w", 4, 5)  # 4 of 5 columns read
    assert a.in_bounds and short.executed


def test_out_of_bounds_launch_is_recorded_not_executed(cpu_backend):
    rec, amap = _tiny_recorder(cpu_backend)
    rec.sgemm(
        "oob", "T", "N", 4, 4, 5, 1.0, amap.ptr("w"), 5, amap.ptr("x"), 5, 0.0, amap.ptr("y"), 4
    )  # n = 4 rows of x: one row too many
    launch = rec.trace.by_label("oob")[0]
    assert not launch.executed
    assert not launch.binding("B").in_bounds


# ---- kernel sources ----
ABI = ["sp14_dir_concat_qaux", "sp14_scale_wire_col", "accumulate_d_h_s2_from_concat", "polyak_ema"]


def test_the_four_abi_kernels_are_registered_as_specified():
    assert [k.name for k in KERNELS if k.abi] == ABI
    assert KERNELS_BY_NAME["polyak_ema"].params == (
        ("target", "float*"),
        ("online", "const float*"),
        ("tau", "float"),
        ("n", "long long"),
    )


def test_every_bundled_kernel_passes_its_own_signature_check():
    kernel_set = load_kernel_set()
    assert {s.spec.name for s in kernel_set.sources} == {k.name for k in KERNELS}
    assert all(s.origin == "bundled" for s in kernel_set.sources)


def test_unsupported_construct_names_file_and_line():
    spec = KERNELS_BY_NAME["polyak_ema"]
    src = (
        'extern "C" __global__ void polyak_ema(float* target, const float* online, float tau,'
        " long long n) {\n  __shared__ float tile[256];\n}\n"
    )
    with pytest.raises(AuditEnvironmentError, match=r"mine\.cu:2: `__shared__`"):
        check_source(spec, src, "mine.cu")


def test_mistyped_entry_point_gives_the_expected_signature():
    spec = KERNELS_BY_NAME["polyak_ema"]
    src = (
        'extern "C" __global__ void polyak_ema(float* target, const float* online, float tau,'
        " int n) {}\n"
    )
    with pytest.raises(
        AuditEnvironmentError,
        match=r"expected extern \"C\" __global__ void "
        r"polyak_ema\(float\* target",
    ):
        check_source(spec, src, "mine.cu")


# ---- the pipeline ----
def _small(**dims) -> Config:
    base = preset_config("ci")
    return dataclasses.replace(base, dims=dataclasses.replace(base.dims, **dims))


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32)


def test_plain_mode_computes_the_same_bits_as_instrumented_mode(cpu_backend):
    cfg = _small(B=9, SH2=7)
    results = []
    for instrumented in (True, False):
        pipe = SP14Pipeline(cfg, cpu_backend, instrumented=instrumented)
        pipe.initialize()
        pipe.step("live")
        pipe.step("sentinel")
        results.append({b: pipe.rec.read(b) for b in ("params", "target_params", "grad_buf")})
        if not instrumented:
            assert pipe.rec.trace.launches == []
        pipe.release()
    for name in results[0]:
        assert np.array_equal(_bits(results[0][name]), _bits(results[1][name])), name


def test_replay_from_saved_state_is_bit_exact(cpu_backend):
    pipe = SP14Pipeline(_small(B=5), cpu_backend)
    pipe.initialize()
    pipe.step("live")
    state = pipe.save_state()
    pipe.step("live")
    first = {b: pipe.rec.read(b) for b in ("params", "target_params", "isv_signals")}
    pipe.load_state(state)
    pipe.step("live")
    for name, values in first.items():
        assert np.array_equal(_bits(values), _bits(pipe.rec.read(name))), name
    pipe.release()


def test_sentinel_mode_never_writes_the_gate(cpu_backend):
    pipe = SP14Pipeline(_small(), cpu_backend)
    pipe.initialize()
    pipe.step("sentinel")
    assert _bits(pipe.rec.read("isv_signals"))[393] == 0  # +0.0 exactly
    assert not list(pipe.rec.trace.kernels("alpha_grad_compute"))
    pipe.release()


def test_kernels_readme_documents_every_signature():
    from egf_audit.kernels import bundled_dir
    from egf_audit.runtime.kernel_sources import expected_signature

    readme = (bundled_dir() / "README.md").read_text()
    for spec in KERNELS:
        assert expected_signature(spec) in readme, spec.name


def test_replay_on_a_fresh_pipeline_matches_the_original_bit_for_bit(cpu_backend):
    """The audit replays step 0 on new pipelines: everything a step reads (saved state and the
    constants) must come with the replay, or its gradients differ from the production run."""
    cfg = _small(B=6)
    original = SP14Pipeline(cfg, cpu_backend)
    original.initialize()
    state = original.save_state()
    original.step("live")
    fresh = SP14Pipeline(cfg, cpu_backend)
    fresh.load_state(state)
    fresh.step("live")
    for name in ("grad_buf", "params", "target_params", "isv_signals"):
        assert np.array_equal(_bits(original.rec.read(name)), _bits(fresh.rec.read(name))), name
    original.release()
    fresh.release()
