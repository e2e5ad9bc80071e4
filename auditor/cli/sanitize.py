"""`egf-audit run --sanitize`: the audit again under compute-sanitizer, once per tool, and what
it found, for the document's environment block and the exit code (runtime/sanitizer.py)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from egf_audit.errors import AuditEnvironmentError, UsageError
from egf_audit.kernels import KERNELS
from egf_audit.runtime import sanitizer

AUDITED_KERNELS = frozenset(k.name for k in KERNELS)


def check_request(device: str) -> None:
    if device == "cpu":
        raise UsageError(
            "--sanitize needs --device cuda or auto: compute-sanitizer checks GPU launches"
        )


def child_args(req: Any, config: Any) -> list[str]:
    """The options of the audit being sanitized, less the device and the outputs."""
    args = ["--preset", config.preset, "--seed", str(config.seed)]
    args += ["--steps", str(req.steps), "--mode", req.mode]
    if req.config_path is not None:
        args += ["--config", str(req.config_path)]
    if req.kernels_dir is not None:
        args += ["--kernels", str(req.kernels_dir)]
    if req.launch_timeout_s is not None:  # a kernel that hangs must end the sanitized run too
        args += ["--launch-timeout", str(req.launch_timeout_s)]
    return args


def sanitize(req: Any, config: Any, backend_name: str) -> tuple[dict[str, Any], list[str]]:
    """({tool: what it found}, one line per finding that fails the gate)."""
    if backend_name != "cuda":
        raise AuditEnvironmentError("--sanitize needs the CUDA backend, and none is usable here")
    exe = sanitizer.find_sanitizer()
    if exe is None:
        raise AuditEnvironmentError(
            "--sanitize: compute-sanitizer is not on PATH or under CUDA_HOME; install the CUDA "
            "toolkit's compute-sanitizer or run without --sanitize"
        )
    scratch = Path(tempfile.mkdtemp(prefix="egf-audit-sanitize-"))
    try:
        child = sanitizer.audit_argv(child_args(req, config), scratch / "audit.md")
        reports = [sanitizer.run_tool(exe, tool, child) for tool in sanitizer.TOOLS]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    failing = []
    for r in reports:
        if r.failure:
            failing.append(f"compute-sanitizer {r.tool} {r.failure}")
        failing += [f"compute-sanitizer {r.tool}: {f.line()}" for f in r.failing(AUDITED_KERNELS)]
    return {r.tool: r.as_dict() for r in reports}, failing
