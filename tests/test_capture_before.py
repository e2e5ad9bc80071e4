"""The verdicts of every committed capture fixture, held as they were before the capture reader
was split and hardened (issue 32: "a test holds the before"): `run --capture --json` on each
folder of tests/data/capture that holds a manifest.json, with the layout file the folder holds
and with names inferred, byte for byte. `before-json.json.gz` beside the fixtures was written
by this module's `--write` on the code before the split; a change that moves any verdict,
summary, evidence or section of a fixture fails here, naming the fixture and the first line
that differs.

Two keys are set aside, because they name where the test ran, not what the capture shows:
`run.capture` (the folder as it was passed) and `egf_audit_version`.

    python tests/test_capture_before.py --write   # only for a change meant to move verdicts
"""

from __future__ import annotations

import difflib
import gzip
import json
import sys
from pathlib import Path

import pytest

from egf_audit.cli.capture_commands import CaptureRequest, run_capture_audit

DATA = Path(__file__).parent / "data" / "capture"
GOLDEN = DATA / "before-json.json.gz"
FIXTURES = sorted(p.parent.relative_to(DATA).as_posix() for p in DATA.rglob("manifest.json"))
MODES = {"layout-file": True, "inferred": False}


def capture_json(fixture: str, use_layout: bool, scratch: Path) -> str:
    """`run --capture --json` of one fixture, the keys that name the run's place set aside."""
    out = scratch / "out.json"
    run_capture_audit(
        CaptureRequest(
            folder=DATA / fixture,
            out=scratch / "trainer-audit.md",
            json_out=out,
            use_layout=use_layout,
        )
    )
    doc = json.loads(out.read_text(encoding="utf-8"))
    doc.pop("egf_audit_version")
    doc["run"].pop("capture")
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def _golden() -> dict[str, str]:
    return json.loads(gzip.decompress(GOLDEN.read_bytes()))


@pytest.fixture(scope="module")
def golden() -> dict[str, str]:
    return _golden()


def test_every_fixture_is_held():
    assert sorted({key.rsplit(":", 1)[0] for key in _golden()}) == FIXTURES


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("fixture", FIXTURES)
def test_a_fixture_gives_the_json_it_gave_before(fixture, mode, golden, tmp_path):
    got = capture_json(fixture, MODES[mode], tmp_path)
    want = golden[f"{fixture}:{mode}"]
    if got != want:
        diff = difflib.unified_diff(want.splitlines(), got.splitlines(), "before", "now", n=2)
        pytest.fail(f"{fixture} ({mode}) moved:\n" + "\n".join(list(diff)[:40]))


def _write(scratch: Path) -> None:
    held = {
        f"{fixture}:{mode}": capture_json(fixture, use_layout, scratch)
        for fixture in FIXTURES
        for mode, use_layout in MODES.items()
    }
    text = json.dumps(held, indent=0, sort_keys=True) + "\n"
    GOLDEN.write_bytes(gzip.compress(text.encode("utf-8"), mtime=0))


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        _write(Path(scratch))
