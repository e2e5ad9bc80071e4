"""GitHub Actions' workflow commands (`::error file=F,line=N::message`), escaped as the runner
reads them, and whether this process runs under Actions. Imports nothing heavy: an error that
ends a command before any audit (a settings file it refuses) is annotated through it too."""

from __future__ import annotations

import os

from egf_audit.reports.controls import visible


def in_github_actions() -> bool:
    return os.environ.get("GITHUB_ACTIONS") == "true"


def escape_data(text: str) -> str:
    """A workflow command's message: %, CR and LF would end or corrupt the command."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A property value (title=, file=) also may not hold the `:` and `,` that delimit them."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def command(level: str, message: str, **properties: object) -> str:
    """One workflow command, its message and properties visible text (reports/controls.py:
    a control or bidi character a trainer's name carried is shown as its escape), escaped as
    the command syntax needs."""
    props = ",".join(
        f"{k}={escape_property(visible(str(v)))}" for k, v in properties.items() if v is not None
    )
    return f"::{level}{' ' + props if props else ''}::{escape_data(visible(message))}"
