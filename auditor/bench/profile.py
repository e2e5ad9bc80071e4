"""`egf-audit bench --profile`: where the plain step's GPU time goes.

A few plain steps run under torch.profiler with CUDA activity on. Its CUPTI tracing is
process-wide, so it sees the kernels CuPy launches and the ones cuBLAS picks, not only torch's.
Device operations are grouped by name into the pipeline's own kernels (names from the kernel
registry), cuBLAS (whatever GEMM, GEMV or split-K kernel it chose) and the rest (memsets, CuPy's
copies). The busy time is the sum over them: when a graph replay takes about as long, the step is
bound by the GPU, and this table says by what.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rich.table import Table

from egf_audit.bench.report import Unavailable
from egf_audit.kernels import KERNELS_BY_NAME

GROUPS = ("cuBLAS", "pipeline", "other")
PROFILED_STEPS = 5
WARM_STEPS = 3
# cuBLAS's kernels have long template names: keep the part that says which kernel it is
_CUBLAS_NAME = re.compile(
    r"(cutlass_\w+|sm\d+_xmma_\w+|gemvx?::kernel|gemv\w*kernel|splitKreduce_kernel|"
    r"dot_kernel|reduce_1Block_kernel|\w*[gG]emm\w*)"
)
_CUBLAS_HINTS = ("gemm", "gemv", "cublas", "cutlass", "splitk", "dot_kernel", "reduce_1block")


@dataclass
class KernelTime:
    name: str  # a pipeline kernel, a cuBLAS kernel, or a device operation such as a memset
    group: str  # one of GROUPS
    launches: float  # per step
    ms: float  # GPU time per step


@dataclass
class StepProfile:
    B: int
    steps: int
    rows: list[KernelTime]  # slowest first

    @property
    def busy_ms(self) -> float:
        return sum(r.ms for r in self.rows)

    def group_ms(self, group: str) -> float:
        return sum(r.ms for r in self.rows if r.group == group)

    def as_dict(self) -> dict[str, Any]:
        return {
            "B": self.B,
            "steps": self.steps,
            "busy_ms": self.busy_ms,
            "by_group_ms": {g: self.group_ms(g) for g in GROUPS},
            "rows": [vars(r) for r in self.rows],
        }


def classify(name: str) -> tuple[str, str]:
    """(group, short name) of one device operation's name."""
    if name in KERNELS_BY_NAME:
        return "pipeline", name
    if any(hint in name.lower() for hint in _CUBLAS_HINTS):
        match = _CUBLAS_NAME.search(name)
        short = match.group(1) if match else name[:60]
        # sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize64x64x8_stage3_warpsize1x4x1_ffma_
        # aligna4_alignc4_execute_split_k_kernel__5x_cublas → sm80_xmma_gemm_tn_n_tilesize64x64x8
        # _split_k: the tile and whether it splits k are what tell two of them apart
        short = re.sub(r"_stage\d+\w*?_execute_(split_k_)?kernel__\d+x_cublas$", r"_\1", short)
        return "cuBLAS", short.replace("_f32f32_f32f32_f32", "").rstrip("_")
    return "other", name[:60]


def aggregate(events: Iterable[tuple[str, float]], steps: int) -> list[KernelTime]:
    """(name, microseconds) of every device operation over `steps` steps → per-step rows."""
    totals: dict[tuple[str, str], list[float]] = {}
    for name, us in events:
        entry = totals.setdefault(classify(name), [0, 0.0])
        entry[0] += 1
        entry[1] += us
    rows = [
        KernelTime(short, group, count / steps, us / steps / 1e3)
        for (group, short), (count, us) in totals.items()
    ]
    return sorted(rows, key=lambda r: (-r.ms, r.name))


def device_events(prof: Any) -> list[tuple[str, float]]:
    import torch

    cuda = torch.autograd.DeviceType.CUDA
    return [(e.name, float(e.device_time)) for e in prof.events() if e.device_type == cuda]


def profile_plain_step(session: Any, pipe: Any, mode: str) -> StepProfile | Unavailable:
    """Profile `PROFILED_STEPS` plain steps of an initialised pipeline after a warm-up. An
    error propagates: the caller turns it into `Unavailable`, as for every measurement."""
    import torch
    from torch.profiler import ProfilerActivity, profile, supported_activities

    if ProfilerActivity.CUDA not in supported_activities():
        return Unavailable(f"torch {torch.__version__} cannot trace CUDA kernels (no CUPTI)")
    pipe.step(mode)  # uploads the batch every later step reuses
    for _ in range(WARM_STEPS):
        pipe.step(mode, upload_batch=False)
    session.sync()
    with profile(activities=[ProfilerActivity.CUDA], acc_events=True) as prof:
        for _ in range(PROFILED_STEPS):
            pipe.step(mode, upload_batch=False)
        session.sync()
    rows = aggregate(device_events(prof), PROFILED_STEPS)
    if not rows:
        return Unavailable("the profiler saw no device operation (CUPTI unavailable?)")
    return StepProfile(pipe.config.dims.B, PROFILED_STEPS, rows)


# ---- rendering ----

TOP_ROWS = 12


def _title(p: StepProfile) -> str:
    groups = ", ".join(f"{g} {p.group_ms(g):.3f} ms" for g in GROUPS)
    launches = sum(r.launches for r in p.rows)
    return (
        f"GPU time of one plain step at B={p.B}: {p.busy_ms:.3f} ms busy in {launches:.0f} "
        f"device operations ({groups}; mean of {p.steps} profiled steps)"
    )


def _cells(p: StepProfile, r: KernelTime) -> list[str]:
    share = r.ms / p.busy_ms if p.busy_ms else 0.0
    return [r.name, r.group, f"{r.launches:g}", f"{r.ms:.3f}", f"{share:.0%}"]


HEADERS = ("device operation", "group", "per step", "ms per step", "share")


def rich_tables(profiles: list[StepProfile | Unavailable]) -> list[Table]:
    tables = []
    for p in profiles:
        if isinstance(p, Unavailable):
            tables.append(Table(title=f"GPU profile unavailable: {p.reason}"))
            continue
        table = Table(title=_title(p), title_justify="left")
        for h in HEADERS:
            table.add_column(h, justify="left" if h in ("device operation", "group") else "right")
        for r in p.rows[:TOP_ROWS]:
            table.add_row(*_cells(p, r))
        tables.append(table)
    return tables


def markdown(profiles: list[StepProfile | Unavailable]) -> str:
    if not profiles:
        return ""
    lines = ["", "### Where the GPU time goes (`--profile`)", ""]
    for p in profiles:
        if isinstance(p, Unavailable):
            lines += [f"GPU profile unavailable: {p.reason}", ""]
            continue
        lines += [_title(p) + ":", "", "| " + " | ".join(HEADERS) + " |"]
        lines.append("| --- | --- | ---: | ---: | ---: |")
        lines += ["| " + " | ".join(_cells(p, r)) + " |" for r in p.rows[:TOP_ROWS]]
        if len(p.rows) > TOP_ROWS:
            rest = sum(r.ms for r in p.rows[TOP_ROWS:])
            lines.append(f"| {len(p.rows) - TOP_ROWS} more |  |  | {rest:.3f} |  |")
        lines.append("")
    return "\n".join(lines)
