"""Shared test setup.

- Every test sees a stable, colourless, 120-column terminal, and no CI environment: a test run
  inside GitHub Actions must not print annotations or append to the job's real step summary.
- `gpu`-marked tests are skipped where `egf_audit.backends.cuda_usable()` says no GPU works.
- Session fixtures build the CPU kernels once (`cpu_backend`) and run one ci-preset audit
  (`ci_audit_run`) that read-only tests can share.
- CLI tests run in `workdir` (a trainer repository's root) and, through `fake`, on that recorded
  audit with invariant verdicts they pick (tests/cli_fakes.py).
- Hypothesis runs as many examples as the profile `HYPOTHESIS_PROFILE` names: "ci" (the
  default, every pull request) or "nightly".
- `nightly`-marked tests (exhaustive or install-heavy variants of checks that a cheaper test
  makes on every pull request) are skipped unless `EGF_AUDIT_NIGHTLY=1`, which `.ci/nightly`
  sets: the skip says so in pytest's summary, so nobody mistakes them for run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import settings

if TYPE_CHECKING:
    from egf_audit.pipeline.config import Config
    from egf_audit.runtime.backends.base import Backend
    from egf_audit.runtime.kernel_sources import KernelSet
    from egf_audit.trace.audit_run import AuditRun

# The CPU backend's GEMMs are tiny; on a busy 2-core CI runner OpenMP's default busy-waiting
# makes them ~30x slower (idle threads spin against the other processes). Passive waiting
# changes no result. It must be set before torch loads its OpenMP runtime, so this file
# imports egf_audit (and with it torch) only inside the fixtures below.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# Examples per hypothesis test. The property test (tests/test_properties.py) runs one audit
# step and three faulty ones per example, about a second each on the CPU: "ci" keeps it near
# 10 s for every pull request, "nightly" (HYPOTHESIS_PROFILE=nightly, .ci/nightly) explores 100
# times as many shapes. Unknown names fail at collection, as hypothesis refuses them.
settings.register_profile("ci", max_examples=10)
settings.register_profile("nightly", max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

CI_ENVIRONMENT = ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "FORCE_COLOR", "CLICOLOR_FORCE")


@pytest.fixture(autouse=True)
def _stable_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("TERM", "dumb")
    monkeypatch.setenv("COLUMNS", "120")
    for name in CI_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)


NIGHTLY = os.environ.get("EGF_AUDIT_NIGHTLY") == "1"

# Under `--dist loadfile` (the README's test command) a worker runs each file whole, so its
# module and session fixtures are built once. Files that share an expensive session fixture
# count as one file here, so it is built once for all of them (`fault_audit_run`: every fault's
# audit, 0.5 s each, read by four files). (pytest-xdist's own `loadgroup` does not group
# under pytest 9: it renames items after pytest has fixed their ids.)
SHARED_SCOPES = {
    "test_registries.py": "fault-audits",
    "test_invariants_flow.py": "fault-audits",
    "test_invariants_core.py": "fault-audits",
    "test_capture_faults.py": "fault-audits",  # the rebuild beside each fault's capture
}


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    if config.getvalue("dist") != "loadfile":
        return None  # xdist's own choice
    from xdist.scheduler import LoadFileScheduling

    config.option.loadscopereorder = False  # the order of LONGEST_FIRST, not by test count

    class SharedFixtureScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = super()._split_scope(nodeid)
            return SHARED_SCOPES.get(Path(file).name, file)

    return SharedFixtureScheduling(config, log)


# The longest test files (seconds of a 2-core run, from --junitxml), handed out first: under
# `--dist loadfile` a worker takes the next file as it finishes one, so a long file handed out
# last runs alone while the other worker idles. Longest first (xdist's own order, by number of
# tests, is switched off in pytest_xdist_make_scheduler); the other files follow in collection
# order, and each file keeps its own test order. A group of SHARED_SCOPES goes where its first
# file goes.
LONGEST_FIRST = (
    "test_capture_faults.py",  # 65 s: every fault's deep capture; its group, fault-audits
    "test_kernels_dir.py",  # 46 s
    "test_capture_cpu.py",  # 39 s
    "test_capture_lies.py",  # 37 s
    "test_install_paths.py",  # 31 s
    "test_capture_outsider.py",  # 28 s
    "test_bench.py",  # 22 s
    "test_properties.py",  # 21 s
    "test_mutation_survivors.py",  # 20 s
    "test_capture_hostile.py",  # 17 s
    "test_document_portable.py",  # 13 s
    "test_integrity_effects.py",  # 13 s
    "test_capture_before.py",  # 12 s
    "test_project_settings.py",  # 11 s
    "test_capture_h200_programs.py",  # 10 s
    "test_capture_files.py",  # 10 s
    "test_docs_commands.py",  # 10 s
    "test_integrity_stream.py",  # 10 s
    "test_capture.py",  # 9 s
    "test_recorder_build.py",  # 9 s
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))  # stable
    if not NIGHTLY:
        later = pytest.mark.skip(reason="nightly: .ci/nightly runs it (EGF_AUDIT_NIGHTLY=1)")
        for item in items:
            if item.get_closest_marker("nightly"):
                item.add_marker(later)
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return  # never import CuPy for a run without GPU tests
    from egf_audit.runtime.backends import cuda_usable

    usable, why = cuda_usable()
    if usable:
        return
    skip = pytest.mark.skip(reason=f"no usable GPU: {why}")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _one_kernel_cache(tmp_path_factory: pytest.TempPathFactory):
    """One kernel cache for the whole run, shared by its workers, unless the caller chose one
    (EGF_AUDIT_CACHE; CI may persist it): tests stay out of $HOME, and the modules that used to
    keep a cache each no longer compile the 20 bundled kernels again each (7 s a module on 2
    cores). Tests about the cache itself set their own."""
    if os.environ.get("EGF_AUDIT_CACHE"):
        yield
        return
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the run's folder
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EGF_AUDIT_CACHE", str(shared / "egf-audit-cache"))
        yield


@pytest.fixture(scope="session")
def kernel_set() -> KernelSet:
    from egf_audit.runtime.kernel_sources import load_kernel_set

    return load_kernel_set()


@pytest.fixture(scope="session")
def cpu_backend(kernel_set: KernelSet) -> Backend:
    """The bundled kernels compiled for the CPU once per session (and cached on disk)."""
    from egf_audit.runtime.backends import select_backend

    return select_backend("cpu", kernel_set)


@pytest.fixture(scope="session")
def ci_config() -> Config:
    from egf_audit.pipeline.config import preset_config

    return preset_config("ci")


@pytest.fixture(scope="session")
def ci_audit_run(ci_config: Config, cpu_backend: Backend) -> AuditRun:
    """One production-wiring audit at the ci preset (both modes, 2 steps). Read-only: tests
    that change a run must build their own."""
    from egf_audit.scenarios.audit import Auditor

    return Auditor(ci_config, cpu_backend, steps=2).run(("sentinel", "live"))


@pytest.fixture(scope="session")
def fault_audit_run(ci_config: Config, kernel_set: KernelSet, cpu_backend: Backend):
    """name -> the ci audit (both modes, 2 steps) of the pipeline with that fault of the
    catalogue put back, each built once per worker and kept (about 25 MB each). Read-only."""
    from egf_audit.runtime.backends import select_backend
    from egf_audit.scenarios.audit import Auditor
    from egf_audit.scenarios.faults import FAULTS_BY_NAME

    runs: dict[str, AuditRun] = {}

    def run(name: str) -> AuditRun:
        if name not in runs:
            fault = FAULTS_BY_NAME[name]
            backend = (
                select_backend("cpu", fault.apply_kernels(kernel_set))
                if fault.patch
                else cpu_backend
            )
            runs[name] = Auditor(ci_config, backend, fault.wiring, steps=2).run(
                ("sentinel", "live")
            )
        return runs[name]

    return run


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A trainer repository's root, the working directory: the document's paths are relative
    to it."""
    (tmp_path / ".git").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def fake(workdir: Path, monkeypatch: pytest.MonkeyPatch, ci_audit_run: AuditRun):
    """Fast runs: the recorded audit, and a registry whose statuses the test picks
    (`fake({"EGF003": FAIL})`; every invariant passes until then)."""
    from cli_fakes import RecordedAuditor, fake_registry

    from egf_audit import invariants
    from egf_audit.cli import commands

    monkeypatch.setattr(commands, "Auditor", RecordedAuditor(ci_audit_run))

    def install(statuses: dict[str, str] | None = None, summary: str = "fake verdict") -> None:
        monkeypatch.setattr(invariants, "INVARIANTS", fake_registry(statuses, summary))

    install()
    return install
