"""`egf-audit capture` loses nothing: run_capture replaces --out only with a complete capture and
leaves the previous capture and the --layout file as they were on every failure. On CPU: the
recorder is never built or loaded, and the command is a Python script that writes the committed
clean capture's files (tests/data/capture/clean) where the recorder would."""

from __future__ import annotations

import gzip
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from egf_audit.capture import command as capture_command
from egf_audit.capture import convert as capture_convert
from egf_audit.capture.command import known_kernels, run_capture
from egf_audit.errors import AuditEnvironmentError, UsageError

CLEAN = Path(__file__).parent / "data" / "capture" / "clean"
PID = int(next(CLEAN.glob("events-*.jsonl.gz")).name.split("-")[1].split(".")[0])
EVENTS = gzip.decompress((CLEAN / f"events-{PID}.jsonl.gz").read_bytes())
SNAPSHOTS = gzip.decompress((CLEAN / f"snapshots-{PID}.bin.gz").read_bytes())
LAYOUT = gzip.decompress((CLEAN / "layout.json.gz").read_bytes())
OLD_MANIFEST = {  # what capture wrote for an earlier run (one process, pid 77)
    "command": ["old-trainer"],
    "exit_code": 0,
    "wall_s": 1.5,
    "layout": "layout.json",
    "snapshot_kernels": [],
    "processes": [
        {
            "pid": 77,
            "audited": True,
            **dict.fromkeys(("kernels", "gemms", "memsets", "copies", "snapshots"), 0),
            "notes": [],
        }
    ],
}
OLD = {  # an earlier capture, as --out holds it
    "events-77.jsonl": b'{"ev":"init","seq":0,"pid":77}\n',
    "snapshots-77.bin": b"\x00\x01old",
    "trace.jsonl": b'{"old": true}\n',
    "manifest.json": json.dumps(OLD_MANIFEST).encode(),
    "layout.json": b'{"old layout copy": 1}',
    "trainer-audit.md": b"# old audit\n",
}
OLD_LAYOUT = b'{"format": "egf-audit-layout/1", "from": "the earlier run"}'

# The trainer: records what the clean capture recorded, then does what its flags say.
TRAINER = r"""
import gzip, os, pathlib, sys
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
PID = int(args["--pid"])
src, dst = pathlib.Path(args["--data"]), pathlib.Path(os.environ["EGF_CAPTURE_DIR"])
if "--marker" in args:
    pathlib.Path(args["--marker"]).write_text("ran")
record = args.get("--record", "all")
if record in ("all", "init"):
    events = gzip.decompress((src / f"events-{PID}.jsonl.gz").read_bytes())
    if record == "init":
        events = events.splitlines(keepends=True)[0]
    (dst / f"events-{PID}.jsonl").write_bytes(events)
    snapshots = gzip.decompress((src / f"snapshots-{PID}.bin.gz").read_bytes())
    (dst / f"snapshots-{PID}.bin").write_bytes(snapshots)
if args.get("--layout-out"):
    layout = gzip.decompress((src / "layout.json.gz").read_bytes())
    broken = int(args.get("--malformed", "0"))  # how many "{" become "["
    pathlib.Path(args["--layout-out"]).write_bytes(layout.replace(b"{", b"[", broken))
plant = args.get("--plant", "")  # what a careless or hostile command leaves in its folder
if plant.startswith("link:"):
    (dst / plant[5:]).symlink_to(args["--victim"])
elif plant == "moved":
    dst.rename(dst.with_name(dst.name + ".moved"))
    dst.symlink_to(args["--victim"])
sys.exit(int(args.get("--exit", "0")))
"""


def trainer(tmp_path: Path, **flags: str | Path) -> list[str]:
    cmd = [sys.executable, "-c", TRAINER, "--data", str(CLEAN), "--pid", str(PID)]
    for name, value in flags.items():
        cmd += [f"--{name.replace('_', '-')}", str(value)]
    return cmd


