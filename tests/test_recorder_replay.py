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
    pids = [int(line.split()[1]) for line in stdout.splitlines() if line.startswith("pid ")]
    names = {pid: f"P{i}" for i, pid in enumerate(pids)}
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
