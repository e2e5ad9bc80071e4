"""Dimensions, hyper-parameters and presets of the audited SP14 trainer.

A run is configured by a preset (`ci`, `prod`), optionally overridden by a TOML file:

    preset = "ci"
    seed = 7
    [dims]
    B = 128
    [hyper]
    gamma = 0.97

Every error is a `ConfigError` whose message is one line naming the key or file.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from egf_audit.errors import UsageError, about_option
from egf_audit.kernels import THREADS_PER_BLOCK
from egf_audit.pipeline import memory_need
from egf_audit.pipeline.layout import build_layout
from egf_audit.small_files import read_small_text
from egf_audit.trace.config_view import ConfigDict
from egf_audit.trace.contract import ALPHA_GRAD_SMOOTHED_INDEX
from egf_audit.trace.hyper import Hyper

MAX_DIM = 1 << 20
# The kernels index with 32-bit ints (the ABI's rows, ld, sh2 are `int`): every element a
# launch's grid can reach, its rows rounded up to a whole block, must have an int index. The CPU
# backend's guard reservations (guarded_memory.REACH) are as wide as such an index can reach.
INT32_MAX = (1 << 31) - 1
# Every allocation of the trainer's layout together (4 bytes an element) may take at most this,
# and at most a quarter of the machine's memory, whatever the command (the bench's buffers live
# on the GPU); an audit run's whole need is held to the available memory (check_run_memory).
MAX_LAYOUT_BYTES = 16 << 30
MEMORY_SHARE = 4
# A config file lists some 25 keys in about 2 KB; a larger file is not one, and reading it
# whole (a /dev/zero, a log) would only fill the memory.
MAX_CONFIG_BYTES = 1 << 20
# Each step adds its trace and snapshots to the run's memory (about 3.5 MB at `ci`, 0.9 GB at
# `prod`), and after the second step every step repeats the same launches on a moved state: an
# audit proves nothing more at 100 steps than at 10, and 100 `ci` steps take ~10 s and ~0.35 GB.
MAX_STEPS = 100
LIMITS = (
    "Every buffer's elements (its rows rounded up to a block of 256 threads) must have a 32-bit "
    f"int index; all buffers together may take at most {MAX_LAYOUT_BYTES >> 30} GiB and a "
    "quarter of the machine's memory; an audit run's estimated peak memory (docs/config.md, "
    "Memory) must fit in the memory available. A config file is a regular file of at most "
    f"{MAX_CONFIG_BYTES >> 20} MiB; --steps is at most {MAX_STEPS}."
)
# numpy's finfo(float32).tiny and .max, spelled out: `egf-audit config --example` reads this
# module and must answer without importing numpy (tests/test_fast_commands.py)
FP32_TINY, FP32_MAX = 2.0**-126, (2.0 - 2.0**-23) * 2.0**127


class ConfigError(UsageError):
    """A bad preset, config file or config key: exit code 2."""


@dataclass(frozen=True)
class Dims:
    """Widths of the trainer; names follow the trainer's constants."""

    B: int  # batch rows
    OBS: int  # observation width
    SH1: int  # trunk layer 1 width
    SH2: int  # trunk layer 2 width (h_s2)
    AUXK: int  # aux head classes (down, flat, up)
    ADV: int  # branch hidden width (adv_h)
    VALH: int  # value-stream hidden width
    A: tuple[int, int, int, int]  # actions per branch: dir, mag, ord, urg
    E: tuple[int, int, int, int]  # extra concat columns per branch (E[0] is the wire)
    N_ISV: int  # length of the ISV signal buffer

    def branch_in(self, d: int) -> int:
        """Input width of branch d's first FC: `[h_s2 | extra_d]`."""
        return self.SH2 + self.E[d]


@dataclass(frozen=True)
class Config:
    preset: str
    seed: int
    dims: Dims
    hyper: Hyper = field(default_factory=Hyper)

    def as_dict(self) -> ConfigDict:
        return {
            "preset": self.preset,
            "seed": self.seed,
            "dims": dataclasses.asdict(self.dims),
            "hyper": dataclasses.asdict(self.hyper),
        }


PRESETS: dict[str, Dims] = {
    "ci": Dims(
        B=64,
        OBS=32,
        SH1=64,
        SH2=48,
        AUXK=3,
        ADV=32,
        VALH=32,
        A=(3, 5, 3, 3),
        E=(1, 2, 1, 1),
        N_ISV=512,
    ),
    "prod": Dims(
        B=4096,
        OBS=128,
        SH1=1024,
        SH2=512,
        AUXK=3,
        ADV=256,
        VALH=256,
        A=(3, 5, 3, 3),
        E=(1, 2, 1, 1),
        N_ISV=512,
    ),
}
DEFAULT_SEED = 0

