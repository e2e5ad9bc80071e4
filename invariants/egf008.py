"""EGF008 both-call-sites-gated: STUB, to be replaced by the real check."""

from __future__ import annotations

from .registry import Invariant, Verdict, failed


def check(run, mode: str) -> Verdict:
    return failed("not implemented yet")


INVARIANT = Invariant(
    code="EGF008",
    slug="both-call-sites-gated",
    message="TODO",
    what="TODO",
    why="TODO",
    how="TODO",
    catches="TODO",
    example="TODO",
    check=check,
)
