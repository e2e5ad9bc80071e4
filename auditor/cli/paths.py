"""Paths as the document shows them: relative to the repository root that holds the document
(or to the document's own folder outside a repository), with `/` separators. So `--kernels okk`,
`--kernels ./okk` and `--kernels /abs/okk` give the same bytes, and a CI job with absolute
workspace paths writes what a local checkout does.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from pathlib import Path

from egf_audit.cli.project import repository_root


def document_base(document: Path) -> Path:
    """What the document's paths are relative to (without a settings file: see project.py)."""
    folder = document.absolute().parent
    return repository_root(folder) or folder


def shown(path: str | Path, base: Path) -> str:
    """`path` relative to `base`, `/`-separated, `..` where it lies outside. Symlinks are not
    resolved: the path is the one the user named, only spelled from the base."""
    absolute = Path(os.path.normpath(Path(path).absolute()))
    return Path(os.path.relpath(absolute, os.path.normpath(base.absolute()))).as_posix()


def command_line(
    options: dict[str, object],
    paths: tuple[str, ...],
    spell: Callable[[str | Path], str],
    default_out: Path,
) -> str:
    """`egf-audit run` with every option that shapes the document, in a fixed order.

    `options` maps an option name (`--preset`) to its value (None: leave it out); those named
    in `paths` are spelled through `spell` (repository-relative for the document, as typed for
    the stale message). `--out` is left out when it is the default."""
    parts = ["egf-audit", "run"]
    for name, value in options.items():
        if value is None:
            continue
        if name in paths:
            assert isinstance(value, str | Path)  # the path options hold paths
            value = spell(value)
            if name == "--out" and value == default_out.as_posix():
                continue
        parts += [name, str(value)]
    return shlex.join(parts)
