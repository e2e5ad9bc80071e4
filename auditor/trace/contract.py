"""The names the pipeline writes and the invariants, the oracle and the reports read.

The audited step (egf_audit.pipeline) records its launches under labels and its snapshots under
checkpoint names; the checkers find them by the same names. Both sides import them from here,
so a checker never imports a constant from the code it audits, and renaming a checkpoint is one
edit. Everything here is a name or a fixed index of the trainer, never a decision.
"""

from __future__ import annotations

import math

from egf_audit.trace.config_view import DimsView

# ---- the trainer's Polyak blend (kernels/CONTRACT.md, section 2) ----
# The preset's tau; a trainer configured otherwise states its tau (a config file for the
# rebuild, `dims.tau` in its layout file for a capture), else this one is the contract.
POLYAK_TAU = 0.005

# ---- fixed indices of the trainer ----
ALPHA_GRAD_SMOOTHED_INDEX = 393  # ISV[393]: the smoothed wire gate
AUX_UP_INDEX = 2  # aux classes are (down, flat, up)
AUX_DOWN_INDEX = 0
BRANCHES = ("dir", "mag", "ord", "urg")

# ---- buffers ----
ISV = "isv_signals"
TARGET = "target_params"
DIR_CONCAT = "sp14_dir_qaux_concat_scratch"  # [B, SH2+1]: online and target forward both write it
DIR_DX = "sp14_d_dir_qaux_concat"  # the dir branch's [B, SH2+1] dX, wire column at SH2
PERSISTENT = ("params", TARGET, "adam_m", "adam_v", "sn_state", ISV)
# the buffers that hold int32 (indices and labels); every other buffer holds float32
INT32_BUFFERS = ("actions", "aux_label", "td_argmax")

# ---- kernels with a role in the wiring ----
CONCAT_KERNEL = "sp14_dir_concat_qaux"
SCALE_KERNEL = "sp14_scale_wire_col"
ACCUMULATE_KERNEL = "accumulate_d_h_s2_from_concat"
POLYAK_KERNEL = "polyak_ema"

# ---- the two backward_full call sites, in the order they run ----
SITES = ("cql", "main")


def at_site(name: str, site: str) -> str:
    """A launch label at a call site: `sp14_scale_wire_col@main`."""
    return f"{name}@{site}"


def site_checkpoint(site: str, name: str) -> str:
    """A checkpoint of one call site: `main:after_scale`."""
    return f"{site}:{name}"


# ---- checkpoints of a step, in the order the step takes them ----
STEP_START = "step_start"
TARGET_FORWARD_BEGIN = "forward_target:begin"
TARGET_FORWARD_END = "forward_target:end"
AFTER_FORWARD = "after_forward"
AFTER_LOSSES = "after_losses"  # ISV[393] as backward reads it
AFTER_BACKWARD = "after_backward"
BEFORE_POLYAK = "before_polyak"
STEP_END = "step_end"
# per call site, via site_checkpoint():
BEFORE_BACKWARD_FULL = "before_backward_full"
AFTER_BACKWARD_FULL = "after_backward_full"
AFTER_INJECT = "after_inject"
AFTER_SCALE = "after_scale"
AFTER_ACCUMULATE = "after_accumulate"
AUX_BEFORE_WIRE = "aux_before_wire"
AUX_AFTER_WIRE = "aux_after_wire"
TRUNK_ENTRY = "trunk_entry"

# ---- label prefixes of launches that are not the trainer's step ----
PRELOAD_PREFIXES = ("init:", "replay:load_state:")  # initial state written before any step
NON_PIPELINE_PREFIXES = ("init:", "batch:", "replay:", "probe:", "audit:", "diagnostic:")
GATE_PROBE_PREFIX = "gate_probe:"  # checkpoints of the gate-producer probes
# the legacy wrapper of backward_full labels its launches so; EGF011 does not trust the label
WRAPPER_PREFIX = "backward_full_wrapper:"

# the d = 0 dW SGEMM, whose x operand the recorder copies for EGF006
DW_DIR_LABELS = frozenset(at_site("backward_branch_dw[d=0]", s) for s in SITES)

# ---- scenarios ----
WRAPPER_SCENARIO = "diagnostic/wrapper"
# checkpoints of the wrapper diagnostic: before and after the legacy wrapper's call, and after a
# full backward_full on the same dQ
WRAPPER_BEFORE = "wrapper:before"
WRAPPER_AFTER = "wrapper:after"
WRAPPER_FULL = "wrapper:full"
GATE_PROBE_SCENARIO = "probe/gate"
REPLAYED_STEP = 0  # every replay re-runs step 0 from the production run's initial state

# what the audit injects into the upstream wire dX to prove the closed gate is NaN-safe
# (floats, not an array: this module is read by commands that must not import numpy; every
# value is exact in fp32)
NONFINITE_PATTERN: tuple[float, ...] = (math.nan, math.inf, -math.inf, -1.0)


def param_shapes(dims: DimsView) -> list[tuple[str, int, int]]:
    """The trainer's named-offset table (poff_*/goff_*): every parameter tensor in the order of
    the flat buffer, as (name, rows, cols)."""
    shapes = [
        ("w_s1", dims.SH1, dims.OBS),
        ("b_s1", 1, dims.SH1),
        ("w_s2", dims.SH2, dims.SH1),
        ("b_s2", 1, dims.SH2),
        ("w_aux", dims.AUXK, dims.SH2),
        ("b_aux", 1, dims.AUXK),
    ]
    for d in range(len(BRANCHES)):
        shapes += [
            (f"w_b{d}fc", dims.ADV, dims.SH2 + dims.E[d]),
            (f"b_b{d}fc", 1, dims.ADV),
            (f"w_b{d}out", dims.A[d], dims.ADV),
            (f"b_b{d}out", 1, dims.A[d]),
        ]
    shapes += [
        ("w_v0", dims.VALH, dims.SH2),
        ("b_v0", 1, dims.VALH),
        ("w_v1", 1, dims.VALH),
        ("b_v1", 1, 1),
    ]
    return shapes