def files(folder: Path) -> dict[str, bytes]:
    """Every entry of a folder (not recursing): name -> bytes, a folder as None."""
    return {p.name: None if p.is_dir() else p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture
def fake_recorder(tmp_path, monkeypatch):
    """No toolkit and no GPU: the recorder 'builds' to an existing file and 'loads'."""
    lib = tmp_path / "lib" / "libegf_capture_recorder.so"
    lib.parent.mkdir()
    lib.write_bytes(b"not a library")
    loaded: list[str] = []
    monkeypatch.setattr(capture_command, "build_recorder", lambda: lib)
    monkeypatch.setattr(capture_command, "CDLL", loaded.append)
    return loaded


@pytest.fixture
def earlier(tmp_path):
    """A workspace after an earlier capture: ws/cap (the capture), ws/build/layout.json."""
    ws = tmp_path / "ws"
    (ws / "cap").mkdir(parents=True)
    for name, data in OLD.items():
        (ws / "cap" / name).write_bytes(data)
    (ws / "build").mkdir()
    (ws / "build" / "layout.json").write_bytes(OLD_LAYOUT)
    return ws


def assert_untouched(ws: Path) -> None:
    """The earlier capture and layout file byte for byte, and nothing else beside them."""
    assert files(ws) == {"build": None, "cap": None}
    assert files(ws / "cap") == OLD
    assert files(ws / "build") == {"layout.json": OLD_LAYOUT}


# ---- a complete capture replaces the earlier one ----
def test_a_complete_capture_replaces_the_earlier_one(tmp_path, fake_recorder, earlier):
    layout = earlier / "build" / "layout.json"
    cmd = trainer(tmp_path, layout_out=layout)
    outcome = run_capture(cmd, earlier / "cap", layout)
    assert fake_recorder == [str(tmp_path / "lib" / "libegf_capture_recorder.so")]
    assert files(earlier) == {"build": None, "cap": None}  # no temporary or old folder left
    assert files(earlier / "build") == {"layout.json": LAYOUT}  # the saved copy is gone
    got = files(earlier / "cap")
    assert sorted(got) == [
        f"events-{PID}.jsonl",
        "layout.json",
        "manifest.json",
        f"snapshots-{PID}.bin",
        "trace.jsonl",
    ]
    assert got[f"events-{PID}.jsonl"] == EVENTS
    assert got[f"snapshots-{PID}.bin"] == SNAPSHOTS
    assert got["layout.json"] == LAYOUT
    manifest = json.loads(got["manifest.json"])
    assert manifest["command"] == cmd
    assert manifest["exit_code"] == 0
    assert manifest["layout"] == "layout.json"
    assert [(p["pid"], p["audited"]) for p in manifest["processes"]] == [(PID, True)]
    trace = got["trace.jsonl"].decode().splitlines()
    assert json.loads(trace[0])["scenario"] == "capture"
    assert len(trace) > 500
    # the fields the command line prints
    assert outcome.exit_code == 0 and outcome.wall_s > 0
    assert outcome.processes == manifest["processes"]
    assert outcome.written == [
        earlier / "cap" / name for name in ("layout.json", "trace.jsonl", "manifest.json")
    ]


def test_a_new_folder_is_created_with_the_usual_mode_and_nothing_beside_it(tmp_path, fake_recorder):
    out = tmp_path / "new" / "cap"
    run_capture(trainer(tmp_path), out)
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask  # not mkdtemp's 0700
    assert files(tmp_path / "new") == {"cap": None}
    assert sorted(files(out)) == [
        f"events-{PID}.jsonl",
        "manifest.json",
        f"snapshots-{PID}.bin",
        "trace.jsonl",
    ]
    assert json.loads((out / "manifest.json").read_text())["layout"] is None


def test_an_empty_folder_is_replaced_and_keeps_its_mode(tmp_path, fake_recorder):
    out = tmp_path / "cap"
    out.mkdir()
    out.chmod(0o750)
    run_capture(trainer(tmp_path), out)
    assert stat.S_IMODE(out.stat().st_mode) == 0o750
    assert files(tmp_path) == {"cap": None, "lib": None}


def test_a_command_that_crashes_after_recording_still_replaces_the_capture(
    tmp_path, fake_recorder, earlier
):
    layout = earlier / "build" / "layout.json"
    outcome = run_capture(trainer(tmp_path, layout_out=layout, exit=7), earlier / "cap", layout)
    assert outcome.exit_code == 7
    assert json.loads((earlier / "cap" / "manifest.json").read_text())["exit_code"] == 7
    assert (earlier / "cap" / f"events-{PID}.jsonl").read_bytes() == EVENTS
    assert files(earlier) == {"build": None, "cap": None}
    assert files(earlier / "build") == {"layout.json": LAYOUT}


def test_through_a_symlink_the_folder_it_points_at_is_replaced(tmp_path, fake_recorder, earlier):
    link = tmp_path / "cap-link"
    link.symlink_to(earlier / "cap")
    run_capture(trainer(tmp_path), link)
    assert link.is_symlink() and link.resolve() == earlier / "cap"
    assert (earlier / "cap" / f"events-{PID}.jsonl").read_bytes() == EVENTS
    assert "events-77.jsonl" not in files(earlier / "cap")
    assert files(earlier) == {"build": None, "cap": None}


# ---- a failed run keeps the earlier capture and layout file ----
@pytest.mark.parametrize(
    ("record", "gpu", "words"),
    [
        (
            "none",
            None,  # a GPU the driver reports: the command used no CUDA, or refused the recorder
            "the recorder was not loaded into the command, which exited with code 3",
        ),
        (
            "none",
            "no NVIDIA driver: libcuda.so.1 cannot be loaded",
            "egf-audit capture needs a usable NVIDIA GPU and this machine has none (no NVIDIA "
            "driver: libcuda.so.1 cannot be loaded): the CUDA driver loads the recorder into "
            "the command when it initialises CUDA; the command ran without it and exited with "
            "code 3",
        ),
        ("init", None, "the command recorded no launch at all (it exited with code 3)"),
    ],
)
def test_a_command_that_records_nothing_keeps_the_earlier_capture(
    tmp_path, fake_recorder, earlier, monkeypatch, record, gpu, words
):
    from egf_audit.capture import driver

    monkeypatch.setattr(driver, "no_gpu_reason", lambda: gpu)
    layout = earlier / "build" / "layout.json"
    with pytest.raises(AuditEnvironmentError, match=re.escape(words)) as caught:
        run_capture(trainer(tmp_path, record=record, exit=3), earlier / "cap", layout)
    assert "(exit 3)" not in str(caught.value)  # the command's code, never read as egf-audit's
    assert_untouched(earlier)


def test_the_driver_probe_names_why_there_is_no_gpu(monkeypatch):
    """Asked of libcuda itself: no library, a driver that does not initialise, no device."""
    import ctypes

    from egf_audit.capture import driver

    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(driver.ctypes, "CDLL", missing)
    assert driver.no_gpu_reason() == "no NVIDIA driver: libcuda.so.1 cannot be loaded"

    class Driver:
        def __init__(self, init: int, count: int):
            self.init, self.count = init, count

        def cuInit(self, flags):
            return self.init

        def cuDeviceGetCount(self, out):
            ctypes.cast(out, ctypes.POINTER(ctypes.c_int))[0] = self.count
            return 0

        def cuGetErrorName(self, status, out):
            name = {100: b"CUDA_ERROR_NO_DEVICE"}.get(status)
            ctypes.cast(out, ctypes.POINTER(ctypes.c_char_p))[0] = name
            return 0 if name else 1

    def loads(fake: Driver):
        return lambda name: fake

    for init, count, said in [
        (100, 0, "the CUDA driver does not initialise (cuInit: CUDA_ERROR_NO_DEVICE)"),
        (999, 0, "the CUDA driver does not initialise (cuInit: error 999)"),
        (0, 0, "the CUDA driver reports no device"),
        (0, 2, None),
    ]:
        monkeypatch.setattr(driver.ctypes, "CDLL", loads(Driver(init, count)))
        assert driver.no_gpu_reason() == said


def test_a_missing_layout_file_keeps_the_earlier_capture(tmp_path, fake_recorder, earlier):
    layout = earlier / "build" / "layout.json"
    with pytest.raises(UsageError, match="the command wrote no layout file there"):
        run_capture(trainer(tmp_path), earlier / "cap", layout)
    assert_untouched(earlier)


def test_a_crash_before_the_layout_file_says_how_the_command_ended(
    tmp_path, fake_recorder, earlier
):
    layout = earlier / "build" / "layout.json"
    with pytest.raises(UsageError, match=r"wrote no layout file there \(it exited 9\)"):
        run_capture(trainer(tmp_path, exit=9), earlier / "cap", layout)
    assert_untouched(earlier)


def test_a_malformed_layout_file_keeps_the_earlier_capture_and_the_rejected_file(
    tmp_path, fake_recorder, earlier
):
    layout = earlier / "build" / "layout.json"
    rejected = earlier / "build" / "layout.json.rejected"
    with pytest.raises(UsageError, match="is not JSON") as caught:
        run_capture(trainer(tmp_path, layout_out=layout, malformed=1), earlier / "cap", layout)
    assert f"kept as {rejected}" in str(caught.value)
    assert files(earlier) == {"build": None, "cap": None}
    assert files(earlier / "cap") == OLD
    assert files(earlier / "build") == {
        "layout.json": OLD_LAYOUT,
        "layout.json.rejected": LAYOUT.replace(b"{", b"[", 1),
    }


def test_without_an_earlier_layout_file_a_failed_run_leaves_none_there(
    tmp_path, fake_recorder, earlier
):
    layout = earlier / "build" / "layout.json"
    layout.unlink()
    with pytest.raises(AuditEnvironmentError):
        run_capture(trainer(tmp_path, layout_out=layout, record="init"), earlier / "cap", layout)
    assert files(earlier / "build") == {"layout.json.rejected": LAYOUT}
    assert files(earlier / "cap") == OLD


def test_ctrl_c_during_the_run_keeps_the_earlier_capture(
    tmp_path, fake_recorder, earlier, monkeypatch
):
    layout = earlier / "build" / "layout.json"
    seen: dict[str, object] = {}

    def interrupted(cmd, env, **kwargs):
        # the layout file from before is out of the way while the command runs
        seen["layout during the run"] = os.path.lexists(layout)
        into = Path(env["EGF_CAPTURE_DIR"])
        seen["into"] = into
        (into / f"events-{PID}.jsonl").write_bytes(EVENTS[:1000])
        raise KeyboardInterrupt

    monkeypatch.setattr(capture_command.subprocess, "Popen", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_capture(["trainer"], earlier / "cap", layout)
    into = seen["into"]
    assert into.parent == earlier and into.name.startswith(".cap.egf-capture-tmp")
    assert seen["layout during the run"] is False
    assert_untouched(earlier)


def test_ctrl_c_while_the_trace_is_written_keeps_the_earlier_capture(
    tmp_path, fake_recorder, earlier, monkeypatch
):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(capture_convert, "to_trace", interrupted)
    layout = earlier / "build" / "layout.json"
    with pytest.raises(KeyboardInterrupt):
        run_capture(trainer(tmp_path, layout_out=layout), earlier / "cap", layout)
    assert files(earlier) == {"build": None, "cap": None}
    assert files(earlier / "cap") == OLD
    assert files(earlier / "build") == {"layout.json": OLD_LAYOUT, "layout.json.rejected": LAYOUT}


def test_a_failed_rename_into_place_puts_the_earlier_capture_back(
    tmp_path, fake_recorder, earlier, monkeypatch
):
    rename = os.rename

    def failing(src, dst, **dir_fds):
        if "egf-capture-new" in str(src):  # the complete capture, renamed into place
            raise OSError(28, "No space left on device")
        rename(src, dst, **dir_fds)

    monkeypatch.setattr(capture_command.os, "rename", failing)
    layout = earlier / "build" / "layout.json"
    with pytest.raises(AuditEnvironmentError, match=r"cannot replace .*No space left on device"):
        run_capture(trainer(tmp_path, layout_out=layout), earlier / "cap", layout)
    assert files(earlier) == {"build": None, "cap": None}
    assert files(earlier / "cap") == OLD
    assert files(earlier / "build") == {"layout.json": OLD_LAYOUT, "layout.json.rejected": LAYOUT}


# ---- what --out and --layout may be, refused before the command runs ----
def test_a_folder_of_other_files_is_refused_before_the_command_runs(tmp_path, fake_recorder):
    out = tmp_path / "results"
    out.mkdir()
    (out / "notes.txt").write_bytes(b"mine")
    (out / "manifest.json").write_bytes(b"{}")
    marker = tmp_path / "ran"
    with pytest.raises(UsageError, match=r"--out .*results holds notes\.txt: it is no egf-audit"):
        run_capture(trainer(tmp_path, marker=marker), out)
    assert not marker.exists() and fake_recorder == []
    assert files(out) == {"manifest.json": b"{}", "notes.txt": b"mine"}
    assert files(tmp_path) == {"lib": None, "results": None}


def test_a_capture_folder_with_a_subfolder_is_refused(tmp_path, fake_recorder, earlier):
    (earlier / "cap" / "events-1.jsonl").mkdir()
    marker = tmp_path / "ran"
    with pytest.raises(UsageError, match=r"holds events-1\.jsonl/"):
        run_capture(trainer(tmp_path, marker=marker), earlier / "cap")
    assert not marker.exists()


def test_a_folder_of_only_a_document_is_no_capture(tmp_path, fake_recorder):
    out = tmp_path / "docs"
    out.mkdir()
    (out / "trainer-audit.md").write_bytes(b"# mine\n")
    with pytest.raises(UsageError, match=r"holds no manifest\.json \(an egf-audit capture's"):
        run_capture(trainer(tmp_path, marker=tmp_path / "ran"), out)
    assert not (tmp_path / "ran").exists()
    assert files(out) == {"trainer-audit.md": b"# mine\n"}


def test_a_regular_file_is_refused_before_the_command_runs(tmp_path, fake_recorder):
    out = tmp_path / "capture"
    out.write_bytes(b"a file")
    link = tmp_path / "link"
    link.symlink_to(out)
    for named in (out, link):
        with pytest.raises(UsageError, match=rf"--out {named} is not a folder but a file"):
            run_capture(trainer(tmp_path, marker=tmp_path / "ran"), named)
    assert not (tmp_path / "ran").exists()
    assert out.read_bytes() == b"a file" and link.is_symlink()
    assert files(tmp_path) == {"capture": b"a file", "lib": None, "link": b"a file"}


def test_a_symlink_to_a_folder_of_other_files_is_refused(tmp_path, fake_recorder):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "a.txt").write_bytes(b"a")
    link = tmp_path / "cap"
    link.symlink_to(mine)
    with pytest.raises(UsageError, match=r"holds a\.txt"):
        run_capture(trainer(tmp_path, marker=tmp_path / "ran"), link)
    assert not (tmp_path / "ran").exists() and files(mine) == {"a.txt": b"a"}


def test_the_current_folder_is_refused(tmp_path, fake_recorder, monkeypatch):
    (tmp_path / "cap").mkdir()
    monkeypatch.chdir(tmp_path / "cap")
    with pytest.raises(UsageError, match="holds the current folder"):
        run_capture(trainer(tmp_path, marker=tmp_path / "ran"), Path("."))
    assert not (tmp_path / "ran").exists()


def test_a_layout_file_inside_out_is_refused(tmp_path, fake_recorder, earlier):
    layout = earlier / "cap" / "layout.json"
    with pytest.raises(UsageError, match="is inside --out"):
        run_capture(trainer(tmp_path, layout_out=layout), earlier / "cap", layout)
    assert_untouched(earlier)


def test_the_trainer_runs_with_the_recorder_variables(tmp_path, fake_recorder, monkeypatch):
    seen = {}
    real = subprocess.Popen

    def spy(cmd, env, **kwargs):
        seen.update({k: env[k] for k in env if k.startswith(("EGF_CAPTURE", "CUDA_INJECTION"))})
        return real(cmd, env=env, **kwargs)

    monkeypatch.setattr(capture_command.subprocess, "Popen", spy)
    run_capture(trainer(tmp_path), tmp_path / "cap", None, ("polyak_ema",), 32)
    into = Path(seen.pop("EGF_CAPTURE_DIR"))
    assert into.parent == tmp_path and into.name.startswith(".cap.egf-capture-tmp-")
    assert not into.exists()
    assert seen == {
        "CUDA_INJECTION64_PATH": str(tmp_path / "lib" / "libegf_capture_recorder.so"),
        "EGF_CAPTURE_SNAPSHOT": "polyak_ema",
        "EGF_CAPTURE_VALUES_MAX": "32",
        # not deep: the guard around every kernel egf-audit's table does not decode
        "EGF_CAPTURE_GUARD": "1",
        "EGF_CAPTURE_KNOWN": known_kernels(),
    }
    assert "polyak_ema:8,8,4,8" in seen["EGF_CAPTURE_KNOWN"].split(";")


# ---- nothing of the user's is overwritten or deleted ----
@pytest.mark.parametrize(
    ("held", "says"),
    [
        ({"manifest.json": b'{"name": "my-tool", "version": 3}'}, "no egf-audit capture's"),
        ({"manifest.json": b'{"command": ["make"], "exit_code": 0}'}, '"processes" must be'),
        ({**OLD, "values-2024.binary-report.xlsx": b"PK"}, "holds values-2024.binary-report.xlsx"),
        ({**OLD, "snapshots-old.bin.bak": b"\0"}, "holds snapshots-old.bin.bak"),
        ({**OLD, "events-78.jsonl": b"{}\n"}, "a file of process 78, which manifest.json does not"),
        ({k: v for k, v in OLD.items() if k != "snapshots-77.bin"}, "holds no snapshots-77.bin"),
    ],
    ids=["another-programs", "like-ours", "xlsx", "bak", "unlisted-pid", "without-snapshots"],
)
def test_a_folder_that_is_no_egf_audit_capture_is_refused_and_kept(
    tmp_path, fake_recorder, held, says
):
    out = tmp_path / "out"
    out.mkdir()
    for name, data in held.items():
        (out / name).write_bytes(data)
    with pytest.raises(UsageError, match=r"no egf-audit capture folder.*nothing in it is deleted"):
        try:
            run_capture(trainer(tmp_path, marker=tmp_path / "ran"), out)
        except UsageError as exc:
            assert says in str(exc), exc
            raise
    assert not (tmp_path / "ran").exists() and fake_recorder == []
    assert files(out) == dict(sorted(held.items()))


def test_a_link_in_an_earlier_capture_is_refused_and_its_target_kept(
    tmp_path, fake_recorder, earlier
):
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"mine")
    (earlier / "cap" / "trace.jsonl").unlink()
    (earlier / "cap" / "trace.jsonl").symlink_to(victim)
    with pytest.raises(UsageError, match=r"holds trace\.jsonl, which is no regular file"):
        run_capture(trainer(tmp_path), earlier / "cap")
    assert victim.read_bytes() == b"mine" and (earlier / "cap" / "trace.jsonl").is_symlink()


