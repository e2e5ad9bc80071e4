"""A stand-in trainer: egf-audit's own SP14 step as a plain process, to be captured.

    python tests/standin/trainer.py [--fault NAME] [--steps 2] [--layout-out FILE]

from the repository root of a checkout where egf-audit is installed (`pip install -e .`). It
lives with the tests, not in the package: it is a demonstration and a fixture maker that puts
the fault catalogue's bugs back, nothing a user of the gate runs. The tests import it as
`standin.trainer` (tests/ is on their path).

Recorder off (plain mode): the process only trains, as the real trainer does, so a capture of
it shares nothing with the auditing process but what the injected recorder writes. `--fault`
puts one historical wiring bug back (egf_audit.scenarios.faults). Step 0 runs with the gate
closed (sentinel: ISV[393] = 0), step 1 with the live producer, so one capture shows both.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from egf_audit.capture.layout import layout_document
from egf_audit.errors import AuditEnvironmentError, UsageError
from egf_audit.outputs.atomic import write_atomic
from egf_audit.pipeline.config import load_config
from egf_audit.pipeline.step import SP14Pipeline
from egf_audit.pipeline.wiring import PRODUCTION
from egf_audit.runtime.backends import select_backend
from egf_audit.runtime.kernel_sources import load_kernel_set
from egf_audit.scenarios.faults import FAULTS_BY_NAME

MODE_SCHEDULE = ("sentinel", "live")  # step k runs MODE_SCHEDULE[k % 2]


def write_layout(pipe: SP14Pipeline, path: Path) -> None:
    """The layout file the way a trainer writes one: every allocation's address and size, the
    named-offset table, the dims."""
    buffers = {
        spec.name: (
            pipe.amap.bases[spec.name],
            spec.size,
            {t.name: (t.offset, t.rows, t.cols) for t in spec.tensors},
        )
        for spec in pipe.layout.buffers
    }
    params = pipe.layout.buffer("params")
    offsets = {t.name: (t.offset, t.rows, t.cols) for t in params.tensors}
    dims = {**dataclasses.asdict(pipe.dims), "tau": float(pipe.config.hyper.tau)}
    write_atomic(path, layout_document(buffers, dims, offsets))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/standin/trainer.py")
    parser.add_argument("--fault", default=None, help="a fault name (egf-audit mutants --help)")
    parser.add_argument("--preset", default="ci")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--layout-out", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        fault = FAULTS_BY_NAME.get(args.fault) if args.fault else None
        if args.fault and fault is None:
            raise UsageError(f"unknown fault {args.fault!r}")
        config = load_config(None, args.preset, args.seed)
        kernels = load_kernel_set()
        wiring = PRODUCTION
        if fault is not None:
            kernels, wiring = fault.apply_kernels(kernels), fault.wiring
            # a trainer runs its own kernels in its own process: the fault's patched source is
            # the trainer's kernel here, not one egf-audit sandboxes in a worker process (the
            # rebuild's isolation), so a capture sees its launch and its writes where they run
            kernels = dataclasses.replace(
                kernels,
                sources=tuple(dataclasses.replace(s, origin="bundled") for s in kernels.sources),
            )
        backend = select_backend(args.device, kernels)
        start = time.perf_counter()
        pipe = SP14Pipeline(config, backend, wiring, instrumented=False, scenario="standin")
        pipe.initialize()
        if args.layout_out is not None:
            write_layout(pipe, args.layout_out)
        for k in range(args.steps):
            pipe.step(MODE_SCHEDULE[k % len(MODE_SCHEDULE)])
        backend.synchronize()
        seconds = time.perf_counter() - start
    except UsageError as exc:
        print(f"standin: error: {exc}", file=sys.stderr)
        return 2
    except AuditEnvironmentError as exc:
        print(f"standin: error: {exc}", file=sys.stderr)
        return 3
    name = args.fault or "clean"
    print(f"standin: {name}: {args.steps} steps on {backend.name} in {seconds:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
