"""`run --cublas-log`: cuBLAS's own API logger as a witness of every recorded SGEMM."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from egf_audit.errors import AuditEnvironmentError, UsageError
from egf_audit.runtime import cublas_witness
from egf_audit.runtime.audit_run import AuditRun
from egf_audit.runtime.backends.base import Backend


def start(device: str) -> Path:
    """The log file cuBLAS's API logger writes. The `egf-audit` command switches the logger on
    at process start (auditor/entry.py); called in a process that has loaded cuBLAS already,
    the logger could no longer be switched on, and that is said rather than a silent miss."""
    if device == "cpu":
        raise UsageError("--cublas-log needs --device cuda or auto: the CPU backend has no cuBLAS")
    if os.environ.get(cublas_witness.CHILD_MARKER):
        return Path(os.environ[cublas_witness.CHILD_MARKER])
    if cublas_witness.cublas_loaded():
        raise AuditEnvironmentError(
            "--cublas-log: cuBLAS is already loaded in this process, so its logger can no longer "
            "be switched on; run `egf-audit run --cublas-log` as a command of its own"
        )
    log = Path(tempfile.mkdtemp(prefix=cublas_witness.LOG_PREFIX)) / "cublas_api.log"
    cublas_witness.enable(log)
    return log


def finish(log: Path, backend: Backend, run: AuditRun) -> cublas_witness.WitnessResult:
    """Parse what cuBLAS logged and match it with every recorded SGEMM, in execution order
    (the scenarios ran one after another, in the order the run keeps them); only the calls on
    the backend's own cuBLAS handle are the pipeline's."""
    backend.synchronize()
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise AuditEnvironmentError(f"--cublas-log: cuBLAS wrote no log ({exc})") from None
    finally:
        if log.parent.name.startswith(cublas_witness.LOG_PREFIX):
            shutil.rmtree(log.parent, ignore_errors=True)
    launches = [x for trace in run.traces.values() for x in trace.launches]
    handles = backend.cublas_handles() or None  # no handle known: every logged call is paired
    return cublas_witness.match(cublas_witness.parse_log(text), launches, handles)
