"""The memory an audit run needs at given dims and steps, and the memory this machine has for it.

The need is a fit of the peak resident memory of a whole `egf-audit run --device cpu` process
(`--mode both`), measured at 22 configurations from B = 64 to 32768 at the `ci` widths, at the
`prod` widths and between them, at 1 to 32 steps (docs/config.md, "Memory", has the table). It
grows with two kinds of buffer at different rates:

    need = 253 MiB + 0.75 MiB x steps
         + (191.5 + 34.0 x steps) x P      P: bytes of `params` (one of its five copies)
         + (19.5 + 3.2 x steps) x R        R: bytes of every other buffer (the batch's)

Every measurement lies within 4 % of the fit. The estimate is the fit with its constants rounded
up, plus a tenth: a config the estimate refuses would have driven the machine into swap or the
OOM killer mid-run, after minutes of work.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from egf_audit.runtime.memory import Layout
from egf_audit.trace.buffers import ELEMENT_BYTES

MIB = 1 << 20
BASE_BYTES = 256 * MIB  # the interpreter, torch and the compiled kernels, before any buffer
BASE_BYTES_PER_STEP = 1 * MIB
PARAM_FACTOR, PARAM_FACTOR_PER_STEP = 192.0, 34.0
OTHER_FACTOR, OTHER_FACTOR_PER_STEP = 20.0, 3.25
MARGIN = 1.10
# The buffers that hold the whole net, each laid out as `params` (pipeline/layout.py).
PARAM_SIZED = ("params", "grad_buf", "adam_m", "adam_v", "target_params")

# Where the machine's available memory cannot be read at all, a run may need at most this.
UNKNOWN_MACHINE_CAP = 8 << 30
_MEMINFO = Path("/proc/meminfo")
_PROC_CGROUP = Path("/proc/self/cgroup")
_CGROUP_ROOT = Path("/sys/fs/cgroup")
# (controller mount below _CGROUP_ROOT, limit file, usage file): cgroup v2, then v1
_CGROUP_FILES = {
    "v2": ("", "memory.max", "memory.current"),
    "v1": ("memory", "memory.limit_in_bytes", "memory.usage_in_bytes"),
}
_NO_LIMIT = 1 << 60  # cgroup v1 writes "no limit" as a huge number (v2 as "max")


def buffer_bytes(layout: Layout) -> int:
    return ELEMENT_BYTES * sum(b.size for b in layout.buffers)


def estimated_need(layout: Layout, steps: int) -> int:
    """Bytes of memory a run of `steps` steps at this layout is estimated to need at its peak."""
    param = ELEMENT_BYTES * layout.buffer("params").size
    other = buffer_bytes(layout) - len(PARAM_SIZED) * param
    need = (
        BASE_BYTES
        + BASE_BYTES_PER_STEP * steps
        + (PARAM_FACTOR + PARAM_FACTOR_PER_STEP * steps) * param
        + (OTHER_FACTOR + OTHER_FACTOR_PER_STEP * steps) * other
    )
    return int(MARGIN * need)


def available_memory() -> tuple[int, str]:
    """(bytes a new run may use, where that figure comes from): the kernel's MemAvailable (what
    can be allocated without swapping), or less where this process's memory cgroup leaves less
    room; the physical memory where neither can be read; else UNKNOWN_MACHINE_CAP."""
    found = [
        (value, source)
        for value, source in (
            (_meminfo_available(), "MemAvailable"),
            (_cgroup_room(), "the memory cgroup's limit less its usage"),
        )
        if value is not None
    ]
    if found:
        return min(found)
    physical = physical_memory()
    if physical is None:
        return UNKNOWN_MACHINE_CAP, "the cap where the machine's memory cannot be read"
    return physical, "the machine's physical memory"


def _meminfo_available() -> int | None:
    try:
        lines = _MEMINFO.read_text(encoding="ascii").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    for line in lines:
        key, _, value = line.partition(":")
        fields = value.split()
        if key == "MemAvailable" and len(fields) == 2 and fields[1] == "kB" and fields[0].isdigit():
            return int(fields[0]) * 1024
    return None


def _cgroup_room() -> int | None:
    """The least room (limit - usage) of this process's memory cgroup and of every cgroup above
    it, v2 or v1; None where no limit is set or none can be read."""
    try:
        lines = _PROC_CGROUP.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    rooms = []
    for line in lines:  # "hierarchy-id:controllers:path"; v2's controllers are empty
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[1] == "":
            mount, limit_name, usage_name = _CGROUP_FILES["v2"]
        elif "memory" in parts[1].split(","):
            mount, limit_name, usage_name = _CGROUP_FILES["v1"]
        else:
            continue
        own = PurePosixPath(parts[2])
        for group in (own, *own.parents):
            folder = _CGROUP_ROOT / mount / group.relative_to("/")
            limit, usage = _read_int(folder / limit_name), _read_int(folder / usage_name)
            if limit is not None and usage is not None and limit < _NO_LIMIT:
                rooms.append(max(0, limit - usage))
    return min(rooms) if rooms else None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None  # v2's "max": no limit


def physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
