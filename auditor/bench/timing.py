"""Timing for `egf-audit bench`: clocks, the step timer, and the session that puts the pipeline
and torch on one device.

A clock makes marks, records them on the timeline the work runs on, and reads the time between
two: CUDA events on the stream the work was queued on (CuPy's for the pipeline, torch's for
torch), `time.perf_counter` after a synchronisation on the CPU. CuPy is imported only on CUDA.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from egf_audit.bench.report import Timing
from egf_audit.runtime.backends.base import Backend, runs_on_streams

# ---- clocks: new() a mark, record() it on the timeline the work runs on, elapsed_ms() ----


class HostClock:
    name = "time.perf_counter (after a device synchronisation)"

    def __init__(self, sync: Callable[[], None] = lambda: None):
        self.sync = sync

    def new(self) -> list[float]:
        return [0.0]

    def record(self, mark: list[float]) -> None:
        self.sync()
        mark[0] = time.perf_counter()

    def elapsed_ms(self, start: list[float], end: list[float]) -> float:
        return (end[0] - start[0]) * 1e3


class CupyEventClock:
    name = "CUDA events (CuPy) on the pipeline's stream"

    def __init__(self, stream: Any):
        self.stream = stream

    def new(self) -> Any:
        import cupy

        return cupy.cuda.Event()

    def record(self, event: Any) -> None:
        event.record(self.stream)

    def elapsed_ms(self, start: Any, end: Any) -> float:
        import cupy

        end.synchronize()
        return float(cupy.cuda.get_elapsed_time(start, end))


class TorchEventClock:
    name = "CUDA events (torch) on torch's current stream"

    def __init__(self, device: torch.device):
        self.device = device

    def new(self) -> torch.cuda.Event:
        return torch.cuda.Event(enable_timing=True)

    def record(self, event: torch.cuda.Event) -> None:
        event.record(torch.cuda.current_stream(self.device))

    def elapsed_ms(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        end.synchronize()
        return float(start.elapsed_time(end))


def time_steps(
    step: Callable[[], Any],
    clock: Any,
    warmup: int,
    repeats: int,
    between: Callable[[], None] | None = None,
) -> Timing:
    """`warmup` untimed steps, then `repeats` steps each between two marks. `between` runs after
    every step, outside the timed region. The marks are made before the loop, so creating them
    costs nothing inside it; nothing waits for the device until all steps are queued."""
    for _ in range(warmup):
        step()
        if between:
            between()
    marks = [(clock.new(), clock.new()) for _ in range(repeats)]
    for start, end in marks:
        clock.record(start)
        step()
        clock.record(end)
        if between:
            between()
    return Timing([clock.elapsed_ms(s, e) for s, e in marks])


# ---- the session: one backend, its stream, torch on the same device ----


@dataclass
class Session:
    backend: Backend
    clock: Any  # times the pipeline and the reference SGEMM
    stream: Any | None  # the CuPy stream the pipeline runs on (cuda only; graphs need it)
    torch_device: torch.device | None
    torch_clock: Any | None
    torch_unavailable: str = ""

    def sync(self) -> None:
        """Wait for both libraries, so one measurement never overlaps the next."""
        self.backend.synchronize()
        if self.torch_device is not None and self.torch_device.type == "cuda":
            torch.cuda.synchronize(self.torch_device)

    def free_caches(self) -> None:
        self.sync()
        if self.stream is not None:
            import cupy

            cupy.get_default_memory_pool().free_all_blocks()
        if self.torch_device is not None and self.torch_device.type == "cuda":
            torch.cuda.empty_cache()


@contextmanager
def bench_session(backend: Backend) -> Iterator[Session]:
    """TF32 off in torch for the run (restored after); on CUDA the pipeline moves to a fresh
    non-blocking stream, because a CUDA graph cannot be captured on the legacy default stream."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        if not runs_on_streams(backend):
            cpu = torch.device("cpu")
            yield Session(backend, HostClock(backend.synchronize), None, cpu, HostClock())
            return
        import cupy

        device, clock, why = None, None, ""
        if torch.cuda.is_available():
            device = torch.device("cuda", cupy.cuda.Device().id)
            clock = TorchEventClock(device)
        else:
            why = f"torch {torch.__version__} sees no CUDA device"
        previous = backend.stream
        stream = cupy.cuda.Stream(non_blocking=True)
        # CuPy's own work (the zero fill of every allocation, device-to-host copies) must run
        # on the stream the launches use: a non-blocking stream does not wait for the legacy
        # default stream, so a zero fill there could land after the first upload here.
        with stream:
            backend.use_stream(stream)
            try:
                yield Session(backend, CupyEventClock(stream), stream, device, clock, why)
            finally:
                # a failed measurement may have left the device in error: never mask it here
                with contextlib.suppress(Exception):
                    stream.synchronize()
                backend.use_stream(previous)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
