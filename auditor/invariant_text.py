"""The invariants' texts (code, slug, message, What / Why / How / Bug / Known limits / Example),
read without importing the checks.

`egf-audit invariants` and `explain` print only these texts, yet importing the registry loads
numpy and torch (the checks and the oracle need them): seconds for a page of static text. So the
texts are read here from the invariant modules' source, the keyword arguments of their
`INVARIANT = Invariant(...)`, which are string literals. The modules stay the one home of the
texts; tests/test_fast_commands.py checks that this reading equals the imported registry, entry
by entry, so the two can never drift apart.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass, fields
from pathlib import Path


@dataclass(frozen=True)
class InvariantText:
    code: str  # "EGF001"
    slug: str  # "gemm-k-matches-lda"
    message: str  # one line, shown when it fails
    what: str  # What it proves
    why: str  # Why it matters
    how: str  # How it is measured
    catches: str  # The bug it catches
    limits: str  # Known limits
    example: str  # a concrete failing wiring

    def doc(self) -> str:
        """The whole text, as `egf-audit explain CODE` prints it."""
        return (
            f"{self.code} {self.slug}\n\n{self.message}\n\n"
            f"## What it proves\n{self.what}\n\n## Why it matters\n{self.why}\n\n"
            f"## How it is measured\n{self.how}\n\n## Bug it catches\n{self.catches}\n\n"
            f"## Known limits\n{self.limits}\n\n## Example\n{self.example}\n"
        )


TEXT_FIELDS = tuple(f.name for f in fields(InvariantText))


class UnreadableText(ValueError):
    """An invariant module whose texts are not plain literals: the caller reads the registry
    instead (cli/explain.py), slow but never wrong."""


def _folder() -> Path:
    # find_spec of a sub-package imports its parent (egf_audit) only, never the checks
    spec = importlib.util.find_spec("egf_audit.invariants")
    if spec is None or not spec.submodule_search_locations:
        raise UnreadableText("the invariants package cannot be found")
    return Path(next(iter(spec.submodule_search_locations)))


def _text_of(path: Path) -> InvariantText:
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if (
            isinstance(node, ast.Assign)
            and [getattr(t, "id", None) for t in node.targets] == ["INVARIANT"]
            and isinstance(node.value, ast.Call)
        ):
            given = {k.arg: k.value for k in node.value.keywords if k.arg in TEXT_FIELDS}
            try:
                values = {name: ast.literal_eval(given[name]) for name in TEXT_FIELDS}
            except (KeyError, ValueError) as exc:
                raise UnreadableText(f"{path.name}: {exc}") from None
            if not all(isinstance(v, str) for v in values.values()):
                raise UnreadableText(f"{path.name}: a text is not a string")
            return InvariantText(**values)
    raise UnreadableText(f"{path.name}: no INVARIANT = Invariant(...)")


def invariant_modules() -> list[Path]:
    """The invariants' modules (one an invariant), found without importing any: how many
    invariants a run will judge, known before torch and the checks are loaded."""
    return sorted(_folder().glob("egf[0-9][0-9][0-9]_*.py"))


def read_texts() -> tuple[InvariantText, ...]:
    """Every invariant's texts, in code order, from the modules' source."""
    paths = invariant_modules()
    if not paths:
        raise UnreadableText("no invariant module found")
    return tuple(sorted((_text_of(p) for p in paths), key=lambda t: t.code))
