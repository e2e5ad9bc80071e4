"""`egf-audit capture -- CMD`: run CMD with the recorder injected and write the capture folder.

The folder holds, per recorded process, `events-<pid>.jsonl` and `snapshots-<pid>.bin` as the
recorder wrote them; `trace.jsonl` (the audited process as `--trace` writes traces);
`layout.json` when `--layout` named the file the trainer writes; and `manifest.json`.

Nothing is lost to a failed run:

- `--out DIR` must be absent, empty, or an earlier capture (a `manifest.json` or
  `events-*.jsonl*`, and only the files a capture and `run --capture` write there, CAPTURE_FILES);
  anything else is refused (UsageError) before CMD runs, since DIR is replaced as a whole.
- The recorder writes into a new hidden folder beside DIR (`.DIR.egf-capture-tmp-*`, on the same
  file system). DIR is replaced only once the capture is complete: the recorder loaded, some
  process recorded launches, the layout file (with `--layout`) exists and loads, and
  `trace.jsonl` and `manifest.json` are written. Then the old DIR is renamed aside, the new one
  renamed into place (the old one renamed back if that fails) and the old one deleted. On every
  other path (an exit-3 or exit-2 error, Ctrl-C, SIGTERM) the temporary folder is removed and
  DIR is as it was. Only SIGKILL or a power loss can leave a hidden `.DIR.egf-capture-*`
  folder (or the saved layout file) behind; DIR itself is never half written.
- The `--layout` file is renamed aside (`.NAME.egf-capture-saved-<pid>`, same folder) before
  CMD runs, so a stale file is never read as the new one. A completed capture deletes the saved
  copy; a failed one puts it back, so the path holds what it held before the run (the earlier
  file, or nothing). A file CMD wrote there during a failed run is kept as `NAME.rejected`.
  The layout file may not lie inside DIR (refused before CMD runs): DIR is replaced as a whole.

**CMD exiting non-zero** (or killed by a signal) after recording launches is a complete capture
of a run that crashed: it replaces DIR, `manifest.json` records the exit code, `run --capture`
fails the capture as incomplete from it, and `egf-audit capture` itself exits with that code.
The events are a faithful record of what the trainer launched up to the crash, and the one
worth reading (and uploading as the CI artifact) to see where it died. Keeping the previous
capture instead would leave a complete, possibly passing capture of an earlier build at DIR,
where a gate that runs anyway (`if: always()`, a script that ignores this exit code) would
judge it in place of the build that crashed: the stale-file mistake the layout file's handling
avoids. A crash before the layout file was written is still a failed capture (exit 2, DIR kept):
without that file the capture is not the one that was asked for.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import stat
import subprocess
import tempfile
import time
from ctypes import CDLL
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path

from egf_audit.errors import AuditEnvironmentError, UsageError, about_option
from egf_audit.outputs.atomic import write_atomic
from egf_audit.runtime.capture_model import ProcessCapture

from . import driver
from .build import build_recorder
from .convert import to_trace
from .events import EVENTS_GLOB, read_capture
from .inference import infer_layout
from .layout import LAYOUT_FILE, load_layout_file, place

DEFAULT_SNAPSHOT = ("sp14_scale_wire_col", "accumulate_d_h_s2_from_concat", "polyak_ema")
MULTIPLE_SUBSCRIBERS = 39  # CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
# What a capture folder may hold: the recorder's files, what run_capture writes, and the
# document `run --capture` wrote into it by default before that default moved out of the
# folder (captures made then still hold it).
CAPTURE_FILES = (
    EVENTS_GLOB,
    "snapshots-*.bin*",
    "values-*.bin*",
    "trace.jsonl",
    "manifest.json",
    LAYOUT_FILE,
    "trainer-audit.md",
)
TMP_MARK = "egf-capture-tmp"  # in the name of the folder a capture is recorded into


@dataclass
class CaptureOutcome:
    exit_code: int  # CMD's own
    wall_s: float
    processes: list[dict] = field(default_factory=list)
    written: list[Path] = field(default_factory=list)


def audited_process(procs: list[ProcessCapture]) -> ProcessCapture:
    """The process that ran the trainer step: the most ABI kernel launches, then the most
    records (a launcher script and its trainer child are both recorded)."""
    abi = ("sp14_dir_concat_qaux", *DEFAULT_SNAPSHOT)
    return max(procs, key=lambda p: (sum(r.name in abi for r in p.kernels()), len(p.records)))


def _environment(
    lib: Path,
    into: Path,
    snapshot: tuple[str, ...],
    values_max: int | None,
    deep: bool,
    deep_values_max: int | None = None,
) -> dict:
    env = dict(os.environ)
    # deep, and how much of it is kept, only as asked here, never inherited
    env.pop("EGF_CAPTURE_DEEP", None)
    env.pop("EGF_CAPTURE_DEEP_VALUES_MAX", None)
    if deep:
        env["EGF_CAPTURE_DEEP"] = "1"
        if deep_values_max is not None:
            env["EGF_CAPTURE_DEEP_VALUES_MAX"] = str(deep_values_max)
    env["CUDA_INJECTION64_PATH"] = str(lib)
    # preloaded too, so that its cublasLtMatmul stands in front of cuBLASLt's and keeps the
    # call's alpha and beta pointers for the log line (cuBLASLt's log never prints them); the
    # driver's injection then finds the library already loaded, one instance
    preload = env.get("LD_PRELOAD", "")
    if str(lib) not in preload.replace(":", " ").split():
        env["LD_PRELOAD"] = f"{lib} {preload}".strip()
    env["EGF_CAPTURE_DIR"] = str(into)
    env["EGF_CAPTURE_SNAPSHOT"] = ",".join(snapshot)
    if values_max is not None:
        env["EGF_CAPTURE_VALUES_MAX"] = str(values_max)
    return env


def _ended(code: int) -> str:
    """How the command ended, worded as the command's own (egf-audit's exit code is 3 here)."""
    return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"


def _diagnose(procs: list[ProcessCapture], code: int) -> None:
    """The exit-3 line when the capture recorded nothing usable. No process at all: the driver
    never loaded the recorder, which is what a machine without a usable GPU gives, so the
    driver is asked whether there is one."""
    if not procs:
        no_gpu = driver.no_gpu_reason()
        if no_gpu is not None:
            raise AuditEnvironmentError(
                f"egf-audit capture needs a usable NVIDIA GPU and this machine has none "
                f"({no_gpu}): the CUDA driver loads the recorder into the command when it "
                f"initialises CUDA; the command ran without it and {_ended(code)}"
            )
        raise AuditEnvironmentError(
            f"the recorder was not loaded into the command, which {_ended(code)}: it "
            "initialised no CUDA (no CUDA use), or the driver refused the injected library"
        )
    for p in procs:
        status = p.init.get("subscribe", 0)
        if status == MULTIPLE_SUBSCRIBERS:
            raise AuditEnvironmentError(
                f"process {p.pid}: CUPTI already has a subscriber (error 39): a profiler, "
                "compute-sanitizer or Nsight holds this process; a capture cannot run beside them"
            )
        if status:
            raise AuditEnvironmentError(f"process {p.pid}: cuptiSubscribe failed ({p.notes[-1:]})")
    if not any(p.records for p in procs):
        raise AuditEnvironmentError(
            f"the command recorded no launch at all (it {_ended(code)}): it never ran GPU work"
        )


# ---- where the capture goes ----
def _is_capture_file(path: Path) -> bool:
    if not any(fnmatchcase(path.name, pattern) for pattern in CAPTURE_FILES):
        return False
    try:
        return not stat.S_ISDIR(path.lstat().st_mode)
    except OSError:
        return False


def capture_target(out: Path) -> Path:
    """The folder a capture of `--out` replaces, after checking that it may: absent, empty, or
    an earlier capture holding nothing else. Raises UsageError naming the path and why.

    A symlink is followed, and the folder it points at is judged and replaced by the same rule
    (the link stays and points at the new capture), as reports are written through a symlink
    (egf_audit.outputs.atomic): replacing the link by a folder would quietly cut off what it was
    set up to point at, and refusing it would refuse `capture -> /scratch/capture` made on
    purpose. A dangling link names the folder to create."""
    target = Path(os.path.realpath(out))
    if target.parent == target:
        raise _out_error(out, ": a capture cannot replace the root folder")
    cwd = Path(os.path.realpath(os.curdir))
    if target == cwd or target in cwd.parents:
        raise _out_error(
            out,
            " holds the current folder, where the command runs; a capture replaces that folder "
            "as a whole: name a folder beside or below it",
        )
    try:
        mode = target.stat().st_mode
        if not stat.S_ISDIR(mode):
            raise _out_error(
                out,
                " is not a folder but a file; a capture writes a folder there: name a new "
                "folder, an empty one, or an earlier capture",
            )
        entries = sorted(target.iterdir())
    except FileNotFoundError:
        return target
    except OSError as exc:
        raise _out_error(out, f": {exc.strerror or exc}") from None
    if not entries:
        return target
    foreign = [p.name + ("/" if p.is_dir() else "") for p in entries if not _is_capture_file(p)]
    if foreign:
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        raise _out_error(
            out,
            f" holds {', '.join(foreign[:3])}{more}: it is no egf-audit capture folder, and a "
            "capture replaces its folder as a whole: name a new or empty folder",
        )
    if not any(p.name == "manifest.json" or fnmatchcase(p.name, EVENTS_GLOB) for p in entries):
        raise _out_error(
            out,
            " holds no manifest.json and no events-*.jsonl: it is no egf-audit capture folder, "
            "and a capture replaces its folder as a whole: name a new or empty folder",
        )
    return target


def _out_error(out: Path, said: str) -> UsageError:
    """`--out OUT<said>`, about the value of --out (a settings file's `capture` names it)."""
    return about_option(UsageError(f"--out {out}{said}"), "out", said.removeprefix(": ").lstrip())


def _check_layout(layout: Path, out: Path, target: Path) -> None:
    where = Path(os.path.realpath(layout.parent)) / layout.name  # the link itself, if one
    if where == target or target in where.parents:
        raise UsageError(
            f"--layout {layout} is inside --out {out}, which a capture replaces as a whole (the "
            f"layout file goes in as {LAYOUT_FILE}): let the command write it outside"
        )
    if where.is_dir():
        raise UsageError(f"--layout {layout} is a folder; name the file the command writes")


def _new_folder_mode(target: Path) -> int:
    """The old capture folder's mode, or what mkdir gives under the umask (mkdtemp gives 0700)."""
    with contextlib.suppress(OSError):
        return stat.S_IMODE(target.stat().st_mode)
    umask = os.umask(0)
    os.umask(umask)
    return 0o777 & ~umask


def _staging_folder(target: Path, out: Path) -> Path:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix=f".{target.name}.{TMP_MARK}-", dir=target.parent))
    except OSError as exc:
        raise AuditEnvironmentError(f"cannot write {out}: {exc.strerror or exc}") from None
    try:
        folder.chmod(_new_folder_mode(target))
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


