"""`run --cublas-log`: cuBLAS's own API logger as a witness of every recorded SGEMM."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from egf_audit.errors import AuditEnvironmentError, UsageError
from egf_audit.runtime import cublas_witness
from egf_audit.runtime.backends.base import Backend
from egf_audit.trace.audit_run import AuditRun


@dataclass
class Witness:
    """The logger tap and the thread whose cuBLAS calls are the pipeline's (the one that runs
    the scenarios: this command's)."""

    tap: cublas_witness.LoggerTap = field(default_factory=cublas_witness.LoggerTap)
    thread: int = field(default_factory=threading.get_ident)


def start(device: str) -> Witness:
    """Refuse the CPU backend at once (before anything is compiled); the logger itself is
    switched on by `listen`, once the backend has loaded cuBLAS."""
    if device == "cpu":
        raise UsageError("--cublas-log needs --device cuda or auto: the CPU backend has no cuBLAS")
    return Witness()


def listen(witness: Witness, backend: Backend) -> None:
    if backend.name != "cuda":
        raise AuditEnvironmentError("--cublas-log needs the CUDA backend, and none is usable here")
    try:
        witness.tap.attach()
    except OSError as exc:
        raise AuditEnvironmentError(
            f"--cublas-log: cuBLAS's logger cannot be switched on ({exc})"
        ) from None


def finish(witness: Witness, backend: Backend, run: AuditRun) -> cublas_witness.WitnessResult:
    """Match what cuBLAS logged in the pipeline's thread with every recorded SGEMM, in execution
    order (the scenarios ran one after another, in the order the run keeps them); only the calls
    on the backend's own cuBLAS handle are the pipeline's."""
    backend.synchronize()
    witness.tap.detach()
    launches = [x for trace in run.traces.values() for x in trace.launches]
    handles = backend.cublas_handles() or None  # no handle known: every logged call is paired
    return cublas_witness.match_tap(witness.tap, witness.thread, launches, handles)
