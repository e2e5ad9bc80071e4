"""Modules imported in a thread beside the audit's first phases, then one piece of work on them.

`egf-audit run` needs torch only from its invariants phase on (the checks, the oracle, the
renderers that import the registry), and importing it is the largest fixed cost of the command
(1.4 s on the 2-core CPU runner, 1.6 s on an H100). So `run_audit` starts these imports here
first, and picks the backend and runs the scenarios meanwhile: whatever of the import falls
where the main thread waits (a GPU, a kernel's C code, a file) is no longer added to the
command's wall time. The thread then runs the one piece of work `then` hands it (the oracle's
warm-up of torch's CUDA start-up, on the CUDA backend), and `join` waits for both before the
invariants run, so no check races either.

Why it is safe: the package's imports form a graph without cycles (tests/test_architecture.py),
and so do torch's, CuPy's and numpy's among themselves, so two threads importing at once only
ever wait for each other, never in a circle; torch's import touches no GPU. An import that
fails here is kept, and raised again in the main thread where the module is first imported
there (`imported`, `join`). The CPU backend imports torch itself, so on the CPU the backend
waits for the imports first (`imported`): torch is never imported by two threads at once. The
thread is no daemon: a command that ends early waits for the warm-up rather than tearing CUDA
down under it; every path through `run_audit` hands it its work (none at all on an error), and
a main thread that ended without doing so ends its wait.
"""

from __future__ import annotations

import importlib
import queue
import threading
from collections.abc import Callable
from types import ModuleType


class Beside:
    """The thread: `start`, then `then` (its work) and `join` from the main thread."""

    def __init__(self, modules: tuple[str, ...]):
        self._modules = modules
        self._work: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._imported = threading.Event()
        self.error: BaseException | None = None  # the import's: `imported` raises it
        self._thread = threading.Thread(target=self._run, name="egf-audit-imports")

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        loaded: list[ModuleType] = []
        try:
            loaded = [importlib.import_module(name) for name in self._modules]
        except BaseException as exc:  # raised in the main thread by `imported`
            self.error = exc
        finally:
            self._imported.set()
        while True:  # the work; a main thread gone without handing any ends the wait
            try:
                work = self._work.get(timeout=0.5)
                break
            except queue.Empty:
                if not threading.main_thread().is_alive():
                    return
        if work is not None and len(loaded) == len(self._modules):
            work()

    def imported(self) -> None:
        """Wait for the imports alone, and raise in this thread what one of them raised. The
        CPU backend imports torch itself: it waits here first, so that torch is never imported
        by two threads at once."""
        self._imported.wait()
        if self.error is not None:
            raise self.error

    def then(self, work: Callable[[], None] | None) -> None:
        """The one piece of work to run once the modules are imported (None: none). Called
        once; `join` hands it None where it was not."""
        self._work.put(work)

    def join(self, raising: bool = True) -> None:
        """Wait for the imports and the work (handing it none where `then` was not called),
        then raise what an import raised (`raising`: not where another error is on its way)."""
        self._work.put(None)  # unread where `then` came first: the thread takes one item
        if self._thread.ident is not None:  # started
            self._thread.join()
        if raising and self.error is not None:
            raise self.error
