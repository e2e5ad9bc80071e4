"""docs/design.md stays true to the code: its picture of the layers is the import table drawn
(tests/design_graph.py), every module of the package is named in its folder's row, every file
it names by path exists, and it opens, as the README's "How it is built" does, with where each
folder installs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import design_graph
import pytest
from test_architecture import PACKAGE_DIRS, ROOT, import_graph, layer_graph

DESIGN = ROOT / "docs" / "design.md"
README = ROOT / "README.md"
ROW = re.compile(r"^\| `(?P<folder>[\w/]+/)` \| (?P<text>.*) \|$", re.MULTILINE)
NAMED_FILE = re.compile(r"`(?P<name>[\w.]+\.py)`")
NAMED_PATH = re.compile(r"`(?P<path>[\w./-]+/[\w.-]+\.py)`")


def is_named_module(path: Path) -> bool:
    """Every module but an `__init__.py` that holds only its docstring (the folder itself)."""
    if path.name != "__init__.py":
        return True
    body = ast.parse(path.read_text(encoding="utf-8")).body
    docstring = body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
    return len(body) > (1 if docstring else 0)


def package_folders() -> dict[str, list[str]]:
    """Each folder of the package, as the repository spells it (`auditor/cli/`), and the modules
    in it that its row must name."""
    folders: dict[str, list[str]] = {}
    for top in PACKAGE_DIRS:
        for path in sorted((ROOT / top).rglob("*.py")):
            folder = f"{path.parent.relative_to(ROOT).as_posix()}/"
            names = folders.setdefault(folder, [])
            if is_named_module(path):
                names.append(path.name)
    return folders


def rows(text: str) -> dict[str, list[str]]:
    """Folder -> the texts of the rows that start with it, in the doc's folder table."""
    found: dict[str, list[str]] = {}
    for m in ROW.finditer(text):
        found.setdefault(m["folder"], []).append(m["text"])
    return found


def unnamed_modules(text: str) -> list[str]:
    """Modules of the package that their folder's row does not name (a folder with no row, or
    two rows, counts for every module in it)."""
    table = rows(text)
    missing = []
    for folder, names in package_folders().items():
        row = table.get(folder, [])
        named = {m["name"] for m in NAMED_FILE.finditer(row[0])} if len(row) == 1 else set()
        missing += [f"{folder}{name}" for name in names if name not in named]
    return missing


def names_not_there(text: str) -> list[str]:
    """What the doc names that does not exist: a module a folder's row names that its folder
    lacks, a row for a folder the package lacks, a `.py` path that leads to no file (a path
    inside the package may be written from under `auditor/`: `cli/commands.py`)."""
    folders = package_folders()
    stale = []
    for folder, texts in rows(text).items():
        if folder not in folders:
            stale.append(f"the row of {folder}")
            continue
        for row in texts:
            stale += [
                f"{folder}{m['name']}"
                for m in NAMED_FILE.finditer(row)
                if not (ROOT / folder / m["name"]).is_file()
            ]
    for m in NAMED_PATH.finditer(text):
        path = m["path"]
        if not any((base / path).is_file() for base in (ROOT, ROOT / "auditor")):
            stale.append(path)
    return sorted(set(stale))


def opening(text: str) -> str:
    """The text up to the first heading after the title."""
    body = text.split("\n", 1)[1]
    return body.split("\n#", 1)[0]


def readme_pointer() -> str:
    """The first paragraph of the README's 'How it is built'."""
    section = README.read_text(encoding="utf-8").split("\n## How it is built\n", 1)[1]
    return section.strip().split("\n\n", 1)[0]


def unstated_mappings(text: str) -> list[str]:
    """Folder-to-import pairs of pyproject.toml that `text` does not state as "`auditor/` is
    `egf_audit`" (or "installs as", or "as" after the first)."""
    return [
        f"{folder}/ -> {package}"
        for folder, package in PACKAGE_DIRS.items()
        if not re.search(rf"`{folder}/` (?:installs as|is|as)\s+`{re.escape(package)}`", text)
    ]


# ---- the picture ----
def test_the_picture_of_the_layers_is_the_import_table():
    held = design_graph.current_region(DESIGN.read_text(encoding="utf-8"))
    assert held == design_graph.render(), "run `python tests/design_graph.py --write`"


