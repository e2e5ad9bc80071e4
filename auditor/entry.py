"""The console entry point, kept import-light on purpose.

cuBLAS reads its API-logger settings once, when the library loads, and importing torch (which
the oracle needs) loads it. So `egf-audit run --cublas-log` sets the logger's variables and
starts the command again before anything heavy is imported; the command then finds them set.

SIGTERM and SIGHUP are turned into the same clean end as Ctrl-C before anything is imported,
and a Ctrl-C while the command line itself loads is one line, not a traceback.
"""

from __future__ import annotations

import os
import sys


def main() -> None:
    try:
        from egf_audit.cli.options import handle_termination_signals

        handle_termination_signals()
        argv = sys.argv[1:]
        if "run" in argv and "--cublas-log" in argv:
            from egf_audit.runtime.cublas_witness import CHILD_MARKER, logger_environment

            if CHILD_MARKER not in os.environ:
                os.execve(
                    sys.executable, [sys.executable, "-m", "egf_audit", *argv], logger_environment()
                )
        from egf_audit.cli.app import run_app

        code = run_app(argv)
    except KeyboardInterrupt as exc:
        from egf_audit.cli.options import interrupted_exit

        message, code = interrupted_exit(exc)
        sys.stderr.write(f"egf-audit: error: {message}\n")
    sys.exit(code)
