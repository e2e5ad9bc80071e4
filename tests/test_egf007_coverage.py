"""EGF007's zeroing check decides whether a memset writes every element of d_h_s2 from the
memset's rows, without listing its elements (covers_all). It must agree exactly with the
definition: every index of [0, n) is one of the region's flat indices."""

from __future__ import annotations

import numpy as np
import pytest

from egf_audit.invariants.common import covers_all
from egf_audit.trace.model import Region


def _by_elements(region: Region, n: int) -> bool:
    written = region.flat_indices()
    covered = np.zeros(n, dtype=bool)
    covered[written[(written >= 0) & (written < n)]] = True
    return bool(covered.all())


def test_covers_all_agrees_with_the_element_listing_definition():
    rng = np.random.default_rng(7)
    cases = 0
    agreed_true = 0
    for _ in range(20_000):
        n = int(rng.integers(0, 40))
        region = Region(
            "d_h_s2",
            offset=int(rng.integers(-8, 12)),
            rows=int(rng.integers(-1, 8)),
            width=int(rng.integers(-1, 12)),
            ld=int(rng.integers(-3, 14)),
        )
        expected = _by_elements(region, n)
        assert covers_all(region, n) == expected, (region, n)
        cases += 1
        agreed_true += expected
    # both answers occur often enough for the comparison to mean something
    assert 1_000 < agreed_true < cases - 1_000


@pytest.mark.parametrize(
    "region, n, expected",
    [
        (Region("d_h_s2", 0, 4096, 512, 512), 4096 * 512, True),  # the memset, whole
        (Region("d_h_s2", 0, 4096, 511, 512), 4096 * 512, False),  # one column short a row
        (Region("d_h_s2", 0, 4095, 512, 512), 4096 * 512, False),  # the last row missing
        (Region("d_h_s2", 1, 4096, 512, 512), 4096 * 512, False),  # element 0 never written
        (Region("d_h_s2", -1, 4097, 512, 512), 4096 * 512, True),  # from before, past the end
    ],
)
def test_covers_all_on_the_prod_shape(region, n, expected):
    assert covers_all(region, n) is expected
    assert _by_elements(region, n) is expected
