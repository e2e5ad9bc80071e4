"""The outputs room: atomic file writes (one file, or a batch that replaces all or nothing) and
the appended step summary."""

from __future__ import annotations

import os

import pytest

from egf_audit.errors import AuditEnvironmentError
from egf_audit.outputs import step_summary
from egf_audit.outputs.atomic import OutputBatch, write_atomic


# ---- the step summary ----
def test_step_summary_is_appended_within_githubs_limit(tmp_path, monkeypatch):
    target = tmp_path / "summary.md"
    target.write_text("earlier step\n")
    monkeypatch.setattr(step_summary, "STEP_SUMMARY_LIMIT", 40)
    step_summary.append_step_summary("x" * 100, str(target))
    # 40 bytes in all: the 13 already there, 26 of the new text and its line end
    assert target.read_bytes() == b"earlier step\n" + b"x" * 26 + b"\n"


def test_step_summary_outside_github_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    monkeypatch.chdir(tmp_path)
    step_summary.append_step_summary("text")
    assert list(tmp_path.iterdir()) == []


# ---- atomic writes ----
def test_atomic_write_keeps_the_old_file_when_replace_fails(tmp_path, monkeypatch):
    target = tmp_path / "doc.md"
    target.write_text("old\n")

    def failing_replace(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(AuditEnvironmentError, match=r"cannot write .*No space left"):
        write_atomic(target, "new\n")
    assert target.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["doc.md"]


def test_batch_replaces_nothing_when_one_output_cannot_be_staged(tmp_path):
    first = tmp_path / "doc.md"
    first.write_text("old\n")
    (tmp_path / "file").write_text("")
    with pytest.raises(AuditEnvironmentError), OutputBatch() as batch:
        batch.add(first, "new\n")
        batch.add(tmp_path / "file" / "x.json", "{}")
        batch.commit()
    assert first.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["doc.md", "file"]


def test_atomic_write_keeps_the_file_mode_and_writes_lf(tmp_path):
    target = tmp_path / "doc.md"
    target.write_text("old\n")
    target.chmod(0o640)
    write_atomic(target, "a\nb\n")
    assert target.stat().st_mode & 0o777 == 0o640
    assert target.read_bytes() == b"a\nb\n"
    new = tmp_path / "deep" / "er" / "new.md"
    write_atomic(new, "x\n")
    assert new.read_text() == "x\n"
