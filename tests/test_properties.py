"""Property: at any small shape (B from 1, SH2 from 1, odd widths) the clean pipeline passes
every invariant, and each historical K mismatch is caught at that shape. How many shapes a run
draws is the hypothesis profile's (tests/conftest.py: "ci" by default, "nightly")."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from egf_audit.invariants import FAIL, evaluate
from egf_audit.pipeline.config import Config, preset_config
from egf_audit.scenarios.audit import Auditor
from egf_audit.scenarios.faults import FAULTS_BY_NAME

K_MISMATCHES = ("fwd-k-sh2", "dw-k-sh2", "dx-k-sh2")


@pytest.fixture(scope="module")
def backend(cpu_backend):
    return cpu_backend


widths = st.integers(min_value=1, max_value=13)
shapes = st.fixed_dictionaries(
    {
        "B": st.integers(min_value=1, max_value=17),
        "OBS": widths,
        "SH1": widths,
        "SH2": widths,
        "ADV": widths,
        "VALH": widths,
        "A": st.tuples(*[st.integers(min_value=1, max_value=6)] * 4),
        "E": st.tuples(st.just(1), *[st.integers(min_value=1, max_value=3)] * 3),
    }
)


def _config(shape: dict, seed: int) -> Config:
    base = preset_config("ci", seed)
    return dataclasses.replace(base, dims=dataclasses.replace(base.dims, **shape))


@settings(  # max_examples: the profile's
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(shape=shapes, seed=st.integers(min_value=0, max_value=2**16))
def test_clean_passes_and_k_mismatches_are_caught_at_every_shape(backend, shape, seed):
    config = _config(shape, seed)
    clean = evaluate(Auditor(config, backend, steps=1).run())
    failures = [(r.code, r.mode, r.verdict.summary) for r in clean if r.verdict.status == FAIL]
    assert failures == [], f"clean pipeline failed at {shape}"
    for name in K_MISMATCHES:  # only EGF001's verdict is asked for: the rest would cost time
        faulty = Auditor(config, backend, FAULTS_BY_NAME[name].wiring, steps=1)
        (verdict,) = (r.verdict for r in evaluate(faulty.run(("sentinel",)), ("EGF001",)))
        assert verdict.status == FAIL, f"{name} not caught by EGF001 at {shape}: {verdict.summary}"


# ---- byte sets (trace/spans.py): every operation is the set of bytes it names ----
_RANGES = st.lists(
    st.tuples(st.integers(0, 200), st.integers(0, 40)).map(lambda t: (t[0], t[0] + t[1])),
    max_size=8,
)


def _bytes(spans) -> set[int]:
    return {b for start, end in spans.ranges for b in range(start, end)}


@given(_RANGES, _RANGES)
def test_byte_sets_minus_intersect_and_union_are_set_arithmetic(a, b):
    from egf_audit.trace.spans import Spans

    x, y = Spans.of(a), Spans.of(b)
    for got, want in (
        (x.minus(y), _bytes(x) - _bytes(y)),
        (x.intersect(y), _bytes(x) & _bytes(y)),
        (x.union(y), _bytes(x) | _bytes(y)),
    ):
        assert _bytes(got) == want
        # disjoint, ascending ranges, none touching the next: the one form of each set
        assert got == Spans.of(got.ranges)
        assert all(s < e for s, e in got.ranges)
