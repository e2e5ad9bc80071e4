"""The shipped recorder library, built by the package's own build path, preloaded into a host
program that calls it as CUPTI would (tests/recorder_host/replay.c, over the stand-ins for
CUPTI, the driver, the runtime, cuBLAS and cuBLASLt beside it). What it writes for the same calls
is held byte for byte in tests/recorder_host/expected/: the recorder's events (pids, thread ids
and the parent's pid replaced by names), and the sha256 of each snapshots and values file.

The expected files were written by the recorder as it was before it was split into units; a
change that means to change what the recorder writes regenerates them with
`python tests/test_recorder_replay.py --write` and says so.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from recorder_stand_ins import HOST, STRICT, build_stand_ins, includes, link_flags

from egf_audit.capture.build import _compiler, build_recorder
from egf_audit.errors import AuditEnvironmentError

EXPECTED = HOST / "expected"
# what each replay runs: its arguments and the recorder's environment
SCENARIOS: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "plain": (("fork",), {}),
    "deep": (("fork",), {"EGF_CAPTURE_DEEP": "1"}),
    "deep-values-cut": (
        (),
        {
            "EGF_CAPTURE_DEEP": "1",
            "EGF_CAPTURE_DEEP_VALUES_MAX": "3000",
            "EGF_CAPTURE_VALUES_MAX": "16",
            "EGF_CAPTURE_SNAPSHOT": "polyak_ema,sp14_scale_wire_col",
        },
    ),
    # a driver that refuses the recorder's PTX: snapshots hashed on the host, --deep stopped
    "kernels-refused": ((), {"EGF_CAPTURE_DEEP": "1", "FAKE_CUDA_NO_MODULE": "1"}),
    # CUPTI already held by a profiler: the init event and a note, nothing more
    "subscribe-refused": ((), {"FAKE_CUPTI_BUSY": "1"}),
}


@dataclass(frozen=True)
class Replay:
    program: Path
    fakes: Path
    recorder: Path

    def run(
        self, folder: Path, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        environment = {
            k: v for k, v in os.environ.items() if not k.startswith(("EGF_CAPTURE_", "LD_"))
        }
        environment.update(
            EGF_CAPTURE_DIR=str(folder),
            LD_LIBRARY_PATH=str(self.fakes),
            LD_PRELOAD=str(self.recorder),
            **(env or {}),
        )
        return subprocess.run(
            [str(self.program), *args], env=environment, capture_output=True, text=True, timeout=60
        )


def build_replay(out: Path) -> Replay:
    """The recorder (build_recorder, into a cache under `out`), the stand-ins and the program."""
    fakes = build_stand_ins(out / "fakes")
    program = out / "replay"
    command = [_compiler(), *STRICT, *includes(), "-o", str(program), str(HOST / "replay.c")]
    command += [*link_flags(fakes), "-ldl"]
    subprocess.run(command, check=True, capture_output=True, text=True)
    saved = os.environ.get("EGF_AUDIT_CACHE")
    os.environ["EGF_AUDIT_CACHE"] = str(out / "cache")
    try:
        recorder = build_recorder()
    finally:
        if saved is None:
            del os.environ["EGF_AUDIT_CACHE"]
        else:
            os.environ["EGF_AUDIT_CACHE"] = saved
    return Replay(program, fakes, recorder)


def normalized(folder: Path, stdout: str) -> str:
    """What the recorder wrote into `folder`, with the pids the replay printed (its own, then
    its child's) named P0, P1, the parent's pid PPID and the thread ids T0, T1, ... in order of
    first appearance: the rest byte for byte; a binary file as its size and sha256."""
    names = {pid: f"P{i}" for i, pid in enumerate(_printed_pids(stdout))}
    tids: dict[str, str] = {}

    def tid(m: re.Match[str]) -> str:
        return f'"tid":"{tids.setdefault(m[1], f"T{len(tids)}")}"'

    def by_pid(text: str) -> str:
        return re.sub(r"-(\d+)\.", lambda m: f"-{names.get(int(m[1]), m[1])}.", text)

    out = []
    for path in sorted(folder.iterdir(), key=lambda p: by_pid(p.name)):
        data = path.read_bytes()
        if path.suffix != ".jsonl":
            out.append(f"== {by_pid(path.name)} ({len(data)} bytes)")
            out.append(hashlib.sha256(data).hexdigest())
            continue
        out.append(f"== {by_pid(path.name)}")
        text = data.decode()
        text = re.sub(r'"tid":(\d+)', tid, text)
        text = re.sub(r'"ppid":\d+', '"ppid":"PPID"', text)
        text = re.sub(r'"pid":(\d+)', lambda m: f'"pid":"{names.get(int(m[1]), m[1])}"', text)
        out.append(text.rstrip("\n"))
    return "\n".join(out) + "\n"


def replay_scenario(replay: Replay, folder: Path, name: str) -> str:
    args, env = SCENARIOS[name]
    folder.mkdir()
    done = replay.run(folder, *args, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr  # the trainer's output stays its own
    return normalized(folder, done.stdout)


@pytest.fixture(scope="module")
def replay(tmp_path_factory: pytest.TempPathFactory) -> Replay:
    try:
        return build_replay(tmp_path_factory.mktemp("replay"))
    except AuditEnvironmentError as exc:
        pytest.skip(f"no CUDA toolkit headers to build the recorder with: {exc}")


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_the_recorder_writes_what_it_wrote_before(replay, tmp_path, name):
    got = replay_scenario(replay, tmp_path / name, name)
    assert got == (EXPECTED / f"{name}.txt").read_text(encoding="utf-8")


def test_without_a_capture_folder_the_recorder_stays_out(replay, tmp_path):
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("EGF_CAPTURE_", "LD_"))}
    environment.update(LD_LIBRARY_PATH=str(replay.fakes), LD_PRELOAD=str(replay.recorder))
    done = subprocess.run(
        [str(replay.program)], env=environment, capture_output=True, text=True, cwd=tmp_path
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert list(tmp_path.iterdir()) == []


# ---- the recorder's own files: made anew, never through a link (issue 34, item 7) ----
OUTSIDE = b"a file of the user's, outside the capture folder\n"


def _printed_pids(stdout: str) -> list[int]:
    return [int(line.split()[1]) for line in stdout.splitlines() if line.startswith("pid ")]


def _planted(replay: Replay, tmp_path: Path, *args: str, env: dict[str, str] | None = None):
    folder = tmp_path / "capture"
    folder.mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_bytes(OUTSIDE)
    done = replay.run(folder, *args, f"outside={outside}", env=env)
    assert done.returncode == 0, done.stderr
    assert outside.read_bytes() == OUTSIDE  # never written through the link
    return folder, outside, done


def _said_once(stderr: str, pid: int, name: str) -> None:
    """One line on the trainer's stderr, naming the process and the file it could not make."""
    (line,) = stderr.splitlines()
    assert line.startswith("egf-audit recorder: ") and f"process {pid} " in line and name in line


@pytest.mark.parametrize(
    "what, env",
    [("events", {}), ("snapshots", {}), ("values", {"EGF_CAPTURE_DEEP": "1"})],
)
def test_a_link_planted_at_a_recorder_file_is_never_written_through(replay, tmp_path, what, env):
    folder, outside, done = _planted(replay, tmp_path, f"plant={what}", env=env)
    (pid,) = _printed_pids(done.stdout)
    planted = folder / f"{what}-{pid}.{'jsonl' if what == 'events' else 'bin'}"
    assert planted.is_symlink() and os.readlink(planted) == str(outside)
    _said_once(done.stderr, pid, planted.name)
    made = sorted(p.name for p in folder.iterdir() if p != planted)
    if what == "events":
        assert made == []  # nothing recorded: no file to say it in but stderr
        return
    # the process's own events file says why, and ends there: no init, no launch, no exit
    # event, so the capture is incomplete (and the files made before the refused one are empty)
    expected = [f"events-{pid}.jsonl"] + ([f"snapshots-{pid}.bin"] if what == "values" else [])
    assert made == expected
    (note,) = [json.loads(line) for line in (folder / made[0]).read_text().splitlines()]
    assert note["ev"] == "note" and planted.name in note["msg"] and "records nothing" in note["msg"]


def test_a_file_planted_at_the_events_file_is_left_as_it_was(replay, tmp_path):
    folder = tmp_path / "capture"
    folder.mkdir()
    done = replay.run(folder, "plant=events")
    assert done.returncode == 0, done.stderr
    (pid,) = _printed_pids(done.stdout)
    assert [p.name for p in folder.iterdir()] == [f"events-{pid}.jsonl"]
    assert (folder / f"events-{pid}.jsonl").read_text() == "planted\n"  # not cut, not added to
    _said_once(done.stderr, pid, f"events-{pid}.jsonl")


def test_a_forked_child_never_writes_through_a_link_planted_at_its_file(replay, tmp_path):
    folder, _, done = _planted(replay, tmp_path, "fork", "plant=child")
    parent, child = _printed_pids(done.stdout)
    assert (folder / f"events-{child}.jsonl").is_symlink()
    assert not (folder / f"snapshots-{child}.bin").exists()
    _said_once(done.stderr, child, f"events-{child}.jsonl")
    last = (folder / f"events-{parent}.jsonl").read_text().splitlines()[-1]
    assert json.loads(last)["ev"] == "exit"  # the parent's capture is whole


def test_a_capture_folder_that_is_a_link_gets_nothing(replay, tmp_path):
    real = tmp_path / "elsewhere"
    real.mkdir()
    link = tmp_path / "capture"
    link.symlink_to(real)
    done = replay.run(link)
    assert done.returncode == 0, done.stderr
    assert list(real.iterdir()) == []
    (line,) = done.stderr.splitlines()
    assert line.startswith("egf-audit recorder: ") and str(link) in line


def test_no_descriptor_into_the_capture_folder_is_handed_on_to_an_exec(replay, tmp_path):
    folder = tmp_path / "capture"
    folder.mkdir()
    done = replay.run(folder, "descriptors")
    assert done.returncode == 0, done.stderr
    (report,) = [line.split()[1:] for line in done.stdout.splitlines() if "descriptors" in line]
    into, inherited = map(int, report)
    assert into >= 2 and inherited == 0  # the events and snapshots files (and the folder)


def main(argv: list[str]) -> int:
    if argv != ["--write"]:
        print("usage: python tests/test_recorder_replay.py --write", file=sys.stderr)
        return 2
    import tempfile

    sys.path.insert(0, str(Path(__file__).parent))
    with tempfile.TemporaryDirectory() as tmp:
        replay = build_replay(Path(tmp))
        EXPECTED.mkdir(exist_ok=True)
        for name in sorted(SCENARIOS):
            text = replay_scenario(replay, Path(tmp) / name, name)
            (EXPECTED / f"{name}.txt").write_text(text, encoding="utf-8")
            print(f"wrote {EXPECTED / f'{name}.txt'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
