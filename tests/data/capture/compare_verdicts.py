"""Compare freshly recorded capture folders with the committed fixtures of the same names.

    python tests/data/capture/compare_verdicts.py NEW_DIR [COMMITTED_DIR]

NEW_DIR holds folders made by a record.sh (tests/data/capture/record.sh, or
tests/data/capture/runtime/record.sh for the `rt-*` and `probe*` ones); COMMITTED_DIR defaults
to the committed fixtures (this folder, and runtime/recorded for the runtime trainer's). For
each folder of NEW_DIR that has a committed twin, every process's verdict status per
invariant, the gate's outcome and what made the capture incomplete must agree, with the layout
file and without it: the recorder and the checks as they are now give the committed verdicts
on the GPU of today. Prints one line per folder and a summary; exits 1 on any difference or
when no folder could be compared, 0 otherwise.
"""

from __future__ import annotations

import sys
from pathlib import Path

from egf_audit.cli.capture_audit import audit_capture
from egf_audit.errors import UsageError

HERE = Path(__file__).resolve().parent
COMMITTED = (HERE, HERE / "runtime" / "recorded", HERE / "llmc" / "recorded", HERE / "deep")


def outcome(folder: Path, use_layout: bool) -> dict[str, object]:
    """What the gate makes of a capture folder: refused, or its verdicts and completeness."""
    try:
        audit = audit_capture(folder, use_layout=use_layout)
    except UsageError as exc:
        return {"refused": str(exc)}
    return {
        "ok": audit.ok,
        "incomplete": len(audit.incomplete),
        "missing": len(audit.missing),
        "processes": [{code: v.status for code, v in p.verdicts} for p in audit.processes],
    }


def twin(name: str, roots: tuple[Path, ...]) -> Path | None:
    for root in roots:
        if (root / name / "manifest.json").is_file():
            return root / name
    return None


def main(argv: list[str]) -> int:
    if not 1 <= len(argv) <= 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    new = Path(argv[0])
    roots = (Path(argv[1]),) if len(argv) == 2 else COMMITTED
    compared = differ = 0
    for folder in sorted(p for p in new.iterdir() if (p / "manifest.json").is_file()):
        committed = twin(folder.name, roots)
        if committed is None:
            print(f"{folder.name}: no committed fixture of that name (not compared)")
            continue
        compared += 1
        for use_layout in (True, False):
            got, want = outcome(folder, use_layout), outcome(committed, use_layout)
            how = "layout file" if use_layout else "inferred"
            if got == want:
                print(f"{folder.name} ({how}): the committed verdicts")
            else:
                differ += 1
                print(
                    f"{folder.name} ({how}): DIFFERS\n  recorded now: {got}\n  committed:    {want}"
                )
    print(f"{compared} captures compared with their fixtures, {differ} audits differ")
    return 1 if differ or not compared else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
