"""The report's rows, typed. Each is one line of a table and one object of verdict.json (`asdict`), with the field
names of the verdict.json contract (docs/design.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

Heads = int | list[int] | None  # uniform count, per-layer counts, or unknown


@dataclass
class Comparison:
    """Half (2): a pruned group against a control of its head count, paired by seed on one eval set.
    diff = control − pruned (positive: pruning wins)."""

    scale: str
    family: str
    ratio: float
    heads_dense: Heads
    heads_kept: Heads
    method: str
    scope: str
    schedule: str
    finetune_steps: int  # 0: the masked model before fine-tune
    control: str
    eval_set: str
    primary: bool
    n_seeds: int
    dense_loss: float
    pruned_loss: float
    control_loss: float
    diff_mean: float
    ci95: list[float] | None
    verdict: str  # Holm-adjusted for the primary rows, raw otherwise
    p_value: float | None
    p_holm: float | None
    ci95_holm: list[float] | None
    verdict_raw: str
    eval_tokens: int | None
    window_share: float | None  # of the variance, from the eval windows; None without per-window losses

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Prunable:
    """Half (1): the mean pruned loss before fine-tune against the same dense models' mean, at one ratio."""

    scale: str
    family: str
    method: str
    eval_set: str
    tolerance: float
    ratio: float
    scope: str
    schedule: str
    n_seeds: int
    dense_loss: float
    pruned_loss: float
    verdict: str  # prunable | not_prunable

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class CurvePoint:
    """A prune curve's point: the mask-only curve (finetune_steps 0) or a swept ratio after fine-tune."""

    scale: str
    family: str
    method: str
    eval_set: str
    ratio: float  # the fraction of heads removed
    finetune_steps: int
    loss_mean: float
    loss_ci95: list[float] | None
    scope: str
    schedule: str
    n_seeds: int

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class ScaleTrend:
    """The primary gap of one (family, ratio, control) against dense parameters, with a fitted slope."""

    family: str
    ratio: float
    control: str
    scales: list[str]
    params: list[float]
    diff_mean: list[float]
    ci95: list
    slope: float | None  # per decade of parameters
    slope_ci95: list[float] | None


@dataclass
class Cost:
    scale: str
    arm: str
    runs: int
    cpu_h: float
    gpu_h: float
    work_s: float  # in training, evaluation and scoring steps
    wall_s: float
    compute_share: float | None


@dataclass
class LearningRate:
    """Every arm's rate and where it came from; a pruned arm's recovery fine-tune's too."""

    scale: str
    family: str
    arm: str
    ratio: float | None
    scope: str
    arch: str  # heads x head_dim
    runs: int
    lr: list[float]
    lr_source: list[str]
    finetune_lr: list[float]
    finetune_lr_source: list[str]

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class EvalInfo:
    """How an eval set was measured: tokens each run is scored on, windows left out as copies of training text."""

    scale: str
    family: str
    eval_set: str
    tokens: int
    windows_excluded: int

    def to_json(self) -> dict:
        return asdict(self)
