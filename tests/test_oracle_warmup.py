"""The background start-up of torch's CUDA work (egf_audit.oracle.warmup): off on the CPU
backend, never raising, and running the oracle's math at a config's shapes."""

from __future__ import annotations

import pytest
import torch

from egf_audit.oracle import warmup
from egf_audit.pipeline.config import preset_config

CI = preset_config("ci")


def test_off_on_the_cpu_backend():
    warm = warmup.start("cpu", CI)
    assert warm.thread is None
    warm.wait()  # returns at once
    assert warm.error is None and warm.seconds is None


def test_without_a_gpu_the_thread_does_nothing(monkeypatch: pytest.MonkeyPatch):
    ran: list[object] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(warmup, "run_once", lambda *a: ran.append(a))
    warm = warmup.start("cuda", CI)
    warm.wait()
    assert warm.thread is not None and not warm.thread.is_alive()
    assert ran == [] and warm.error is None and warm.seconds is not None


def test_an_error_is_kept_not_raised(monkeypatch: pytest.MonkeyPatch):
    def fail(*_args: object) -> None:
        raise RuntimeError("no device")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(warmup, "run_once", fail)
    warm = warmup.start("cuda", CI)
    warm.wait()
    assert isinstance(warm.error, RuntimeError) and str(warm.error) == "no device"


def test_runs_the_oracle_step_at_the_config_shapes(monkeypatch: pytest.MonkeyPatch):
    """On the CPU, the same code the thread runs on the GPU: one float64 step of the oracle's
    model, its decisions and its comparisons, at the ci preset's shapes, with torch's forward,
    autograd and every matmul reached."""
    seen: list[tuple[int, ...]] = []
    matmul = torch.Tensor.__matmul__

    def recording(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        seen.append((*a.shape, *b.shape))
        return matmul(a, b)

    monkeypatch.setattr(torch.Tensor, "__matmul__", recording)
    warmup.run_once(CI.dims, CI.hyper, torch.device("cpu"))
    d = CI.dims
    assert (d.B, d.SH1, d.SH1, d.SH2) in seen  # h_s1 @ w_s2^T, as the model runs it
    assert (d.B, d.VALH, d.VALH, d.SH2) in seen  # EGF007's value dX
