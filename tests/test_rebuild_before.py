"""The rebuild's verdicts held as they were before the one trace model (issue 32: "the rebuild
and every capture fixture give the same verdicts and findings, byte for byte, before and after;
a test holds the before"): every invariant's verdict in both modes of the ci-preset CPU audit,
for the production wiring and for each fault of the catalogue. `tests/data/rebuild-before.json.gz`
was written by this module's `--write` on the code before the change.

Status and summary are held byte for byte, and so is the evidence, except that a float of the
evidence is held to 1e-9 of its magnitude: the oracle's float64 errors and the measured
magnitudes are sums whose order a CPU BLAS may pick by its thread count, and the summaries (which
the Verdict type keeps free of measured floats) are held exactly.

    python tests/test_rebuild_before.py --write   # only for a change meant to move verdicts
"""

from __future__ import annotations

import gzip
import json
import math
import sys
from pathlib import Path
from typing import Any

import pytest

GOLDEN = Path(__file__).parent / "data" / "rebuild-before.json.gz"
CLEAN = "production"


def _fault_names() -> list[str]:
    from egf_audit.scenarios.faults import FAULTS

    return [f.name for f in FAULTS]


def verdicts_of(run: Any) -> dict[str, Any]:
    """code:mode -> the verdict as JSON holds it (status, summary, evidence)."""
    from egf_audit.invariants import evaluate

    return {
        f"{r.code}:{r.mode}": json.loads(
            json.dumps(
                {"status": r.verdict.status, "summary": r.verdict.summary, **r.verdict.evidence},
                sort_keys=True,
            )
        )
        for r in evaluate(run)
    }


def _same(want: Any, got: Any, where: str) -> str | None:
    """Where `got` first differs from `want`: floats to 1e-9 of their magnitude, all else
    exactly; None when they agree."""
    if isinstance(want, float) and isinstance(got, float):
        if math.isnan(want) and math.isnan(got):
            return None
        return None if math.isclose(want, got, rel_tol=1e-9, abs_tol=1e-300) else where
    if type(want) is not type(got):
        return f"{where}: {want!r} became {got!r}"
    if isinstance(want, dict):
        if sorted(want) != sorted(got):
            return f"{where}: keys {sorted(want)} became {sorted(got)}"
        for key in want:
            found = _same(want[key], got[key], f"{where}.{key}")
            if found:
                return found
        return None
    if isinstance(want, list):
        if len(want) != len(got):
            return f"{where}: {len(want)} items became {len(got)}"
        for i, (a, b) in enumerate(zip(want, got, strict=True)):
            found = _same(a, b, f"{where}[{i}]")
            if found:
                return found
        return None
    return None if want == got else f"{where}: {want!r} became {got!r}"


def _golden() -> dict[str, Any]:
    return json.loads(gzip.decompress(GOLDEN.read_bytes()))


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    return _golden()


def test_every_fault_is_held(golden):
    assert sorted(golden) == sorted([CLEAN, *_fault_names()])


def test_the_production_wiring_gives_the_verdicts_it_gave_before(golden, ci_audit_run):
    assert _same(golden[CLEAN], verdicts_of(ci_audit_run), CLEAN) is None


@pytest.mark.parametrize("fault", _fault_names())
def test_a_fault_gives_the_verdicts_it_gave_before(fault, golden, fault_audit_run):
    assert _same(golden[fault], verdicts_of(fault_audit_run(fault)), fault) is None


def test_the_comparison_sees_a_moved_summary_and_a_moved_float():
    held = {"EGF001:live": {"status": "pass", "summary": "s", "max_err": 1.0e-12}}
    assert _same(held, json.loads(json.dumps(held)), "x") is None
    moved = {"EGF001:live": {"status": "pass", "summary": "t", "max_err": 1.0e-12}}
    assert _same(held, moved, "x") == "x.EGF001:live.summary: 's' became 't'"
    drifted = {"EGF001:live": {"status": "pass", "summary": "s", "max_err": 1.1e-12}}
    assert _same(held, drifted, "x") == "x.EGF001:live.max_err"


def _write() -> None:
    from egf_audit.pipeline.config import preset_config
    from egf_audit.runtime.backends import select_backend
    from egf_audit.runtime.kernel_sources import load_kernel_set
    from egf_audit.scenarios.audit import Auditor
    from egf_audit.scenarios.faults import FAULTS

    config, kernels = preset_config("ci"), load_kernel_set()
    backend = select_backend("cpu", kernels)
    held = {CLEAN: verdicts_of(Auditor(config, backend, steps=2).run(("sentinel", "live")))}
    for fault in FAULTS:
        on = select_backend("cpu", fault.apply_kernels(kernels)) if fault.patch else backend
        run = Auditor(config, on, fault.wiring, steps=2).run(("sentinel", "live"))
        held[fault.name] = verdicts_of(run)
    text = json.dumps(held, indent=0, sort_keys=True) + "\n"
    GOLDEN.write_bytes(gzip.compress(text.encode("utf-8"), mtime=0))


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_rebuild_before.py --write")
    _write()
