"""What `run --capture` takes beside the folder to shape its gate: the codes allowed to stay
UNDECIDED (`--allow-undecided CODE[,CODE]`, repeatable, or `allow-undecided = [...]` in the
settings table) and what kind of program was captured (`--trainer sp14|generic`, or `trainer`).

Each value is checked here, for the command line and the settings table alike; the problem comes
back in words, and the caller names the option or the key and its file. The invariants' codes are
read from their source (no torch; `egf-audit --help` stays quick).
"""

from __future__ import annotations

from collections.abc import Iterable

from egf_audit.errors import UsageError

TRAINERS = ("sp14", "generic")  # the same as egf_audit.cli.capture_audit.TRAINERS (tested)
MAX_SHOWN = 40  # a hostile value is cut to this many characters in a message


def shown_value(value: object) -> str:
    text = repr(value)
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "..."


def known_codes() -> tuple[str, ...]:
    from egf_audit.cli.explain import invariant_texts

    return tuple(t.code for t in invariant_texts())


def codes_problem(values: Iterable[object]) -> tuple[frozenset[str], str]:
    """The codes named by `values` (each a code or a comma list of codes), and "" or the first
    problem: an empty item, a value that is no string, a code no invariant has."""
    known = known_codes()
    found: set[str] = set()
    for value in values:
        if not isinstance(value, str):
            return frozenset(), f"{shown_value(value)} is not a string of codes"
        for item in value.split(","):
            code = item.strip()
            if not code:
                return frozenset(), f"{shown_value(value)} has an empty code"
            if code not in known:
                return frozenset(), (
                    f"{shown_value(code)} is no invariant's code (known: {known[0]} to {known[-1]})"
                )
            found.add(code)
    return frozenset(found), ""


def trainer_problem(value: object) -> str:
    if value in TRAINERS:
        return ""
    return f"{shown_value(value)} is no kind of trainer (choose from {', '.join(TRAINERS)})"


def allowed_option(values: list[str]) -> frozenset[str]:
    """--allow-undecided's values; a bad one is exit 2, one line."""
    codes, problem = codes_problem(values)
    if problem:
        raise UsageError(f"--allow-undecided: {problem}")
    return codes


def trainer_option(value: str) -> str:
    if problem := trainer_problem(value):
        raise UsageError(f"--trainer: {problem}")
    return value
