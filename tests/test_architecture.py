"""The layers of the package and the one direction their imports may run.

    cli -> scenarios -> pipeline -> runtime (recorder -> trace)
    invariants read a finished trace (runtime) and the oracle; reports render results;
    outputs writes them (cli, bench and capture call it; reports never do).

Every import counts: top-level, inside a function, and under TYPE_CHECKING, because a cycle that
only type checkers see is still two modules that cannot be read apart.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# where each top-level folder installs (pyproject.toml's package-dir)
PACKAGE_DIRS = {
    "auditor": "egf_audit",
    "kernels": "egf_audit.kernels",
    "invariants": "egf_audit.invariants",
    "reports": "egf_audit.reports",
}

# layer -> the layers it may import. A layer is a sub-package of egf_audit (or one of its
# top-level modules); `egf_audit` itself (the version) and `errors` are leaves anyone may use.
ALLOWED: dict[str, set[str]] = {
    "egf_audit": set(),
    "errors": set(),
    "invariant_text": set(),  # the invariants' texts, read without importing the checks
    "kernels": set(),
    "runtime": {"kernels"},
    "pipeline": {"runtime", "kernels"},
    "oracle": {"runtime"},
    "invariants": {"runtime", "oracle", "kernels"},
    "reports": {"invariants", "runtime", "kernels"},
    # writes files: the commands' rooms share it, the renderers (reports) never reach the disk
    "outputs": set(),
    "scenarios": {"pipeline", "runtime", "invariants", "kernels"},
    "bench": {"pipeline", "runtime", "oracle", "reports", "outputs", "kernels"},
    "capture": {
        "scenarios",
        "pipeline",
        "runtime",
        "invariants",
        "oracle",
        "reports",
        "outputs",
        "kernels",
    },
    "cli": {
        "scenarios",
        "pipeline",
        "runtime",
        "invariants",
        "oracle",
        "reports",
        "outputs",
        "kernels",
        "bench",
        "capture",
    },
    "entry": {"cli", "runtime"},
    "__main__": {"entry"},
}
LEAVES = {"egf_audit", "errors", "invariant_text"}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    parts = [PACKAGE_DIRS[rel.parts[0]], *rel.with_suffix("").parts[1:]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "egf_audit"


def imports_of(path: Path, module: str, modules: set[str]) -> set[str]:
    """Every egf_audit module `path` imports, by absolute name. `from pkg import mod` imports
    pkg.mod; `from pkg import name` imports pkg."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
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


def import_graph() -> dict[str, set[str]]:
    files = [p for d in PACKAGE_DIRS for p in (ROOT / d).rglob("*.py")]
    modules = {module_name(p): p for p in files}
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


@pytest.mark.parametrize(
    ("module", "planted", "expected"),
    [
        ("egf_audit.pipeline.step", "egf_audit.scenarios.audit", "pipeline may not import"),
        ("egf_audit.invariants.common", "egf_audit.pipeline.config", "invariants may not import"),
        ("egf_audit.oracle.compare", "egf_audit.pipeline.step", "oracle may not import"),
        ("egf_audit.runtime.trace", "egf_audit.pipeline.layout", "runtime may not import"),
        ("egf_audit.reports.github", "egf_audit.outputs.atomic", "reports may not import"),
        ("egf_audit.outputs.atomic", "egf_audit.reports.github", "outputs may not import"),
    ],
)
def test_a_planted_wrong_way_import_is_caught(module, planted, expected):
    graph = import_graph()
    graph[module] = graph[module] | {planted}
    assert any(expected in v for v in layer_violations(graph))


def test_a_planted_cycle_is_caught():
    graph = import_graph()
    graph["egf_audit.runtime.trace"] = graph["egf_audit.runtime.trace"] | {
        "egf_audit.runtime.recorder"
    }
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1]
    assert {"egf_audit.runtime.trace", "egf_audit.runtime.recorder"} <= set(cycle)


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
