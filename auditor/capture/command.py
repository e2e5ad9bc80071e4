"""`egf-audit capture -- CMD`: run CMD with the recorder injected and write the capture folder.

The folder holds, per recorded process, `events-<pid>.jsonl` and `snapshots-<pid>.bin` (and, for
`--deep` with values, `values-<pid>.bin`, dropped once the command has ended for a process that
launched no ABI kernel, whose values no invariant reads: manifest.values_dropped) as the
recorder wrote them; `trace.jsonl` (the audited process as `--trace` writes traces);
`layout.json` when `--layout` named the file the trainer writes; and `manifest.json`, the table
of contents `run --capture` holds the folder to.

Nothing is lost to a failed run, and nothing of the user's is overwritten (capture/destination.py
says where a capture is recorded, completed and swapped in):

- `--out DIR` must be absent, empty, or an earlier egf-audit capture holding only what its
  manifest lists; anything else is refused (UsageError) before CMD runs, and nothing in it is
  deleted.
- DIR is replaced only once the capture is complete: the recorder loaded, some process recorded
  launches, the layout file (with `--layout`) exists and loads, and `trace.jsonl` and
  `manifest.json` are written (never through a link: a file the command planted refuses the
  capture). Then the old DIR is renamed aside, the new one renamed into place (the old one
  renamed back if that fails) and the old one deleted. On every other path (an exit-3 or exit-2
  error, Ctrl-C, SIGTERM) the temporary folders are removed and DIR is as it was. Only SIGKILL
  or a power loss can leave a hidden `.DIR.egf-capture-*` folder (or the saved layout file)
  behind; DIR itself is never half written.
- The `--layout` file is renamed aside (`.NAME.egf-capture-saved-<pid>`, same folder) before
  CMD runs, so a stale file is never read as the new one. A completed capture deletes the saved
  copy; a failed one puts it back, so the path holds what it held before the run (the earlier
  file, or nothing). A file CMD wrote there during a failed run is kept as `NAME.rejected`.
  The layout file may not lie inside DIR (refused before CMD runs): DIR is replaced as a whole.
  It is read as `--config` is (a regular file, at most 16 MiB, opened without blocking).

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
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from ctypes import CDLL
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from egf_audit.errors import AuditEnvironmentError, UsageError
from egf_audit.kernels import KERNELS_BY_NAME
from egf_audit.small_files import read_small_bytes

from . import driver
from .build import build_recorder
from .destination import Completed, capture_target, check_layout_path, staged, swap
from .folder import TRACE_FILE
from .kernel_params import param_size
from .layout import LAYOUT_FILE, MAX_LAYOUT_BYTES, parse_layout, place
from .manifest import (
    MANIFEST_FILE,
    audited_process,
    manifest_document,
    process_entries,
    values_dropped,
)

if TYPE_CHECKING:
    from egf_audit.trace.process import ProcessCapture

DEFAULT_SNAPSHOT = ("sp14_scale_wire_col", "accumulate_d_h_s2_from_concat", "polyak_ema")
MULTIPLE_SUBSCRIBERS = 39  # CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED


@dataclass(frozen=True)
class Platform:
    """What a capture runs the command on besides NVIDIA's libraries (`capture --cpu`,
    capture/cpu_capture.py): what it adds to the command's environment, a check once the command
    has run (it raises UsageError, and --out is kept as it was, when the capture must not stand),
    and what the manifest says of it."""

    environment: Callable[[dict], None]
    after: Callable[[], None]
    manifest: dict = field(default_factory=dict)


@dataclass
class CaptureOutcome:
    exit_code: int  # CMD's own
    wall_s: float
    processes: list[dict] = field(default_factory=list)
    written: list[Path] = field(default_factory=list)


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
    for name in ("EGF_CAPTURE_DEEP", "EGF_CAPTURE_DEEP_VALUES_MAX", "EGF_CAPTURE_GUARD"):
        env.pop(name, None)
    # without --deep, what an unknown kernel's launch changed in the allocations it is handed
    # (rec_guard.c): the evidence the invariants that fail closed on such a kernel read
    env["EGF_CAPTURE_GUARD"] = "0" if deep else "1"
    env["EGF_CAPTURE_KNOWN"] = known_kernels()
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


def known_kernels() -> str:
    """egf-audit's kernel table as the recorder reads it (`name:8,8,4;...`): a launch whose name
    and parameter sizes match an entry is decoded by the reader and judged by its contract, so
    the recorder keeps no guard around it."""
    return ";".join(
        f"{name}:{','.join(str(param_size(ctype)) for _, ctype in spec.params)}"
        for name, spec in sorted(KERNELS_BY_NAME.items())
    )


def _ended(code: int) -> str:
    """How the command ended, worded as the command's own (egf-audit's exit code is 3 here)."""
    return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"


def _diagnose(procs: list[ProcessCapture], code: int, ask_driver: bool = True) -> None:
    """The exit-3 line when the capture recorded nothing usable. No process at all: the driver
    never loaded the recorder, which is what a machine without a usable GPU gives, so the
    driver is asked whether there is one (not on a Platform's own driver: `--cpu`)."""
    if not procs:
        no_gpu = driver.no_gpu_reason() if ask_driver else None
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


def _layout_bytes(layout: Path, code: int) -> tuple[bytes, Path]:
    """The layout file the command wrote, read as `--config` is and checked now (not at
    `run --capture`): its bytes, copied byte for byte into the capture."""
    ended = f" (it exited {code})" if code else ""
    if not os.path.lexists(layout):
        raise UsageError(f"--layout {layout}: the command wrote no layout file there{ended}")
    try:
        data = read_small_bytes(layout, "layout file", limit=MAX_LAYOUT_BYTES)
        parse_layout(data, layout)
    except UsageError as exc:
        raise UsageError(f"{exc}{ended}; the file is kept as {_rejected(layout)}") from None
    return data, layout


# ---- the run ----
def _import_reader() -> None:
    """Import what reads the capture once the command has ended (the event reader, numpy, the
    conversion to a trace): done while the command runs, this fixed cost is not added to it."""
    from . import convert, events, inference  # noqa: F401


def _run(command: list[str], env: dict) -> tuple[int, float]:
    """Run the command: its exit code (as subprocess gives it) and its wall time. As
    subprocess.run does, Ctrl-C (after the command's own brief chance to end) or a termination
    kills the command before it is raised; an import of egf-audit's own that fails meanwhile is
    raised once the command has ended, never at the cost of the user's run."""
    start = time.perf_counter()
    try:
        proc = subprocess.Popen(command, env=env)
    except OSError as exc:
        raise UsageError(f"cannot run {shlex.join(command)}: {exc.strerror}") from None
    failed: Exception | None = None
    with proc:
        try:
            try:
                _import_reader()
            except Exception as exc:  # egf-audit's own failure: the command runs to its end
                failed = exc
            code = proc.wait()
        except KeyboardInterrupt:
            # Ctrl-C reached the command too: its brief chance to end (Popen.wait gives it
            # where the interrupt lands inside it), then the kill
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.25)
            proc.kill()
            raise
        except BaseException:
            proc.kill()
            raise
    if failed is not None:
        raise failed
    return code, time.perf_counter() - start