@pytest.mark.parametrize("name", ["trace.jsonl", "manifest.json", "layout.json", "notes.txt"])
def test_a_file_the_command_plants_in_its_capture_folder_refuses_the_capture(
    tmp_path, fake_recorder, earlier, name
):
    """A link planted where capture writes its own files is never written through: the
    capture is refused, the file it points at and the earlier capture stay as they were."""
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"mine")
    layout = earlier / "build" / "layout.json"
    cmd = trainer(tmp_path, layout_out=layout, plant=f"link:{name}", victim=victim)
    with pytest.raises(
        UsageError, match=rf"the command left {re.escape(name)} in its capture folder \(a link\)"
    ):
        run_capture(cmd, earlier / "cap", layout)
    assert victim.read_bytes() == b"mine"
    assert files(earlier / "cap") == OLD


def test_a_capture_folder_the_command_replaced_by_a_link_is_refused(
    tmp_path, fake_recorder, earlier
):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "results.csv").write_bytes(b"mine")
    with pytest.raises(UsageError, match=r"is no folder now: the command moved it or put a link"):
        run_capture(trainer(tmp_path, plant="moved", victim=victim), earlier / "cap")
    assert files(victim) == {"results.csv": b"mine"}
    assert files(earlier / "cap") == OLD


def test_a_file_put_where_capture_creates_its_own_is_never_written_over(
    tmp_path, fake_recorder, earlier, monkeypatch
):
    """Another process that finds the folder the capture is completed in and puts a file where
    trace.jsonl goes: the capture is refused, the file left as it was put."""
    taken = capture_command.Completed.take_recorded

    def racing(self, recording):
        taken(self, recording)
        (self.path / "trace.jsonl").write_bytes(b"someone else's")

    monkeypatch.setattr(capture_command.Completed, "take_recorded", racing)
    with pytest.raises(
        UsageError, match=r"trace\.jsonl is already in the folder the capture is completed in"
    ):
        run_capture(trainer(tmp_path), earlier / "cap")
    assert files(earlier / "cap") == OLD
    assert sorted(files(earlier)) == ["build", "cap"]  # no folder of the capture left behind


