"""The process the CUDA backend's untrusted kernels run in, so that one cannot take the gate down.

A kernel that faults on the GPU (an illegal address, a `__trap()`) leaves the CUDA context it
ran in unusable, and one that never returns blocks its host thread forever. So every kernel
egf-audit does not ship runs in a worker process with its own context, on the audit's very
buffers, shared through CUDA IPC: the worker opens each allocation's IPC handle once and
translates the audit's pointers into its own mapping of the same memory. The audit sends one
launch at a time and waits, up to the per-launch time-out, for the worker's answer, given after
the worker synchronised. A fault is answered in words and ends the worker; a worker that dies
or does not answer is killed. Either way the audit's own context is untouched, its launch is
recorded as failed (EGF013), and the next launch gets a fresh worker.

Run as `python -m egf_audit.runtime.backends.cuda_worker READ_FD WRITE_FD DEVICE`.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, NoReturn

from egf_audit.errors import AuditEnvironmentError
from egf_audit.runtime.backends.worker_process import describe_signal, die_with_parent
from egf_audit.runtime.guards import LaunchFailed

STARTUP_TIMEOUT_S = 600.0  # importing CuPy and compiling the kernels with NVRTC, cold


@dataclass(frozen=True)
class WorkerKernel:
    """What the worker compiles: a kernel source as the audit read it (picklable)."""

    name: str
    path: str
    code: str
    include_dir: str | None
    params: tuple[tuple[str, str], ...]


class SharedAllocations:
    """The allocations a launch's pointers may lie in: (base, bytes, IPC handle) each, as the
    audit's process sees them, sorted by base."""

    def __init__(self, entries: Sequence[tuple[int, int, bytes]]):
        self.entries = sorted(entries)
        self._bases = [e[0] for e in self.entries]

    def containing(self, ptr: int) -> tuple[int, int, bytes] | None:
        i = bisect.bisect_right(self._bases, ptr) - 1
        if i >= 0 and ptr < self.entries[i][0] + self.entries[i][1]:
            return self.entries[i]
        return None


# ---- the worker's side ----
def _serve(receive: Connection, send: Connection, device: int) -> int:
    import cupy

    from egf_audit.runtime.backends.cuda_kernels import compile_function, pack_arguments

    cupy.cuda.Device(device).use()
    kernels: list[WorkerKernel] = receive.recv()
    try:
        functions = [compile_function(k.path, k.code, k.include_dir, k.name) for k in kernels]
    except Exception as exc:  # the audit compiled the same sources: say why, and stop
        send.send(f"the kernel worker could not load its kernels: {exc}")
        return 1
    stream = cupy.cuda.Stream(non_blocking=True)
    opened: dict[bytes, int] = {}  # IPC handle -> this process's address of that allocation
    shared = SharedAllocations(())
    send.send("ready")
    while True:
        try:
            message = receive.recv()
        except EOFError:
            return 0
        if message[0] == "share":
            shared = SharedAllocations(message[1])
            wanted = {handle for _, _, handle in shared.entries}
            for handle in set(opened) - wanted:  # the audit freed it
                cupy.cuda.runtime.ipcCloseMemHandle(opened.pop(handle))
            try:
                for handle in wanted - set(opened):
                    opened[handle] = cupy.cuda.runtime.ipcOpenMemHandle(
                        handle, cupy.cuda.runtime.cudaIpcMemLazyEnablePeerAccess
                    )
            except cupy.cuda.runtime.CUDARuntimeError as exc:
                send.send(f"the kernel worker could not open the audit's buffers (CUDA IPC): {exc}")
                return 1
            send.send("ok")
            continue
        _, index, blocks, threads, args = message
        params = kernels[index].params
        local = []
        for (name, kind), value in zip(params, args, strict=True):
            if kind.endswith("*"):
                entry = shared.containing(value)
                if entry is None:
                    send.send(f"was passed {name} = {value:#x}, in no allocation of the audit")
                    return 1
                value = opened[entry[2]] + (value - entry[0])
            local.append(value)
        try:
            functions[index]((blocks,), (threads,), pack_arguments(params, local), stream=stream)
            stream.synchronize()
        except (cupy.cuda.driver.CUDADriverError, cupy.cuda.runtime.CUDARuntimeError) as exc:
            send.send(f"failed on the GPU: {exc}")
            _quit(0)  # the context is lost: this worker ends, before any CUDA object's cleanup
        send.send("ok")


