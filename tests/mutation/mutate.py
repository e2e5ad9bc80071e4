"""Mutation testing of the invariant checks and the capture checks (docs/mutation-score.md).

    python tests/mutation/mutate.py list                      # every mutant, numbered
    python tests/mutation/mutate.py selftest                  # the harness sees no unmutated change
    python tests/mutation/mutate.py run [--jobs 2] [--only M0001,M0002] [--out FILE]
    python tests/mutation/mutate.py report FILE               # the score and the survivors

The mutants (tests/mutation/operators.py) edit the deciding code of invariants/*.py and of
auditor/capture/{layout,inference,convert}.py, auditor/trace/{observed,evidence}.py and
auditor/cli/capture_audit.py in memory; no file is written but `--out`
and the inputs under a temporary folder. pytest is not run per mutant: the inputs the test
suite judges are built once, their verdicts recorded, and each mutant is judged in a forked
child:

- the rebuild: the ci preset's clean AuditRun (both modes, 2 steps), one per fault of
  `egf_audit.scenarios.faults.FAULTS` (as tests/test_registries.py builds them), the clean run
  without launches and without checkpoints/snapshots, and a run without traces;
- captures: every committed fixture of tests/data/capture with its layout file and without it,
  every lie of tests/data/capture/lies.py (without the layout file where it is visible so), and
  the CPU capture (tests/cpu_capture.py) of the clean stand-in and of every fault, with and
  without the layout file.

The child re-executes the mutated module's tree in the module's own namespace, then every
module of the targets that imports it (the registry `egf_audit.invariants` last among the
invariants, `egf_audit.cli.capture_audit` after the capture modules), so INVARIANTS holds the
mutated checks, and recomputes what the mutant can change: the rebuild verdicts and capture
verdicts of the invariants whose modules depend on the mutated one (on the recorded captures'
capture traces), or, for a capture module, the whole `audit_capture` of every capture (its
events read once, before). A mutant is KILLED when any verdict status, any audit outcome
(refused, incomplete, no trainer) differs from the original, or an exception escapes where the
original had none; it SURVIVES otherwise.
"""

from __future__ import annotations

import os

# one thread each: the children run two at a time on a 2-core runner, and OpenMP's busy
# waiting (and its thread pool after a fork) must not stall them
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import ast  # noqa: E402
import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import gzip  # noqa: E402
import hashlib  # noqa: E402
import importlib  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections import Counter  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(HERE), str(ROOT / "tests")]

import numpy as np  # noqa: E402
from operators import CAPTURE_MODULES, TARGETS, Mutant, all_mutants  # noqa: E402

MODES = ("sentinel", "live")
MUTANT_TIMEOUT_S = 300  # a child that runs longer is killed (and the mutant counts as killed)


# ---- the targets as modules ----
def _check_targets_are_imported_from_here() -> None:
    """The mutants are made from this checkout's files: the installed `egf_audit` must be
    this checkout, or the harness would judge other code than it mutates."""
    for file, module in TARGETS:
        loaded = Path(importlib.import_module(module).__file__).resolve()
        if loaded != (ROOT / file).resolve():
            sys.exit(f"{module} is imported from {loaded}, not from {ROOT / file}")


def _imports(file: str) -> set[str]:
    """The target modules a target imports (anywhere in it, relative imports resolved)."""
    tree = ast.parse((ROOT / file).read_text(encoding="utf-8"))
    module = dict(TARGETS)[file]
    package = module if file.endswith("__init__.py") else module.rsplit(".", 1)[0]
    names = {m for _, m in TARGETS}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            found |= {base} & names
            found |= {f"{base}.{a.name}" for a in node.names} & names
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names} & names
    found.discard(module)
    return found


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    """(module -> the target modules that import it, transitively), and an import order."""
    imports = {module: _imports(file) for file, module in TARGETS}
    order: list[str] = []

    def visit(m: str, stack: tuple[str, ...] = ()) -> None:
        if m in order:
            return
        if m in stack:
            raise RuntimeError(f"import cycle: {(*stack, m)}")
        for dep in sorted(imports[m]):
            visit(dep, (*stack, m))
        order.append(m)

    for _, m in TARGETS:
        visit(m)
    dependents: dict[str, set[str]] = {m: set() for m in imports}
    for m, deps in imports.items():
        for dep in deps:
            dependents[dep].add(m)
    changed = True  # closed: an importer of an importer depends too
    while changed:
        changed = False
        for ds in dependents.values():
            more = set().union(*(dependents[d] for d in ds)) - ds if ds else set()
            if more:
                ds |= more
                changed = True
    return dependents, order


