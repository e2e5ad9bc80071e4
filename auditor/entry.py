"""The console entry point, kept import-light on purpose.

SIGTERM and SIGHUP are turned into the same clean end as Ctrl-C before anything is imported,
and a Ctrl-C while the command line itself loads is one line, not a traceback.
"""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from egf_audit.cli.options import handle_termination_signals

        handle_termination_signals()
        argv = sys.argv[1:]
        from egf_audit.cli.app import run_app

        code = run_app(argv)
    except KeyboardInterrupt as exc:
        from egf_audit.cli.options import interrupted_exit

        message, code = interrupted_exit(exc)
        sys.stderr.write(f"egf-audit: error: {message}\n")
    sys.exit(code)
