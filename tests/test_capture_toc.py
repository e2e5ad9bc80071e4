"""A capture folder's manifest is its table of contents (capture/folder.py, manifest.py,
audit.py): what it names is checked against what is there and what is there against it, a
disagreement refused in one line naming both sides; a named layout file is never replaced by
inference; every process's incompleteness is judged, audited or not. Built from the committed
clean and two-processes captures."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from egf_audit.capture.folder import read_folder
from egf_audit.capture.manifest import CAPTURE_FORMAT, read_manifest
from egf_audit.cli.capture_audit import audit_capture
from egf_audit.errors import UsageError

DATA = Path(__file__).parent / "data" / "capture"


def _copy(tmp_path: Path, name: str = "clean") -> Path:
    folder = tmp_path / "capture"
    shutil.copytree(DATA / name, folder)
    return folder


def _manifest(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "manifest.json").read_text())


def _set_manifest(folder: Path, doc: dict[str, Any]) -> None:
    (folder / "manifest.json").write_text(json.dumps(doc))


def _pid(folder: Path) -> int:
    return next(p["pid"] for p in _manifest(folder)["processes"] if p["audited"])


def refused(folder: Path, pattern: str, use_layout: bool = True) -> str:
    with pytest.raises(UsageError, match=pattern) as info:
        audit_capture(folder, use_layout=use_layout)
    assert "\n" not in str(info.value)
    return str(info.value)


@pytest.fixture
def clean(tmp_path: Path) -> Path:
    return _copy(tmp_path)


# ---- what the manifest lists, against what is there ----
def test_the_committed_captures_agree_with_their_manifests():
    for name in ("clean", "two-processes", "killed", "runtime/recorded/rt-deep-clean"):
        found = read_folder(DATA / name)
        assert found.manifest is not None and found.processes


def test_a_listed_process_without_its_events_file_is_refused(clean):
    pid = _pid(clean)
    (clean / f"events-{pid}.jsonl.gz").unlink()
    refused(clean, rf"^manifest\.json lists process {pid}, and the folder holds no events-{pid}")


def test_a_listed_process_without_its_snapshots_file_is_refused(clean):
    pid = _pid(clean)
    (clean / f"snapshots-{pid}.bin.gz").unlink()
    refused(clean, rf"holds no snapshots-{pid}\.bin \(the recorder writes one for every process\)")


def test_a_process_the_manifest_does_not_list_is_refused(clean):
    pid = _pid(clean)
    shutil.copy(clean / f"events-{pid}.jsonl.gz", clean / "events-9.jsonl.gz")
    refused(
        clean,
        r"^events-9\.jsonl\.gz: a file of process 9, which manifest\.json does not list "
        rf"\(it lists pid {pid}\)",
    )


@pytest.mark.parametrize(
    "name", ["README.txt", "values-2024.binary-report.xlsx", "layout.json.bak"]
)
def test_a_file_the_manifest_does_not_account_for_is_refused(clean, name):
    (clean / name).write_bytes(b"mine")
    refused(clean, rf"^{re.escape(name)}: no file of a capture")


def test_a_folder_inside_the_capture_is_refused(clean):
    (clean / "sub").mkdir()
    refused(clean, r"^sub/: a folder inside a capture folder")


def test_a_layout_file_the_manifest_does_not_name_is_refused(clean):
    doc = _manifest(clean)
    doc["layout"] = None
    _set_manifest(clean, doc)
    refused(clean, r"^layout\.json\.gz: a layout file, and manifest\.json names none")


def test_two_layout_files_are_refused(clean):
    (clean / "layout.json").write_bytes(gzip.decompress((clean / "layout.json.gz").read_bytes()))
    refused(clean, r"^layout\.json\.gz: layout\.json beside it: two layout files")


@pytest.mark.parametrize(
    ("key", "delta"),
    [("kernels", 1), ("gemms", -1), ("memsets", 5), ("copies", -2), ("snapshots", 1)],
)
def test_a_count_the_events_do_not_hold_is_refused(clean, key, delta):
    doc = _manifest(clean)
    entry = doc["processes"][0]
    entry[key] += delta
    _set_manifest(clean, doc)
    refused(
        clean,
        rf"^manifest\.json counts {entry[key]} {key} of process \d+; "
        rf"events-\d+\.jsonl\.gz holds {entry[key] - delta}$",
    )


def test_notes_the_events_do_not_hold_are_refused(clean):
    doc = _manifest(clean)
    doc["processes"][0]["notes"] = []
    _set_manifest(clean, doc)
    refused(clean, r"^manifest\.json's notes of process \d+ are not the notes events-")


def test_a_capture_cut_short_and_closed_with_an_exit_line_is_refused(clean):
    """The issue's case: the manifest counts 757 launches, the file holds those of step 0."""
    pid = _pid(clean)
    path = clean / f"events-{pid}.jsonl.gz"
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    cut = next(i for i, line in enumerate(lines) if '"name":"polyak_ema"' in line) + 1
    last = json.loads(lines[cut - 1])
    kept = [
        *lines[:cut],
        json.dumps({"ev": "exit", "seq": last["seq"] + 1, "tid": last["tid"], "pid": pid}),
    ]
    path.write_bytes(gzip.compress(("\n".join(kept) + "\n").encode()))
    refused(
        clean,
        r"^manifest\.json counts 757 kernels of process \d+; events-\d+\.jsonl\.gz holds \d+$",
    )


