"""The reading of every mutant that survives (docs/mutation-score.md): why no behaviour the
suite asserts can tell it from the original, or the gap it shows.

Each entry matches the survivors of one function whose description contains `match` ("" for
all of them); the first matching entry wins. `mutate.py report` prints the survivors by entry
and lists any survivor no entry reads (a new survivor needs reading).

Classes:
- equivalent: no input can make any verdict differ.
- unreachable: only an input that neither the recorder nor the Auditor produces makes a verdict
  differ (the reason names what rules the input out).
- fail-closed: the mutant only adds failures or crashes (exit 1 or 3); it cannot make the check
  pass or stay undecided where the original fails.
- redundant: another rule of the same check (named) fails every input that reaches this one.
- boundary: the verdict differs only at an exact limit no bug lands on.
- check-bug: the check cannot fail where it must; a strict xfail test in
  tests/test_mutation_survivors.py fails until it is fixed.
- gap: a real gap left without a test (why).
- killed-outside: no verdict differs, but a test the harness does not mirror fails on it
  (named; checked by running that test with the mutant installed).
"""

from __future__ import annotations

from typing import NamedTuple


class Entry(NamedTuple):
    file: str
    function: str
    match: str
    kind: str
    why: str


CC = "invariants/capture_common.py"
CO = "invariants/common.py"
E1 = "invariants/egf001_gemm_k_matches_lda.py"
GS = "invariants/gemm_spans.py"
CR = "invariants/capture_roles.py"
AB = "invariants/allocation_bounds.py"
E2 = "invariants/egf002_dw_unaffected_by_scale.py"
E3 = "invariants/egf003_wire_zero_under_sentinel.py"
E4 = "invariants/egf004_wire_gated_proportional.py"
E5 = "invariants/egf005_target_net_untouched.py"
E6 = "invariants/egf006_online_concat_rebuilt.py"
E7 = "invariants/egf007_d_h_s2_accumulation.py"
E8 = "invariants/egf008_both_call_sites_gated.py"
E9 = "invariants/egf009_state_shapes_grown.py"
E10 = "invariants/egf010_oracle_agreement.py"
E11 = "invariants/egf011_wrapper_path_residual.py"
E12 = "invariants/egf012_gate_range_fail_closed.py"
E13 = "invariants/egf013_kernel_effects_contained.py"
PO = "invariants/polyak.py"
TE = "invariants/trunk_entry.py"
LA = "auditor/capture/layout.py"
IN = "auditor/capture/inference.py"
CV = "auditor/capture/convert.py"
AU = "auditor/cli/capture_audit.py"
LS = "invariants/launch_shape.py"
OB = "auditor/trace/observed.py"
EV = "auditor/trace/evidence.py"
CM = "auditor/trace/gemm_operands.py"  # GemmOperand.extent_bytes: what EGF001's _gemm_extent was