def _swap(staging: Path, target: Path, out: Path) -> Path | None:
    """Put the complete capture at `target`; returns the old folder, renamed aside, to delete.
    If the new one cannot be renamed into place the old one is put back."""
    try:  # again: the command may have written into DIR, or moved the link, while it ran
        if capture_target(out) != target:
            raise UsageError(f"--out {out} points elsewhere since the command started")
    except UsageError as exc:
        raise UsageError(f"after the command ran: {exc}") from None
    old = None
    try:
        if os.path.lexists(target):
            old = target.with_name(
                f".{target.name}.egf-capture-old-{os.getpid()}-{secrets.token_hex(4)}"
            )
            os.rename(target, old)
        try:
            os.rename(staging, target)
        except BaseException:
            if old is not None:
                os.rename(old, target)
            raise
    except OSError as exc:
        raise AuditEnvironmentError(f"cannot replace {out}: {exc.strerror or exc}") from None
    return old


# ---- the layout file ----
def _rejected(layout: Path) -> Path:
    return layout.with_name(f"{layout.name}.rejected")


def _set_aside(layout: Path) -> Path | None:
    """Rename the layout file from an earlier run aside: the command must write a new one, and
    a stale one (stale addresses) must never be read as it."""
    if not os.path.lexists(layout):
        return None
    saved = layout.with_name(f".{layout.name}.egf-capture-saved-{os.getpid()}")
    try:
        os.replace(layout, saved)
    except OSError as exc:
        raise AuditEnvironmentError(f"cannot move {layout} aside: {exc.strerror or exc}") from None
    return saved


