"""The backward_full call sites of a trace's steps, cut the same way for the rebuild's launches
and a capture's (issue 30: one rule per invariant needs one notion of a call site).

A call site is a run of `accumulate_d_h_s2_from_concat` launches (nothing but checkpoints,
memsets and copies between them), named as the seed names them (`cql`, then `main`) where a
step has exactly two, `site0`, `site1`, ... where it has another number (a finding of EGF007
and EGF008). Its window starts after the previous site's last accumulate, and the first site's
at the step's first GEMM, so what the trainer did while it allocated (its first memsets) is
never counted as a step's work. Only the kinds and names of the launches are read: never a
label, which the rebuild writes and a capture has not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from egf_audit.trace.contract import ACCUMULATE_KERNEL, SITES

RUN_KINDS = ("kernel", "sgemm")  # what a run of accumulates may not have between its launches


class Launched(Protocol):
    """What the cut reads of one launch (a `Launch`, or a capture's record before it is one):
    its kind as a `Launch` names it ("kernel", "sgemm", "memset", "copy", "checkpoint", ...),
    its name and its step."""

    @property
    def kind(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def step(self) -> int: ...


class Cut(NamedTuple):
    """A `Launched` made of its three facts."""

    kind: str
    name: str
    step: int


@dataclass
class Site:
    """One backward_full call site of one step: its launches run from `begin` (the first
    launch after the previous site, or the step's first GEMM) to `end` (its last accumulate)."""

    name: str
    step: int
    begin: int  # positions in the launches the sites were cut from (a Trace's launches)
    first_accumulate: int
    end: int


def _previous_run_launch(launches: Sequence[Launched], i: int) -> int | None:
    for j in range(i - 1, -1, -1):
        if launches[j].kind in RUN_KINDS:
            return j
    return None


def call_sites(launches: Sequence[Launched]) -> list[Site]:
    """Every step's call sites, in order, with positions into `launches`."""
    groups: list[tuple[int, int]] = []  # (first, last) accumulate positions of each run
    for i, x in enumerate(launches):
        if x.kind == "kernel" and x.name == ACCUMULATE_KERNEL:
            if groups and groups[-1][1] == _previous_run_launch(launches, i):
                groups[-1] = (groups[-1][0], i)
            else:
                groups.append((i, i))
    by_step: dict[int, list[tuple[int, int]]] = {}
    for first, last in groups:
        by_step.setdefault(launches[first].step, []).append((first, last))
    step_start: dict[int, int] = {}  # the first position of each step
    for i, x in enumerate(launches):
        step_start.setdefault(x.step, i)
    sites = []
    for step, runs in by_step.items():
        first_of_step = step_start[step]
        begin = next(
            (i for i in range(first_of_step, runs[0][0]) if launches[i].kind == "sgemm"),
            first_of_step,
        )
        names = SITES if len(runs) == len(SITES) else tuple(f"site{k}" for k in range(len(runs)))
        for name, (first, last) in zip(names, runs, strict=True):
            sites.append(Site(name, step, begin, first, last))
            begin = last + 1
    return sites