def test_a_values_file_of_a_process_that_kept_none_is_refused(clean):
    (clean / f"values-{_pid(clean)}.bin").write_bytes(b"\0" * 8)
    refused(clean, r"^values-\d+\.bin: events-\d+\.jsonl\.gz says its recorder kept no values")


def test_the_values_file_of_a_process_that_kept_values_is_required(tmp_path):
    folder = _copy(tmp_path, "runtime/recorded/rt-deep-clean")
    pid = _pid(folder)
    (folder / f"values-{pid}.bin.gz").unlink()
    refused(
        folder,
        r"says its recorder kept values \(its init event\), and the folder holds no "
        rf"values-{pid}\.bin",
    )


# ---- the layout file it names ----
def test_a_named_layout_file_that_is_gone_is_refused_never_inferred(clean):
    (clean / "layout.json.gz").unlink()
    refused(clean, r"^manifest\.json names the layout file layout\.json, and the folder holds none")
    refused(clean, r"holds none", use_layout=False)  # even when inference was asked for


def test_a_named_layout_file_that_is_a_dangling_link_is_refused(clean):
    (clean / "layout.json.gz").unlink()
    (clean / "layout.json.gz").symlink_to(clean / "nowhere.json")
    refused(clean, r"^layout\.json: named by manifest\.json, and no file of that name can be read")


def test_a_named_layout_file_that_is_a_fifo_is_refused_without_opening_it(clean):
    (clean / "layout.json.gz").unlink()
    os.mkfifo(clean / "layout.json.gz")
    refused(
        clean, r"^layout\.json\.gz: a FIFO \(named pipe\), not a regular file$", use_layout=False
    )


def test_another_trainers_layout_file_is_refused_never_inferred(clean):
    other = DATA / "runtime" / "recorded" / "rt-clean" / "layout.json.gz"
    (clean / "layout.json.gz").write_bytes(other.read_bytes())
    message = refused(
        clean, r"^the layout file names none of process 1's ABI pointers \(the first at 0x"
    )
    assert "never replaced by inference" in message
    assert audit_capture(clean, use_layout=False).processes  # inference, when asked for


def test_another_trainers_layout_file_for_a_process_of_gemms_is_refused(tmp_path):
    folder = _copy(tmp_path, "runtime/recorded/probe")
    (folder / "layout.json.gz").write_bytes((DATA / "clean" / "layout.json.gz").read_bytes())
    refused(folder, r"^the layout file names none of process 1's GEMM operands")


def test_a_second_trainer_the_layout_file_was_not_written_for_is_named_by_inference(tmp_path):
    """Only the audited process must be named by the file; another trainer process in the same
    capture (other addresses) is judged by inference, as the note says."""
    folder = _copy(tmp_path, "two-processes")
    doc = _manifest(folder)
    launcher = next(p for p in doc["processes"] if not p["audited"])
    trainer = next(p for p in doc["processes"] if p["audited"])
    src = DATA / "runtime" / "recorded" / "rt-clean"
    rt_pid = _pid(src)
    for stem in ("events", "snapshots"):
        suffix = "jsonl" if stem == "events" else "bin"
        (folder / f"{stem}-{launcher['pid']}.{suffix}.gz").unlink()
        data = gzip.decompress((src / f"{stem}-{rt_pid}.{suffix}.gz").read_bytes())
        if stem == "events":
            data = data.replace(f'"pid":{rt_pid}'.encode(), f'"pid":{launcher["pid"]}'.encode())
        (folder / f"{stem}-{launcher['pid']}.{suffix}.gz").write_bytes(gzip.compress(data))
    rt = _manifest(src)["processes"][0]
    launcher.update(
        {k: rt[k] for k in ("kernels", "gemms", "memsets", "copies", "snapshots", "notes")}
    )
    _set_manifest(folder, doc)
    audit = audit_capture(folder)
    first = next(p for p in audit.processes if p.section == "process 1")
    assert first.layout_note == "the layout file names none of its pointers: names inferred"
    assert trainer["audited"]


