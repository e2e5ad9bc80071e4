"""`egf-audit config --example`: an example TOML config naming every key with its range.

docs/config.md embeds the same text (a test keeps the two equal), so the reference and the
tool cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import textwrap

from egf_audit.pipeline.config import (
    DEFAULT_SEED,
    FP32_MAX,
    FP32_TINY,
    LIMITS,
    MAX_DIM,
    PRESETS,
    Hyper,
)

# key -> (range, meaning); the ranges are the ones egf_audit.pipeline.config enforces
DIM_KEYS = {
    "B": (f"1..{MAX_DIM}", "batch rows"),
    "OBS": (f"1..{MAX_DIM}", "observation width"),
    "SH1": (f"1..{MAX_DIM}", "trunk layer 1 width"),
    "SH2": (f"1..{MAX_DIM}", "trunk layer 2 width (h_s2); the wire is column SH2 of the concat"),
    "AUXK": (f"3..{MAX_DIM}", "aux head classes (down, flat, up, ...)"),
    "ADV": (f"1..{MAX_DIM}", "branch hidden width (adv_h)"),
    "VALH": (f"1..{MAX_DIM}", "value-stream hidden width"),
    "A": ("4 integers >= 1", "actions of the branches dir, mag, ord, urg"),
    "E": ("4 integers >= 1, the first = 1", "extra concat columns per branch (E[0] is the wire)"),
    "N_ISV": (f"394..{MAX_DIM}", "length of isv_signals (must hold element 393)"),
}
POSITIVE_FP32 = f"normal fp32, {FP32_TINY:.3g}..{FP32_MAX:.3g}"
HYPER_KEYS = {
    "gamma": ("[0, 1]", "discount"),
    "huber_kappa": (POSITIVE_FP32, "Huber loss threshold"),
    "lambda_cql": ("[0, 1]", "weight of the CQL aux loss"),
    "lambda_aux": ("[0, 1]", "weight of the aux cross-entropy"),
    "lr": (POSITIVE_FP32, "Adam learning rate"),
    "beta1": ("[0, 1)", "Adam first-moment decay"),
    "beta2": ("[0, 1)", "Adam second-moment decay"),
    "eps": (POSITIVE_FP32, "Adam epsilon"),
    "tau": ("[0, 1]", "Polyak rate: target = tau * params + (1 - tau) * target"),
    "sigma_max": (POSITIVE_FP32, "spectral-norm bound of w_b0fc"),
    "gate_ema": ("[0, 1]", "EMA decay of the live gate written to ISV[393]"),
}


def _toml(value: object) -> str:
    if isinstance(value, tuple | list):
        return "[" + ", ".join(map(str, value)) + "]"
    return repr(value) if isinstance(value, float) else str(value)


def example_toml() -> str:
    """Every key at the `ci` preset's value, each with its range: a file to copy and edit."""
    dims = PRESETS["ci"]
    hyper = Hyper()
    lines = [
        "# egf-audit config: every key is optional; a key left out keeps the preset's value.",
        "# Use it with `egf-audit run --config FILE`; --preset and --seed on the command line win.",
        *[f"# {line}" for line in textwrap.wrap(LIMITS, 96)],
        "",
        'preset = "ci"  # ci or prod: the base the keys below override',
        f"seed = {DEFAULT_SEED}  # >= 0: seed of the weights and batches",
        "",
        "[dims]",
    ]
    for key, (rng, meaning) in DIM_KEYS.items():
        lines.append(f"{key} = {_toml(getattr(dims, key))}  # {rng}: {meaning}")
    lines += ["", "[hyper]"]
    for key, (rng, meaning) in HYPER_KEYS.items():
        lines.append(f"{key} = {_toml(getattr(hyper, key))}  # {rng}: {meaning}")
    return "\n".join(lines) + "\n"


def _cell(value: object) -> str:
    return ", ".join(map(str, value)) if isinstance(value, tuple) else str(value)


def key_tables() -> str:
    """The markdown tables of docs/config.md: every key, its range, default and meaning."""
    ci, prod, hyper = PRESETS["ci"], PRESETS["prod"], Hyper()
    dims = [
        f"| `dims.{k}` | {r} | {_cell(getattr(ci, k))} | {_cell(getattr(prod, k))} | {m} |"
        for k, (r, m) in DIM_KEYS.items()
    ]
    hypers = [
        f"| `hyper.{k}` | {r} | {getattr(hyper, k)!r} | {m} |" for k, (r, m) in HYPER_KEYS.items()
    ]
    return (
        "\n".join(
            [
                "## `[dims]`: the trainer's widths",
                "",
                "| key | range | `ci` | `prod` | meaning |",
                "|---|---|---|---|---|",
                *dims,
                "",
                LIMITS,
                "",
                "## `[hyper]`: hyper-parameters",
                "",
                "| key | range | default | meaning |",
                "|---|---|---|---|",
                *hypers,
            ]
        )
        + "\n"
    )


def documented_keys() -> tuple[set[str], set[str]]:
    return set(DIM_KEYS), set(HYPER_KEYS)


def config_keys() -> tuple[set[str], set[str]]:
    """The keys the config loader knows, to check that none goes undocumented."""
    return (
        {f.name for f in dataclasses.fields(PRESETS["ci"])},
        {f.name for f in dataclasses.fields(Hyper)},
    )
