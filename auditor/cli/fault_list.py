"""`egf-audit mutants --list`: the fault catalogue as a table. Import-light on purpose: the
catalogue (scenarios/faults.py) needs no torch, numpy or invariant, so the list answers in a
fraction of a second (tests/test_fast_commands.py), where tables.py loads the registry."""

from __future__ import annotations

from collections.abc import Iterable

from rich.table import Table
from rich.text import Text

from egf_audit.scenarios.faults import Fault


def fault_list(faults: Iterable[Fault]) -> Table:
    table = Table(title="egf-audit faults", title_justify="left")
    table.add_column("fault", no_wrap=True)
    table.add_column("the bug it puts back")
    for fault in faults:
        table.add_row(Text(fault.name), Text(fault.summary))
    return table
