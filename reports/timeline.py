"""The backward timeline of one call site, numbered as the seed's orchestration.

The launches come from the trace; the checkpoints the pipeline records around each phase
(`{site}:before_backward_full`, `:after_backward_full`, `:after_scale`, `:after_accumulate`)
decide which numbered step a launch belongs to, so a missing or misplaced launch shows up as an
empty step or in the wrong one.
"""

from __future__ import annotations

from dataclasses import dataclass

from egf_audit.trace.contract import (
    AFTER_ACCUMULATE,
    AFTER_BACKWARD_FULL,
    AFTER_SCALE,
    BEFORE_BACKWARD_FULL,
    site_checkpoint,
)
from egf_audit.trace.model import Launch, Trace

STEPS = {
    1: "`sp14_dir_concat_qaux(save_h_s2)` rebuilds the online concat",
    2: "memset `d_h_s2 = 0`",
    3: "`backward_full(dQ, dir_qaux_concat_ptr, d_dir_qaux_concat_ptr)`",
    4: "`sp14_scale_wire_col`: `d_dir_qaux_concat[:, SH2] *= ISV[393]`",
    5: "`accumulate_d_h_s2_from_concat` for every branch (beta = 1)",
    6: "gated wire into the aux head, then the trunk backward",
}
SITE_TITLES = {"cql": "CQL aux call site", "main": "main online call site"}
# the checkpoint that closes steps 1-2, 3, 4 and 5; step 6 runs to the end of the site
BOUNDARIES = (BEFORE_BACKWARD_FULL, AFTER_BACKWARD_FULL, AFTER_SCALE, AFTER_ACCUMULATE)


@dataclass(frozen=True)
class TimelineEntry:
    step: int
    launch: Launch


def _step_before_backward_full(x: Launch) -> int:
    if x.label.startswith("rebuild_online_concat") or x.name == "sp14_dir_concat_qaux":
        return 1
    return 2


def site_timeline(trace: Trace, site: str, step: int = 0) -> list[TimelineEntry] | None:
    """Every launch of `site` at `step` with its numbered step; None when the site's
    checkpoints are missing (the trace is not a backward step)."""
    try:
        bounds = [trace.checkpoint_index(step, site_checkpoint(site, name)) for name in BOUNDARIES]
    except KeyError:
        return None
    entries = []
    for x in trace.launches:
        if x.step != step or x.kind == "checkpoint" or x.site != site:
            continue
        if x.index < bounds[0]:
            number = _step_before_backward_full(x)
        else:
            number = 3 + sum(x.index > b for b in bounds[1:])
        entries.append(TimelineEntry(number, x))
    return entries