TRIAGE: tuple[Entry, ...] = (
    # ---- launch_shape ----
    Entry(
        LS,
        "launch_shape_problem",
        "is None -> False",
        "unreachable",
        "a launch without a grid or a block: the reader refuses a kernel event without both "
        "(capture/schema.py's dim3), and the rebuild's recorder records both on every kernel; "
        "tests/test_one_rule.py's launch-shape cases hold the branch (a trace made by other "
        "means would crash on the missing grid without it, never pass)",
    ),
    # ---- capture_common ----
    Entry(
        CC,
        "wire_at_accumulate",
        "base is None",
        "fail-closed",
        "without the guard a dims-bearing capture that names no sp14_d_dir_qaux_concat reads "
        "no snapshot (its pointer is no int) and the history refuses or crashes: a FAIL or an "
        "exit 3, never a pass",
    ),
    Entry(
        CC,
        "wire_at_accumulate",
        "ld_concat",
        "killed-outside",
        "the branch chooses the missing data's words only; tests/test_capture_before.py fails "
        "on it (accumulate-wire-col's default capture, its EGF003/EGF004 summaries)",
    ),
    Entry(
        CC,
        "dims_of",
        "",
        "fail-closed",
        "each operand alone: a capture naming exactly one of B and SH2 (a layout file with one "
        "of them, no concat launch); the None that then reaches the checks compares unequal to "
        "every argument (a FAIL) or raises (exit 3), never a pass",
    ),
    Entry(
        CC,
        "pointer_problem",
        "",
        "equivalent",
        "a pointer into an unnamed buffer is a problem either way: Missing gives a FAIL "
        "(missing data), the mutant a FAIL naming the pointer; every caller fails on both",
    ),
    Entry(
        CC,
        "snapshotted",
        "",
        "equivalent",
        "snapshotted() is called by no check: dead code (reported to the owner)",
    ),
    Entry(
        CC,
        "all_values",
        "<= -> <",
        "boundary",
        "differs only for a region of exactly HASH_CHECK_MAX = 2**18 elements (a performance "
        "limit of the re-hash, not a rule)",
    ),
    Entry(
        CC,
        "_region_problems",
        "",
        "unreachable",
        "the recorder derives every scale snapshot's ptr, elements, ld and skip_col from the "
        "launch's own arguments (the recorder's rec_snapshot.c abi_snapshots); killed by no input "
        "since survivor case snapshot-regions-not-the-launches shifts body regions, which "
        "EGF003/EGF004 also fail through the hash of the shifted body",
    ),
    Entry(
        CC,
        "scale_views",
        "",
        "unreachable",
        "as _region_problems: a scale snapshot that is not of the launch's region needs a "
        "recorder out of step with its launches; the shifted-region case is failed by the "
        "body hash rule as well",
    ),
    Entry(
        CC,
        "wire_at_accumulate",
        "values.size % ld",
        "unreachable",
        "all_values() returns every element of a region whose hash matches, and the recorder "
        "snapshots rows * ld_concat elements of d_concat: a multiple of ld",
    ),
    # ---- common ----
    Entry(
        CO,
        "alpha_at",
        "",
        "unreachable",
        "the config refuses N_ISV <= 393 (pipeline/config.py), so every isv_signals snapshot "
        "of a run holds element 393",
    ),
    Entry(
        CO,
        "region_values",
        "region.rows <= 0",
        "unreachable",
        "region_values() is called by EGF006 only, after it checked the operand is B x "
        "(SH2 + 1): rows and width are positive",
    ),
    Entry(
        CO,
        "region_values",
        "region.width <= 0",
        "unreachable",
        "as above: EGF006 calls it with a B x (SH2 + 1) box only",
    ),
    Entry(
        CO,
        "region_values",
        "region.offset < 0",
        "unreachable",
        "a binding's region starts at its pointer's element in the buffer it resolved to: "
        "offset >= 0 (runtime/recorder)",
    ),
    Entry(
        CO,
        "is_plus_zero",
        "",
        "equivalent",
        "the index constant [0] -> [-1] of a one-element array: the same element",
    ),
    # ---- EGF001: allocation bounds, operand identity, slices (issue 30 items 2 and 3) ----
    Entry(
        AB,
        "allocation_problem",
        "live_at",
        "gap",
        "moved unchanged out of egf001_gemm_k_matches_lda.py: no input points a launch into an "
        "allocation freed before it ran",
    ),
    Entry(
        AB,
        "allocation_of",
        "< -> <=",
        "unreachable",
        "an allocation made at the launch's own seq: the reader refuses seqs that do not "
        "increase strictly",
    ),
    Entry(
        CR,
        "_writes",
        "",
        "gap",
        "the order rule's writers that are no cuBLAS GEMM (a kernel egf-audit does not know, "
        "a decoded kernel handed a pointer no buffer names): no input has such a launch write a "
        "contract GEMM's input ahead of it (every stand-in computes its layers in cuBLAS)",
    ),
    Entry(
        E1,
        "check_capture",
        "unbound",
        "equivalent",
        "an unbound GEMM has no bindings (gemm_operands binds none) and a bound one always has "
        "some; the rest is the words of the undecided entry",
    ),
    Entry(
        E1,
        "check_capture",
        "its operands are not bound",
        "equivalent",
        "the words of the undecided entry of a GEMM without bindings",
    ),
    Entry(
        E1,
        "check_capture",
        "not x.bindings",
        "equivalent",
        "an unbound GEMM has no bindings and a bound one always has some",
    ),
    Entry(
        E1,
        "check_capture",
        "if not ct.capture.sp14",
        "equivalent",
        "which of the two passing summaries is given: the words only",
    ),
    Entry(
        GS,
        "rows_problem",
        "> 0",
        "boundary",
        "an empty box (m, n or k = 0) in a process that is no SP14 trainer",
    ),
    Entry(
        GS,
        "rows_problem",
        "r.rows > 1",
        "boundary",
        "one-row operands: their row stride is never used; a two-row box with another stride "
        "still ends past its tensor or fails the column rule",
    ),
    Entry(
        GS,
        "rows_problem",
        "-> False",
        "gap",
        "no harness input has a process that is no SP14 trainer with a long row stride, a row "
        "offset or a box past its tensor under a flat layout; the committed probe-ld-long "
        "(tests/test_capture_h200_programs.py) asserts the row-stride words, and is no input",
    ),
    Entry(
        GS,
        "slice_problem",
        "<= 0",
        "boundary",
        "an empty box (a GEMM with m, n or k = 0) on a stacked tensor",
    ),
    Entry(
        GS,
        "slice_problem",
        "r.rows > 1",
        "boundary",
        "a one-row box's row stride is never used; a two-row box on slices of more rows fails "
        "the partial-slice rule anyway",
    ),
    Entry(
        GS,
        "slice_problem",
        "start // C % R -> False",
        "redundant",
        "a box starting at row j > 0 of a slice ends j rows into the next slice (partial-slice "
        "rule) unless it also reads j rows fewer: tests/capture_plants.py's first-row-left-out "
        "case (added after this run) is that input",
    ),
    Entry(
        GS,
        "implied_slice_problem",
        "batch",
        "boundary",
        "batch <= 1 -> < 1 or <= 0: a single-batch strided call reaches the rule (only adds "
        "failures); <= 2: two-batch calls are exempt; the default 1 -> 2 or 0: a call with no "
        "batch count has no stride either, and returns None on it",
    ),
    Entry(
        GS,
        "implied_slice_problem",
        "ld <= 0",
        "fail-closed",
        "ld 0 reaches divmod and raises (exit 3); ld <= 1 exempts one-column operands, a "
        "boundary no GEMM of the inputs has (every ld is 32 or more)",
    ),
    Entry(
        GS,
        "implied_slice_problem",
        "stride <= 0",
        "equivalent",
        "a stride of 0 gives 0 slice rows, which every box covers; stride <= 1 exempts a stride "
        "of one element, no whole number of rows of ld > 1",
    ),
    Entry(
        LA,
        "_product",
        "",
        "killed-outside",
        "the product is only compared with LIMIT: a mutant moves which refusal a tensor of 2**40 "
        "elements or more gets (more than 2**40 elements / does not fit its buffer), never "
        "whether it is refused; the refusal words are asserted by tests/test_mutation_survivors"
        ".py's llmc-qkvr-2-40-elements and llmc-qkvr-past-2-40-elements (read, not yet run with "
        "the mutant installed)",
    ),
    Entry(
        LA,
        "_tensor",
        "",
        "killed-outside",
        "a tensor of 2**40 elements or more, or of one axis, is refused by the fit or overlap "
        "rule instead: the same refusal with other words, which llmc-qkvr-past-2-40-elements, "
        "llmc-qkvr-2-40-elements and llmc-qkvr-one-axis assert (read, not yet run with the "
        "mutant installed)",
    ),
    # ---- EGF001 ----
    Entry(
        E1,
        "_extent_problem",
        "not b.in_bounds",
        "equivalent",
        "an operand past its buffer also breaks a span rule (its tensor fits its buffer, so a "
        "box past the buffer cannot equal the tensor's extent), or lands in no tensor: FAIL "
        "either way",
    ),
    Entry(
        GS,
        "span_problem",
        "1 -> 2",
        "boundary",
        "misses a row-stride mismatch of a 2-row operand only; the trainer's GEMM operands "
        "have B, ADV, SH1, SH2 or 1 rows",
    ),
    Entry(
        E1,
        "check",
        "if not traces",
        "equivalent",
        "without traces sgemm_count stays 0 and the next guard fails the mode",
    ),
    Entry(
        E1,
        "check",
        "x.kind == 'checkpoint'",
        "equivalent",
        "a checkpoint has no bindings: judged as another launch it adds no finding",
    ),
    Entry(
        GS,
        "k_sh2_signature",
        "1 -> 2",
        "boundary",
        "misses the K = SH2 signature of a 2-row operand only (B or ADV rows in the trainer)",
    ),
    Entry(
        GS,
        "k_sh2_signature",
        "",
        "fail-closed",
        "also flags a one-row operand spanning SH2 of SH2 + 1: more failures, never fewer",
    ),
    Entry(
        CM,
        "extent_bytes",
        "rows - 1",
        "fail-closed",
        "an extent one row longer: more operands past their allocation, never fewer",
    ),
    Entry(
        CM,
        "extent_bytes",
        "",
        "equivalent",
        "an empty box then gives a negative extent instead of 0: neither reaches past the "
        "allocation",
    ),
    Entry(
        E1,
        "check_capture",
        "x.kind == 'sgemm'",
        "fail-closed",
        "GEMMs judged by the kernels' bounds rule as well: more failures only",
    ),
    Entry(
        E1,
        "check_capture",
        "not in in x.kind in ('memset', 'copy')",
        "fail-closed",
        "kernels judged by a memset's rule as well (their `bytes` argument is absent: 0 "
        "elements, never past an allocation)",
    ),
    # ---- EGF002 ----
    Entry(
        E2,
        "check",
        "s.kind == 'production'",
        "equivalent",
        "swaps which trace is the reference: bitwise equality is symmetric, and the wire rule "
        "reads the reference only when all traces are equal",
    ),
    Entry(
        E2,
        "check",
        "not production",
        "unreachable",
        "the Auditor records a mode's replays with its production trace or neither",
    ),
    Entry(E2, "check", "not replays", "unreachable", "as above: a run has both or neither"),
    Entry(
        E2,
        "check",
        "0 -> 1",
        "fail-closed",
        "`due` also true where every trunk dW element is exactly 0: the wire rule fails more",
    ),
    Entry(E2, "check", "0 -> -1", "fail-closed", "as above"),
    Entry(
        E2,
        "dw_flow_problems",
        "or operand Spans()",
        "equivalent",
        "a scale's writes are its declared wire column, never empty: `c.writes or not Spans()` "
        "is `c.writes`",
    ),
    Entry(
        E2,
        "dw_flow_problems",
        "taint.intersect(dw)",
        "killed-outside",
        "every input that leaves the scale's output in dW also has a dW GEMM read it (the "
        "first finding); tests/test_invariants_core.py "
        "test_egf002_fails_a_rebuild_whose_dw_holds_the_scale_s_output and "
        "tests/test_one_rule.py test_the_scale_writing_dw_itself_fails_at_the_step_s_end "
        "assert the finding and fail on it",
    ),
    Entry(E2, "dw_flow_problems", "dW w_b0fc holds", "killed-outside", "as above"),
    Entry(
        E2,
        "_captured_calls",
        "r.within is not None",
        "equivalent",
        "a kernel cuBLAS launched inside a GEMM call declares nothing (Unbounded, not a GEMM) "
        "and its observed changes are keyed by its GEMM's seq: as a call of its own it writes "
        "nothing the flow reads",
    ),
    Entry(
        E2,
        "_rebuild_bytes",
        "4096",
        "equivalent",
        "the gap between the rebuild's buffers: without it adjacent buffers' ranges may merge, "
        "the bytes each set holds stay the same",
    ),
    Entry(
        E2,
        "_rebuild_bytes",
        "tensor is None",
        "unreachable",
        "the rebuild's layout always names w_b0fc in grad_buf (the pipeline's parameter table)",
    ),
    # ---- EGF003 ----
    Entry(
        E3,
        "check",
        "if not checked",
        "equivalent",
        "with no gate-0 step injected_checked is 0 and the next guard fails the mode",
    ),
    Entry(
        E3,
        "check_capture",
        "kept wire value",
        "unreachable",
        "reached only when the wire's hash is the all-+0.0 hash but a kept value is not +0.0: "
        "values and hash of one recorder region agree",
    ),
    Entry(
        E3, "check_capture", "(bits(scale.wire_after.values) != 0).any()", "unreachable", "as above"
    ),
    Entry(
        E3, "check_capture", "bits(wire) != 0", "equivalent", "the row count in the finding's words"
    ),
    # ---- EGF004 ----
    Entry(
        E4,
        "check_capture",
        "<= -> <",
        "boundary",
        "a site whose gate is exactly 1.0 left unjudged: a correct scale multiplies by 1 there, "
        "so only a bug specific to alpha = 1 would differ",
    ),
    # ---- EGF005 ----
    Entry(
        E5,
        "_stray_target_writes",
        "position < first_step",
        "equivalent",
        "position == first_step is the step_start checkpoint: no bindings",
    ),
    Entry(
        PO,
        "polyak_error_ulps",
        "",
        "gap",
        "an infinite Polyak input propagated to an infinite result of the other sign would be "
        "excused: only a diverged net (an Inf parameter) reaches it; no fault or capture has "
        "one",
    ),
    Entry(
        E5,
        "_step_measures",
        "ulps > MAX_POLYAK_ULP",
        "boundary",
        "a result exactly 2 ulp away (the tolerance's edge)",
    ),
    Entry(
        PO,
        "polyak_snapshot_problems",
        "> -> >=",
        "boundary",
        "a result exactly 2 ulp away (the tolerance's edge)",
    ),
    Entry(
        E5,
        "check_capture",
        "TARGET not in ct.capture.layout.buffers",
        "equivalent",
        "pointer_problem() raises the same Missing for target_params or params unnamed",
    ),
    Entry(
        E5,
        "check_capture",
        "'params' not in ct.capture.layout.buffers",
        "equivalent",
        "pointer_problem() raises the same Missing",
    ),
    Entry(E5, "check_capture", "and operand seen", "equivalent", "values_checked is evidence only"),
    Entry(
        E5,
        "check_capture",
        "0 < snapshotted < len(polyaks)",
        "redundant",
        "with a deferring recorder (a step's start is snapshotted at the first launch that "
        "can be) a Polyak without snapshots always leaves a later step without its start or "
        "its own before-snapshot, which the step rule fails; one Polyak alone cannot be "
        "partly snapshotted",
    ),
    Entry(E5, "check_capture", "snapshotted} of", "redundant", "as above"),
    Entry(
        E5,
        "check_capture",
        "step > 0",
        "redundant",
        "the pair of the rule above: every step without its start snapshot follows a Polyak "
        "without snapshots, which that rule fails",
    ),
    Entry(E5, "check_capture", "no snapshot of target_params at the", "redundant", "as above"),
    Entry(
        E5,
        "check_capture",
        "x.index < first_gemm",
        "equivalent",
        "index == first_gemm is that GEMM, not a copy or memset",
    ),
    Entry(
        PO,
        "polyak_argument_problems",
        "stated is None",
        "equivalent",
        "the surviving one is line 251's: whose tau the finding's words name",
    ),
    Entry(
        PO,
        "polyak_argument_problems",
        "not isinstance(tau, float)",
        "unreachable",
        "polyak_ema's tau is a float parameter in the kernel table: decoded, it is a float",
    ),
    # ---- EGF006 ----
    Entry(
        E6,
        "_start_problem",
        "r is None",
        "fail-closed",
        "the words of the finding only, or an AttributeError (exit 3) where the binding "
        "resolved to no buffer: never a pass",
    ),
    Entry(
        E6,
        "site_concat_problems",
        "site.end + 1",
        "equivalent",
        "a site's last launch is its last accumulate, which reads no concat as a dW's x",
    ),
    Entry(
        E6,
        "concat_problems",
        "param == 'aux_softmax'",
        "fail-closed",
        "the softmax left unnamed raises Missing instead of being skipped: more failures",
    ),
    Entry(E6, "concat_problems", "-> False", "fail-closed", "as above"),
    Entry(
        E6,
        "check_capture",
        "writer.name != CONCAT_KERNEL",
        "redundant",
        "any other last writer fails concat_problems() on its arguments (a copy or GEMM has "
        "no rows/sh2/auxk of the contract)",
    ),
    Entry(E6, "check_capture", "writer is not None", "redundant", "as above"),
    Entry(
        E6,
        "check_capture",
        "if writer is None or writer.name != CONCAT_KERNEL",
        "redundant",
        "as above",
    ),
    # ---- EGF003 and EGF004's wire ----
    Entry(
        "invariants/wire_gate.py",
        "expected_wire",
        "isinstance(g, torch.Tensor)",
        "unreachable",
        "at gate 0 only EGF003's arrays reach it (EGF004, which reads tensors, judges open "
        "gates); the mutated branch would make the same zeros",
    ),
    # ---- EGF007 ----
    Entry(
        E7,
        "_first_backward_full_launch",
        "",
        "equivalent",
        "the loop then starts at the checkpoint itself, which it skips",
    ),
    Entry(
        TE,
        "recompute",
        "shape != expected",
        "unreachable",
        "the snapshots' shapes come from the run's own layout",
    ),
    Entry(TE, "recompute", "err <= bound", "boundary", "an error exactly at the proved bound"),
    Entry(
        E7,
        "check",
        "x.name == ACCUMULATE_KERNEL",
        "equivalent",
        "the accumulate count in the evidence and the summary's words",
    ),
    Entry(E7, "check", "if wire", "equivalent", "the summary's words"),
    Entry(
        E7,
        "_accumulate_value_problems",
        "",
        "unreachable",
        "the recorder snapshots an accumulate's d_h_s2 and d_concat regions from its own "
        "arguments, all or none; survivor case snapshot-regions-partly-missing removes one "
        "region, which the value rule then also fails",
    ),
    Entry(
        E7,
        "check_capture",
        "'d_h_s2' not in ct.capture.layout.buffers",
        "equivalent",
        "pointer_problem() raises the same Missing for an unnamed d_h_s2",
    ),
    Entry(
        E7,
        "check_capture",
        "0 -> 1",
        "boundary",
        "differs only when exactly one accumulate launch was snapshotted",
    ),
    # ---- EGF008 ----
    Entry(
        E8,
        "scale_problems",
        "",
        "unreachable",
        "the kernel table (kernels/) declares dx_concat written and isv read for every scale "
        "launch",
    ),
    Entry(
        E8,
        "site_failure",
        "",
        "equivalent",
        "equal indices: the dX GEMM, a scale, an accumulate and a writer are different "
        "launches, and an accumulate declares the dX read-only",
    ),
    Entry(
        E8,
        "_site_failure",
        "",
        "equivalent",
        "judges each site with the other site's launches: the number of failing site-steps, "
        "and so the verdict, stays",
    ),
    Entry(
        E8,
        "check_capture",
        "x.name == SCALE_KERNEL",
        "fail-closed",
        "fails a capture with no call site and no scale: more failures only",
    ),
    Entry(
        E8,
        "check_capture",
        "failures.append",
        "equivalent",
        "the evidence's failure records; the problems decide",
    ),
    # ---- EGF009 ----
    Entry(
        E9,
        "_layout_failures",
        "shape != [adv, width]",
        "redundant",
        "w_b0fc's table entry is what every adam_update of w_b0fc is held to: a wrong entry "
        "also fails the adam-slice rule on the run's own launches",
    ),
    Entry(E9, "_layout_failures", "'w_b0fc-shape'", "redundant", "as above"),
    Entry(E9, "_adam_failure", "", "equivalent", "the evidence's slice description"),
    Entry(
        E9,
        "_sn_failures",
        "b.region is None",
        "fail-closed",
        "an sn binding in no buffer then raises (exit 3) instead of being skipped",
    ),
    # ---- EGF010 ----
    Entry(
        E10,
        "_traces",
        "no production trace",
        "redundant",
        "a mode without its production trace has none of its oracle replays either, each named",
    ),
    Entry(E10, "check", "if problems", "equivalent", "whether the evidence lists the problems"),
    Entry(
        E10,
        "check",
        "bad_layers",
        "redundant",
        "every decision flip outside the near-tie band moves a gradient past its tolerance "
        "(bad_tensors) in the catalogue's forward faults",
    ),
    Entry(E10, "check", "problems or incomplete", "equivalent", "the summary's words"),
    Entry(
        E10,
        "check",
        "operand problems",
        "equivalent",
        "inside the failing branch: the summary's words",
    ),
    Entry(
        E10,
        "check",
        "operand incomplete",
        "equivalent",
        "inside the failing branch: the summary's words",
    ),
    Entry(E10, "check", "if bad_tensors", "equivalent", "the summary's words"),
    Entry(E10, "check", "MAX_LISTED", "equivalent", "the summary's words"),
    # ---- EGF011 ----
    Entry(
        E11,
        "_wrapper_call",
        "",
        "equivalent",
        "the wrapper diagnostic's first checkpoint is in the same step as WRAPPER_BEFORE",
    ),
    Entry(
        E11,
        "_writes_grown_grad",
        "",
        "equivalent",
        "the residual's evidence (EGF011 warns whatever it measures)",
    ),
    Entry(
        E11,
        "_residual",
        "raise",
        "unreachable",
        "the audit's own wrapper diagnostic always runs the dW of w_b0fc and snapshots "
        "grad_buf's w_b0fc with SH2 + 1 columns",
    ),
    Entry(
        E11,
        "_residual",
        "<= wire",
        "unreachable",
        "grad_buf's w_b0fc always has SH2 + 1 columns in the rebuild's layout",
    ),
    Entry(
        E11,
        "_residual",
        "written is None",
        "unreachable",
        "the diagnostic's dW always writes grad_buf's w_b0fc",
    ),
    Entry(
        E11,
        "_residual",
        "",
        "equivalent",
        "the residual's evidence (EGF011 warns whatever it measures)",
    ),
    Entry(E11, "check", "wire_col_nonzero_after_wrapper", "equivalent", "the warning's words"),
    Entry(
        E11,
        "check_capture",
        "b.region is None",
        "fail-closed",
        "checks the K = SH2 signature of named operands too: more failures only",
    ),
    # ---- EGF012 ----
    Entry(
        E12,
        "alpha",
        "",
        "unreachable",
        "the config refuses N_ISV <= 393: every isv_signals snapshot holds element 393",
    ),
    Entry(
        E12,
        "_produced",
        "x.index < end",
        "equivalent",
        "index == end is the after_losses checkpoint",
    ),
    Entry(
        E12,
        "_probe_failures",
        "isinstance(previous, float)",
        "redundant",
        "a NaN previous gate the producer does not close leaves NaN, which the range rule fails",
    ),
    Entry(
        E12,
        "_probe_failures",
        "operand not marks",
        "equivalent",
        "without probe checkpoints no probe is non-finite either: the other operand fails",
    ),
    Entry(E12, "check", "== -> != in mode == 'sentinel'", "equivalent", "the pass summary's words"),
    # ---- EGF013 ----
    Entry(
        E13,
        "check",
        "x.effects is None",
        "fail-closed",
        "a refused launch without effects counted as unobserved: more failures only",
    ),
    # ---- registry ----
    Entry(
        "invariants/registry.py",
        "Invariant.__post_init__",
        "",
        "unreachable",
        "every entry of INVARIANTS states its limits; the check guards the registry's own "
        "definitions, which no audit input changes",
    ),
    # ---- layout.py ----
    Entry(
        LA,
        "_refuse_partial_overlaps",
        "",
        "gap",
        "open_[-1] -> open_[-0] (the outermost open buffer): differs only for a buffer that "
        "partly overlaps one nested inside a third; no layout writer nests buffers two deep",
    ),
    Entry(
        IN,
        "infer_layout",
        "r.args['h_s2'] != first['h_s2']",
        "equivalent",
        "names tgt_h_s2 only; no capture check compares a pointer with tgt_h_s2's start, and "
        "without a layout file EGF001 leaves the target forward's GEMMs unnamed anyway",
    ),
    Entry(
        IN,
        "infer_layout",
        "a['isv_index'] + 1",
        "equivalent",
        "the inferred isv_signals is unbounded (bounds never judged by its size), and the "
        "gate is reached through its base pointer",
    ),
    Entry(
        IN,
        "infer_layout",
        "dx_concat",
        "fail-closed",
        "the scale's own naming of the dX buffer matters only where no GEMM named it; without "
        "it EGF008 fails a correct trainer (more failures only)",
    ),
    Entry(
        IN,
        "_add_param",
        "",
        "killed-outside",
        "w_b0fc inferred as a buffer of its own inside params instead of a tensor of params: "
        "every verdict stays; tests/test_capture.py::"
        "test_inference_binds_the_same_gemms_to_w_b0fc_as_the_layout_file asserts the buffer "
        "is params and fails with this mutant installed",
    ),
    # ---- convert.py ----
    Entry(
        CV,
        "_binding",
        "0 -> -1",
        "equivalent",
        "the only unbounded buffer is the inferred isv_signals, sized to isv_index + 1 from "
        "the very launch: a region in it starts at offset >= 0",
    ),
    Entry(
        CV,
        "_binding",
        "",
        "fail-closed",
        "a read of element 0 of the inferred isv_signals judged out of bounds: a scale with "
        "isv_index 0, which EGF008 fails anyway",
    ),
    Entry(
        CV,
        "_sites",
        "",
        "equivalent",
        "only kernel records are ever named accumulate_d_h_s2_from_concat",
    ),
    Entry(
        CV,
        "to_trace",
        "memset",
        "equivalent",
        "labels only: no capture check decides on a launch's label",
    ),
    Entry(CV, "to_trace", "s.end + 1", "equivalent", "labels only"),
    Entry(
        CV,
        "to_trace",
        "r.args",
        "equivalent",
        "an alloc record always carries dst and bytes (events.py requires them)",
    ),
    # ---- trace/observed.py: a deep capture's calls paired with their effects ----
    Entry(
        OB,
        "_live_totals",
        "changes[i][0] < seq",
        "equivalent",
        "an allocation or a free is an event of its own, never at a call's seq: no change "
        "sits at the seq it is compared with",
    ),
    Entry(
        OB,
        "observations",
        "r.within",
        "unreachable",
        "the reader sets a launch's `within` only to the seq of the GEMM record whose call is "
        "open on its thread (capture/events.py, cublas_call), or -1: a launch made inside a call "
        "no GEMM record holds cannot be read from a folder; the branch guards the trace model",
    ),
    Entry(
        OB,
        "observations",
        "made by cuBLAS inside",
        "unreachable",
        "the finding of the branch above, which no folder reaches",
    ),
    # ---- trace/evidence.py: what a guard or a deep effect saw a launch write ----
    Entry(
        EV,
        "observed_write",
        "b <= start",
        "killed-outside",
        "a guard that compared from one word into the target to its end would be taken as "
        "covering it; no capture input has one (only a layout buffer spanning two allocations "
        "gives it), and tests/test_one_rule.py's "
        "test_a_guard_is_evidence_only_for_a_buffer_it_compared_whole fails on it (checked with "
        "the mutant installed)",
    ),
    # ---- audit.py ----
    Entry(
        AU,
        "_layout_for",
        "",
        "equivalent",
        "a layout file names all or none of one process's pointers; which of them the test "
        "samples does not change which way it goes",
    ),
    Entry(
        AU,
        "audit_capture",
        "r.kind in ('sgemm', 'gemm')",
        "equivalent",
        "the GEMM count in a not-audited process's words",
    ),
)
