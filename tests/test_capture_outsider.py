"""The outsider trainer (tests/data/capture/outsider: an SP14 trainer written from the docs alone,
its own helper kernels handed `const` pointers into target_params and d_h_s2, params, grads and
Adam state in one allocation, activations in one pool) captured on the CPU by `egf-audit capture
--cpu`, unmodified, and judged as any trainer's capture is.

Its clean run must pass every decidable invariant in the default capture (the guards around its
own kernels decide EGF002/5/6/7/8) and in the deep one; each fault it can express must fail with
the catalogue's codes (its README's table). The guard's evidence is tested both ways: a guard
that shows a write into target_params fails EGF005, and a capture without its guards fails
closed on step 0, where no snapshot proves the target unchanged. Each capture made here must
also give, invariant by invariant, the status the same capture got on a GPU (the committed
recording, recorded/verdicts.jsonl.gz).
"""

from __future__ import annotations

import json
import shutil
from functools import cache
from pathlib import Path

import pytest
from cpu_standins import OUTSIDER, artifact

from egf_audit.capture.cpu_capture import run_cpu_capture
from egf_audit.cli.capture_audit import audit_capture
from egf_audit.errors import UsageError

pytestmark = pytest.mark.skipif(
    shutil.which("nvcc") is None, reason="nvcc is not on PATH: the outsider is built with it"
)

EXPECTED = json.loads((OUTSIDER / "expected.json").read_text(encoding="utf-8"))
# what each capture of the outsider fails, with its layout file: its README's table ("expected
# (default, layout)"; `--deep` adds EGF010 where the numbers differ from its oracle's)
FAILS: dict[str, frozenset[str]] = {k: frozenset(v) for k, v in EXPECTED["fails"].items()}
# what the default capture structurally cannot decide (no adam_update; not deep)
UNDECIDED = {mode: set(codes) for mode, codes in EXPECTED["undecided"].items()}


@cache
def checker():
    """check_verdicts.py, the GPU recording's checker (.ci/gpu's outsider part), as a module."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_verdicts", OUTSIDER / "check_verdicts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@cache
def recorded_lines() -> tuple[dict, ...]:
    """The committed GPU recording's audits, read once."""
    check = checker()
    return tuple(check.read_lines(check.RECORDED))


def _gpu_statuses(mode: str, fault: str) -> dict[str, str]:
    """What the GPU machine's audit of the same capture (with its layout file) gave."""
    mode_and_fault = checker()._mode_and_fault
    (line,) = [
        x
        for x in recorded_lines()
        if x["layout"] == "file" and mode_and_fault(x["capture"]) == (mode, fault)
    ]
    (process,) = line["processes"]
    return {code: status for code, (status, _) in process["verdicts"].items()}


@cache
def _capture(mode: str, fault: str, root: str) -> Path:
    out = Path(root) / f"{mode}-{fault}"
    layout = Path(root) / f"{mode}-{fault}.layout.json"
    command = [str(artifact("outsider") / "outsider"), "--kernels", str(OUTSIDER / "kernels")]
    command += ["--layout-out", str(layout)] + ([] if fault == "clean" else ["--fault", fault])
    outcome = run_cpu_capture(command, out, None, layout, deep=mode == "deep")
    assert outcome.exit_code == 0, outcome
    return out


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("outsider"))


def _statuses(folder: Path) -> dict[str, str]:
    (process,) = audit_capture(folder, use_layout=True).processes
    return {code: v.status for code, v in process.verdicts}


@pytest.mark.parametrize("mode", ["default", "deep"])
def test_the_clean_outsider_passes_every_decidable_invariant(root: str, mode: str) -> None:
    statuses = _statuses(_capture(mode, "clean", root))
    assert {c for c, s in statuses.items() if s != "pass"} == UNDECIDED[mode], statuses
    assert {c for c, s in statuses.items() if s == "undecided"} == UNDECIDED[mode]
    assert statuses == _gpu_statuses(mode, "clean")


@pytest.mark.parametrize("fault", sorted(set(FAILS) - {"clean"}))
def test_each_outsider_fault_fails_with_its_catalogue_codes(root: str, fault: str) -> None:
    statuses = _statuses(_capture("default", fault, root))
    assert {c for c, s in statuses.items() if s == "fail"} == FAILS[fault], statuses
    assert statuses == _gpu_statuses("default", fault)


@pytest.mark.parametrize("fault", sorted(EXPECTED["fails_deep"]))
def test_a_deep_capture_decides_what_the_default_one_fails_closed_on(root: str, fault: str) -> None:
    statuses = _statuses(_capture("deep", fault, root))
    failing = {c for c, s in statuses.items() if s == "fail"}
    want = set(EXPECTED["fails_deep"][fault])
    assert want <= failing <= want | set(EXPECTED["deep_may_add"]), statuses
    assert FAILS[fault] - want, "fails_deep lists only what --deep decides otherwise"
    assert all(statuses[c] == "pass" for c in FAILS[fault] - want), statuses
    assert statuses == _gpu_statuses("deep", fault)


