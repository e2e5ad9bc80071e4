"""The console entry point, kept import-light on purpose.

cuBLAS reads its API-logger settings once, when the library loads, and importing torch (which
the oracle needs) loads it. So `egf-audit run --cublas-log` sets the logger's variables and
starts the command again before anything heavy is imported; the command then finds them set.
"""

from __future__ import annotations

import os
import sys

from egf_audit.runtime.cublas_witness import CHILD_MARKER, logger_environment


def main() -> None:
    argv = sys.argv[1:]
    if "run" in argv and "--cublas-log" in argv and CHILD_MARKER not in os.environ:
        os.execve(sys.executable, [sys.executable, "-m", "egf_audit", *argv], logger_environment())
    from egf_audit.cli.app import main as cli_main

    cli_main()
