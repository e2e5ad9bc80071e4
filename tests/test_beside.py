"""cli/beside.py: modules imported in a thread beside `egf-audit run`'s first phases, then one
piece of work; every path ends the thread, and an import's error is raised in the main thread."""

from __future__ import annotations

import sys
import threading

import pytest

from egf_audit.cli.beside import Beside


def test_the_imports_then_the_work_run_in_the_thread_and_join_waits_for_both():
    ran: list[str] = []
    beside = Beside(("json", "email.utils"))
    beside.start()
    beside.then(lambda: ran.append(threading.current_thread().name))
    beside.join()
    assert ran == ["egf-audit-imports"] and "email.utils" in sys.modules


def test_join_without_work_ends_the_thread():
    beside = Beside(("json",))
    beside.start()
    beside.join()
    assert not beside._thread.is_alive()


def test_a_failed_import_skips_the_work_and_is_raised_in_the_main_thread():
    ran: list[bool] = []
    beside = Beside(("json", "egf_audit_no_such_module"))
    beside.start()
    with pytest.raises(ModuleNotFoundError, match="egf_audit_no_such_module"):
        beside.imported()
    beside.then(lambda: ran.append(True))
    with pytest.raises(ModuleNotFoundError):
        beside.join()
    beside.join(raising=False)  # a second join, where another error is on its way: quiet
    assert ran == [] and not beside._thread.is_alive()


def test_join_of_a_thread_never_started_returns():
    Beside(("json",)).join()
