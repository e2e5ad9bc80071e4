"""Where egf-audit keeps what it compiles: `$EGF_AUDIT_CACHE`, else `~/.cache/egf-audit`, one
folder per kind of build (the CPU kernels, the capture recorder). A home folder that cannot be
found is one error line saying how to choose the folder instead."""

from __future__ import annotations

import os
from pathlib import Path

from egf_audit.errors import AuditEnvironmentError

CACHE_HINT = "set EGF_AUDIT_CACHE to a writable folder"


def cache_dir(kind: str) -> Path:
    """The cache folder of one kind of build (`cpu-kernels`, `capture`); not created here."""
    root = os.environ.get("EGF_AUDIT_CACHE")
    if not root:
        try:
            root = str(Path.home() / ".cache" / "egf-audit")
        except RuntimeError:  # no HOME and no passwd entry
            raise AuditEnvironmentError(
                f"no home folder for the {kind} cache: {CACHE_HINT}"
            ) from None
    return Path(root) / kind
