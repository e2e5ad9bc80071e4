"""EGF004 wire-gated-proportional: STUB, to be replaced by the real check."""

from __future__ import annotations

from .registry import Invariant, Verdict, failed


def check(run, mode: str) -> Verdict:
    return failed("not implemented yet")


INVARIANT = Invariant(
    code="EGF004",
    slug="wire-gated-proportional",
    message="TODO",
    what="TODO",
    why="TODO",
    how="TODO",
    catches="TODO",
    example="TODO",
    check=check,
)
