"""`run --capture` on lying captures: each one made at test time from the committed clean capture
by tests/data/capture/lies.py, the trainer's launches edited for one real wiring bug and the
recorder replayed over them (the module's docstring says how, the LIES table which invariants
must fail). The replay itself must give back the clean capture, byte for byte, from the clean
capture's own launches.

Every lie is judged with the trainer's layout file and, where inference can see it, without one.
The command line must exit 2 on a malformed capture, 1 on an incomplete one or a failing
invariant, never print a traceback; the API must name each expected invariant as failing. The
controls (the clean capture with its exit event, a layout file without shapes) must pass.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from capture_folders import without_layout
from typer.testing import CliRunner

from egf_audit.cli.app import app
from egf_audit.cli.capture_audit import CaptureAudit, audit_capture
from egf_audit.errors import UsageError
from egf_audit.invariants import capture_common
from egf_audit.invariants.registry import PASS


def _load_lies():
    path = Path(__file__).parent / "data" / "capture" / "lies.py"
    spec = importlib.util.spec_from_file_location("capture_lies", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module's annotations there
    spec.loader.exec_module(module)
    return module


lies = _load_lies()
CASES = [
    pytest.param(name, with_layout, id=f"{name}-{'layout-file' if with_layout else 'inferred'}")
    for name, (_, _, needs_layout) in lies.LIES.items()
    for with_layout in ((True,) if needs_layout else (True, False))
]
# the audit names processes by their place in pid order: the faulty copy has the higher pid
FAULTY_SECTION = {"second-process-scale-off-by-one": "process 2"}


@pytest.fixture(scope="module", autouse=True)
def _hash_once():
    """Every audit checks each region whose values it reads against the recorder's hash, with
    FNV-1a in Python (about 0.15 s a capture); the lies share most of their regions. Across
    this module's audits the same bytes are hashed once: the same function, remembered."""
    hashed = capture_common.fnv1a_hex

    @functools.cache
    def by_bytes(data: bytes) -> str:
        return hashed(np.frombuffer(data, "<f4"))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            capture_common,
            "fnv1a_hex",
            lambda values: by_bytes(np.ascontiguousarray(values, "<f4").tobytes()),
        )
        yield


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """Each lie written once (with or without the layout file), for every test that reads it:
    the audit writes its document outside the capture folder, and nothing writes inside it."""
    root, folders = tmp_path_factory.mktemp("lies"), {}

    def folder(name: str, with_layout: bool) -> Path:
        if (name, with_layout) not in folders:
            where = root / f"{name}-{'layout-file' if with_layout else 'inferred'}"
            other = folders.get((name, True))
            if with_layout or other is None:
                folders[name, with_layout] = lies.make(name, where, with_layout=with_layout)
            else:  # the same lie, as capture writes it without --layout
                where.mkdir()
                for path in other.iterdir():
                    (where / path.name).write_bytes(path.read_bytes())
                folders[name, with_layout] = without_layout(where)
        return folders[name, with_layout]

    return folder


def _statuses(audit: CaptureAudit) -> dict[str, set[str]]:
    """Each invariant's statuses over the audited processes."""
    out: dict[str, set[str]] = {}
    for process in audit.processes:
        for code, verdict in process.verdicts:
            out.setdefault(code, set()).add(verdict.status)
    return out


def _gate(folder: Path, tmp_path: Path):
    result = CliRunner().invoke(
        app, ["run", "--capture", str(folder), "--out", str(tmp_path / "trainer-audit.md")]
    )
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


