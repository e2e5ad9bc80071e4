"""Every command block (```sh, ```console, ```bash) of docs/ci-gate.md and docs/capture.md is
either run here, as a user would type it on a CPU machine, with its documented outcome asserted,
or skipped for a reason reviewed in SKIPPED (a GPU, the network). A block that is in neither
list fails: a new command in the docs is run or its reason written down, never passed over.

Blocks are known by their document and first line, so moving one keeps its entry; editing its
first line makes it new (and fails until it is listed again). Runs share one trainer repository
(`trainer`), and the real egf-audit of this checkout on PATH."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from egf_audit.kernels import KERNELS, bundled_source

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("docs/ci-gate.md", "docs/capture.md")
FENCE = re.compile(r"^```(sh|console|bash)\n(.*?)^```", re.DOTALL | re.MULTILINE)


@dataclass(frozen=True)
class Block:
    doc: str
    line: int  # where its fence opens
    text: str

    @property
    def key(self) -> tuple[str, str]:
        return Path(self.doc).name, self.text.splitlines()[0].strip()

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}"


def blocks() -> list[Block]:
    found = []
    for doc in DOCS:
        text = (ROOT / doc).read_text(encoding="utf-8")
        for m in FENCE.finditer(text):
            found.append(Block(doc, text.count("\n", 0, m.start()) + 1, m.group(2)))
    return found


# ---- the blocks that cannot run on a CPU machine without the network, each with its reason ----
SKIPPED = {
    (
        "ci-gate.md",
        "python -m venv .venv && . .venv/bin/activate",
    ): "network: installs torch from PyTorch's index and egf-audit from a git host",
    (
        "capture.md",
        "$ egf-audit capture --layout build/layout.json --out capture -- "
        "./target/release/sp14-smoke --two-steps --layout-out build/layout.json",
    ): "GPU: captures a trainer's CUDA process (CUPTI); the trainer binary is the reader's own",
    (
        "capture.md",
        "$ egf-audit capture --out caps/FAULT --layout build/layout.json -- python "
        "tests/standin/trainer.py --fault FAULT --layout-out build/layout.json",
    ): "GPU: captures the stand-in trainer on CuPy; FAULT is a placeholder for each fault",
    (
        "capture.md",
        "$ nvcc -cudart shared -o build/trainer src/trainer.cu -lcublas -lcublasLt",
    ): "the trainer's sources are the reader's own (and cuBLAS is not installed here); "
    "tests/test_capture_cpu.py builds and captures the C++ stand-ins with these commands",
}


# ---- the blocks run here: what each must do ----
def _made_once(done: subprocess.CompletedProcess[str], repo: Path) -> None:
    """`egf-audit run` reads the table, writes the document; `git add` stages both files."""
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].startswith("PASS: all 13 invariants hold")
    document = (repo / "docs" / "dqn-wire-up-audit.md").read_text()
    assert "**Sources:** the trainer's folder `src/kernels/` (20 of 20 kernels)." in document
    staged = _git(repo, "diff", "--cached", "--name-only").split()
    assert staged == ["docs/dqn-wire-up-audit.md", "pyproject.toml"]


def _timed(done: subprocess.CompletedProcess[str], repo: Path) -> None:
    """Five timings of each fast command, each a number of seconds, none an error."""
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    for cmd in ("--help", "invariants", "explain EGF001"):
        times = [ln for ln in lines if ln.startswith(f"egf-audit {cmd}: ")]
        assert len(times) == 5 and all(re.fullmatch(r".*: \d+\.\d+ s", t) for t in times), lines


RUN: dict[tuple[str, str], Callable[[subprocess.CompletedProcess[str], Path], None]] = {
    (
        "ci-gate.md",
        "egf-audit run                              # reads [tool.egf-audit]; writes "
        "docs/dqn-wire-up-audit.md",
    ): _made_once,
    ("ci-gate.md", 'for cmd in "--help" "invariants" "explain EGF001"; do'): _timed,
}


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True)
    return done.stdout


@pytest.fixture(scope="module")
def trainer(tmp_path_factory) -> Path:
    """A trainer repository as docs/ci-gate.md sets one up: its kernels under src/kernels and
    the [tool.egf-audit] table, in git."""
    repo = tmp_path_factory.mktemp("trainer")
    _git(repo, "init", "-q")
    folder = repo / "src" / "kernels"
    folder.mkdir(parents=True)
    for spec in KERNELS:
        (folder / spec.file).write_text(bundled_source(spec.file))
    (repo / "pyproject.toml").write_text(
        '[project]\nname = "trainer"\n\n[tool.egf-audit]\nkernels = "src/kernels"\ndevice = "cpu"\n'
    )
    return repo


def test_every_block_is_run_or_skipped_for_a_reason():
    keys = [b.key for b in blocks()]
    assert len(keys) == len(set(keys)), "two blocks open with the same line: make them differ"
    unlisted = [str(b) for b in blocks() if b.key not in RUN and b.key not in SKIPPED]
    assert unlisted == [], "run each new block here (RUN) or say why not (SKIPPED)"
    assert not set(RUN) & set(SKIPPED)
    stale = sorted((set(RUN) | set(SKIPPED)) - set(keys))
    assert stale == [], "a listed block is gone from the docs: drop its entry"
    assert all(reason.strip() for reason in SKIPPED.values())


@pytest.mark.parametrize("block", blocks(), ids=str)
def test_a_block_does_what_its_doc_says(block, trainer):
    if block.key in SKIPPED:
        pytest.skip(SKIPPED[block.key])
    if block.key not in RUN:
        pytest.fail(f"{block} is in neither list")
    assert not block.text.lstrip().startswith("$"), "a console block to run: add its parsing"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("GITHUB_ACTIONS", None)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.text],
        cwd=trainer,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    RUN[block.key](done, trainer)
