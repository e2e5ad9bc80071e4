"""`egf-audit invariants` and `explain`: the invariants' texts, read without importing the
checks (egf_audit.invariant_text), so both answer in a fraction of a second with no torch or
numpy loaded (tests/test_fast_commands.py)."""

from __future__ import annotations

import json

from rich.table import Table
from rich.text import Text

from egf_audit import __version__
from egf_audit.errors import UsageError
from egf_audit.invariant_text import InvariantText, UnreadableText, read_texts

INVARIANTS_SCHEMA = "egf-audit/invariants/1"


def invariant_texts() -> tuple[InvariantText, ...]:
    """The texts, read from source; from the imported registry (seconds, never wrong) when a
    module stops spelling them as literals."""
    try:
        return read_texts()
    except (UnreadableText, OSError, SyntaxError):
        from egf_audit.invariants import INVARIANTS

        return tuple(inv.text() for inv in INVARIANTS)


def invariants_json() -> str:
    data = {
        "schema": INVARIANTS_SCHEMA,
        "egf_audit_version": __version__,
        "invariants": [
            {
                "code": t.code,
                "slug": t.slug,
                "message": t.message,
                "what": t.what,
                "why": t.why,
                "how": t.how,
                "catches": t.catches,
                "limits": t.limits,
                "example": t.example,
            }
            for t in invariant_texts()
        ],
    }
    return json.dumps(data, indent=2) + "\n"


def invariants_table() -> Table:
    table = Table(title="egf-audit invariants", title_justify="left")
    table.add_column("code", no_wrap=True)
    table.add_column("slug", no_wrap=True)
    table.add_column("message")
    for t in invariant_texts():
        table.add_row(Text(t.code), Text(t.slug), Text(t.message))
    return table


def find_invariant(name: str) -> InvariantText:
    """An invariant by code (`EGF003`, any case) or slug (`wire-zero-under-sentinel`)."""
    wanted = name.strip()
    texts = invariant_texts()
    for t in texts:
        if t.code == wanted.upper() or t.slug == wanted.lower():
            return t
    known = ", ".join(f"{t.code} ({t.slug})" for t in texts)
    raise UsageError(f"unknown invariant {name!r} (known: {known})")


def explain(name: str) -> str:
    """The invariant's whole text (What / Why / How / Bug / Known limits / Example), as
    markdown."""
    return find_invariant(name).doc()
