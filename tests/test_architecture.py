"""The layers of the package and the one direction their imports may run.

    cli -> scenarios -> pipeline -> runtime (recorder -> trace)
    invariants read a finished trace (runtime) and the oracle; reports render results;
    outputs writes them (cli, bench and capture call it; reports never do).

Every import counts: top-level, inside a function, and under TYPE_CHECKING, because a cycle that
only type checkers see is still two modules that cannot be read apart.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _package_dirs() -> dict[str, str]:
    """Where each top-level folder installs ({"auditor": "egf_audit", "kernels":
    "egf_audit.kernels", ...}), read from pyproject.toml's package-dir, its one home."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    mapping = pyproject["tool"]["setuptools"]["package-dir"]
    return {folder: package for package, folder in mapping.items()}


PACKAGE_DIRS = _package_dirs()

# layer -> the layers it may import. A layer is a sub-package of egf_audit (or one of its
# top-level modules); `egf_audit` itself (the version) and `errors` are leaves anyone may use.
ALLOWED: dict[str, set[str]] = {
    "egf_audit": set(),
    "errors": set(),
    "invariant_text": set(),  # the invariants' texts, read without importing the checks
    "small_files": {"errors"},  # reading a --config or settings file that cannot block
    "kernels": set(),
    # the trace model: what the rebuild's recorder and the capture's reader both produce and
    # the invariants read (launches, bindings, effects, snapshots, steps, call sites, the
    # evidence only a capture holds), with the contract's names and the config view
    "trace": {"kernels"},
    "runtime": {"trace", "kernels"},
    "pipeline": {"runtime", "trace", "kernels"},
    "oracle": {"runtime", "trace"},
    # one rule per invariant over the one trace model: the invariants import neither the
    # rebuild's recorder (runtime) nor the capture's reader (capture), only what both produce
    "invariants": {"trace", "oracle", "kernels"},
    "reports": {"invariants", "runtime", "trace", "kernels"},
    # writes files: the commands' rooms share it, the renderers (reports) never reach the disk
    "outputs": set(),
    "scenarios": {"pipeline", "runtime", "trace", "invariants", "kernels"},
    "bench": {"pipeline", "runtime", "trace", "oracle", "reports", "outputs", "kernels"},
    # the trainer's process: the recorder, the reader and what a read capture is, below the
    # invariants that judge it (cli/capture_audit.py runs them); the stand-in trainer that ran
    # the pipeline and the fault catalogue is a script of the tests (tests/standin/)
    "capture": {"runtime", "trace", "outputs", "kernels"},
    "cli": {
        "scenarios",
        "pipeline",
        "runtime",
        "trace",
        "invariants",
        "oracle",
        "reports",
        "outputs",
        "kernels",
        "bench",
        "capture",
    },
    "entry": {"cli", "runtime", "trace"},
    "__main__": {"entry"},
}
LEAVES = {"egf_audit", "errors", "invariant_text", "small_files"}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    parts = [PACKAGE_DIRS[rel.parts[0]], *rel.with_suffix("").parts[1:]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "egf_audit"


def _imported_by_call(node: ast.AST) -> str | None:
    """The egf_audit module an `import_module("...")` or `__import__("...")` call names."""
    if not (isinstance(node, ast.Call) and node.args):
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    first = node.args[0]
    if name not in ("import_module", "__import__") or not isinstance(first, ast.Constant):
        return None
    value = first.value
    return value if isinstance(value, str) and value.startswith("egf_audit") else None


def imports_of(path: Path, module: str, modules: set[str]) -> set[str]:
    """Every egf_audit module `path` imports, by absolute name. `from pkg import mod` imports
    pkg.mod; `from pkg import name` imports pkg; `importlib.import_module("egf_audit.x")` (a
    module loaded only when a command asks for it) imports egf_audit.x."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (named := _imported_by_call(node)) is not None:
            found.add(named)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("egf_audit")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            if not base.startswith("egf_audit"):
                continue
            for alias in node.names:
                child = f"{base}.{alias.name}"
                found.add(child if child in modules else base)
    return found


def module_files() -> dict[str, Path]:
    """Every module of the package, by its import name, and its file."""
    return {module_name(p): p for d in PACKAGE_DIRS for p in sorted((ROOT / d).rglob("*.py"))}


def import_graph() -> dict[str, set[str]]:
    modules = module_files()
    names = set(modules)
    return {m: {i for i in imports_of(p, m, names) if i in names} - {m} for m, p in modules.items()}


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for module, imported in sorted(graph.items()):
        layer = layer_of(module)
        for target in sorted(imported):
            other = layer_of(target)
            if other == layer or other in LEAVES:
                continue
            if other not in ALLOWED.get(layer, set()):
                out.append(f"{module} imports {target} ({layer} may not import {other})")
    return out


def layer_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Layer -> the other layers its modules import (the leaves left out); every layer that
    has a module is a key. docs/design.md's picture of the layers is drawn from this."""
    layers: dict[str, set[str]] = {layer_of(m): set() for m in graph}
    for module, imported in graph.items():
        layers[layer_of(module)] |= {layer_of(t) for t in imported} - LEAVES - {layer_of(module)}
    return {layer: targets for layer, targets in layers.items() if layer not in LEAVES}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle among modules, as the list of modules around it, or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_every_layer_is_known():
    layers = {layer_of(m) for m in import_graph()}
    assert layers <= set(ALLOWED), layers - set(ALLOWED)


def test_imports_run_one_way():
    assert layer_violations(import_graph()) == []


def test_no_import_cycle():
    assert find_cycle(import_graph()) is None


def test_no_layer_imports_one_that_imports_it_back():
    """The picture of the layers has no arrow running back up."""
    assert find_cycle(layer_graph(import_graph())) is None


@pytest.mark.parametrize(
    ("module", "planted", "expected"),
    [
        ("egf_audit.pipeline.step", "egf_audit.scenarios.audit", "pipeline may not import"),
        ("egf_audit.invariants.common", "egf_audit.pipeline.config", "invariants may not import"),
        ("egf_audit.invariants.common", "egf_audit.capture.events", "invariants may not import"),
        ("egf_audit.invariants.common", "egf_audit.runtime.recorder", "invariants may not import"),
        ("egf_audit.oracle.compare", "egf_audit.pipeline.step", "oracle may not import"),
        ("egf_audit.trace.model", "egf_audit.pipeline.layout", "trace may not import"),
        ("egf_audit.trace.captured", "egf_audit.capture.events", "trace may not import"),
        ("egf_audit.runtime.recorder", "egf_audit.pipeline.layout", "runtime may not import"),
        ("egf_audit.reports.github", "egf_audit.outputs.atomic", "reports may not import"),
        ("egf_audit.outputs.atomic", "egf_audit.reports.github", "outputs may not import"),
    ],
)
def test_a_planted_wrong_way_import_is_caught(module, planted, expected):
    graph = import_graph()
    graph[module] = graph[module] | {planted}
    assert any(expected in v for v in layer_violations(graph))


def test_an_import_made_when_a_command_runs_counts():
    """`bench` is loaded by importlib only when asked for; the import still runs one way."""
    assert "egf_audit.bench.run" in import_graph()["egf_audit.cli.other_commands"]


def test_a_planted_cycle_is_caught():
    graph = import_graph()
    graph["egf_audit.trace.model"] = graph["egf_audit.trace.model"] | {"egf_audit.runtime.recorder"}
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1]
    assert {"egf_audit.trace.model", "egf_audit.runtime.recorder"} <= set(cycle)


def test_every_cli_option_names_its_flag():
    """typer before 0.29 names an option after its metavar when no flag is given (`--MODE`), so
    every typer.Option in the command line spells its flag out."""
    unnamed = []
    for path in (ROOT / "auditor" / "cli").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "Option"
            ):
                first = node.args[0] if node.args else None
                named = isinstance(first, ast.Constant) and str(first.value).startswith("-")
                if not named:
                    unnamed.append(f"{path.name}:{node.lineno}")
    assert unnamed == []