def _complete(
    command: list[str],
    ran: tuple[int, float],
    recording: Path,
    done: Completed,
    layout: Path | None,
    env: dict,
    snapshot: tuple[str, ...],
    platform: Platform | None = None,
) -> CaptureOutcome:
    """Complete the capture the command recorded into `recording`, in `done`."""
    from .convert import to_trace
    from .events import read_capture
    from .inference import infer_layout

    code, wall = ran
    done.take_recorded(recording)
    procs = read_capture(done.path)
    _diagnose(procs, code, ask_driver=platform is None)
    for p in procs:
        if values_dropped(p):
            done.drop(f"values-{p.pid}.bin")
    outcome = CaptureOutcome(code, wall)
    main = audited_process(procs)
    if layout is not None:
        data, named = _layout_bytes(layout, code)
        done.write_new(LAYOUT_FILE, data)
        used, _ = place(parse_layout(data, named), main)
    else:
        used = infer_layout(main)
    trace = to_trace(main, used, scenario="capture")
    done.write_new(TRACE_FILE, ("\n".join(trace.to_jsonl()) + "\n").encode("utf-8"))
    outcome.processes = process_entries(procs, main)
    manifest = manifest_document(
        command,
        code,
        wall,
        layout is not None,
        snapshot,
        env.get("EGF_CAPTURE_DEEP") == "1",
        outcome.processes,
        platform.manifest if platform is not None else None,
    )
    done.write_new(MANIFEST_FILE, (json.dumps(manifest, indent=1) + "\n").encode("utf-8"))
    return outcome


def run_capture(
    command: list[str],
    out: Path,
    layout: Path | None = None,
    snapshot: tuple[str, ...] = DEFAULT_SNAPSHOT,
    values_max: int | None = None,
    deep: bool = False,
    deep_values_max: int | None = None,
    platform: Platform | None = None,
) -> CaptureOutcome:
    """Run `command` under the recorder and replace `out` with the capture once it is complete
    (the module docstring says what is kept when it is not)."""
    if not command:
        raise UsageError("capture needs a command after `--`")
    out = Path(out)
    target = capture_target(out)
    if layout is not None:
        layout = Path(layout)
        check_layout_path(layout, out, target)
    lib = build_recorder()
    try:
        CDLL(str(lib))  # the driver would refuse it silently; refuse it loudly here
    except OSError as exc:
        raise AuditEnvironmentError(f"the capture recorder does not load: {exc}") from None
    with staged(target, out) as recording:
        saved = _set_aside(layout) if layout is not None else None
        done: Completed | None = None
        try:
            env = _environment(lib, recording, snapshot, values_max, deep, deep_values_max)
            if platform is not None:
                platform.environment(env)
            ran = _run(command, env)
            if platform is not None:
                platform.after()
            done = Completed(target, out)  # made now: the command never learns its name
            outcome = _complete(command, ran, recording, done, layout, env, snapshot, platform)
            old = swap(done, target, out)
        except BaseException:
            if done is not None:
                done.remove()
            if layout is not None:
                _put_back(layout, saved)
            raise
        done.close()
    # Complete. An interruption from here on leaves at most the old folder or the saved layout
    # file behind, both hidden; the new capture is in place.
    if saved is not None:
        with contextlib.suppress(OSError):
            saved.unlink()
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    outcome.written = [out / name for name in (TRACE_FILE, MANIFEST_FILE)]
    if layout is not None:
        outcome.written.insert(0, out / LAYOUT_FILE)
    return outcome
