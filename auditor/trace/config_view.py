"""The run's configuration as its readers see it: the invariants, the oracle and the reports.

The configuration is built and validated by egf_audit.pipeline.config, a layer above the trace
model that none of its readers may import. These protocols are the part they read, named once:
`pipeline.config.Config`, `Dims` and `Hyper` satisfy them structurally (a type checker proves it
where the scenarios hand their `Config` to an `AuditRun`), so a field renamed on one side is a
type error on the other, not a reader's AttributeError in the middle of a user's run.
"""

from __future__ import annotations

from dataclasses import Field
from typing import Any, ClassVar, Protocol, TypedDict


class DimsView(Protocol):
    """Widths of the trainer (`pipeline.config.Dims`); names follow the trainer's constants."""

    @property
    def B(self) -> int: ...  # batch rows
    @property
    def OBS(self) -> int: ...  # observation width
    @property
    def SH1(self) -> int: ...  # trunk layer 1 width
    @property
    def SH2(self) -> int: ...  # trunk layer 2 width (h_s2)
    @property
    def AUXK(self) -> int: ...  # aux head classes (down, flat, up)
    @property
    def ADV(self) -> int: ...  # branch hidden width (adv_h)
    @property
    def VALH(self) -> int: ...  # value-stream hidden width
    @property
    def A(self) -> tuple[int, int, int, int]: ...  # actions per branch: dir, mag, ord, urg
    @property
    def E(self) -> tuple[int, int, int, int]: ...  # extra concat columns per branch
    @property
    def N_ISV(self) -> int: ...  # length of the ISV signal buffer


class HyperView(Protocol):
    """The hyper-parameters (`pipeline.config.Hyper`). A dataclass: the oracle rounds every
    field to fp32, as the kernels receive them, through `dataclasses.fields` and `replace`."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    @property
    def gamma(self) -> float: ...
    @property
    def huber_kappa(self) -> float: ...
    @property
    def lambda_cql(self) -> float: ...
    @property
    def lambda_aux(self) -> float: ...
    @property
    def lr(self) -> float: ...
    @property
    def beta1(self) -> float: ...
    @property
    def beta2(self) -> float: ...
    @property
    def eps(self) -> float: ...
    @property
    def tau(self) -> float: ...
    @property
    def sigma_max(self) -> float: ...
    @property
    def gate_ema(self) -> float: ...


class ConfigDict(TypedDict):
    """`ConfigView.as_dict()`: what `--json` exports and the document's configuration lists."""

    preset: str
    seed: int
    dims: dict[str, int | tuple[int, ...]]
    hyper: dict[str, float]


class ConfigView(Protocol):
    """One run's configuration (`pipeline.config.Config`)."""

    @property
    def preset(self) -> str: ...
    @property
    def seed(self) -> int: ...
    @property
    def dims(self) -> DimsView: ...
    @property
    def hyper(self) -> HyperView: ...
    def as_dict(self) -> ConfigDict: ...
