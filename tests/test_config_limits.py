"""Every config the validator accepts runs a correct pipeline to a clean audit, and every value
that could not is refused before anything runs (one line, exit 2)."""

from __future__ import annotations

import pytest

from egf_audit.invariants import FAIL, evaluate
from egf_audit.pipeline.config import ConfigError, config_from_mapping
from egf_audit.scenarios.audit import Auditor


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ({"hyper": {"beta1": 1}}, "hyper.beta1 must lie in [0, 1)"),
        ({"hyper": {"beta2": 1.0}}, "hyper.beta2 must lie in [0, 1)"),
        ({"hyper": {"eps": 1e-300}}, "hyper.eps must be a normal fp32 number"),
        ({"hyper": {"lr": 1e39}}, "hyper.lr must be a normal fp32 number"),
        ({"hyper": {"sigma_max": 1e-39}}, "hyper.sigma_max must be a normal fp32 number"),
        ({"dims": {"SH1": 1048576, "SH2": 1048576}}, "GiB of buffers; the limit is"),
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
