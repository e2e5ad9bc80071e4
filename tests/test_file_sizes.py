"""Files a reader can hold: no Python module in auditor/, invariants/ or reports/ over 400 lines,
with no exemption: a module that grows past the limit is split by what each part knows."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("auditor", "invariants", "reports")
LIMIT = 400


def _line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def _modules() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def test_modules_are_at_most_400_lines() -> None:
    modules = _modules()
    assert len(modules) > 100, "the folders moved? (the package has over 150 modules)"
    over = {str(p.relative_to(ROOT)): _line_count(p) for p in modules if _line_count(p) > LIMIT}
    assert not over, f"modules over {LIMIT} lines (split them by what each part knows): {over}"
