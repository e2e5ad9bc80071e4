"""Small markdown helpers shared by the document and the GitHub step summary. Each writes its
text on one line (runs of spaces, tabs and line breaks become one space) with every control,
format and bidi character escaped (reports/controls.py): a cell or a name cannot break a table,
format, inject markup or hide what it says."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from egf_audit.reports.controls import visible

_SPACES = re.compile(r"[ \t\n\r\x0b\x0c]+")


def one_line(value: object) -> str:
    """`value` as one line of visible text: its spaces collapsed, its hidden characters shown."""
    return visible(_SPACES.sub(" ", str(value)).strip())


def cell(value: object) -> str:
    """One table cell: a single line, with the characters that would break a GFM table escaped."""
    text = one_line(value)
    return re.sub(r"(?<!\\)\|", r"\\|", text) or " "  # a pipe `text` escaped stays escaped once


def code(value: object) -> str:
    """Inline code that survives a table cell (backticks inside are replaced, not nested)."""
    text = visible(str(value)).replace("`", "'")
    return f"`{text}`"


_MARKDOWN = str.maketrans({c: "\\" + c for c in "\\`*_[]<>#!|~"})


def text(value: object) -> str:
    """Untrusted text (a name from a trainer's layout file, a summary quoting it) as plain
    markdown: one line, every character that could open markup, a link, HTML or a table cell
    escaped, so a name can neither format nor inject anything."""
    return one_line(value).translate(_MARKDOWN) or " "


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """A GitHub-flavoured markdown table; cells are escaped with `cell`."""
    lines = [
        "| " + " | ".join(cell(h) for h in header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return lines
