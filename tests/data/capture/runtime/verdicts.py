"""One line of JSON per audit of a capture folder, with the layout file and without it: the
gate, every process's verdicts, and what the reader made of its launches and GEMMs (entry
points, decoded or not, bound or not). Usage: python verdicts.py CAPTURE_DIR NAME"""

import collections
import json
import sys

from egf_audit.cli.capture_audit import audit_capture
from egf_audit.errors import UsageError


def main(folder: str, name: str) -> None:
    for use_layout in (True, False):
        line: dict = {"capture": name, "layout": "file" if use_layout else "inferred"}
        try:
            audit = audit_capture(folder, use_layout=use_layout)
        except UsageError as exc:
            print(json.dumps(line | {"refused": str(exc)}))
            continue
        line |= {"ok": audit.ok, "incomplete": audit.incomplete, "missing": audit.missing}
        line["not_audited"] = audit.not_audited
        line["processes"] = []
        for p in audit.processes:
            records = p.trace.capture.process.records
            kernels = [r for r in records if r.kind == "kernel"]
            gemms = [r for r in records if r.kind in ("sgemm", "gemm")]
            line["processes"].append(
                {
                    "section": p.section,
                    "sp14": p.trace.capture.sp14,
                    "verdicts": {c: [v.status, v.summary] for c, v in p.verdicts},
                    "kernel_apis": collections.Counter(r.api for r in kernels),
                    "kernels_decoded": sum(r.decoded for r in kernels),
                    "kernels": len(kernels),
                    "abi_by_symbol": sorted(
                        {r.args.get("symbol", r.name) for r in kernels if r.decoded}
                    ),
                    "gemms": len(gemms),
                    "gemms_bound": sum("unbound" not in r.args for r in gemms),
                    "gemm_functions": collections.Counter(r.name for r in gemms),
                    "gemms_unbound": [r.args["unbound"] for r in gemms if "unbound" in r.args],
                    "internal_lt": p.trace.capture.process.internal_lt,
                    "notes": p.trace.capture.process.notes,
                    "snapshots": len(p.trace.capture.process.snapshots),
                }
            )
        print(json.dumps(line))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
