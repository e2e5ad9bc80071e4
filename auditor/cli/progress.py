"""Progress over an audit's phases and scenarios, on stderr.

On a terminal: a rich progress bar that disappears when done. Not on a terminal (CI logs,
pipes): one plain line per item. Quiet: nothing. Results never go here; they go to stdout.
"""

from __future__ import annotations

from typing import Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress
from rich.text import Text


class Progress(Protocol):
    """What the plain functions report progress through."""

    def plan(self, total: int) -> None: ...

    def step(self, message: str) -> None: ...


class NullProgress:
    """Progress that shows nothing (library use, --quiet)."""

    def plan(self, total: int) -> None:
        pass

    def step(self, message: str) -> None:
        pass

    def __enter__(self) -> NullProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class LineProgress(NullProgress):
    """One line per item: readable in a CI log, no control sequences."""

    def __init__(self, console: Console):
        self.console = console
        self.total = 0
        self.done = 0

    def plan(self, total: int) -> None:
        self.total = total

    def step(self, message: str) -> None:
        self.done += 1
        where = f"[{self.done}/{self.total}] " if self.total else ""
        self.console.print(Text(f"egf-audit: {where}{message}"), highlight=False)


class BarProgress(NullProgress):
    def __init__(self, console: Console):
        self.bar = RichProgress(
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self.task = self.bar.add_task("starting", total=None)
        self.started = False

    def plan(self, total: int) -> None:
        self.bar.update(self.task, total=total)

    def step(self, message: str) -> None:
        # `message` names the item starting now; the one before it is then complete
        self.bar.update(self.task, advance=1 if self.started else 0, description=message)
        self.started = True

    def __enter__(self) -> BarProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()


def progress_for(console: Console, quiet: bool) -> NullProgress:
    if quiet:
        return NullProgress()
    if console.is_terminal:
        return BarProgress(console)
    return LineProgress(console)