def main(argv: Sequence[str]) -> NoReturn:  # pragma: no cover - runs in the worker process
    read_fd, write_fd, device = (int(a) for a in argv)
    die_with_parent()
    os.dup2(2, 1)  # a kernel's printf goes to stderr: the audit's stdout carries the results
    receive, send = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    try:
        code = _serve(receive, send, device)
    except Exception as exc:  # the worker's own failure (no CuPy, no device): one line
        with contextlib.suppress(OSError):
            send.send(f"the kernel worker failed: {type(exc).__name__}: {exc}")
        code = 1
    _quit(code)


def _quit(code: int) -> NoReturn:  # pragma: no cover - runs in the worker process
    """End the worker without destructors: after a fault every CUDA object's cleanup would fail
    on the lost context, and say so on stderr."""
    sys.stderr.flush()
    os._exit(code)


# ---- the audit's side ----
class GpuKernelWorker:
    """One worker process for `kernels` (in that order: a launch names its index)."""

    def __init__(self, kernels: Sequence[WorkerKernel], device: int, timeout_s: float):
        self.timeout_s = timeout_s
        to_worker, from_worker = os.pipe(), os.pipe()
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "egf_audit.runtime.backends.cuda_worker",
                str(to_worker[0]),
                str(from_worker[1]),
                str(device),
            ],
            pass_fds=(to_worker[0], from_worker[1]),
            stdin=subprocess.DEVNULL,
        )
        os.close(to_worker[0])
        os.close(from_worker[1])
        self._send = Connection(to_worker[1], readable=False)
        self._receive = Connection(from_worker[0], writable=False)
        self._send.send(list(kernels))
        self._expect("ready", "start")

    @property
    def alive(self) -> bool:
        return self._process.poll() is None

    def share(self, entries: Sequence[tuple[int, int, bytes]]) -> None:
        """Open these allocations in the worker (and close the ones no longer among them)."""
        self._send.send(("share", tuple(entries)))
        self._expect("ok", "open the audit's buffers")

    def _expect(self, wanted: str, what: str) -> None:
        """Starting and sharing run no audited code: a failure there is the environment's."""
        try:
            answer = self._answer(STARTUP_TIMEOUT_S, what)
        except LaunchFailed as exc:
            answer = exc.what
        if answer != wanted:
            self.stop()
            if not answer.startswith("the kernel worker"):
                answer = f"the kernel worker did not {what}: it {answer}"
            raise AuditEnvironmentError(answer)

    def run(self, index: int, blocks: int, threads: int, args: Sequence[Any]) -> None:
        try:
            self._send.send(("launch", index, blocks, threads, tuple(args)))
        except OSError:
            raise LaunchFailed(self._reap()) from None
        answer = self._answer(self.timeout_s, "return")
        if answer != "ok":
            self.stop()
            raise LaunchFailed(answer)

    def _answer(self, timeout_s: float, what: str) -> str:
        if not self._receive.poll(timeout_s):
            self.stop()
            raise LaunchFailed(f"did not {what} within {timeout_s:g} s (the worker was killed)")
        try:
            return str(self._receive.recv())
        except (EOFError, OSError):
            return self._reap()

    def _reap(self) -> str:
        """What ended a worker that closed its end of the pipe (it is exiting)."""
        try:
            status = self._process.wait(timeout=STARTUP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.stop()
            return "closed its pipe but did not exit (the worker was killed)"
        self.stop()
        if status < 0:
            return describe_signal(-status)
        return f"exited with status {status}"

    def stop(self) -> None:
        """Kill the worker, without waiting: a context with a kernel still running takes the
        driver a while to tear down, and the audit need not wait for it (subprocess reaps it)."""
        if self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()
        for conn in (self._send, self._receive):
            with contextlib.suppress(OSError):
                conn.close()


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
