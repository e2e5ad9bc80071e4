"""`Trace.to_jsonl` writes each launch as the JSON of its fields, as dataclasses.asdict would give
them, without asdict's deep copy (a capture's trace.jsonl is written while the user waits): the
lines are held byte for byte to an asdict-based encoder, on a capture's trace and on a rebuild's
(whose launches carry observed effects)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from egf_audit.capture.convert import to_trace
from egf_audit.capture.events import read_capture
from egf_audit.capture.layout import load_layout_file, place
from egf_audit.capture.manifest import audited_process
from egf_audit.trace.effects import Effects, GuardBreach, StrayWrite
from egf_audit.trace.model import Binding, Launch, Region, Trace

FIXTURE = Path(__file__).parent / "data" / "capture" / "runtime" / "recorded" / "rt-deep-clean"


def _asdict_lines(trace: Trace) -> list[str]:
    def default(value: object) -> object:
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, tuple):
            return list(value)
        raise TypeError(type(value).__name__)

    head = {"type": "trace", "scenario": trace.scenario, "backend": trace.backend}
    lines = [json.dumps({**head, "meta": trace.meta}, sort_keys=True)]
    for x in trace.launches:
        record = asdict(x)
        record["type"] = "launch"
        lines.append(json.dumps(record, sort_keys=True, default=default))
    return lines


def test_a_capture_s_trace_is_written_as_asdict_writes_it():
    proc = audited_process(read_capture(FIXTURE))
    layout, _ = place(load_layout_file(FIXTURE / "layout.json.gz"), proc)
    trace = to_trace(proc, layout, scenario="capture")
    assert len(trace.launches) > 500
    assert list(trace.to_jsonl()) == _asdict_lines(trace)


def test_launches_with_effects_numpy_scalars_and_int_keys_are_written_as_asdict_writes_them():
    region = Region("params", 3, 2, 4, 5)
    binding = Binding("C", 4096, "rw", region, "w_b0fc", (0, 8, 5), True)
    effects = Effects(
        (StrayWrite("params", 17, "w_b0fc", 2, 0x3F800000, 0),),
        (GuardBreach("d_h_s2", "after", 3, 1),),
        "exited with code 7",
    )
    launch = Launch(
        0, 1, "sgemm", "sgemm", "forward[x]@main",
        {"m": np.int32(8), "alpha": np.float32(0.5), "pair": (1, 2.0), "rows": {3: 1, 1: 2},
         "nested": {"k": [np.uint64(9)]}},
        (binding,), True, effects, None,
    )  # fmt: skip
    trace = Trace("sentinel", "cpu", {}, meta={"step": 1})
    trace.launches.append(launch)
    assert list(trace.to_jsonl()) == _asdict_lines(trace)
