"""Hold the outsider's GPU recording (record.sh's verdicts.jsonl) to expected.json: every
capture recorded with its layout file, in each mode, fails exactly its fault's codes (the
default and runtime-API modes), or its `fails_deep` codes where it has them (else its codes) and
at most `deep_may_add` (`--deep`), and the clean
one leaves undecided exactly what its mode cannot decide. A fault of expected.json with no
recording in a mode that was recorded, or a recording no rule covers, fails too.
Usage: python check_verdicts.py VERDICTS_JSONL"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

EXPECTED = json.loads((Path(__file__).parent / "expected.json").read_text(encoding="utf-8"))
PREFIXES = {"out-rt-": "runtime", "out-deep-": "deep", "out-": "default"}
# the H100 recording of 2026-12-07, committed (tests/test_capture_h200_programs.py)
RECORDED = Path(__file__).parent / "recorded" / "verdicts.jsonl.gz"


def read_lines(path: Path | str) -> list[dict]:
    """record.sh's verdicts.jsonl, or its committed gzipped copy, one audit per line."""
    path = Path(path)
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return [json.loads(x) for x in data.decode("utf-8").splitlines() if x.strip()]


def _mode_and_fault(capture: str) -> tuple[str, str]:
    for prefix, mode in PREFIXES.items():  # the longer prefixes first
        if capture.startswith(prefix):
            return mode, capture[len(prefix) :]
    raise ValueError(f"{capture}: no recording of record.sh is named so")


def problems(lines: list[dict]) -> list[str]:
    found: list[str] = []
    seen: dict[str, set[str]] = {}
    for line in lines:
        if line.get("layout") != "file":
            continue  # inference decides less by design: judged by the layout file only
        mode, fault = _mode_and_fault(line["capture"])
        seen.setdefault(mode, set()).add(fault)
        if fault not in EXPECTED["fails"]:
            found.append(f"{line['capture']}: no expectation for fault {fault}")
            continue
        if "refused" in line or line.get("incomplete") or len(line.get("processes", [])) != 1:
            found.append(f"{line['capture']}: not one complete audited process: {line}")
            continue
        verdicts = line["processes"][0]["verdicts"]
        failing = {c for c, (status, _) in verdicts.items() if status == "fail"}
        codes = EXPECTED["fails_deep"].get(fault) if mode == "deep" else None
        want = set(EXPECTED["fails"][fault] if codes is None else codes)
        extra = set(EXPECTED["deep_may_add"]) if mode == "deep" else set()
        if not want <= failing <= want | extra:
            found.append(f"{line['capture']}: fails {sorted(failing)}, expected {sorted(want)}")
        if fault == "clean":
            undecided = {c for c, (status, _) in verdicts.items() if status == "undecided"}
            wanted = set(EXPECTED["undecided"]["deep" if mode == "deep" else "default"])
            if undecided != wanted:
                found.append(
                    f"{line['capture']}: undecided {sorted(undecided)}, not {sorted(wanted)}"
                )
    for mode, faults in seen.items():
        for fault in sorted(set(EXPECTED["fails"]) - faults):
            found.append(f"{mode}: no recording of {fault}")
    if not seen:
        found.append("no capture recorded with its layout file")
    return found


def main(path: str) -> int:
    lines = read_lines(path)
    found = problems(lines)
    for p in found:
        print(p)
    judged = sum(1 for x in lines if x.get("layout") == "file")
    print(f"outsider: {judged - len(found)} of {judged} captures give their expected verdicts")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
