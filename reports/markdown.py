"""Small markdown helpers shared by the document and the GitHub step summary."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def cell(value: object) -> str:
    """One table cell: a single line, with the characters that would break a GFM table escaped."""
    text = " ".join(str(value).split())
    return text.replace("|", "\\|") or " "


def code(value: object) -> str:
    """Inline code that survives a table cell (backticks inside are replaced, not nested)."""
    text = str(value).replace("`", "'")
    return f"`{text}`"


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """A GitHub-flavoured markdown table; cells are escaped with `cell`."""
    lines = [
        "| " + " | ".join(cell(h) for h in header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return lines