def test_a_completed_folder_moved_before_the_swap_replaces_nothing(
    tmp_path, fake_recorder, earlier, monkeypatch
):
    complete = capture_command._complete

    def moved(command, ran, recording, done, *rest):
        outcome = complete(command, ran, recording, done, *rest)
        done.path.rename(done.path.with_name("elsewhere"))
        done.path.mkdir()  # a folder of the same name, not the one the capture was made in
        return outcome

    monkeypatch.setattr(capture_command, "_complete", moved)
    with pytest.raises(UsageError, match=r"the folder the capture was completed in was moved"):
        run_capture(trainer(tmp_path), earlier / "cap")
    assert files(earlier / "cap") == OLD


def test_a_capture_writes_the_format_mark_and_its_table_of_contents(tmp_path, fake_recorder):
    out = tmp_path / "cap"
    run_capture(trainer(tmp_path), out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == "egf-audit-capture/1"
    (entry,) = manifest["processes"]
    assert entry["pid"] == PID and entry["kernels"] > 700 and entry["snapshots"] > 0
    run_capture(trainer(tmp_path), out)  # an egf-audit capture: replaced


def test_egf_audit_s_own_failure_while_the_command_runs_does_not_kill_it(tmp_path, monkeypatch):
    """An import of egf-audit's own that fails while the traced command runs is raised once the
    command has ended: the user's run is not killed for it."""
    marker = tmp_path / "finished"

    def broken() -> None:
        raise RuntimeError("numpy is broken")

    monkeypatch.setattr(capture_command, "_import_reader", broken)
    command = [sys.executable, "-c", f"import time; time.sleep(0.3); open({str(marker)!r}, 'w')"]
    with pytest.raises(RuntimeError, match="numpy is broken"):
        capture_command._run(command, dict(os.environ))
    assert marker.exists()


def test_ctrl_c_while_the_command_runs_kills_and_reaps_it(tmp_path, monkeypatch):
    started = []

    def interrupted() -> None:
        raise KeyboardInterrupt

    real = subprocess.Popen

    def spy(*args, **kwargs):
        started.append(real(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(capture_command, "_import_reader", interrupted)
    monkeypatch.setattr(capture_command.subprocess, "Popen", spy)
    with pytest.raises(KeyboardInterrupt):
        capture_command._run(["sleep", "30"], dict(os.environ))
    (proc,) = started
    assert proc.returncode is not None and proc.returncode < 0  # killed, and waited for