# ---- the inputs ----
@dataclasses.dataclass
class Inputs:
    # name -> (AuditRun, the modes judged, the codes judged or None for all)
    runs: dict[str, tuple[Any, tuple[str, ...], frozenset[str] | None]]
    captures: dict[str, tuple[Path, bool]]  # name -> (folder, use the layout file)
    read: dict[Path, Any]  # folder -> read_capture's processes, or the UsageError it raised
    not_built: dict[str, str]  # inputs that could not be built, and why
    seconds: dict[str, float]
    # capture name -> (module, attribute, value) set while it is audited (a survivor case's)
    settings: dict[str, tuple[tuple[str, str, Any], ...]] = dataclasses.field(default_factory=dict)


def _load_lies():
    path = ROOT / "tests" / "data" / "capture" / "lies.py"
    spec = importlib.util.spec_from_file_location("capture_lies", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _without_layout(folder: Path, out: Path) -> Path:
    """A CPU capture as `egf-audit capture` without --layout writes it (test_capture_faults)."""
    shutil.copytree(folder, out)
    (out / "layout.json").unlink()
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["layout"] = None
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return out


def _rebuild_runs() -> tuple[dict[str, tuple[Any, tuple[str, ...], frozenset[str] | None]], tuple]:
    from egf_audit.pipeline.config import preset_config
    from egf_audit.runtime.backends import select_backend
    from egf_audit.runtime.kernel_sources import load_kernel_set
    from egf_audit.scenarios.audit import Auditor
    from egf_audit.scenarios.faults import FAULTS
    from egf_audit.trace.audit_run import AuditRun

    config, kernels = preset_config("ci"), load_kernel_set()
    backend = select_backend("cpu", kernels)
    clean = Auditor(config, backend, steps=2).run(MODES)

    def damaged(what: str):  # tests/test_registries.py `without`
        def damage(trace):
            if what == "launches":
                return dataclasses.replace(trace, launches=[])
            kept = [x for x in trace.launches if x.kind != "checkpoint"]
            return dataclasses.replace(trace, launches=kept, snapshots={})

        return dataclasses.replace(clean, traces={n: damage(t) for n, t in clean.traces.items()})

    # faults first: a mutant that changes a verdict most often changes a fault's
    runs: dict[str, tuple[Any, tuple[str, ...], frozenset[str] | None]] = {}
    for fault in FAULTS:
        faulty = select_backend("cpu", fault.apply_kernels(kernels)) if fault.patch else backend
        run = Auditor(config, faulty, fault.wiring, steps=2).run(MODES)
        runs[f"fault:{fault.name}"] = (run, MODES, None)
    runs["clean"] = (clean, MODES, None)
    runs["clean-without-launches"] = (damaged("launches"), MODES, None)
    runs["clean-without-snapshots"] = (damaged("snapshots"), MODES, None)
    runs["no-traces"] = (AuditRun(config, MODES, 2), MODES, None)
    # tests/test_invariants_core.py: EGF001-EGF006 in sentinel mode with every checkpoint lost
    # in turn, and in live mode on a run without live traces
    core = frozenset(f"EGF00{i}" for i in range(1, 7))
    names = sorted({key[1] for trace in clean.traces.values() for key in trace.snapshots})
    for name in names:
        kept = {
            n: dataclasses.replace(
                t, snapshots={k: v for k, v in t.snapshots.items() if k[1] != name}
            )
            for n, t in clean.traces.items()
        }
        lost = dataclasses.replace(clean, traces=kept)
        runs[f"clean-without-checkpoint:{name}"] = (lost, ("sentinel",), core)
    sentinel_only = dataclasses.replace(
        clean,
        modes=("sentinel",),
        scenarios={k: s for k, s in clean.scenarios.items() if s.mode != "live"},
    )
    runs["sentinel-only"] = (sentinel_only, ("live",), core)
    # tests/rebuild_damages.py: each shared rule's rebuild branch, on launches whose values
    # cannot show the damage
    from rebuild_damages import DAMAGES
    from rebuild_damages import damaged as damaged_by

    for name, (damage, code) in DAMAGES.items():
        runs[f"damaged:{name}"] = (damaged_by(clean, damage), MODES, frozenset({code}))
    return runs, (clean, config, kernels, backend)


def build_inputs(scratch: Path, survivor_tests: bool = True) -> Inputs:
    from cpu_capture import capture_standin

    from egf_audit.capture.events import read_capture
    from egf_audit.errors import UsageError
    from egf_audit.scenarios.faults import FAULTS

    seconds: dict[str, float] = {}
    start = time.perf_counter()
    runs, context = _rebuild_runs()
    seconds["rebuild runs"] = time.perf_counter() - start

    captures: dict[str, tuple[Path, bool]] = {}
    not_built: dict[str, str] = {}
    data = ROOT / "tests" / "data" / "capture"
    # every committed capture folder, nested ones too (the deep catalogue, the runtime-API,
    # outsider and llm.c recordings): the outsider's own kernels are what the guard evidence and
    # a deep capture's observed effects (trace/evidence.py, trace/observed.py) are read for
    for folder in sorted(m.parent for m in data.rglob("manifest.json")):
        name = folder.relative_to(data).as_posix()
        captures[f"fixture:{name}:layout"] = (folder, True)
        captures[f"fixture:{name}:inferred"] = (folder, False)

    # what other capture tests build from the fixtures: the clean capture cut off mid-line
    # (tests/test_capture_gate.py), a layout file without dims (tests/test_capture.py)
    cut = scratch / "extra" / "clean-cut-off"
    shutil.copytree(data / "clean", cut)
    (events,) = cut.glob("events-*.jsonl.gz")
    events.write_bytes(gzip.compress(gzip.decompress(events.read_bytes())[:-30]))
    captures["extra:clean-cut-off:layout"] = (cut, True)
    no_dims = scratch / "extra" / "dw-k-sh2-layout-without-dims"
    shutil.copytree(data / "dw-k-sh2", no_dims)
    doc = json.loads(gzip.decompress((no_dims / "layout.json.gz").read_bytes()))
    del doc["dims"]
    (no_dims / "layout.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    captures["extra:dw-k-sh2-layout-without-dims:layout"] = (no_dims, True)
    # a folder without a capture (tests/test_capture.py), the clean capture without its manifest
    (scratch / "extra" / "empty").mkdir()
    captures["extra:empty:layout"] = (scratch / "extra" / "empty", True)
    no_manifest = scratch / "extra" / "clean-without-manifest"
    shutil.copytree(data / "clean", no_manifest)
    (no_manifest / "manifest.json").unlink()
    captures["extra:clean-without-manifest:layout"] = (no_manifest, True)

    start = time.perf_counter()
    try:
        lies = _load_lies()
    except Exception as exc:  # a catalogue being edited: say so, judge the rest
        not_built["lies.py"] = f"{type(exc).__name__}: {exc}"
        lies = None
    for slug, (_, _, needs_layout) in lies.LIES.items() if lies else []:
        for with_layout in (True,) if needs_layout else (True, False):
            how = "layout" if with_layout else "inferred"
            try:
                folder = lies.make(slug, scratch / "lies" / f"{slug}-{how}", with_layout)
            except Exception as exc:
                not_built[f"lie:{slug}:{how}"] = f"{type(exc).__name__}: {exc}"[:200]
                continue
            captures[f"lie:{slug}:{how}"] = (folder, with_layout)
    seconds["lies"] = time.perf_counter() - start

    start = time.perf_counter()
    for name in ["clean", *(f.name for f in FAULTS)]:
        folder = capture_standin(scratch / "cpu" / name, None if name == "clean" else name)
        captures[f"cpu:{name}:layout"] = (folder, True)
        bare = _without_layout(folder, scratch / "cpu" / f"{name}-without-layout")
        captures[f"cpu:{name}:inferred"] = (bare, False)
        # --deep, without values (EGF010's oracle stays out: it has inputs of its own): what
        # EGF013's capture check and EGF002's observed writes read, as the suite's deep
        # catalogue (tests/test_capture_faults.py) records them
        deep = capture_standin(
            scratch / "cpu-deep" / name, None if name == "clean" else name, values_max=0, deep=True
        )
        captures[f"cpu-deep:{name}:layout"] = (deep, True)
    seconds["cpu captures"] = time.perf_counter() - start

    # the inputs of tests/test_mutation_survivors.py (the tests written for survivors)
    start = time.perf_counter()
    survivors = None
    try:
        if survivor_tests:
            import test_mutation_survivors as survivors
    except Exception as exc:
        not_built["test_mutation_survivors.py"] = f"{type(exc).__name__}: {exc}"
    for name, case in survivors.CAPTURE_CASES.items() if survivors else []:
        how = "layout" if case.with_layout else "inferred"
        try:
            folder = case.make(scratch / "survivors" / name)
        except Exception as exc:
            not_built[f"survivor:{name}"] = f"{type(exc).__name__}: {exc}"[:200]
            continue
        captures[f"survivor:{name}:{how}"] = (folder, case.with_layout)
    for name, case in survivors.RUN_CASES.items() if survivors else []:
        try:
            run = case.build(survivors.RunContext(*context))
        except Exception as exc:
            not_built[f"survivor-run:{name}"] = f"{type(exc).__name__}: {exc}"[:200]
            continue
        runs[f"survivor:{name}"] = (run, (case.mode,), None)
    seconds["survivor inputs"] = time.perf_counter() - start
    # lies first, then the recorded fixtures: the captures most likely to show a difference
    order = ("lie:", "fixture:", "cpu:", "cpu-deep:", "extra:", "survivor:")
    captures = dict(sorted(captures.items(), key=lambda kv: order.index(kv[0].split(":")[0] + ":")))

    start = time.perf_counter()
    read: dict[Path, Any] = {}
    for folder, _ in captures.values():
        if folder not in read:
            try:
                read[folder] = read_capture(folder)
            except UsageError as exc:
                read[folder] = exc
    seconds["reading captures"] = time.perf_counter() - start
    settings = {
        f"survivor:{name}:{'layout' if case.with_layout else 'inferred'}": case.settings
        for name, case in (survivors.CAPTURE_CASES.items() if survivors else [])
        if case.settings
    }
    return Inputs(runs, captures, read, not_built, seconds, settings)


# ---- the recorder's hash, remembered: the checks recompute it byte by byte in Python ----
_FNV_MEMO: dict[bytes, str] = {}


def _install_hash_memo(mutant: Mutant | None) -> None:
    cc = sys.modules["egf_audit.invariants.capture_common"]
    original = cc.fnv1a_hex
    if getattr(original, "memo", False):
        return
    if mutant is not None and mutant.module == cc.__name__ and mutant.function == "fnv1a_hex":
        return  # the mutant is in the hash itself

    def memo(values: np.ndarray) -> str:
        raw = np.ascontiguousarray(values, dtype="<f4").tobytes()
        key = hashlib.blake2b(raw, digest_size=20).digest()
        if key not in _FNV_MEMO:
            _FNV_MEMO[key] = original(values)
        return _FNV_MEMO[key]

    memo.memo = True  # type: ignore[attr-defined]
    for _, module in TARGETS:
        namespace = sys.modules[module].__dict__
        if namespace.get("fnv1a_hex") is original:
            namespace["fnv1a_hex"] = memo


# ---- judging ----
def _status(verdict) -> str:
    """A verdict's status, and whether its `failed` property (what reports and tests read)
    agrees with it."""
    if verdict.failed != (verdict.status == "fail"):
        return f"{verdict.status} (its failed property says {verdict.failed})"
    return verdict.status


@contextlib.contextmanager
def _applied(settings: tuple[tuple[str, str, Any], ...]):
    """Module attributes set for one input (as the modules stand now), restored after."""
    saved = []
    for module, name, value in settings:
        namespace = sys.modules[module].__dict__
        saved.append((namespace, name, namespace[name]))
        namespace[name] = value
    try:
        yield
    finally:
        for namespace, name, value in reversed(saved):
            namespace[name] = value


def _read_cached(inputs: Inputs):
    from egf_audit.errors import UsageError

    def read_capture(folder):
        found = inputs.read[Path(folder)]
        if isinstance(found, UsageError):
            raise UsageError(str(found))
        return found

    return read_capture


def capture_outcome(inputs: Inputs, name: str, keep: dict | None = None):
    """(key, status) of the whole `audit_capture` of one capture input, as the modules stand."""
    from egf_audit.errors import UsageError

    audit_module = sys.modules["egf_audit.cli.capture_audit"]
    # capture/folder.py imports the reader where a folder is read: the cached reading goes there
    sys.modules["egf_audit.capture.events"].read_capture = _read_cached(inputs)
    folder, use_layout = inputs.captures[name]
    try:
        with _applied(inputs.settings.get(name, ())):
            audit = audit_module.audit_capture(folder, use_layout=use_layout)
    except UsageError:
        yield f"capture|{name}|audit", "refused"
        return
    except Exception as exc:
        yield f"capture|{name}|audit", f"exception {type(exc).__name__}: {exc}"[:200]
        return
    yield (
        f"capture|{name}|audit",
        f"ok={audit.ok} failed={sorted(audit.failed_codes())} "
        f"incomplete={bool(audit.incomplete)} missing={bool(audit.missing)} "
        f"processes={len(audit.processes)} not_audited={len(audit.not_audited)}",
    )
    for process in audit.processes:
        for code, verdict in process.verdicts:
            yield f"capture|{name}|{process.section}|{code}", _status(verdict)
    if keep is not None:
        keep[name] = [(p.section, p.trace) for p in audit.processes]


def outcomes(inputs: Inputs, cts: dict[str, list], codes: set[str] | None, module: str | None):
    """(key, status) of what a mutant of `module` can change, in the order most likely to
    differ first: the rebuild verdicts of `codes` (None: all) on every run, then their capture
    verdicts on the recorded capture traces; for a capture module, every capture's whole audit.
    `module` None: everything (the original verdicts)."""
    if module in CAPTURE_MODULES:
        for name in inputs.captures:
            yield from capture_outcome(inputs, name)
        return
    registry = sys.modules["egf_audit.invariants"]
    invariants = [inv for inv in registry.INVARIANTS if codes is None or inv.code in codes]
    if module in (None, "egf_audit.invariants"):  # one code asked for (--only, test_properties)
        try:
            only = [
                (r.code, r.mode) for r in registry.evaluate(inputs.runs["clean"][0], ("EGF001",))
            ]
        except Exception as exc:
            only = f"exception {type(exc).__name__}"
        yield "rebuild|clean|evaluate EGF001 only", repr(only)
    for run_name, (run, modes, judged) in inputs.runs.items():
        if module == "egf_audit.invariants":  # the registry's own loop (a mutant of evaluate)
            try:
                results = registry.evaluate(run)
            except Exception as exc:
                yield f"rebuild|{run_name}|evaluate", f"exception {type(exc).__name__}"
                continue
            for r in results:
                if (judged is None or r.code in judged) and r.mode in modes:
                    yield f"rebuild|{run_name}|{r.code}|{r.mode}", _status(r.verdict)
            continue
        for inv in invariants:
            if judged is not None and inv.code not in judged:
                continue
            for mode in modes:
                try:
                    status = _status(inv.verdict(run, mode))
                except Exception as exc:
                    status = f"exception {type(exc).__name__}: {exc}"[:200]
                yield f"rebuild|{run_name}|{inv.code}|{mode}", status
    for name, processes in cts.items():
        for section, ct in processes:
            for inv in invariants:
                try:
                    with _applied(inputs.settings.get(name, ())):
                        verdict = inv.capture_verdict(ct)
                    status = _status(verdict)
                except Exception as exc:
                    status = f"exception {type(exc).__name__}: {exc}"[:200]
                yield f"capture|{name}|{section}|{inv.code}", status


def baseline(inputs: Inputs) -> tuple[dict[str, str], dict[str, list]]:
    out: dict[str, str] = {}
    cts: dict[str, list] = {}
    for name in inputs.captures:
        out.update(capture_outcome(inputs, name, cts))
    out.update(outcomes(inputs, cts, None, None))
    return out, cts


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def judge(
    mutant: Mutant | None,
    module: str,
    inputs: Inputs,
    cts: dict[str, list],
    original: dict[str, str],
    plan: dict,
) -> dict[str, Any]:
    """In the child: install the mutant (None: the module unmutated), recompute, compare."""
    start = time.perf_counter()
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(MUTANT_TIMEOUT_S - 10)
    result: dict[str, Any] = {}
    try:
        file = next(f for f, m in TARGETS if m == module)
        tree = plan["trees"][file]
        if mutant is not None:
            tree = mutant.tree(tree)
        code = compile(tree, str(ROOT / file), "exec")
        exec(code, sys.modules[module].__dict__)
        for dependent in plan["order"]:
            if dependent in plan["dependents"][module]:
                exec(plan["codes"][dependent], sys.modules[dependent].__dict__)
        _install_hash_memo(mutant)
        reach = plan["dependents"][module] | {module}
        codes = {c for c, m in plan["module_of_code"].items() if m in reach}
        via_evaluate = module == "egf_audit.invariants"
        judged = 0
        result = {"status": "survived", "diffs": []}
        for key, value in outcomes(inputs, cts, None if via_evaluate else codes, module):
            judged += 1
            if original.get(key) != value:  # the first difference kills it
                diff = f"{key}: {original.get(key, '(none)')} -> {value}"
                result = {"status": "killed", "diffs": [diff]}
                break
        result["judged"] = judged
    except _Timeout:
        result = {"status": "killed", "diffs": ["timed out"]}
    except Exception as exc:  # the mutated module itself fails to load: an import error
        tail = traceback.format_exc().strip().splitlines()[-1]
        result = {"status": "killed", "diffs": [f"exception escapes: {tail}"]}
        del exc
    signal.alarm(0)
    result["seconds"] = round(time.perf_counter() - start, 3)
    return result


def run_children(
    jobs: list[tuple[str, Mutant | None, str]],
    inputs: Inputs,
    cts: dict[str, list],
    original: dict[str, str],
    plan: dict,
    parallel: int,
    scratch: Path,
    progress: bool = True,
) -> dict[str, dict[str, Any]]:
    """Each job (key, mutant, module) judged in a forked child, `parallel` at a time."""
    results: dict[str, dict[str, Any]] = {}
    pending = list(jobs)
    running: dict[int, tuple[str, float, Path]] = {}
    done = 0
    started = time.perf_counter()
    sys.stdout.flush()
    sys.stderr.flush()
    while pending or running:
        while pending and len(running) < parallel:
            key, mutant, module = pending.pop(0)
            out = scratch / "results" / f"{key}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            pid = os.fork()
            if pid == 0:  # the child
                code = 0
                try:
                    result = judge(mutant, module, inputs, cts, original, plan)
                    out.write_text(json.dumps(result))
                except BaseException:
                    code = 1
                finally:
                    os._exit(code)
            running[pid] = (key, time.perf_counter(), out)
        pid, _status_code = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            now = time.perf_counter()
            for child, (_, t0, _) in list(running.items()):
                if now - t0 > MUTANT_TIMEOUT_S:
                    os.kill(child, signal.SIGKILL)
            time.sleep(0.01)
            continue
        key, t0, out = running.pop(pid)
        if out.exists():
            results[key] = json.loads(out.read_text())
        else:
            results[key] = {
                "status": "killed",
                "diffs": ["the child died (timeout or crash)"],
                "seconds": round(time.perf_counter() - t0, 3),
            }
        done += 1
        if progress and (done % 25 == 0 or (not pending and not running)):
            rate = (time.perf_counter() - started) / done
            left = rate * (len(pending) + len(running))
            print(f"  {done}/{len(jobs)} judged, ~{left / 60:.1f} min left", flush=True)
    return results


def _plan() -> dict:
    dependents, order = _graph()
    registry = importlib.import_module("egf_audit.invariants")
    trees, codes = {}, {}
    for file, module in TARGETS:
        source = (ROOT / file).read_text(encoding="utf-8")
        trees[file] = ast.parse(source, filename=str(ROOT / file))
        codes[module] = compile(trees[file], str(ROOT / file), "exec")
    module_of_code = {inv.code: inv.check.__module__ for inv in registry.INVARIANTS}
    return {
        "dependents": dependents,
        "order": order,
        "trees": trees,
        "codes": codes,
        "module_of_code": module_of_code,
    }


def prepare(
    scratch: Path, survivor_tests: bool = True
) -> tuple[Inputs, dict[str, list], dict[str, str], dict]:
    _check_targets_are_imported_from_here()
    import egf_audit.cli.capture_audit  # noqa: F401  (every target loaded before the fork)

    plan = _plan()
    _install_hash_memo(None)
    print("building the inputs ...", flush=True)
    inputs = build_inputs(scratch, survivor_tests)
    start = time.perf_counter()
    original, cts = baseline(inputs)
    inputs.seconds["original verdicts"] = time.perf_counter() - start
    for what, s in inputs.seconds.items():
        print(f"  {what}: {s:.1f} s", flush=True)
    print(
        f"  {len(inputs.runs)} rebuild runs, {len(inputs.captures)} capture inputs, "
        f"{len(original)} verdicts recorded",
        flush=True,
    )
    for name, why in inputs.not_built.items():
        print(f"  NOT BUILT {name}: {why}", flush=True)
    return inputs, cts, original, plan


# ---- commands ----
def cmd_list(_args) -> None:
    for m in all_mutants():
        print(f"{m.id} {m.file}:{m.line} {m.function} [{m.operator}] {m.description}")


def cmd_show(args) -> None:
    """Each mutant's source line and the edit, for reading a survivor."""
    wanted = set(args.ids.split(","))
    for m in all_mutants():
        if m.id not in wanted:
            continue
        lines = (ROOT / m.file).read_text(encoding="utf-8").splitlines()
        print(f"{m.id} {m.file}:{m.line} {m.function} [{m.operator}] {m.description}")
        for n in range(max(m.line - args.context, 1), min(m.line + args.context, len(lines)) + 1):
            print(f"  {'>' if n == m.line else ' '}{n:4d} {lines[n - 1]}")


def _install(mutant: Mutant, plan: dict) -> None:
    """The mutant's module re-executed mutated, and every target that imports it after it."""
    exec(
        compile(mutant.tree(plan["trees"][mutant.file]), mutant.file, "exec"),
        sys.modules[mutant.module].__dict__,
    )
    for dependent in plan["order"]:
        if dependent in plan["dependents"][mutant.module]:
            exec(plan["codes"][dependent], sys.modules[dependent].__dict__)


def cmd_probe(args) -> None:
    """One capture folder's audit, original and with a mutant installed: which verdict differs."""
    from egf_audit.cli.capture_audit import audit_capture

    plan = _plan()
    _install_hash_memo(None)

    def verdicts():
        audit = sys.modules["egf_audit.cli.capture_audit"].audit_capture
        try:
            a = audit(Path(args.capture), use_layout=not args.inferred)
        except Exception as exc:
            return {"audit": f"{type(exc).__name__}: {exc}"}
        out = {"audit": f"ok={a.ok} incomplete={a.incomplete} missing={a.missing}"}
        for p in a.processes:
            for code, v in p.verdicts:
                out[f"{p.section} {code}"] = f"{v.status}: {v.summary}"
        return out

    del audit_capture
    before = verdicts()
    mutant = next(m for m in all_mutants() if m.id == args.id)
    _install(mutant, plan)
    after = verdicts()
    print(f"{mutant.id} {mutant.file}:{mutant.line} {mutant.description}")
    for key in before:
        mark = "  " if before[key] == after.get(key) else "* "
        print(f"{mark}{key}: {before[key][:200]}")
        if mark == "* ":
            print(f"  {' ' * len(key)}  -> {after.get(key, '(none)')[:200]}")


def cmd_probe_rebuild(args) -> None:
    """One rebuild run (the clean ci run, or a fault's), original and with a mutant installed."""
    import egf_audit.cli.capture_audit  # noqa: F401  (every target loaded)
    from egf_audit.pipeline.config import preset_config
    from egf_audit.runtime.backends import select_backend
    from egf_audit.runtime.kernel_sources import load_kernel_set
    from egf_audit.scenarios.audit import Auditor
    from egf_audit.scenarios.faults import FAULTS_BY_NAME

    plan = _plan()
    kernels = load_kernel_set()
    fault = FAULTS_BY_NAME.get(args.fault)
    if fault is not None and fault.patch:
        kernels = fault.apply_kernels(kernels)
    wiring = fault.wiring if fault is not None else None
    auditor = Auditor(preset_config("ci"), select_backend("cpu", kernels), wiring, steps=2)
    run = (
        auditor.run(MODES)
        if wiring is not None
        else Auditor(preset_config("ci"), select_backend("cpu", kernels), steps=2).run(MODES)
    )

    def verdicts():
        registry = sys.modules["egf_audit.invariants"]
        out = {}
        for inv in registry.INVARIANTS:
            for mode in MODES:
                try:
                    v = inv.verdict(run, mode)
                    out[f"{inv.code} {mode}"] = f"{v.status}: {v.summary}"
                except Exception as exc:
                    out[f"{inv.code} {mode}"] = f"{type(exc).__name__}: {exc}"
        return out

    before = verdicts()
    mutant = next(m for m in all_mutants() if m.id == args.id)
    _install(mutant, plan)
    after = verdicts()
    print(f"{mutant.id} {mutant.file}:{mutant.line} {mutant.description}")
    for key in before:
        if before[key] != after[key] or args.all:
            print(f"  {key}: {before[key][:160]}\n  {' ' * len(key)}  -> {after[key][:160]}")


def cmd_selftest(args) -> None:
    """Every target re-executed unmutated: nothing may differ (else the harness is wrong)."""
    with tempfile.TemporaryDirectory(prefix="egf-mutation-") as tmp:
        inputs, cts, original, plan = prepare(Path(tmp))
        jobs = [(f"identity-{m}", None, m) for _, m in TARGETS]
        results = run_children(jobs, inputs, cts, original, plan, args.jobs, Path(tmp), False)
    bad = {k: r for k, r in results.items() if r["status"] != "survived"}
    for key, r in sorted(results.items()):
        print(f"{key}: {r['status']} ({r['seconds']} s) {r.get('diffs', [])[:2]}")
    sys.exit(1 if bad else 0)


def cmd_run(args) -> None:
    mutants = all_mutants()
    if args.only:
        wanted = set(args.only.split(","))
        mutants = [m for m in mutants if m.id in wanted]
    if args.module:
        mutants = [m for m in mutants if args.module in m.file]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="egf-mutation-") as tmp:
        inputs, cts, original, plan = prepare(Path(tmp), not args.without_survivor_tests)
        prepared = time.perf_counter() - started
        print(f"judging {len(mutants)} mutants, {args.jobs} at a time ...", flush=True)
        jobs = [(m.id, m, m.module) for m in mutants]
        results = run_children(jobs, inputs, cts, original, plan, args.jobs, Path(tmp))
    total = time.perf_counter() - started
    rows = []
    for m in mutants:
        row = dataclasses.asdict(m)
        row.pop("path")
        rows.append(row | results[m.id])
    doc = {
        "inputs": {
            "rebuild_runs": sorted(inputs.runs),
            "captures": sorted(inputs.captures),
            "not_built": inputs.not_built,
            "verdicts": len(original),
        },
        "seconds": {
            **{k: round(v, 1) for k, v in inputs.seconds.items()},
            "preparation": round(prepared, 1),
            "total": round(total, 1),
            "jobs": args.jobs,
        },
        "results": rows,
    }
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    killed = sum(r["status"] == "killed" for r in rows)
    print(f"{killed} of {len(rows)} mutants killed; {total / 60:.1f} min; results in {args.out}")


def cmd_report(args) -> None:
    from triage import TRIAGE

    doc = json.loads(Path(args.file).read_text())
    rows = doc["results"]
    by_file: dict[str, Counter] = {}
    for r in rows:
        by_file.setdefault(r["file"], Counter())[r["status"]] += 1
    print("| module | mutants | killed | survived | score |")
    print("|---|---:|---:|---:|---:|")
    total: Counter = Counter()
    for file, c in sorted(by_file.items()):
        n = c["killed"] + c["survived"]
        total.update(c)
        print(f"| {file} | {n} | {c['killed']} | {c['survived']} | {c['killed'] / n:.1%} |")
    n = total["killed"] + total["survived"]
    print(
        f"| **all** | {n} | {total['killed']} | {total['survived']} | {total['killed'] / n:.1%} |"
    )
    times = [r["seconds"] for r in rows]
    print(
        f"\nper mutant: mean {np.mean(times):.2f} s, max {max(times):.1f} s; "
        f"whole run {doc['seconds']['total'] / 60:.1f} min ({doc['seconds']['jobs']} jobs)\n"
    )
    groups: dict[int, list[dict]] = {}
    unread = []
    for r in rows:
        if r["status"] != "survived":
            continue
        at = next((i for i, e in enumerate(TRIAGE) if _reads(e, r)), None)
        if at is None:
            unread.append(r)
        else:
            groups.setdefault(at, []).append(r)
    kinds = Counter()
    print("| survivors | where | reading | why |")
    print("|---|---|---|---|")
    for at in sorted(groups, key=lambda i: (TRIAGE[i].file, i)):
        e, found = TRIAGE[at], groups[at]
        kinds[e.kind] += len(found)
        ids = ", ".join(f"{r['id']} `{_cell(r['description'])}`" for r in found)
        print(f"| {ids} | {e.file} `{e.function}` | {e.kind} | {_cell(e.why)} |")
    print(f"\nby reading: {dict(sorted(kinds.items()))}")
    for r in unread:
        print(f"UNREAD {r['id']} {r['file']}:{r['line']} {r['function']} {r['description']}")


def _reads(e, r: dict) -> bool:
    return e.file == r["file"] and e.function == r["function"] and e.match in r["description"]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list")
    p = sub.add_parser("selftest")
    p.add_argument("--jobs", type=int, default=2)
    p = sub.add_parser("run")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--only", default="", help="comma-separated mutant ids")
    p.add_argument("--module", default="", help="only the mutants of files containing this")
    p.add_argument("--out", default="mutation-results.json")
    p.add_argument(
        "--without-survivor-tests",
        action="store_true",
        help="leave out the inputs of tests/test_mutation_survivors.py (the suite before it)",
    )
    p = sub.add_parser("show")
    p.add_argument("ids", help="comma-separated mutant ids")
    p.add_argument("--context", type=int, default=2)
    p = sub.add_parser("probe")
    p.add_argument("id")
    p.add_argument("capture")
    p.add_argument("--inferred", action="store_true")
    p = sub.add_parser("probe-rebuild")
    p.add_argument("id")
    p.add_argument("--fault", default="")
    p.add_argument("--all", action="store_true")
    p = sub.add_parser("report")
    p.add_argument("file")
    args = parser.parse_args(argv)
    commands = {"list": cmd_list, "show": cmd_show, "selftest": cmd_selftest}
    commands |= {"run": cmd_run, "report": cmd_report, "probe": cmd_probe}
    commands["probe-rebuild"] = cmd_probe_rebuild
    commands[args.command](args)


if __name__ == "__main__":
    main()
