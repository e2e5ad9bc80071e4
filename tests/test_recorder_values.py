"""The recorder's --deep values, run on the host (tests/recorder_host/deep_values.c): the
recorder's units compiled in whole with it, the driver calls they make for --deep answered over
host memory by tests/recorder_host/fake_cuda.c. It checks what no GPU recording here exercises:
a new allocation whose memory is not zero (its `contents`), a changed run that crosses from one
allocation into the next packed against it, and a fork, after which the parent's values file
must hold each byte once."""

from __future__ import annotations

import json
import struct
import subprocess
from pathlib import Path

import pytest
from recorder_stand_ins import HOST, build_stand_ins, includes, link_flags

from egf_audit.capture.build import HERE, SOURCES, _compiler
from egf_audit.errors import AuditEnvironmentError

HARNESS = HOST / "deep_values.c"


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("harness")
    try:
        fakes = build_stand_ins(folder / "fakes")
    except AuditEnvironmentError as exc:
        pytest.skip(f"no CUDA toolkit headers to build the recorder with: {exc}")
    out = folder / "deep_values"
    command = [_compiler(), "-O1", "-Wall", f"-I{HERE}", *includes(), "-o", str(out), str(HARNESS)]
    command += [*map(str, SOURCES), *link_flags(fakes, "libcuda.so.1", "libcupti.so.13")]
    subprocess.run([*command, "-ldl", "-lpthread"], check=True, capture_output=True, text=True)
    return out


def _run(harness: Path, folder: Path, fork: bool) -> tuple[list[dict], bytes, tuple[int, ...]]:
    folder.mkdir()
    args = [str(harness), str(folder), *(["fork"] if fork else [])]
    done = subprocess.run(args, check=True, capture_output=True, text=True)
    mem, packed, written = (int(x) for x in done.stdout.split())
    (events_path,) = [p for p in folder.glob("events-*.jsonl") if '"msg":"start"' in p.read_text()]
    pid = events_path.name.split("-")[1].split(".")[0]
    events = [json.loads(line) for line in events_path.read_text().splitlines()]
    values = (folder / f"values-{pid}.bin").read_bytes()
    return events, values, (mem, packed, written)


def _words(values: bytes, event: dict) -> list[int]:
    n = sum(size for _, size in event["changed"]) // 4
    return list(struct.unpack_from(f"<{n}I", values, event["values"]))


@pytest.mark.parametrize("fork", [False, True], ids=["one-process", "forked"])
def test_contents_effects_and_their_bytes(harness, tmp_path, fork):
    events, values, (mem, packed, written) = _run(harness, tmp_path / "capture", fork)
    contents = {e["alloc"]: e for e in events if e["ev"] == "contents"}
    effects = {e["launch"]: e for e in events if e["ev"] == "effect"}
    # the non-zero words 0, 1 and 40 of the new allocation, at their own addresses
    assert contents[0]["changed"] == [[mem, 8], [mem + 160, 4]]
    assert _words(values, contents[0]) == [0x3F800000, 0x40000000, 0x40400000]
    # fresh zero memory has no contents, whatever the recorder's own copy held before
    assert contents[3]["changed"] == [] and contents[4]["changed"] == []
    assert effects[1]["changed"] == [[mem + 400, 4]]
    assert _words(values, effects[1]) == [0x40800000]
    assert effects[2]["changed"] == [[mem + 404, 4]]
    assert _words(values, effects[2]) == [0x40A00000]
    # one run across the boundary of two packed allocations, its bytes from both copies
    assert effects[5]["changed"] == [[packed + 996, 12]]
    assert _words(values, effects[5]) == [0x11111111, 0x22222222, 0x33333333]
    # every event's bytes follow the previous event's, and the file holds each byte once
    offset = 0
    for e in events:
        if "values" in e:
            assert e["values"] == offset
            offset += sum(size for _, size in e["changed"])
    assert len(values) == offset == written
