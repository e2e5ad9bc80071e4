"""The one loader of kernel sources on the GPU: NVRTC through `cupy.RawModule`, memoized per
distinct source, used by the audit's process and by the worker that runs untrusted kernels."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cache
from typing import Any

import cupy
import numpy as np

from egf_audit.errors import AuditEnvironmentError
from egf_audit.runtime.kernel_sources import KernelSource

NVRTC_OPTIONS = ("-std=c++17",)
_SCALARS = {"int": np.int32, "float": np.float32, "long long": np.int64}


def _nvrtc_errors(log: str) -> str:
    """NVRTC's `path(7): error: ...` as `path:7: error: ...` (the form g++ prints), without its
    note about the temporary file it compiled."""
    lines = [
        re.sub(r"^(.*?)\((\d+)\): (error|warning)", r"\1:\2: \3", ln.strip())
        for ln in log.splitlines()
    ]
    errors = [ln for ln in lines if ": error" in ln][:6]
    return " | ".join(errors) or log.strip()[:400]


@cache
def _module(path: str, text: str, include_dir: str | None) -> cupy.RawModule:
    """One memoized RawModule per distinct source (the cache key is the text itself; headers
    under include_dir are NVRTC's to read, as nvcc -I reads them)."""
    options = NVRTC_OPTIONS + ((f"-I{include_dir}",) if include_dir else ())
    return cupy.RawModule(code=f'#line 1 "{path}"\n{text}', options=options)


def compile_function(path: str, code: str, include_dir: str | None, name: str) -> Any:
    """The kernel `name` of one source, compiled by NVRTC (memoized)."""
    try:
        return _module(path, code, include_dir).get_function(name)
    except cupy.cuda.compiler.CompileException as exc:
        raise AuditEnvironmentError(
            f"kernel {path} does not compile: {_nvrtc_errors(str(exc))}"
        ) from None
    except cupy.cuda.driver.CUDADriverError as exc:
        raise AuditEnvironmentError(f"kernel {path}: {exc}") from None


def load_function(source: KernelSource) -> Any:
    return compile_function(source.path, source.code, source.include_dir, source.spec.name)


def pack_arguments(params: Sequence[tuple[str, str]], args: Sequence[Any]) -> tuple:
    """A launch's arguments as the kernel's C types (pointers as 64-bit integers)."""
    return tuple(
        np.uint64(v) if t.endswith("*") else _SCALARS[t](v)
        for (_, t), v in zip(params, args, strict=True)
    )
