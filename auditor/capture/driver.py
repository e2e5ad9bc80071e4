"""Whether this machine has a usable CUDA driver and device, asked of the driver itself (libcuda
through ctypes: cuInit, cuDeviceGetCount), never of CuPy or torch, which `egf-audit capture`
does not need. Asked only after a command recorded nothing, to say "no GPU" when that is why."""

from __future__ import annotations

import ctypes

LIBRARY = "libcuda.so.1"  # the driver's soname; the toolkit's stub libcuda.so is no driver


def no_gpu_reason() -> str | None:
    """Why no CUDA device can be used here, in words; None when the driver reports a device."""
    try:
        cuda = ctypes.CDLL(LIBRARY)
    except OSError:
        return f"no NVIDIA driver: {LIBRARY} cannot be loaded"
    status = cuda.cuInit(0)
    if status != 0:
        return f"the CUDA driver does not initialise (cuInit: {_error_name(cuda, status)})"
    count = ctypes.c_int(0)
    status = cuda.cuDeviceGetCount(ctypes.byref(count))
    if status != 0:
        return f"the CUDA driver cannot count its devices ({_error_name(cuda, status)})"
    return None if count.value > 0 else "the CUDA driver reports no device"


def _error_name(cuda: ctypes.CDLL, status: int) -> str:
    name = ctypes.c_char_p()
    if cuda.cuGetErrorName(status, ctypes.byref(name)) == 0 and name.value:
        return name.value.decode("ascii", "replace")
    return f"error {status}"
