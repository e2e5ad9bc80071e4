"""Whether a kernel launch runs the threads its contract asks for: EGF001's rule for the launch
configuration, the one argument of a kernel launch that no pointer or size names.

The grid and the block decide which rows a kernel writes as much as its `rows` or `n` do: a
launch of `sp14_dir_concat_qaux` with one block of 32 threads for 64 rows rebuilds half the
concat and leaves the rest stale, in bounds, with every argument right. The ABI (kernels/
CONTRACT.md, section 3) asks for a 1-D launch with enough blocks to cover the kernel's rows or
elements; the kernel table's `threads` says how many that is for each kernel. The rebuild
records the grid and block it launched with, a capture the ones the trainer passed, and both
are held to this one rule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeGuard

from egf_audit.kernels import KERNELS_BY_NAME

if TYPE_CHECKING:
    from egf_audit.trace.model import Launch

Dim3 = tuple[int, int, int]


def _whole(value: object) -> TypeGuard[int]:
    """An int that is no bool (JSON's true would pass as 1 otherwise)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _dim3(value: object) -> Dim3 | None:
    """A launch dimension as (x, y, z): the rebuild records x alone, a capture all three."""
    if _whole(value):
        return (value, 1, 1)
    if isinstance(value, (list, tuple)) and len(value) == 3 and all(map(_whole, value)):
        return (value[0], value[1], value[2])
    return None


def launch_shape_problem(x: Launch) -> str | None:
    """Why a launch of a kernel of egf-audit's table does not run the threads its contract asks
    for, or None: a 1-D grid and block (y and z of 1: the kernels index with x alone, so more
    threads in y or z run the same rows again, and an accumulate adds twice) whose threads
    cover the kernel's rows or elements. The caller passes only launches decoded from the
    table (a capture's unknown kernel has no contract to hold it to)."""
    spec = KERNELS_BY_NAME.get(x.name)
    if x.kind != "kernel" or spec is None:
        return None
    grid, block = _dim3(x.args.get("grid")), _dim3(x.args.get("block"))
    if grid is None or block is None:
        return "its launch shape (grid and block) is not recorded"
    if grid[1:] != (1, 1) or block[1:] != (1, 1):
        return (
            f"runs grid {list(grid)} of blocks {list(block)}: the contract's launch is 1-D, and "
            "threads in y or z repeat the rows of x"
        )
    try:
        needed = spec.threads(x.args)
    except (KeyError, TypeError):
        return "its arguments do not say how many threads it needs"
    ran = grid[0] * block[0]
    if ran < needed:
        return (
            f"runs {ran} threads (grid {grid[0]} × block {block[0]}) where its contract needs "
            f"{needed}, one a row or element: the last {needed - ran} are never written"
        )
    return None
