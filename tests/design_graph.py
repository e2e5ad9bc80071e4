"""docs/design.md's picture of the layers, drawn from the import table that
tests/test_architecture.py reads (`layer_graph`: layer -> the layers its modules import).

    python tests/design_graph.py            # print the picture's region
    python tests/design_graph.py --write    # rewrite the region in docs/design.md
    python tests/design_graph.py --check    # exit 1 and print a diff when docs/design.md is stale

An arrow A --> B says that a module of A imports a module of B; every import counts, as in
test_architecture. The two leaves every layer may import get no arrows (a line under the
picture names them), so the picture shows the rooms and not the plumbing.
tests/test_design_doc.py fails when the region is stale.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import textwrap
from pathlib import Path

from test_architecture import LEAVES, ROOT, import_graph, layer_graph, layer_of, module_files

DOC = ROOT / "docs" / "design.md"
BEGIN = "<!-- BEGIN layers: drawn by `python tests/design_graph.py --write`; do not edit -->"
END = "<!-- END layers -->"
# A few words a node carries under its folder. A new layer needs its words here: drawing it
# without them fails, naming the layer, so the picture never shows an unexplained room.
ROLES = {
    "__main__": "python -m egf_audit",
    "entry": "console entry point",
    "cli": "typer app, plain commands",
    "bench": "egf-audit bench",
    "capture": "the trainer's process: recorded, read into a trace",
    "scenarios": "scenarios, faults, mutants",
    "pipeline": "the SP14 step, rebuilt",
    "reports": "renderers: document, JSON, JUnit, GitHub",
    "outputs": "writes files: atomic, step summary",
    "invariants": "EGF001-EGF013",
    "oracle": "float64 model (EGF010)",
    "runtime": "the rebuild's recorder, backends",
    "trace": "the trace model both sources produce; the contract",
    "kernels": ".cu sources, ABI table",
    "egf_audit": "the version",
    "errors": "error kinds, exit codes",
    "invariant_text": "the invariants' texts, read from source",
    "small_files": "a --config or settings file read without blocking",
}


def role(layer: str) -> str:
    if layer not in ROLES:
        raise SystemExit(
            f"tests/design_graph.py: the layer {layer!r} has no words in ROLES: add a few that "
            "say what it holds, then run `python tests/design_graph.py --write`"
        )
    return ROLES[layer]


def layer_home(layer: str, files: dict[str, Path]) -> str:
    """The layer's folder (`auditor/cli/`) or, for a top-level module, its file (the version's
    layer, `egf_audit` itself, is the package's `__init__.py`, not all of `auditor/`)."""
    if layer == "egf_audit":
        return files["egf_audit"].relative_to(ROOT).as_posix()
    path = files[f"egf_audit.{layer}"].relative_to(ROOT)
    return f"{path.parent.as_posix()}/" if path.name == "__init__.py" else path.as_posix()


def _node_id(layer: str) -> str:
    return layer.strip("_")  # mermaid ids: `__main__` would read as markup


def top_down(layers: dict[str, set[str]]) -> list[str]:
    """Every layer after all that import it (importers first), ties by name: the picture's
    order from the top."""
    order: list[str] = []
    placed: set[str] = set()
    while len(order) < len(layers):
        ready = sorted(
            layer
            for layer in layers
            if layer not in placed
            and all(layer not in layers[other] for other in layers if other not in placed)
        )
        if not ready:
            raise SystemExit("the layers import each other in a circle: nothing to draw")
        order += ready
        placed |= set(ready)
    return order


def render() -> str:
    """The region between BEGIN and END, markers included."""
    files = module_files()
    layers = layer_graph(import_graph())
    order = top_down(layers)
    rank = {layer: i for i, layer in enumerate(order)}
    lines = [BEGIN, "```mermaid", "flowchart TB"]
    for layer in order:
        label = f"{layer_home(layer, files)}<br/>{role(layer)}"
        lines.append(f'    {_node_id(layer)}["{label}"]')
    for layer in order:
        for target in sorted(layers[layer], key=rank.__getitem__):
            lines.append(f"    {_node_id(layer)} --> {_node_id(target)}")
    lines.append("```")
    leaves = sorted({layer_of(m) for m in files} & LEAVES)
    named = [f"`{layer_home(leaf, files)}` ({role(leaf)})" for leaf in leaves]
    note = (
        f"{len(order)} layers, {sum(map(len, layers.values()))} arrows (a module of the upper "
        "layer imports one of the lower). Every layer may also import the leaves, drawn without "
        f"arrows: {', '.join(named)}."
    )
    wrapped = textwrap.fill(note, width=96, break_long_words=False, break_on_hyphens=False)
    lines += ["", wrapped, END]
    return "\n".join(lines)


def current_region(text: str) -> str:
    """The region as docs/design.md holds it. Raises ValueError when a marker is missing."""
    start = text.index(BEGIN)
    end = text.index(END, start) + len(END)
    return text[start:end]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/design_graph.py")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--write", action="store_true", help="rewrite the region in the doc")
    what.add_argument("--check", action="store_true", help="exit 1 when the doc is stale")
    args = parser.parse_args(argv)
    drawn = render()
    if not (args.write or args.check):
        print(drawn)
        return 0
    text = DOC.read_text(encoding="utf-8")
    try:
        held = current_region(text)
    except ValueError:
        print(f"docs/design.md: no region between {BEGIN!r} and {END!r}", file=sys.stderr)
        return 2
    if held == drawn:
        return 0
    if args.check:
        diff = difflib.unified_diff(
            held.splitlines(), drawn.splitlines(), "docs/design.md", "drawn", lineterm=""
        )
        print("\n".join(diff))
        stale = "docs/design.md is stale: run `python tests/design_graph.py --write`"
        print(stale, file=sys.stderr)
        return 1
    DOC.write_text(text.replace(held, drawn), encoding="utf-8")
    print("wrote docs/design.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
