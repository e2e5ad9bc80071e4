"""The process the CPU backend's kernels run in, so that audited code cannot take the gate down.

The worker is forked from the audit after its buffers are mapped (shared anonymous mappings,
guarded_memory.py): it sees the same memory at the same addresses, so a launch's raw pointers
mean the same thing on both sides and nothing is copied. The parent sends one launch at a time
over a pipe and waits, up to a per-launch time-out, for a one-byte reply. A worker that
segfaults, aborts, calls exit() or never answers becomes a `LaunchFailed` naming what happened;
the next launch gets a fresh worker. A buffer mapped after the fork is not in the worker, so the
backend forks a new one when its allocations changed (once per scenario).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import struct
import warnings
from collections.abc import Callable, Sequence

from egf_audit.runtime.backends.worker_process import describe_exit, die_with_parent
from egf_audit.runtime.guards import LaunchFailed

_HEADER = struct.Struct("<HII")  # kernel index, blocks, threads
_FORMATS = {"int": "i", "float": "d", "long long": "q"}  # doubles: ctypes rounds to fp32 as before
_OK = b"\x00"


def argument_format(param_types: Sequence[str]) -> struct.Struct:
    return struct.Struct(
        "<" + "".join("Q" if t.endswith("*") else _FORMATS[t] for t in param_types)
    )


def _read_exactly(fd: int, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = os.read(fd, count - len(data))
        if not chunk:
            return data
        data += chunk
    return data


class KernelWorker:
    """One forked worker. `functions[i]` is called with (blocks, threads, *args) in the child."""

    def __init__(
        self,
        functions: Sequence[Callable[..., None]],
        formats: Sequence[struct.Struct],
        timeout_s: float,
    ):
        self._functions = functions
        self._formats = formats
        self.timeout_s = timeout_s
        to_child = os.pipe()
        from_child = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # multi-threaded fork: see _serve
            pid = os.fork()
        if pid == 0:  # pragma: no cover - the child; its end is observed by the parent
            code = 70
            try:
                os.close(to_child[1])
                os.close(from_child[0])
                code = self._serve(to_child[0], from_child[1])
            finally:
                os._exit(code)
        os.close(to_child[0])
        os.close(from_child[1])
        self.pid = pid
        self._send, self._receive = to_child[1], from_child[0]

    def _serve(self, receive: int, send: int) -> int:
        """The child's loop. It touches no torch and no lock another thread of the parent could
        have held at the fork: only os, struct and the ctypes entry points."""
        libc = ctypes.CDLL(None)
        die_with_parent()
        keep = sorted((receive, send))
        os.closerange(3, keep[0])  # other workers' pipes: their EOF must reach them
        os.closerange(keep[0] + 1, keep[1])
        os.closerange(keep[1] + 1, 1 << 16)
        os.dup2(2, 1)  # a kernel's printf goes to stderr: stdout carries the results
        while True:
            header = _read_exactly(receive, _HEADER.size)
            if len(header) < _HEADER.size:
                return 0  # the parent closed the pipe
            index, blocks, threads = _HEADER.unpack(header)
            fmt = self._formats[index]
            args = fmt.unpack(_read_exactly(receive, fmt.size))
            self._functions[index](blocks, threads, *args)
            libc.fflush(None)
            os.write(send, _OK)

    def run(self, index: int, blocks: int, threads: int, args: Sequence) -> None:
        message = _HEADER.pack(index, blocks, threads) + self._formats[index].pack(*args)
        try:
            os.write(self._send, message)
        except BrokenPipeError:
            raise LaunchFailed(self._reap()) from None
        ready, _, _ = select.select([self._receive], [], [], self.timeout_s)
        if not ready:
            self.stop()
            reap_stopped(block=True)
            raise LaunchFailed(
                f"did not return within {self.timeout_s:g} s (the worker was killed)"
            )
        if os.read(self._receive, 1) != _OK:
            raise LaunchFailed(self._reap())

    def _reap(self) -> str:
        _, status = os.waitpid(self.pid, 0)
        self.pid = 0
        self._close_pipes()
        return describe_exit(status)

    def _close_pipes(self) -> None:
        for fd in (self._send, self._receive):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._send = self._receive = -1

    @property
    def alive(self) -> bool:
        return self.pid != 0

    def stop(self) -> None:
        """Kill the worker; it is reaped later (`reap_stopped`): waiting for a big process to
        tear down costs more than forking the next one."""
        if self.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            _STOPPED.append(self.pid)
            self.pid = 0
        self._close_pipes()
        reap_stopped()


_STOPPED: list[int] = []  # killed workers not yet reaped


def reap_stopped(block: bool = False) -> None:
    """Collect killed workers that have ended (all of them, waiting, when `block`)."""
    for pid in list(_STOPPED):
        try:
            done, _ = os.waitpid(pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            _STOPPED.remove(pid)
