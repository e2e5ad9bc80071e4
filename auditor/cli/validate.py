"""Option checks the commands share: each bad value is a one-line UsageError (exit 2).
`check_device` is the backends' own."""

from __future__ import annotations

from egf_audit.errors import UsageError
from egf_audit.pipeline.config import validate_steps
from egf_audit.runtime.backends import check_device

__all__ = ["check_device", "check_launch_timeout", "check_steps", "parse_modes"]

MODE_CHOICES = {"sentinel": ("sentinel",), "live": ("live",), "both": ("sentinel", "live")}


def parse_modes(mode: str) -> tuple[str, ...]:
    if mode not in MODE_CHOICES:
        raise UsageError(f"unknown mode {mode!r} (choose from {', '.join(MODE_CHOICES)})")
    return MODE_CHOICES[mode]


def check_launch_timeout(seconds: float | None) -> float | None:
    if seconds is not None and not seconds > 0:  # NaN too
        raise UsageError(f"--launch-timeout must be a positive number of seconds, got {seconds}")
    return seconds


def check_steps(steps: int) -> int:
    return validate_steps(steps)  # its bound lives beside the memory estimate it keeps small
