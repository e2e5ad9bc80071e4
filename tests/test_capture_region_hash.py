"""The recorder's region hash (mix64, rec_snapshot.c) and the reader's recomputation
of it (invariants/capture_common.py) are one function: the C between the source's "region hash"
markers is compiled alone and run on regions the reader also hashes, bit for bit; the hash of
zeros the sentinel check compares with is the hash of zeros; and a region whose kept values
disagree with its mix64 hash is missing data whatever its size (fnv1a regions keep their
size bound)."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from egf_audit.capture.build import HERE
from egf_audit.invariants import capture_common
from egf_audit.trace.model import Missing
from egf_audit.trace.process import SnapshotRegion

HARNESS = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
%s
int main(int argc, char **argv) {
    long long count = atoll(argv[2]), ld = atoll(argv[3]), skip = atoll(argv[4]);
    float *values = malloc((size_t)(count ? count : 1) * sizeof(float));
    FILE *f = fopen(argv[1], "rb");
    if (!f || fread(values, sizeof(float), (size_t)count, f) != (size_t)count) return 2;
    printf("%%016llx\n", (unsigned long long)region_hash(values, count, ld, skip));
    return 0;
}
"""


@pytest.fixture(scope="module")
def c_hash(tmp_path_factory: pytest.TempPathFactory):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    source = (HERE / "rec_snapshot.c").read_text(encoding="utf-8")
    block = re.search(
        r"/\* ---- region hash \(begin\).*?region hash \(end\) ---- \*/", source, re.S
    )
    assert block, "the region hash markers moved in rec_snapshot.c"
    folder = tmp_path_factory.mktemp("region-hash")
    (folder / "harness.c").write_text(HARNESS % block.group(0), encoding="utf-8")
    binary = folder / "harness"
    subprocess.run(
        [cc, "-O2", "-Wall", "-Werror", "-o", str(binary), str(folder / "harness.c")], check=True
    )

    def run(values: np.ndarray, ld: int, skip_col: int) -> str:
        data = folder / "values.bin"
        data.write_bytes(np.ascontiguousarray(values, "<f4").tobytes())
        out = subprocess.run(
            [str(binary), str(data), str(values.size), str(ld), str(skip_col)],
            check=True,
            capture_output=True,
            text=True,
        )
        return out.stdout.strip()

    return run


def _with_column_left_out(values: np.ndarray, ld: int, skip_col: int) -> str:
    """mix64 written out element by element in Python integers, column `skip_col` left out."""
    mask = capture_common.MASK64
    total = 0
    bits = np.ascontiguousarray(values, "<f4").view("<u4")
    for i, word in enumerate(bits.tolist()):
        if i % ld == skip_col:
            continue
        z = (word + i * capture_common.MIX64_STEP) & mask
        z = ((z ^ (z >> 30)) * capture_common.MIX64_M1) & mask
        z = ((z ^ (z >> 27)) * capture_common.MIX64_M2) & mask
        total = (total + (z ^ (z >> 31))) & mask
    return f"{total:016x}"


def test_the_c_hash_and_the_readers_are_the_same_function(c_hash):
    rng = np.random.default_rng(3)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -3.4e38], np.float32)
    for size in (0, 1, 2, 7, 64, 1000, (1 << 20) + 3):  # past one chunk of the reader's loop
        values = rng.standard_normal(size).astype(np.float32)
        if size >= specials.size:
            values[: specials.size] = specials
        assert c_hash(values, size, -1) == capture_common.mix64_hex(values), size


def test_a_left_out_column_keeps_the_other_elements_indices(c_hash):
    rng = np.random.default_rng(4)
    rows, ld = 5, 7
    values = rng.standard_normal(rows * ld).astype(np.float32)
    got = c_hash(values, ld, ld - 1)
    assert got == _with_column_left_out(values, ld, ld - 1)
    changed = values.copy()
    changed[ld - 1] = 123.0  # in the left-out column: the hash does not see it
    assert c_hash(changed, ld, ld - 1) == got
    changed[0] = 123.0  # elsewhere it does
    assert c_hash(changed, ld, ld - 1) != got


def test_the_hash_of_zeros_is_the_zeros_hash(c_hash):
    for elements in (0, 1, 256, 4096):
        zeros = np.zeros(elements, np.float32)
        assert capture_common.zeros_hash(elements, "mix64") == c_hash(zeros, elements, -1)
    # +0.0 and -0.0 differ: a wire of -0.0 is not the sentinel's +0.0
    assert capture_common.mix64_hex(np.array([-0.0], np.float32)) != capture_common.zeros_hash(
        1, "mix64"
    )


@pytest.mark.parametrize(
    "kind, elements, checked",
    [
        ("mix64", 10, True),
        ("mix64", capture_common.HASH_CHECK_MAX + 1, True),
        ("fnv1a", 10, True),
        ("fnv1a", capture_common.HASH_CHECK_MAX + 1, False),
    ],
)
def test_kept_values_are_held_to_their_hash(kind, elements, checked):
    values = np.arange(elements, dtype=np.float32)
    right = capture_common.region_hash_hex(values, kind)
    region = SnapshotRegion(1, "before", "d_h_s2", 0, elements, right, values, hash_kind=kind)
    assert capture_common.all_values(region, "d_h_s2") is values
    lying = SnapshotRegion(1, "before", "d_h_s2", 0, elements, "f" * 16, values, hash_kind=kind)
    if checked:
        with pytest.raises(Missing, match="disagree with the recorder's hash"):
            capture_common.all_values(lying, "d_h_s2")
    else:  # an fnv1a region past the bound is trusted as hashed (docs/capture.md, Limits)
        assert capture_common.all_values(lying, "d_h_s2") is values
