"""Every help text says what its source says: typer's rich mode reads `[word]` as a style tag
and drops it, so a literal bracket (`[tool.egf-audit]`) must reach rich escaped. Walked over
every command and option of the app, so a new help text is held to it without a new test."""

from __future__ import annotations

import re

import pytest
import typer
from cli_fakes import invoke
from rich.text import Text

from egf_audit.cli.app import app

STYLE_TAG = re.compile(r"\[/?bold\]")  # the only markup the help texts mean


def help_texts() -> list[tuple[str, str]]:
    """(where, text) of every command's help and every parameter's."""
    root = typer.main.get_command(app)
    found = [("egf-audit", root.help or "")]
    for name, command in root.commands.items():  # type: ignore[attr-defined]
        found.append((name, command.help or ""))
        for param in command.params:
            found += [(f"{name} {param.name}", getattr(param, "help", None) or "")]
    return [(where, text) for where, text in found if text]


@pytest.mark.parametrize(("where", "text"), help_texts(), ids=lambda v: str(v)[:40])
def test_a_help_text_loses_no_bracket_to_rich(where, text):
    meant = STYLE_TAG.sub("", text).replace("\\[", "[")
    assert Text.from_markup(text).plain == meant, where


@pytest.mark.parametrize("argv", [["run", "--help"], ["mutants", "--help"], ["capture", "--help"]])
def test_help_names_the_settings_table(argv):
    said = " ".join(invoke(*argv).stdout.split())
    assert "[tool.egf-audit] table" in said
    assert "the table" not in said.replace("the [tool.egf-audit] table", "")