def _put_back(layout: Path, saved: Path | None) -> None:
    """After a failed run: keep what the command wrote as NAME.rejected, restore the earlier."""
    try:
        if os.path.lexists(layout):
            os.replace(layout, _rejected(layout))
        if saved is not None:
            os.replace(saved, layout)
    except OSError as exc:
        kept = f"; the earlier one is kept as {saved}" if saved is not None else ""
        raise AuditEnvironmentError(
            f"cannot put the layout file {layout} back: {exc.strerror or exc}{kept}"
        ) from None


def _copy_layout(layout: Path, folder: Path, code: int) -> None:
    """Check the layout file the command wrote and copy it, byte for byte, into the capture."""
    ended = f" (it exited {code})" if code else ""
    if not os.path.lexists(layout):
        raise UsageError(f"--layout {layout}: the command wrote no layout file there{ended}")
    try:
        load_layout_file(layout)  # refuse a malformed file now, not at `run --capture`
    except UsageError as exc:
        raise UsageError(f"{exc}{ended}; the file is kept as {_rejected(layout)}") from None
    try:
        (folder / LAYOUT_FILE).write_bytes(layout.read_bytes())
    except OSError as exc:
        raise UsageError(f"cannot read layout file {layout}: {exc.strerror or exc}") from None


# ---- the run ----
def _record(
    command: list[str],
    folder: Path,
    layout: Path | None,
    env: dict,
    snapshot: tuple[str, ...],
) -> CaptureOutcome:
    """Run the command into `folder` and complete the capture there."""
    start = time.perf_counter()
    try:
        proc = subprocess.run(command, env=env)
    except OSError as exc:
        raise UsageError(f"cannot run {shlex.join(command)}: {exc.strerror}") from None
    wall = time.perf_counter() - start
    procs = read_capture(folder)
    _diagnose(procs, proc.returncode)
    outcome = CaptureOutcome(proc.returncode, wall)
    main = audited_process(procs)
    if layout is not None:
        _copy_layout(layout, folder, proc.returncode)
        used, _ = place(load_layout_file(folder / LAYOUT_FILE), main)
    else:
        used = infer_layout(main)
    trace = to_trace(main, used, scenario="capture").trace
    write_atomic(folder / "trace.jsonl", "\n".join(trace.to_jsonl()) + "\n")
    outcome.processes = [
        {
            "pid": p.pid,
            "audited": p is main,
            "kernels": len(p.kernels()),
            "gemms": sum(r.kind in ("sgemm", "gemm") for r in p.records),
            "memsets": sum(r.kind == "memset" for r in p.records),
            "copies": sum(r.kind == "copy" for r in p.records),
            "snapshots": len(p.snapshots),
            "notes": p.notes,
        }
        for p in procs
    ]
    manifest = {
        "command": command,
        "exit_code": proc.returncode,
        "wall_s": round(wall, 3),
        "layout": LAYOUT_FILE if layout is not None else None,
        "snapshot_kernels": list(snapshot),
        "deep": env.get("EGF_CAPTURE_DEEP") == "1",
        "processes": outcome.processes,
    }
    write_atomic(folder / "manifest.json", json.dumps(manifest, indent=1) + "\n")
    return outcome