_TUPLE_DIMS = {"A", "E"}
_TOP_KEYS = {"preset", "seed", "dims", "hyper"}


def _check_int(key: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"config key {key} must be an integer, got {value!r}")
    if value < minimum:
        raise ConfigError(f"config key {key} must be >= {minimum}, got {value}")
    if value > MAX_DIM:
        raise ConfigError(f"config key {key} = {value} is absurdly large (limit {MAX_DIM})")
    return value


def _check_float(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"config key {key} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ConfigError(f"config key {key} must be finite, got {value}")
    return value


def validate_dims(dims: Dims) -> Dims:
    """Reject shapes the trainer cannot have. Returns dims unchanged."""
    for f in dataclasses.fields(Dims):
        value = getattr(dims, f.name)
        if f.name in _TUPLE_DIMS:
            if not isinstance(value, tuple) or len(value) != 4:
                raise ConfigError(f"config key dims.{f.name} must be a list of 4 integers")
            for i, item in enumerate(value):
                _check_int(f"dims.{f.name}[{i}]", item)
        else:
            _check_int(f"dims.{f.name}", value)
    if dims.AUXK < 3:
        raise ConfigError(f"config key dims.AUXK must be >= 3 (down, flat, up), got {dims.AUXK}")
    if dims.N_ISV <= ALPHA_GRAD_SMOOTHED_INDEX:
        raise ConfigError(
            f"config key dims.N_ISV must exceed ALPHA_GRAD_SMOOTHED_INDEX = "
            f"{ALPHA_GRAD_SMOOTHED_INDEX}, got {dims.N_ISV}"
        )
    if dims.E[0] != 1:
        raise ConfigError(f"config key dims.E[0] must be 1 (the wire column), got {dims.E[0]}")
    _check_total_size(dims)
    return dims


def _check_total_size(dims: Dims) -> None:
    layout = build_layout(dims)
    for buffer in layout.buffers:
        # a launch over a buffer's rows runs whole blocks: up to a block less one row more
        reach = buffer.size + (THREADS_PER_BLOCK - 1) * max(t.cols for t in buffer.tensors)
        if reach > INT32_MAX:
            raise ConfigError(
                f"config dims make {buffer.name} hold {buffer.size} elements, more than the "
                f"kernels' 32-bit int indices reach (2^31 - 1, with the rows of a last block of "
                f"{THREADS_PER_BLOCK} threads)"
            )
    total = memory_need.buffer_bytes(layout)
    memory = memory_need.physical_memory()
    limit = min(MAX_LAYOUT_BYTES, memory // MEMORY_SHARE) if memory else MAX_LAYOUT_BYTES
    if total > limit:
        raise ConfigError(
            f"config dims need {total / 2**30:.1f} GiB of buffers; the limit is "
            f"{limit / 2**30:.1f} GiB (at most {MAX_LAYOUT_BYTES >> 30} GiB and a quarter of "
            "this machine's memory)"
        )


def check_run_memory(dims: Dims, steps: int) -> None:
    """Refuse a run whose estimated peak memory (memory_need.py) exceeds the available memory,
    before anything runs: a run that swaps takes hours, one the OOM killer ends gives no verdict."""
    layout = build_layout(dims)
    need = memory_need.estimated_need(layout, steps)
    available, source = memory_need.available_memory()
    if need > available:
        raise ConfigError(
            f"config dims with --steps {steps} need an estimated {need / 2**30:.1f} GiB of "
            f"memory ({memory_need.buffer_bytes(layout) / 2**30:.2f} GiB of buffers); "
            f"{available / 2**30:.1f} GiB is available ({source}); see docs/config.md, Memory"
        )


def validate_steps(steps: int) -> int:
    if steps < 1:
        raise ConfigError(f"--steps must be at least 1, got {steps}")
    if steps > MAX_STEPS:
        raise ConfigError(
            f"--steps must be at most {MAX_STEPS}, got {steps} (each step keeps its trace and "
            "snapshots in memory; see docs/config.md)"
        )
    return steps


def validate_hyper(hyper: Hyper) -> Hyper:
    """Every value accepted here runs a correct pipeline: the kernels take each as fp32."""
    for name in ("gamma", "lambda_cql", "lambda_aux", "tau", "gate_ema"):
        value = getattr(hyper, name)
        if not 0.0 <= value <= 1.0:
            raise ConfigError(f"config key hyper.{name} must lie in [0, 1], got {value}")
    for name in ("beta1", "beta2"):  # Adam divides by 1 - beta^t
        value = getattr(hyper, name)
        if not 0.0 <= value < 1.0:
            raise ConfigError(f"config key hyper.{name} must lie in [0, 1), got {value}")
    for name in ("huber_kappa", "lr", "eps", "sigma_max"):
        value = getattr(hyper, name)
        if not FP32_TINY <= value <= FP32_MAX:  # a normal, finite fp32 number (> 0)
            raise ConfigError(
                f"config key hyper.{name} must be a normal fp32 number in "
                f"[{FP32_TINY:.3g}, {FP32_MAX:.3g}], got {value}"
            )
    return hyper


def preset_error(preset: object) -> ConfigError:
    return ConfigError(f"unknown preset {preset!r} (choose from {', '.join(PRESETS)})")


def preset_config(preset: str = "ci", seed: int = DEFAULT_SEED) -> Config:
    if preset not in PRESETS:
        raise preset_error(preset)
    return Config(preset=preset, seed=seed, dims=PRESETS[preset])


def _override_dims(base: Dims, table: object) -> Dims:
    if not isinstance(table, dict):
        raise ConfigError("config key dims must be a table")
    known = {f.name for f in dataclasses.fields(Dims)}
    # a field named by the file has no static type: _check_int and validate_dims check each value
    changes: dict[str, Any] = {}
    for key, value in table.items():
        if key not in known:
            raise ConfigError(f"unknown config key dims.{key} (known: {', '.join(sorted(known))})")
        if key in _TUPLE_DIMS:
            if not isinstance(value, list) or len(value) != 4:
                raise ConfigError(f"config key dims.{key} must be a list of 4 integers")
            changes[key] = tuple(_check_int(f"dims.{key}[{i}]", v) for i, v in enumerate(value))
        else:
            changes[key] = _check_int(f"dims.{key}", value)
    return validate_dims(dataclasses.replace(base, **changes))


def _override_hyper(base: Hyper, table: object) -> Hyper:
    if not isinstance(table, dict):
        raise ConfigError("config key hyper must be a table")
    known = {f.name for f in dataclasses.fields(Hyper)}
    changes = {}
    for key, value in table.items():
        if key not in known:
            raise ConfigError(f"unknown config key hyper.{key} (known: {', '.join(sorted(known))})")
        changes[key] = _check_float(f"hyper.{key}", value)
    return validate_hyper(dataclasses.replace(base, **changes))


def config_from_mapping(data: dict, preset: str | None = None, seed: int | None = None) -> Config:
    """Build a Config from a parsed TOML mapping; explicit preset/seed arguments win."""
    for key in data:
        if key not in _TOP_KEYS:
            raise ConfigError(f"unknown config key {key} (known: {', '.join(sorted(_TOP_KEYS))})")
    chosen = preset or data.get("preset", "ci")
    if not isinstance(chosen, str):
        raise ConfigError(f"config key preset must be a string, got {chosen!r}")
    raw_seed = seed if seed is not None else data.get("seed", DEFAULT_SEED)
    base = preset_config(chosen, _check_int("seed", raw_seed, minimum=0))
    dims = _override_dims(base.dims, data["dims"]) if "dims" in data else base.dims
    hyper = _override_hyper(base.hyper, data["hyper"]) if "hyper" in data else base.hyper
    return Config(preset=base.preset, seed=base.seed, dims=dims, hyper=hyper)


def load_config(
    path: str | Path | None = None, preset: str | None = None, seed: int | None = None
) -> Config:
    """The run's config: the preset (default `ci`), overridden by the TOML file at `path`. An
    error in the file (reading it, its TOML, its keys) is about `--config`; an unknown preset
    given here is about `--preset`."""
    if preset is not None and preset not in PRESETS:
        raise about_option(preset_error(preset), "preset")
    if path is None:
        base = preset_config(preset or "ci", _check_int("seed", seed or 0, minimum=0))
        return base
    path = Path(path)
    try:
        text = read_config_text(path)
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
        return config_from_mapping(data, preset=preset, seed=seed)
    except ConfigError as exc:
        raise about_option(exc, "config") from None


def read_config_text(path: Path) -> str:
    """The text of a config file: a regular file of at most MAX_CONFIG_BYTES, never read
    blocking (egf_audit.small_files)."""
    return read_small_text(path, "config file", ConfigError, MAX_CONFIG_BYTES)
