"""A fresh virtual environment that borrows this environment's third-party packages.

`python tests/borrowed_site.py VENV` (or `make_venv(VENV)`) creates VENV with no egf-audit in
it, and a `.pth` file that puts one folder on its path: links to every package installed here
(torch, numpy, rich, typer, pip, ...) except egf-audit itself. Installing egf-audit's wheel or
checkout into VENV then checks what a fresh install checks: the package's own files and entry
point come from what was installed, and pip resolves its declared dependencies against
installed distributions (with `--no-index`, a requirement nothing satisfies fails the
install), without copying a 1 GB torch into every environment a test or CI makes. A fresh
runner pays that copy once, in its own environment; doing it again per check measured 60 to
90 s of CI time each.

The borrowed folder is not a site directory: `.pth` files inside it (the editable install's
finder among them) are never processed, so VENV cannot import this checkout by accident.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

# what egf-audit's own editable or regular install leaves in site-packages
OWN = ("egf_audit", "__editable__.egf_audit", "__editable___egf_audit", "egf-audit")


def _ours(name: str) -> bool:
    return name.lower().replace("-", "_").startswith(tuple(o.replace("-", "_") for o in OWN))


def make_venv(venv: Path) -> Path:
    """Create `venv` borrowing this interpreter's packages; return its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    borrowed = venv / "borrowed"
    borrowed.mkdir()
    here = Path(sysconfig.get_paths()["purelib"])
    for entry in sorted(here.iterdir()):
        if _ours(entry.name) or entry.suffix == ".pth" or entry.name == "__pycache__":
            continue
        os.symlink(entry, borrowed / entry.name)
    (site / "borrowed.pth").write_text(f"{borrowed}\n")
    return python


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/borrowed_site.py VENV")
    print(make_venv(Path(sys.argv[1])))
