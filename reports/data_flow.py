"""The document's mermaid data-flow diagram, drawn from what was measured.

The d = 0 SGEMMs carry the widths they really read and wrote (k of the forward SGEMM, m of the
dW and dX SGEMMs, from step 0 of the reference trace) against the concat width SH2 + 1. An edge
whose SGEMM drops the wire column, or whose stage the wire-status table finds broken, is drawn
red and labelled BROKEN.
"""

from __future__ import annotations

from egf_audit.invariants.registry import FAIL
from egf_audit.reports.model import AuditReport
from egf_audit.reports.wire_status import first, reference_trace, wire_status
from egf_audit.trace.model import Trace

BROKEN_STYLE = "stroke:#d00,stroke-width:3px,color:#d00"


def _width(trace: Trace | None, label: str, arg: str) -> int | None:
    x = first(trace, label) if trace is not None else None
    return None if x is None else int(x.args[arg])


class _Edges:
    """Mermaid edges, numbered in drawing order so `linkStyle N` can colour the broken ones."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.broken: list[int] = []
        self.count = 0

    def add(self, line: str, broken: bool = False) -> None:
        if broken:
            self.broken.append(self.count)
        self.lines.append(line)
        self.count += 1


def _width_label(name: str, width: int | None, wanted: int) -> tuple[str, bool]:
    if width is None:
        return f"{name} not recorded", True
    if width != wanted:
        return f"{name} = {width} of {wanted}: BROKEN, the wire column is dropped", True
    return f"{name} = {width}", False


def data_flow(report: AuditReport) -> list[str]:
    d = report.config.dims
    w = d.SH2 + 1
    trace = reference_trace(report)
    broken_rows = {row.wire for row in wire_status(report) if row.status == FAIL}
    fwd, fwd_bad = _width_label("k", _width(trace, "forward_branch_fc[d=0]@online", "k"), w)
    fwd_bad |= "Forward dispatch" in broken_rows
    sites = {}
    for site in ("cql", "main"):
        dw_text, dw_bad = _width_label(
            "m", _width(trace, f"backward_branch_dw[d=0]@{site}", "m"), w
        )
        dx_text, dx_bad = _width_label(
            "m", _width(trace, f"backward_branch_dx[d=0]@{site}", "m"), w
        )
        sites[site] = (dw_text, dw_bad, dx_text, dx_bad)
    dw_label = "; ".join(f"{s}: {v[0]}" for s, v in sites.items())
    dx_label = "; ".join(f"{s}: {v[2]}" for s, v in sites.items())
    dw_bad = any(v[1] for v in sites.values()) or "dW unchanged" in broken_rows
    dx_bad = any(v[3] for v in sites.values()) or "Backward dispatch" in broken_rows
    gate_bad = "Backward dispatch" in broken_rows
    target_bad = "Target net" in broken_rows

    e = _Edges()
    e.add(f'    obs["obs [{d.B}, {d.OBS}]"] --> trunk["trunk: h_s1, h_s2"]')
    e.add(f'    trunk --> hs2["save_h_s2 [{d.B}, {d.SH2}]"]')
    e.add(f'    hs2 --> aux["aux head: aux_nb_softmax_buf [{d.B}, {d.AUXK}]"]')
    e.add('    aux --> wire["wire = p[up] - p[down]"]')
    e.add(f'    hs2 --> concat["sp14_dir_qaux_concat_scratch [{d.B}, {w}]"]')
    e.add("    wire --> concat")
    e.add(
        f'    concat -- "{fwd}" --> fc0["forward_branch_fc d=0: w_b0fc [{d.ADV}, {w}]"]',
        fwd_bad,
    )
    e.add('    hs2 --> heads["mag, ord, urg branches; value stream"]')
    e.add('    fc0 --> q["dueling Q heads"]')
    e.add("    heads --> q")
    head = ["## Data flow", "", _caption(trace), "", "```mermaid", "flowchart TD"]
    body = ["  subgraph forward", *e.lines, "  end"]
    e.lines = []
    e.add(f'    dq["dQ"] -- "{dw_label}" --> dwsg["d=0 dW SGEMM: grad_buf+goff_w_b0fc"]', dw_bad)
    e.add(
        f'    dq -- "{dx_label}" --> dxsg["d=0 dX SGEMM: sp14_d_dir_qaux_concat [{d.B}, {w}]"]',
        dx_bad,
    )
    e.add('    dxsg --> gate{"sp14_scale_wire_col: column SH2 times ISV[393]"}', gate_bad)
    e.add(
        f'    gate -- "columns 0..{d.SH2 - 1}" --> acc["accumulate into d_h_s2 [{d.B}, {d.SH2}]"]'
    )
    e.add('    gate -- "gated wire column" --> auxb["aux head backward"]', gate_bad)
    e.add('    acc --> trunkb["trunk backward"]')
    e.add("    auxb --> trunkb")
    body += ['  subgraph backward ["backward, per call site: cql, then main"]', *e.lines, "  end"]
    e.lines = []
    e.add('  isv["ISV[393]: 0.0 (sentinel) or the live gate"] -.-> gate')
    e.add("  q --> dq")
    polyak = "BROKEN: not the only writer" if target_bad else "the only writer"
    e.add(
        '  polyak["polyak_ema: tau params + (1 - tau) target"] -. '
        f'"{polyak}" .-> target["target_params"]',
        target_bad,
    )
    body += e.lines
    if e.broken:
        body.append(f"  linkStyle {','.join(map(str, e.broken))} {BROKEN_STYLE}")
    return [*head, *body, "```"]


def _caption(trace: Trace | None) -> str:
    where = "step 0 of the reference run" if trace is not None else "no recorded trace"
    return (
        "The widths on the d = 0 SGEMM edges are the ones measured at "
        f"{where} (k of the forward SGEMM, m of the backward ones, against SH2 + 1); an edge "
        "drawn red and labelled BROKEN drops the wire column or belongs to a stage the wire "
        "status finds broken."
    )
