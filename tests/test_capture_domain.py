"""Every value the capture reader uses is in its domain first (capture/schema.py, live_memory.py,
cublas_log.py, gemms.py): addresses inside the process's user address space (0, or 2**15 up to
2**48, and what they name ending there too), live allocations apart, a snapshot region inside
the allocation holding it, a deep effect's runs inside what the recorder compared, cuBLAS's log
read whole-value, a GEMM's batches inside the address space. Each rule: one line, exit 2.
Built from the committed clean capture (and the deep and cuBLASLt recordings), as
tests/test_capture_files.py builds its hostile captures."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from test_capture_files import EVENTS, Capture, at, refused

from egf_audit.capture.events import read_capture
from egf_audit.capture.schema import ADDRESS_LIMIT, LOWEST_ADDRESS, MAX_STRING

DATA = Path(__file__).parent / "data" / "capture"
ADDRESS = "no address of the process"


@pytest.fixture
def cap(tmp_path: Path) -> Capture:
    return Capture(tmp_path)


def _shift_after(cap: Capture, number: int) -> None:
    """Room for one more line after `number`: every seq from there on, and every launch or
    allocation a line names by seq, one higher."""
    threshold = cap.event(number + 1)["seq"]
    for i in range(number, len(cap.lines)):
        e = json.loads(cap.lines[i])
        e["seq"] += 1
        cap.lines[i] = json.dumps(e)
    for i in range(len(cap.lines)):
        e = json.loads(cap.lines[i])
        for key in ("launch", "alloc"):
            if e["ev"] != "memset" and isinstance(e.get(key), int) and e[key] >= threshold:
                e[key] += 1
                cap.lines[i] = json.dumps(e)


def _insert_after(cap: Capture, number: int, event: dict[str, Any]) -> int:
    _shift_after(cap, number)
    before = cap.event(number)
    cap.lines.insert(number, json.dumps(event | {"seq": before["seq"] + 1, "tid": before["tid"]}))
    cap.save()
    return number + 1


# ---- addresses ----
@pytest.mark.parametrize(
    ("ev", "key", "value"),
    [
        ("alloc", "dst", 4096),
        ("alloc", "dst", ADDRESS_LIMIT),
        ("memset", "dst", 16),
        ("copy", "dst", 2**64 - 8),
        ("copy", "src", LOWEST_ADDRESS - 4),
        ("snapshot", "ptr", ADDRESS_LIMIT + 4096),
    ],
)
def test_an_address_outside_the_address_space_is_refused(cap, ev, key, value):
    number = cap.edit(cap.first_of(ev), lambda e: e | {key: value})
    refused(cap.folder, at(EVENTS, number) + f'"{key}" is {value}: {ADDRESS}')


def test_the_lowest_and_highest_addresses_are_in_the_domain(cap):
    """The bounds themselves: 2**15 is an address, 2**48 - 4096 with 4096 bytes ends on it."""
    cap.edit(cap.first_of("memset"), lambda e: e | {"dst": LOWEST_ADDRESS})
    cap.edit(cap.first_of("copy"), lambda e: e | {"dst": ADDRESS_LIMIT - e["bytes"]})
    read_capture(cap.folder)


def test_bytes_leaving_the_address_space_are_refused(cap):
    number = cap.edit(cap.first_of("copy"), lambda e: e | {"dst": ADDRESS_LIMIT - 8, "bytes": 16})
    refused(cap.folder, at(EVENTS, number) + r'"dst" \d+ and 16 bytes from it leave the address')


def test_an_allocation_of_bytes_at_address_zero_is_refused(cap):
    number = cap.edit(cap.first_of("alloc"), lambda e: e | {"dst": 0, "bytes": 1 << 40})
    refused(cap.folder, at(EVENTS, number) + "an allocation of 1099511627776 bytes at address 0")


def _free(cap: Capture, after: int, address: int) -> int:
    free = {"ev": "free", "api": "cuMemFree_v2", "dst": address, "src": 0, "bytes": 0, "value": 0}
    return _insert_after(cap, after, free)


def test_a_free_of_any_value_frees_nothing_and_is_no_address(cap):
    """A free is recorded at its call, before the driver checks it: cudaFree(garbage) is a
    call the trainer made, which frees nothing."""
    _free(cap, cap.first_of("alloc"), 2**64 - 1)
    read_capture(cap.folder)


def test_a_string_longer_than_the_recorder_writes_is_refused(cap):
    number = cap.edit(cap.first_of("note"), lambda e: e | {"msg": "x" * (MAX_STRING + 1)})
    refused(cap.folder, at(EVENTS, number) + '"msg" is longer than 65536 characters')


# ---- live allocations ----
def test_a_live_allocation_overlapping_another_is_refused(cap):
    first = cap.first_of("alloc")
    alloc = cap.event(first)
    number = _insert_after(cap, first, alloc | {"dst": alloc["dst"] + 16})
    refused(
        cap.folder,
        at(EVENTS, number) + r"an allocation of \d+ bytes at \d+ overlaps the live allocation",
        rf"\(line {first}\)",
    )


def test_an_allocation_where_a_freed_one_was_is_taken(cap):
    """The driver hands freed memory out again: the same address after its free is no overlap."""
    first = cap.first_of("alloc")
    alloc = cap.event(first)
    free = _free(cap, first, alloc["dst"])
    _insert_after(cap, free, alloc)
    read_capture(cap.folder)


def test_a_zero_byte_allocation_overlaps_nothing(cap):
    first = cap.first_of("alloc")
    _insert_after(cap, first, cap.event(first) | {"bytes": 0})
    read_capture(cap.folder)


def test_a_snapshot_region_past_the_allocation_holding_it_is_refused(cap):
    number = cap.edit(
        cap.first(lambda e: e.get("region") == "d_h_s2"),
        lambda e: e | {"elements": 1 << 24, "rows": 1, "ld": 1 << 24},
    )
    refused(
        cap.folder,
        at(EVENTS, number) + r"a d_h_s2 region of 16777216 elements: \d+ bytes from \d+ run \d+ "
        "bytes past the end of the live allocation holding it",
    )


def test_a_wire_region_longer_than_an_int_of_rows_is_refused(cap):
    number = cap.edit(
        cap.first(lambda e: e.get("region") == "wire"),
        lambda e: e | {"elements": 2**31, "rows": 2**31, "ld": 1},
    )
    refused(cap.folder, at(EVENTS, number) + "a wire region of 2147483648 elements: more rows")


def test_a_snapshot_of_address_zero_is_refused(cap):
    number = cap.edit(cap.first_of("snapshot"), lambda e: e | {"ptr": 0})
    refused(cap.folder, at(EVENTS, number) + '"ptr" 0: a region of no memory')


def test_a_snapshot_leaving_the_address_space_is_refused(cap):
    number = cap.edit(
        cap.first_of("snapshot"),
        lambda e: e | {"ptr": ADDRESS_LIMIT - 4, "elements": 2, "rows": 2, "ld": 1, "count": 0},
    )
    refused(cap.folder, at(EVENTS, number) + r'"ptr" \d+ and 2 elements from it leave')


# ---- cuBLAS's log, whole values ----
def _set_arg(cap: Capture, arg: str, value: str) -> int:
    header = cap.first(lambda e: "cublasSgemm_v2" in e.get("msg", ""))
    number = next(
        n for n in range(header + 1, len(cap.lines) + 1) if f"i!  {arg}:" in cap.event(n)["msg"]
    )
    cap.edit(number, lambda e: e | {"msg": re.sub(r"val=.*", f"val={value}", e["msg"].rstrip())})
    return header


@pytest.mark.parametrize(
    "value",
    [
        "POINTER (IN HEX:0x0xzz)",
        "POINTER (IN HEX:0x0x)",
        "POINTER (IN HEX:0x0x10000000000000000)",
        "POINTER (IN HEX:0x0x7f0000001000) and more",
        "POINTER (IN HEX:0x0x10)",
        "POINTER (IN HEX:0x0xffff800000000000)",
    ],
)
def test_a_pointer_that_is_no_pointer_of_the_process_is_refused(cap, value):
    header = _set_arg(cap, "A", value)
    refused(cap.folder, at(EVENTS, header) + r"cublasSgemm_v2 call: A .* is no device pointer")


def test_a_null_pointer_reads_as_zero(cap):
    header = _set_arg(cap, "C", "POINTER (IN HEX:0x(nil))")
    (proc,) = read_capture(cap.folder)
    assert next(r for r in proc.records if r.line == header).args["C"] == 0


@pytest.mark.parametrize(("arg", "value"), [("m", "64abc"), ("m", "64 rows"), ("ldc", "0x40")])
def test_an_integer_that_is_not_the_whole_value_is_refused(cap, arg, value):
    header = _set_arg(cap, arg, value)
    refused(cap.folder, at(EVENTS, header) + f"cublasSgemm_v2 call: {arg} .* is no int")


def test_an_operation_that_is_not_the_whole_value_is_refused(cap):
    header = _set_arg(cap, "transa", "CUBLAS_OP_T(1) or N")
    refused(cap.folder, at(EVENTS, header) + "cublasSgemm_v2 call: transa .* is no CUBLAS_OP_N")


# ---- GEMM batches and cuBLASLt layouts ----
PROBE = DATA / "runtime" / "recorded" / "probe"
LT = DATA / "runtime" / "recorded" / "rt-gemm-lt"


def _copy_edit(src: Path, tmp_path: Path, edit) -> tuple[Path, str]:
    folder = tmp_path / "capture"
    shutil.copytree(src, folder)
    (events,) = folder.glob("events-*.jsonl.gz")
    lines = gzip.decompress(events.read_bytes()).decode().splitlines()
    number = edit(lines)
    events.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    return folder, f"{events.name} line {number}"


def _strided(arg: str, value: int):
    def edit(lines: list[str]) -> int:
        header = next(i for i, line in enumerate(lines) if "cublasSgemmStridedBatched(" in line)
        n = next(i for i in range(header, len(lines)) if f"i!  {arg}:" in lines[i])
        e = json.loads(lines[n])
        e["msg"] = re.sub(r"val=-?\d+", f"val={value}", e["msg"])
        lines[n] = json.dumps(e)
        return header + 1

    return edit


@pytest.mark.parametrize(
    ("arg", "value", "says"),
    [
        ("batchCount", 2**31, "batchCount 2147483648 is no int"),
        ("batchCount", -1, "batchCount -1 is no int"),
        ("strideA", 2**61, r"operand A\[2\] spans bytes \d+ to \d+, outside"),
        ("strideC", -(2**46), r"operand C\[2\] spans bytes -\d+ to"),
    ],
)
def test_a_strided_call_whose_batches_leave_the_address_space_is_refused(
    tmp_path, arg, value, says
):
    folder, where = _copy_edit(PROBE, tmp_path, _strided(arg, value))
    refused(folder, rf"^{re.escape(where)}: cublasSgemmStridedBatched call: {says}")


def _lt(change):
    def edit(lines: list[str]) -> int:
        n = next(i for i, line in enumerate(lines) if '"ev":"ltmatmul"' in line)
        e = json.loads(lines[n])
        change(e)
        lines[n] = json.dumps(e)
        return n + 1

    return edit


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (
            lambda e: e["adesc"].__setitem__(5, 1 << 62),
            '"adesc" has batch count 4611686018427387904',
        ),
        (lambda e: e["adesc"].__setitem__(4, -5), '"adesc" has ld -5'),
        (lambda e: e["ddesc"].__setitem__(2, 1 << 62), "cublasLtMatmul call: operand .* outside"),
        (lambda e: e.update(a=1 << 60), f'"a" is 1152921504606846976: {ADDRESS}'),
    ],
)
def test_a_cublaslt_call_outside_its_domain_is_refused(tmp_path, change, says):
    folder, where = _copy_edit(LT, tmp_path, _lt(change))
    refused(folder, rf"^{re.escape(where)}: {says}")


def test_a_cublaslt_call_whose_second_batch_lies_below_address_zero_is_refused(tmp_path):
    def back(e: dict[str, Any]) -> None:
        for key in ("adesc", "bdesc", "cdesc", "ddesc"):
            e[key][5], e[key][6] = 2, -(1 << 62)

    folder, where = _copy_edit(LT, tmp_path, _lt(back))
    refused(folder, rf"^{re.escape(where)}: cublasLtMatmul call: operand A\[1\] spans bytes -")


# ---- a deep capture's effects ----
DEEP = DATA / "deep" / "clean"


def _effect(change):
    def edit(lines: list[str]) -> int:
        n = [i for i, line in enumerate(lines) if '"ev":"effect"' in line and "[[" in line][3]
        e = json.loads(lines[n])
        change(e)
        lines[n] = json.dumps(e)
        return n + 1

    return edit


def test_an_effect_outside_every_allocation_compared_is_refused(tmp_path):
    folder, where = _copy_edit(DEEP, tmp_path, _effect(lambda e: e.update(changed=[[1 << 40, 4]])))
    refused(folder, rf"^{re.escape(where)}: an effect of call \d+: changed bytes at \d+, below")


def test_an_effect_past_an_allocations_compared_end_is_refused(tmp_path):
    def past(e: dict[str, Any]) -> None:
        start, size = e["changed"][0]
        e["changed"] = [[start, size + (1 << 30)]]

    folder, where = _copy_edit(DEEP, tmp_path, _effect(past))
    refused(folder, rf"^{re.escape(where)}: an effect of call \d+: changed bytes .* outside every")


def test_an_effect_run_past_the_address_space_is_refused(tmp_path):
    change = _effect(lambda e: e.update(changed=[[ADDRESS_LIMIT - 4, 8]]))
    folder, where = _copy_edit(DEEP, tmp_path, change)
    refused(folder, rf"^{re.escape(where)}: \"changed\" \[0\] ends at \d+, past the process")


def test_a_pointer_array_entry_outside_the_address_space_is_refused(tmp_path):
    def edit(lines: list[str]) -> int:
        n = next(i for i, line in enumerate(lines) if '"a_ptrs"' in line)
        e = json.loads(lines[n])
        e["a_ptrs"][1] = 1 << 50
        lines[n] = json.dumps(e)
        return n + 1

    folder, where = _copy_edit(PROBE, tmp_path, edit)
    refused(folder, rf"^{re.escape(where)}: \"a_ptrs\" \[1\] is 1125899906842624: {ADDRESS}")
