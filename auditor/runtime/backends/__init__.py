"""Backends run launches on real buffers: `cuda` (CuPy + cuBLAS) and `cpu` (the same kernel
sources compiled by the host compiler, GEMMs through torch). `select_backend` implements
`--device auto|cuda|cpu`."""

from __future__ import annotations

from egf_audit.errors import AuditEnvironmentError, UsageError, about_option
from egf_audit.runtime.backends.base import Backend
from egf_audit.runtime.kernel_sources import KernelSet

DEVICES = ("auto", "cuda", "cpu")


def cuda_usable() -> tuple[bool, str]:
    """Whether a GPU and CuPy really work here (an import alone proves nothing), and why not."""
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return False, "no CUDA device"
        probe = cupy.arange(4, dtype=cupy.float32) * 2
        if float(probe.sum()) != 12.0:
            return False, "a CuPy probe computed a wrong result"
        from cupy_backends.cuda.libs import cublas  # noqa: F401
    except Exception as exc:
        return False, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return True, ""


def check_device(device: str) -> str:
    """The device, if it is one of DEVICES; else a usage error (exit 2)."""
    if device not in DEVICES:
        raise UsageError(f"unknown device {device!r} (choose from {', '.join(DEVICES)})")
    return device


def select_backend(
    device: str, kernel_set: KernelSet, launch_timeout_s: float | None = None
) -> Backend:
    """The backend for `--device`. `launch_timeout_s`: the per-launch watchdog of the worker that
    runs untrusted kernels (None: its default)."""
    from egf_audit.runtime.backends.worker_process import DEFAULT_LAUNCH_TIMEOUT_S

    timeout_s = launch_timeout_s or DEFAULT_LAUNCH_TIMEOUT_S
    check_device(device)
    if device in ("auto", "cuda"):
        ok, why = cuda_usable()
        if ok:
            from egf_audit.runtime.backends.cuda import CudaBackend

            return CudaBackend(kernel_set, timeout_s)
        if device == "cuda":
            raise about_option(
                AuditEnvironmentError(f"--device cuda asked for, but no usable GPU: {why}"),
                "device",
                f"no usable GPU: {why}",
            )
    from egf_audit.runtime.backends.cpu import CpuBackend

    return CpuBackend(kernel_set, timeout_s)


__all__ = ["DEVICES", "Backend", "check_device", "cuda_usable", "select_backend"]
