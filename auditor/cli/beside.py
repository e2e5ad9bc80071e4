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
there, as it was before. The thread is no daemon: a command that ends early waits for the
warm-up rather than tearing CUDA down under it, and every path through `run_audit` hands it
its work (none at all on an error) so that it ends.
"""

from __future__ import annotations

import importlib
import queue
import threading
from collections.abc import Callable
from types import ModuleType


class Beside:
    def __init__(self, modules: tuple[str, ...]):
        self._modules = modules
        self._work: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.error: BaseException | None = None  # the import's, raised again where it is used
        self._thread = threading.Thread(target=self._run, name="egf-audit-imports")
        self._thread.start()

    def _run(self) -> None:
        loaded: list[ModuleType] = []
        try:
            loaded = [importlib.import_module(name) for name in self._modules]
        except BaseException as exc:  # kept: the main thread's own import raises it again
            self.error = exc
        work = self._work.get()
        if work is not None and len(loaded) == len(self._modules):
            work()

    def then(self, work: Callable[[], None] | None) -> None:
        """The one piece of work to run once the modules are imported (None: none). Called
        once; `join` hands it None where it was not."""
        self._work.put(work)

    def join(self) -> None:
        """Wait for the imports and the work (handing it none where `then` was not called)."""
        self._work.put(None)  # unread where `then` came first: the thread takes one item
        self._thread.join()
