"""`egf-audit capture --cpu -- CMD`: the trainer's own process captured on a machine without a
GPU. egf-audit's own CUDA libraries for the CPU (cpu_libraries.py: libcuda.so.1, libcupti,
libcudart, libcublas, libcublasLt, libnvrtc) come first for the loader, the trainer's kernel
sources are compiled for the CPU (cpu_kernels.py), and the recorder, the same
egf_capture_recorder.c as on a GPU, is injected by the fake driver at cuInit and writes the
same capture folder, so `run --capture` judges it with no change (docs/capture.md, "Without a
GPU").

Whatever the fakes do not model is refused by name: each refusal is a line of a file outside
the capture folder, and after the command a capture with any is refused (exit 2, naming the
first; --out is kept as it was), never judged as if it had run.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path

from egf_audit.errors import AuditEnvironmentError, UsageError
from egf_audit.runtime.backends.worker_process import DEFAULT_LAUNCH_TIMEOUT_S

from .build import build_recorder
from .command import DEFAULT_SNAPSHOT, CaptureOutcome, Platform, run_capture
from .cpu_kernels import kernels_dir_index
from .cpu_libraries import build_cpu_libraries

REFUSED_LIMIT = 3  # refusals named in the one line


def _refusals(path: Path) -> list[tuple[str, str]]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    found: dict[str, str] = {}
    for line in text.splitlines():
        name, _, why = line.partition("\t")
        found.setdefault(name, why)
    return list(found.items())


def refusal_error(refused: list[tuple[str, str]]) -> UsageError:
    """The one line for a capture the fakes refused (exit 2)."""
    first, why = refused[0]
    more = ""
    if len(refused) > 1:
        others = ", ".join(name for name, _ in refused[1:REFUSED_LIMIT])
        extra = len(refused) - REFUSED_LIMIT
        more = f" (also refused: {others}{f' and {extra} more' if extra > 0 else ''})"
    return UsageError(
        f"capture --cpu: the command called {first}, which --cpu does not run: {why}{more}; "
        "the capture is refused (docs/capture.md lists what --cpu models)"
    )


def _environment(libraries: Path, index: Path, refusals: Path, env: dict) -> None:
    loader = env.get("LD_LIBRARY_PATH", "")
    env["LD_LIBRARY_PATH"] = f"{libraries}:{loader}" if loader else str(libraries)
    env["EGF_CPU_KERNEL_INDEX"] = str(index)
    env["EGF_CPU_REFUSALS"] = str(refusals)
    env["EGF_CPU_PYTHON"] = sys.executable
    # a launch running longer is stopped as a hang, as the CPU backend's worker stops one
    env["EGF_CPU_LAUNCH_TIMEOUT"] = str(int(DEFAULT_LAUNCH_TIMEOUT_S))
    # cuBLAS's own logger settings of the trainer's: the recorder turns its logger on itself
    for name in ("CUBLAS_LOGINFO_DBG", "CUBLAS_LOGDEST_DBG"):
        env.pop(name, None)


def run_cpu_capture(
    command: list[str],
    out: Path,
    kernels_dir: Path | None,
    layout: Path | None = None,
    snapshot: tuple[str, ...] = DEFAULT_SNAPSHOT,
    values_max: int | None = None,
    deep: bool = False,
    deep_values_max: int | None = None,
) -> CaptureOutcome:
    """Build the fake libraries and the kernels, then `run_capture` with them first for the
    loader; a refusal by the fakes is a UsageError after the command ran."""
    if kernels_dir is not None and not Path(kernels_dir).is_dir():
        raise UsageError(f"--kernels {kernels_dir}: no such folder")
    libraries = build_cpu_libraries(build_recorder())
    index_text = kernels_dir_index(Path(kernels_dir) if kernels_dir is not None else None)
    try:
        scratch = Path(tempfile.mkdtemp(prefix="egf-capture-cpu-"))
    except OSError as exc:
        raise AuditEnvironmentError(f"capture --cpu: no scratch folder: {exc.strerror}") from None
    index, refusals = scratch / "kernels.index", scratch / "refusals.txt"
    try:
        index.write_text(index_text, encoding="utf-8")

        def after() -> None:
            refused = _refusals(refusals)
            if refused:
                raise refusal_error(refused)

        platform = Platform(
            environment=lambda env: _environment(libraries, index, refusals, env),
            after=after,
            manifest={"platform": "cpu", "kernels": str(kernels_dir) if kernels_dir else None},
        )
        return run_capture(
            command, out, layout, snapshot, values_max, deep, deep_values_max, platform
        )
    finally:
        for path in (index, refusals):
            with contextlib.suppress(OSError):
                os.unlink(path)
        with contextlib.suppress(OSError):
            scratch.rmdir()
