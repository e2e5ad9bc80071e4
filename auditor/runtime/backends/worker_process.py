"""What the two kernel workers share (cpu_worker.py forks one, cuda_worker.py starts one): the
per-launch watchdog's default, the rule that a worker never outlives the audit, and how a
worker's end is put in words on the launch it ended."""

from __future__ import annotations

import ctypes
import os
import signal

DEFAULT_LAUNCH_TIMEOUT_S = 120.0  # generous: the slowest kernel at prod shapes takes < 1 s
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Have Linux kill this process (SIGKILL) when the audit that started it ends."""
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def describe_signal(number: int) -> str:
    """`crashed with SIGSEGV`: a process ended by signal `number`."""
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = f"signal {number}"
    return f"crashed with {name}"


def describe_exit(status: int) -> str:
    """A wait status in words: `crashed with SIGSEGV`, `exited with status 0`."""
    if os.WIFSIGNALED(status):
        return describe_signal(os.WTERMSIG(status))
    if os.WIFEXITED(status):
        return f"exited with status {os.WEXITSTATUS(status)}"
    return f"ended with wait status {status}"