@pytest.mark.parametrize(("name", "with_layout"), CASES)
def test_run_capture_fails_each_lie(name: str, with_layout: bool, tmp_path: Path, made):
    _, expected, _ = lies.LIES[name]
    folder = made(name, with_layout)
    result = _gate(folder, tmp_path)
    if expected == lies.REFUSED:
        assert result.exit_code == 2, result.output
        with pytest.raises(UsageError):
            audit_capture(folder, use_layout=with_layout)
        return
    audit = audit_capture(folder, use_layout=with_layout)
    if expected == lies.INCOMPLETE:
        assert result.exit_code == 1, result.output
        assert audit.incomplete and not audit.ok
        assert any(line in result.output for line in audit.incomplete), result.output
        return
    if expected == lies.PASSES and not with_layout:
        # a control by inference: nothing fails, and what only a layout file decides (EGF001's
        # unnamed operands, EGF002's and EGF009's tables) stays undecided, failing the gate
        assert result.exit_code == 1, result.output
        assert not audit.ok and not audit.failed_codes() and not audit.incomplete
        undecided = {code for p in audit.processes for code in p.undecided_failing}
        assert undecided == {"EGF001", "EGF002", "EGF009"}, undecided
        assert "EGF001[process 1] is undecided by inference" in result.output
        return
    if expected == lies.PASSES:
        assert result.exit_code == 0, result.output
        assert audit.ok and not audit.failed_codes() and not audit.incomplete
        return
    must_fail = set(expected) | (lies.WITH_LAYOUT_ALSO.get(name, set()) if with_layout else set())
    not_pass = set() if with_layout else set(lies.NOT_PASS_WITHOUT_LAYOUT.get(name, ()))
    failed = audit.failed_codes()
    assert must_fail - not_pass <= failed, f"{sorted(must_fail - failed)} do not fail"
    statuses = _statuses(audit)
    for code in not_pass:
        assert PASS not in statuses.get(code, {PASS}), f"{code} passes: {statuses.get(code)}"
    if must_fail - not_pass or failed:
        assert result.exit_code == 1, result.output
        assert not audit.ok
    if name in FAULTY_SECTION:
        assert FAULTY_SECTION[name] in result.output, result.output


# ---- the lies themselves are captures the recorder could have written ----
CLEAN = lies.CLEAN


def _event_keys(folder: Path) -> dict[str, set[frozenset[str]]]:
    keys: dict[str, set[frozenset[str]]] = {}
    for path in folder.glob("events-*.jsonl.gz"):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                event = json.loads(line)
                keys.setdefault(event["ev"], set()).add(frozenset(event))
    return keys


CLEAN_KEYS = _event_keys(CLEAN)


def test_the_clean_capture_replayed_is_the_clean_capture(tmp_path: Path):
    """The replay the lies are made with (lies.rerecord) writes, for the clean capture's own
    launches, the events, snapshot values and manifest the H200 recorded, byte for byte."""
    folder = lies.make("clean-with-exit-event", tmp_path / "clean", with_layout=True)
    for path in sorted(CLEAN.glob("*-*.gz")):
        written = (folder / path.name.removesuffix(".gz")).read_bytes()
        assert written == gzip.decompress(path.read_bytes()), path.name
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    assert manifest == json.loads((CLEAN / "manifest.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", sorted(lies.LIES))
def test_each_lie_is_well_formed_where_it_is_not_about_form(name: str, made):
    """Seqs increase, each snapshot follows its launch (a step_start region the kernel line
    just before it) and points inside the snapshots file, a region whose every value is kept
    hashes to its values, and every event has the keys the recorder writes for its kind; a
    non-JSON line only where the lie is that line: a malformed one (refused) or the last one,
    cut off without its newline (incomplete)."""
    _, expected, _ = lies.LIES[name]
    folder = made(name, True)
    for path in sorted(folder.glob("events-*.jsonl")):
        pid = path.name.split("-")[1].split(".")[0]
        blob = (folder / f"snapshots-{pid}.bin").read_bytes()
        kernels: set[int] = set()
        previous, last_line = -1, None
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for number, line in enumerate(lines, 1):
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                cut = number == len(lines) and not text.endswith("\n")
                assert expected == lies.REFUSED or (cut and expected == lies.INCOMPLETE), line
                continue
            assert frozenset(event) in CLEAN_KEYS[event["ev"]], event
            assert event["seq"] > previous, event
            previous = event["seq"]
            if event["ev"] == "kernel":
                kernels.add(event["seq"])
            before, last_line = last_line, event
            if event["ev"] != "snapshot":
                continue
            if event["when"] == "step_start":
                assert before["ev"] == "kernel" and event["launch"] == before["seq"], event
            else:
                assert event["launch"] in kernels, event
            count, offset = event["count"], event["offset"]
            assert offset + 4 * count <= len(blob) and count <= event["elements"], event
            values = np.frombuffer(blob, "<f4", count, offset)
            if count == event["elements"]:
                assert lies.fnv1a(values) == event["hash"], event