def run_capture(
    command: list[str],
    out: Path,
    layout: Path | None = None,
    snapshot: tuple[str, ...] = DEFAULT_SNAPSHOT,
    values_max: int | None = None,
    deep: bool = False,
    deep_values_max: int | None = None,
) -> CaptureOutcome:
    """Run `command` under the recorder and replace `out` with the capture once it is complete
    (the module docstring says what is kept when it is not)."""
    if not command:
        raise UsageError("capture needs a command after `--`")
    out = Path(out)
    target = capture_target(out)
    if layout is not None:
        layout = Path(layout)
        _check_layout(layout, out, target)
    lib = build_recorder()
    try:
        CDLL(str(lib))  # the driver would refuse it silently; refuse it loudly here
    except OSError as exc:
        raise AuditEnvironmentError(f"the capture recorder does not load: {exc}") from None
    staging = _staging_folder(target, out)
    try:
        saved = _set_aside(layout) if layout is not None else None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        env = _environment(lib, staging, snapshot, values_max, deep, deep_values_max)
        outcome = _record(command, staging, layout, env, snapshot)
        old = _swap(staging, target, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if layout is not None:
            _put_back(layout, saved)
        raise
    # Complete. An interruption from here on leaves at most the old folder or the saved layout
    # file behind, both hidden; the new capture is in place.
    if saved is not None:
        with contextlib.suppress(OSError):
            saved.unlink()
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    outcome.written = [out / name for name in ("trace.jsonl", "manifest.json")]
    if layout is not None:
        outcome.written.insert(0, out / LAYOUT_FILE)
    return outcome