def test_the_picture_shows_the_outputs_room_and_no_arrow_back_up():
    drawn = design_graph.render()
    assert 'outputs["auditor/outputs/<br/>' in drawn
    assert {"cli", "bench", "capture"} <= {
        layer for layer, targets in layer_graph(import_graph()).items() if "outputs" in targets
    }
    assert "reports --> outputs" not in drawn
    order = design_graph.top_down(layer_graph(import_graph()))
    arrows = re.findall(r"^    (\w+) --> (\w+)$", drawn, re.MULTILINE)
    ids = [design_graph._node_id(layer) for layer in order]
    assert arrows and all(ids.index(a) < ids.index(b) for a, b in arrows)


def test_a_new_import_between_layers_makes_the_picture_stale(monkeypatch):
    graph = import_graph()
    graph["egf_audit.oracle.model"] = graph["egf_audit.oracle.model"] | {"egf_audit.kernels"}
    monkeypatch.setattr(design_graph, "import_graph", lambda: graph)
    drawn = design_graph.render()
    assert "    oracle --> kernels" in drawn
    assert drawn != design_graph.current_region(DESIGN.read_text(encoding="utf-8"))


def test_a_circle_between_layers_cannot_be_drawn(monkeypatch):
    graph = import_graph()
    graph["egf_audit.trace.model"] = graph["egf_audit.trace.model"] | {"egf_audit.cli.app"}
    monkeypatch.setattr(design_graph, "import_graph", lambda: graph)
    with pytest.raises(SystemExit, match="in a circle"):
        design_graph.render()


def test_check_exits_1_with_a_diff_when_the_doc_is_stale(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "design.md"
    region = design_graph.current_region(DESIGN.read_text(encoding="utf-8"))
    stale.write_text(f"# d\n\n{region.replace(' --> runtime', ' --> kernels', 1)}\n")
    monkeypatch.setattr(design_graph, "DOC", stale)
    assert design_graph.main(["--check"]) == 1
    out = capsys.readouterr()
    assert out.out.startswith("--- docs/design.md\n+++ drawn\n")
    assert "run `python tests/design_graph.py --write`" in out.err
    assert design_graph.main(["--write"]) == 0
    assert capsys.readouterr().err == "wrote docs/design.md\n"
    assert design_graph.main(["--check"]) == 0
    stale.write_text("# d\n\nno picture here\n")
    assert design_graph.main(["--check"]) == 2
    assert capsys.readouterr().err == (
        f"docs/design.md: no region between {design_graph.BEGIN!r} and {design_graph.END!r}\n"
    )


# ---- every module named ----
def test_every_module_is_named_in_its_folders_row():
    missing = unnamed_modules(DESIGN.read_text(encoding="utf-8"))
    assert missing == [], "name each in its folder's row of docs/design.md's module table"


def test_the_doc_names_no_module_that_is_not_there():
    assert names_not_there(DESIGN.read_text(encoding="utf-8")) == []


# the planted cases compare with the doc as it is, so they judge the checker alone
def test_a_module_left_out_of_its_row_is_caught():
    doc = DESIGN.read_text(encoding="utf-8")
    text = doc.replace("`step_summary.py` (the append", "(", 1)
    added = set(unnamed_modules(text)) - set(unnamed_modules(doc))
    assert added == {"auditor/outputs/step_summary.py"}


def test_a_stale_name_is_caught():
    doc = DESIGN.read_text(encoding="utf-8")
    text = doc.replace("`atomic.py` (`write_atomic`", "`standin.py` (`write_atomic`", 1)
    text = text.replace("`trace/config_view.py`", "`trace/runner.py`", 1)
    added = set(names_not_there(text)) - set(names_not_there(doc))
    assert added == {"auditor/outputs/standin.py", "trace/runner.py"}
    assert set(unnamed_modules(text)) - set(unnamed_modules(doc)) == {"auditor/outputs/atomic.py"}


def test_an_empty_init_is_the_folder_and_one_with_code_is_a_module():
    folders = package_folders()
    assert "__init__.py" not in folders["auditor/cli/"]  # empty
    assert "__init__.py" not in folders["auditor/outputs/"]  # its docstring only
    assert "__init__.py" in folders["invariants/"]  # INVARIANTS
    assert "__init__.py" in folders["auditor/"]  # the version


# ---- where each folder installs ----
def test_the_design_doc_opens_with_where_each_folder_installs():
    assert unstated_mappings(opening(DESIGN.read_text(encoding="utf-8"))) == []


def test_the_readmes_pointer_opens_with_where_each_folder_installs():
    assert unstated_mappings(readme_pointer()) == []


def test_a_mapping_left_unsaid_is_caught():
    text = "`auditor/` installs as `egf_audit`, `invariants/` as `egf_audit.invariants`"
    assert unstated_mappings(text) == [
        "kernels/ -> egf_audit.kernels",
        "reports/ -> egf_audit.reports",
    ]
