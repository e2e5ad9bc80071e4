"""Every config the validator accepts runs a correct pipeline to a clean audit, and every value
that could not is refused before anything runs (one line, exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_fakes import invoke

from egf_audit.invariants import FAIL, evaluate
from egf_audit.pipeline import memory_need
from egf_audit.pipeline.config import (
    MAX_CONFIG_BYTES,
    MAX_STEPS,
    ConfigError,
    check_run_memory,
    config_from_mapping,
    load_config,
    validate_steps,
)
from egf_audit.pipeline.layout import build_layout
from egf_audit.scenarios.audit import Auditor

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ({"hyper": {"beta1": 1}}, "hyper.beta1 must lie in [0, 1)"),
        ({"hyper": {"beta2": 1.0}}, "hyper.beta2 must lie in [0, 1)"),
        ({"hyper": {"eps": 1e-300}}, "hyper.eps must be a normal fp32 number"),
        ({"hyper": {"lr": 1e39}}, "hyper.lr must be a normal fp32 number"),
        ({"hyper": {"sigma_max": 1e-39}}, "hyper.sigma_max must be a normal fp32 number"),
        ({"dims": {"B": 1048576, "SH1": 2000}}, "GiB of buffers; the limit is"),
        (
            {"dims": {"SH1": 1048576, "SH2": 1048576}},
            "config dims make params hold 1099718198066 elements, more than the kernels' 32-bit "
            "int indices reach (2^31 - 1, with the rows of a last block of 256 threads)",
        ),
        (
            {"dims": {"B": 1048576, "SH1": 2048}},
            "config dims make save_h_s1 hold 2147483648 elements, more than the kernels' 32-bit "
            "int indices reach",
        ),
    ],
)
def test_a_value_no_pipeline_could_run_is_refused(override, words):
    with pytest.raises(ConfigError) as caught:
        config_from_mapping(override)
    assert words in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "hyper",
    [
        {"lambda_aux": 0},  # the CE gradient is -0.0, the closed wire adds +0.0 (EGF003)
        {"beta1": 0.999999, "beta2": 0.9999999, "eps": 1.2e-38},  # 1 - beta cancels in fp32
        {"lambda_cql": 0, "tau": 1, "gamma": 0},
    ],
    ids=["lambda_aux-0", "betas-near-1", "edges"],
)
def test_an_accepted_edge_value_gives_a_clean_audit(cpu_backend, hyper):
    config = config_from_mapping({"hyper": hyper})
    run = Auditor(config, cpu_backend, steps=2).run(("sentinel", "live"))
    failing = [
        f"{r.code}[{r.mode}]: {r.verdict.summary}"
        for r in evaluate(run)
        if r.verdict.status == FAIL
    ]
    assert failing == []


# ---- a config file is read only when it is a small regular file (issue 19, item 6) ----
def run_cli(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The CLI in its own process: a config read that blocks fails the test by the time-out
    instead of holding the suite."""
    env = {**os.environ, "NO_COLOR": "1", "TERM": "dumb", "COLUMNS": "120"}
    return subprocess.run(
        [sys.executable, "-m", "egf_audit", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def error_lines(stderr: str) -> list[str]:
    """The error lines (stderr also carries the progress lines)."""
    return [ln for ln in stderr.splitlines() if ln.startswith("egf-audit: error:")]


def assert_refused(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert result.returncode == 2, result.stderr
    assert error_lines(result.stderr) == [f"egf-audit: error: {message}"], result.stderr
    assert "Traceback" not in result.stderr


def test_a_fifo_as_config_is_refused_at_once_without_a_blocking_read(tmp_path):
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)  # no writer ever opens it: a blocking open or read would never return
    out = tmp_path / "audit.md"
    result = run_cli(
        "run", "--device", "cpu", "--config", str(fifo), "--out", str(out), cwd=tmp_path
    )
    assert_refused(result, f"config file {fifo} is a FIFO (named pipe), not a regular file")
    assert not out.exists()


def test_a_character_device_as_config_is_refused_without_reading_it(tmp_path):
    """/dev/zero never ends: read whole, it would fill the memory."""
    result = run_cli("run", "--device", "cpu", "--config", "/dev/zero", cwd=tmp_path)
    assert_refused(result, "config file /dev/zero is a character device, not a regular file")


def test_a_directory_as_config_is_refused(tmp_path):
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path)
    assert str(caught.value) == f"config file {tmp_path} is a directory, not a regular file"


def test_a_config_file_over_one_mib_is_refused_and_one_of_exactly_one_mib_is_read(tmp_path):
    header = b'preset = "ci"\n[dims]\nB = 128\n'
    padded = header + b"#" * (MAX_CONFIG_BYTES - len(header) - 1) + b"\n"
    assert len(padded) == MAX_CONFIG_BYTES == 1 << 20
    exact = tmp_path / "exact.toml"
    exact.write_bytes(padded)
    assert load_config(exact).dims.B == 128
    over = tmp_path / "over.toml"
    over.write_bytes(padded + b"\n")
    with pytest.raises(ConfigError) as caught:
        load_config(over)
    assert str(caught.value) == (
        f"config file {over} holds 1048577 bytes or more; a config file may hold at most "
        "1048576 bytes (1 MiB)"
    )


def test_a_config_file_that_is_not_utf8_is_one_line(tmp_path):
    bad = tmp_path / "latin1.toml"
    bad.write_bytes(b"# caf\xe9\n")
    with pytest.raises(ConfigError) as caught:
        load_config(bad)
    assert str(caught.value) == f"config file {bad} is not UTF-8 text: invalid continuation byte"


# ---- the memory a run needs (issue 19, item 6) ----
def measured_rows() -> list[dict[str, str]]:
    """The table of peak RSS measurements in docs/config.md, section Memory."""
    text = (ROOT / "docs" / "config.md").read_text(encoding="utf-8")
    section = text[text.index("## Memory") :]
    lines = [ln for ln in section.splitlines() if ln.startswith("| ")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    return [
        dict(zip(header, (cell.strip() for cell in ln.strip("|").split("|")), strict=True))
        for ln in lines[1:]
    ]


WIDTHS = {
    "`ci`": {"preset": "ci"},
    "`prod`": {"preset": "prod"},
    "between": {
        "preset": "prod",
        "dims": {"OBS": 64, "SH1": 512, "SH2": 256, "ADV": 128, "VALH": 128},
    },
}


def test_the_estimate_lies_above_every_measured_peak_and_within_a_seventh_of_it():
    rows = measured_rows()
    assert len(rows) == 22
    for row in rows:
        base = WIDTHS[row["widths"]]
        dims = {**base.get("dims", {}), "B": int(row["B"])}
        layout = build_layout(config_from_mapping({**base, "dims": dims}).dims)
        rss = float(row["peak RSS (MiB)"]) * 2**20
        assert round(memory_need.buffer_bytes(layout) / 2**20, 1) == float(row["buffers (MiB)"])
        estimate = memory_need.estimated_need(layout, int(row["steps"]))
        assert round(estimate / 2**20) == int(row["estimate (MiB)"]), row
        assert rss < estimate < 1.15 * rss, row


def test_a_run_that_would_not_fit_is_refused_with_both_figures(monkeypatch):
    monkeypatch.setattr(memory_need, "available_memory", lambda: (1 << 30, "a test's figure"))
    dims = config_from_mapping({"dims": {"B": 16384}}).dims
    with pytest.raises(ConfigError) as caught:
        check_run_memory(dims, 2)
    assert str(caught.value) == (
        "config dims with --steps 2 need an estimated 3.1 GiB of memory (0.10 GiB of buffers); "
        "1.0 GiB is available (a test's figure); see docs/config.md, Memory"
    )
    monkeypatch.setattr(memory_need, "available_memory", lambda: (4 << 30, "a test's figure"))
    check_run_memory(dims, 2)  # 3.1 GiB fits in 4


def test_the_cli_refuses_a_run_that_would_not_fit_before_anything_runs(workdir, monkeypatch):
    monkeypatch.setattr(memory_need, "available_memory", lambda: (1 << 30, "a test's figure"))
    (workdir / "big.toml").write_text("[dims]\nB = 65536\n")
    for command in ("run", "mutants"):
        result = invoke(command, "--device", "cpu", "--config", "big.toml")
        assert result.exit_code == 2, result.output
        assert error_lines(result.stderr) == [
            "egf-audit: error: config dims with --steps 2 need an estimated 11.4 GiB of memory "
            "(0.38 GiB of buffers); 1.0 GiB is available (a test's figure); see docs/config.md, "
            "Memory"
        ]
    assert not (workdir / "docs").exists()


def test_more_steps_need_more_memory_and_are_refused_sooner(monkeypatch):
    monkeypatch.setattr(memory_need, "available_memory", lambda: (1 << 30, "a test's figure"))
    dims = config_from_mapping({"dims": {"B": 4096}}).dims
    check_run_memory(dims, 2)  # 1011 MiB
    with pytest.raises(ConfigError, match=r"with --steps 3 need an estimated 1\.1 GiB"):
        check_run_memory(dims, 3)  # 1101 MiB


def test_available_memory_is_the_least_of_meminfo_and_the_cgroups_room(tmp_path, monkeypatch):
    (tmp_path / "meminfo").write_text("MemTotal: 8388608 kB\nMemAvailable: 2097152 kB\n")
    (tmp_path / "cgroup").write_text("0::/ci/job\n")
    job = tmp_path / "fs" / "ci" / "job"
    job.mkdir(parents=True)
    (job / "memory.max").write_text(f"{1 << 30}\n")
    (job / "memory.current").write_text(f"{256 << 20}\n")
    (tmp_path / "fs" / "ci" / "memory.max").write_text("max\n")  # no limit above
    (tmp_path / "fs" / "ci" / "memory.current").write_text(f"{300 << 20}\n")
    monkeypatch.setattr(memory_need, "_MEMINFO", tmp_path / "meminfo")
    monkeypatch.setattr(memory_need, "_PROC_CGROUP", tmp_path / "cgroup")
    monkeypatch.setattr(memory_need, "_CGROUP_ROOT", tmp_path / "fs")
    room = (768 << 20, "the memory cgroup's limit less its usage")
    assert memory_need.available_memory() == room
    (job / "memory.max").write_text("max\n")
    assert memory_need.available_memory() == (2 << 30, "MemAvailable")


def test_available_memory_falls_back_to_physical_memory_then_to_a_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(memory_need, "_MEMINFO", tmp_path / "absent")
    monkeypatch.setattr(memory_need, "_PROC_CGROUP", tmp_path / "absent")
    monkeypatch.setattr(memory_need, "physical_memory", lambda: 16 << 30)
    assert memory_need.available_memory() == (16 << 30, "the machine's physical memory")
    monkeypatch.setattr(memory_need, "physical_memory", lambda: None)
    assert memory_need.available_memory() == (
        8 << 30,
        "the cap where the machine's memory cannot be read",
    )


# ---- --steps has a bound (issue 19, item 6) ----
def test_steps_are_bounded_by_max_steps():
    assert MAX_STEPS == 100
    assert validate_steps(100) == 100
    with pytest.raises(ConfigError) as caught:
        validate_steps(101)
    assert str(caught.value) == (
        "--steps must be at most 100, got 101 (each step keeps its trace and snapshots in "
        "memory; see docs/config.md)"
    )


@pytest.mark.parametrize("command", ["run", "mutants"])
def test_the_cli_refuses_steps_past_the_bound_in_one_line(workdir, command):
    result = invoke(command, "--device", "cpu", "--steps", "101")
    assert result.exit_code == 2, result.output
    assert error_lines(result.stderr) == [
        "egf-audit: error: --steps must be at most 100, got 101 (each step keeps its trace and "
        "snapshots in memory; see docs/config.md)"
    ]
    assert not (workdir / "docs").exists()