# ---- the manifest itself ----
@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda d: d.update(tool="other"), r"holds 'tool', a key egf-audit capture does not write"),
        (lambda d: d["processes"][0].update(extra=1), r'"processes"\[0\] holds \'extra\''),
        (lambda d: d.update(processes={}), r'"processes" must be a list'),
        (lambda d: d["processes"][0].update(pid=-1), r'"pid" must be an integer from 0'),
        (lambda d: d["processes"][0].update(kernels=-1), r'"kernels" must be a count'),
        (lambda d: d["processes"][0].update(notes=[1]), r'"notes" must be a list of strings'),
        (lambda d: d["processes"][0].update(audited=1), r'"audited" must be true or false'),
        (
            lambda d: d["processes"].append(dict(d["processes"][0], audited=False)),
            r"lists pid \d+ twice",
        ),
        (lambda d: d["processes"][0].update(audited=False), r"marks 0 processes audited, not one"),
        (
            lambda d: d.update(layout="../layout.json"),
            r"\"layout\" is '\.\./layout\.json': capture names the layout file layout\.json",
        ),
        (
            lambda d: d.update(format="other-tool/1"),
            r'"format" is \'other-tool/1\', not "egf-audit-capture/1"',
        ),
        (lambda d: d.update(wall_s=-1), r'"wall_s" must be a number of seconds'),
        (lambda d: d.update(snapshot_kernels="polyak_ema"), r'"snapshot_kernels" must be a list'),
        (lambda d: d.update(exit_code=10**30), r"not JSON \(an integer of 31 digits\)"),
    ],
)
def test_a_manifest_that_is_not_what_capture_writes_is_refused(clean, change, says):
    doc = _manifest(clean)
    change(doc)
    _set_manifest(clean, doc)
    with pytest.raises(UsageError, match=rf"^manifest\.json: .*{says}"):
        read_manifest(clean)


def test_a_manifest_nested_deeper_than_any_manifest_is_refused(clean):
    (clean / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UsageError, match=r"^manifest\.json: not JSON \(nested 100000 deep"):
        read_manifest(clean)


def test_the_manifest_capture_writes_carries_the_format_mark(clean):
    doc = _manifest(clean)
    doc["format"] = CAPTURE_FORMAT
    _set_manifest(clean, doc)
    assert read_manifest(clean).processes[0].audited


# ---- every process's incompleteness, audited or not ----
def _launcher_events(folder: Path, cut: str) -> None:
    doc = _manifest(folder)
    pid = next(p["pid"] for p in doc["processes"] if not p["audited"])
    path = folder / f"events-{pid}.jsonl.gz"
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    assert json.loads(lines[-1])["ev"] == "exit"
    text = "\n".join(lines[:-1]) + "\n" + (lines[-1][:20] if cut == "mid-line" else "")
    path.write_bytes(gzip.compress(text.encode()))


@pytest.mark.parametrize("cut", ["exit-line", "mid-line"])
def test_a_launcher_that_did_not_end_makes_the_capture_incomplete(tmp_path, cut):
    folder = _copy(tmp_path, "two-processes")
    _launcher_events(folder, cut)
    audit = audit_capture(folder)
    assert not audit.ok
    (line,) = audit.incomplete
    assert line.startswith("process 1: ")
    assert (
        "cut off mid-write" if cut == "mid-line" else "ends without the recorder's exit"
    ) in line


def test_a_launcher_not_recorded_deep_makes_a_deep_capture_incomplete(tmp_path):
    folder = _copy(tmp_path, "two-processes")
    doc = _manifest(folder)
    doc["deep"] = True
    _set_manifest(folder, doc)
    audit = audit_capture(folder)
    assert [line.split(":")[0] for line in audit.incomplete] == ["process 1", "process 2"]


# ---- "values_dropped": capture drops the values of a process no SP14 invariant reads ----
@pytest.mark.parametrize(
    ("fixture", "edit", "pattern"),
    [
        # an SP14 process: capture never drops its values (EGF010's oracle reads them)
        ("runtime/recorded/rt-deep-clean", "drop", "launched SP14 kernels, .* never drops those"),
        # the file is still there
        ("runtime/recorded/rt-deep-clean", "mark", r"values-\d+\.bin\.gz: manifest.json says"),
        # its recorder kept no values at all
        ("runtime/recorded/rt-clean", "mark", "says its recorder kept none"),
        # the mark is written only as true
        ("runtime/recorded/rt-clean", "false", '"values_dropped" is written only as true'),
    ],
)
def test_a_manifest_that_says_values_were_dropped_is_held_to_it(tmp_path, fixture, edit, pattern):
    folder = _copy(tmp_path, fixture)
    doc = _manifest(folder)
    (entry,) = doc["processes"]
    entry["values_dropped"] = edit != "false"
    _set_manifest(folder, doc)
    if edit == "drop":
        for name in folder.glob("values-*"):
            name.unlink()
    refused(folder, pattern)