def test_its_runtime_api_mode_is_refused_by_name_under_cpu(root: str) -> None:
    """--api runtime loads its kernels with cudaLibraryLoadData, which --cpu does not model
    (docs/capture.md): one refusal naming the call, never a capture judged without them."""
    layout = Path(root) / "runtime.layout.json"
    command = [str(artifact("outsider") / "outsider"), "--kernels", str(OUTSIDER / "kernels")]
    command += ["--layout-out", str(layout), "--api", "runtime"]
    with pytest.raises(UsageError, match="called cudaLibraryLoadData, which --cpu does not run"):
        run_cpu_capture(command, Path(root) / "runtime", None, layout, deep=False)


def _events(folder: Path) -> Path:
    (events,) = folder.glob("events-*.jsonl")
    return events


def _edited(root: str, tmp_path: Path, edit) -> Path:
    """The default clean capture, copied, its events file rewritten line by line by `edit`
    (None drops the line), the manifest's counts left as recorded."""
    copy = tmp_path / "edited"
    shutil.copytree(_capture("default", "clean", root), copy)
    events = _events(copy)
    lines = [edit(json.loads(line)) for line in events.read_text().splitlines()]
    events.write_text("".join(json.dumps(e) + "\n" for e in lines if e is not None))
    return copy


def test_the_bias_kernels_are_guarded_and_write_nothing_of_the_target(root: str) -> None:
    folder = _capture("default", "clean", root)
    events = [json.loads(line) for line in _events(folder).read_text().splitlines()]
    names = {e["seq"]: e["name"] for e in events if e["ev"] == "kernel"}
    guards = [e for e in events if e["ev"] == "guard"]
    guarded = {names[g["launch"]] for g in guards}
    assert "dqn_bias_forward" in guarded
    assert "polyak_ema" not in guarded  # a kernel egf-audit knows is judged by its contract
    assert all(g["compared"] for g in guards)


def test_a_guard_that_shows_a_write_into_the_target_fails_egf005(root: str, tmp_path) -> None:
    layout = json.loads(next(_capture("default", "clean", root).glob("layout*.json")).read_text())
    target = layout["buffers"]["target_params"]["address"]
    seen = []

    def edit(event: dict) -> dict:
        # the first guard that compared the target's allocation now shows 4 bytes of it changed
        if event["ev"] == "guard" and not seen:
            holding = [b for b, n in event["compared"] if b <= target < b + n]
            if holding:
                seen.append(event["launch"])
                event["changed"] = sorted([*event["changed"], [target, 4]])
        return event

    statuses = _statuses(_edited(root, tmp_path, edit))
    assert seen
    assert statuses["EGF005"] == "fail"


def test_without_its_guards_the_target_forward_fails_closed(root: str, tmp_path) -> None:
    folder = _edited(root, tmp_path, lambda e: None if e["ev"] == "guard" else e)
    (process,) = audit_capture(folder, use_layout=True).processes
    verdict = dict(process.verdicts)["EGF005"]
    assert verdict.status == "fail"
    assert "neither an observation of the launch nor a snapshot" in verdict.summary


# ---- the GPU recording's checker (.ci/gpu's outsider part), on recordings made up here ----
def _line(capture: str, failing: set[str], undecided: set[str] = frozenset()) -> dict:
    codes = [f"EGF{i:03d}" for i in range(1, 14)]
    status = {
        c: "fail" if c in failing else "undecided" if c in undecided else "pass" for c in codes
    }
    verdicts = {c: [s, "words"] for c, s in status.items()}
    return {"capture": capture, "layout": "file", "processes": [{"verdicts": verdicts}]}


def _recording(mode_prefix: str, deep: bool) -> list[dict]:
    mode = "deep" if deep else "default"
    lines = []
    for fault, codes in FAILS.items():
        undecided = UNDECIDED[mode] if fault == "clean" else set()
        if deep:
            codes = EXPECTED["fails_deep"].get(fault, codes)
        failing = set(codes) | ({"EGF010"} if deep and fault != "clean" else set())
        lines.append(_line(f"{mode_prefix}{fault}", failing, undecided))
    return lines


def test_the_gpu_checker_passes_a_recording_as_expected_and_fails_each_departure() -> None:
    check = checker()
    good = _recording("out-", False) + _recording("out-deep-", True) + _recording("out-rt-", False)
    assert check.problems(good) == []
    wrong = [dict(x) for x in good]
    wrong[1] = _line("out-fwd-k-sh2", {"EGF011"})  # EGF001 no longer fails
    assert any("out-fwd-k-sh2" in p for p in check.problems(wrong))
    assert any("no recording of dw-k-sh2" in p for p in check.problems(good[:2] + good[3:]))
    too_many = [*good, _line("out-rt-clean-2", set())]
    assert any("no expectation" in p for p in check.problems(too_many))
    undecided = good[: -len(FAILS)] + _recording("out-rt-", True)  # EGF010 added outside --deep
    assert check.problems(undecided)
    assert check.problems([]) == ["no capture recorded with its layout file"]
    # --deep failing closed where its memory history decides (fails_deep) is a departure too
    name = "out-deep-accumulate-wire-col"
    closed = [
        _line(name, FAILS["accumulate-wire-col"]) if x["capture"] == name else x for x in good
    ]
    assert [p for p in check.problems(closed) if name in p]
