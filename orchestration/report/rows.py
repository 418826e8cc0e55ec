"""The report's rows, typed. Each is one line of a table and one object of verdict.json (`asdict`), with the field
names of the verdict.json contract (docs/design.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from orchestration.design.unit import Cell

Heads = int | list[int] | None  # uniform count, per-layer counts, or unknown


@dataclass
class Comparison:
    """Half (2): a pruned group against a control of its head count, paired by seed on one eval set.
    diff = control − pruned (positive: pruning wins)."""

    scale: Cell
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
    recovery: str = "lm"  # the recovery objective of the pruned group (lm | distill)
    stage: str = "final"  # pre_ft: the masked model before fine-tune; final: after the recovery (F steps)
    # the group's other grouped axes (declared since these fields were: orchestration/design/axes.py), by name
    group: dict = field(default_factory=dict)
    # a primary row's interval at 1 − α/m over its family of m (Bonferroni): the m intervals cover together with
    # probability ≥ 95%. `ci95_holm` is the step-down interval of the Holm step that tested the row: for the last
    # steps that is the unadjusted 95% interval, so it is not simultaneous
    ci95_simultaneous: list[float] | None = None

    def to_json(self) -> dict:
        return _without_empty_group(asdict(self))


@dataclass
class Prunable:
    """Half (1): the mean pruned loss before fine-tune against the same dense models' mean, at one ratio."""

    scale: Cell
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
    group: dict = field(default_factory=dict)  # as Comparison.group

    def to_json(self) -> dict:
        return _without_empty_group(asdict(self))


@dataclass
class CurvePoint:
    """A prune curve's point: the mask-only curve (finetune_steps 0) or a swept ratio after fine-tune."""

    scale: Cell
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
    group: dict = field(default_factory=dict)  # as Comparison.group

    def to_json(self) -> dict:
        return _without_empty_group(asdict(self))


@dataclass
class Cost:
    scale: Cell
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

    scale: Cell
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

    scale: Cell
    family: str
    eval_set: str
    tokens: int
    windows_excluded: int

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Timing:
    """Prune timing: the pruned models' final loss (after training on to T and the recovery fine-tune) when the
    heads went at a fraction `prune_at` of T, with the paired difference to pruning the trained model (prune_at 1)."""

    scale: Cell
    family: str
    ratio: float
    method: str
    prune_at: float
    eval_set: str
    n_seeds: int
    loss_mean: float
    loss_ci95: list[float] | None
    vs_late_mean: float | None  # loss(prune_at) − loss(1), paired by seed
    vs_late_ci95: list[float] | None
    vs_late: str  # matches | worse | better | inconclusive | insufficient_seeds | reference (prune_at 1)
    dense_loss: float | None  # the reference lines of the plot: the dense models and Scratch-E at this ratio
    scratch_e_loss: float | None
    margin: float | None = None  # equivalence margin of "matches": half the cell's |Scratch-E gap| (None: no Scratch-E)
    # Behnke & Heafield's question: Scratch-E − loss(prune_at), paired by seed (positive: the heads removed at p
    # beat the same structure trained from scratch), its 95% t-interval (unadjusted) and verdict word
    vs_scratch_e_mean: float | None = None
    vs_scratch_e_ci95: list[float] | None = None
    vs_scratch_e: str = "insufficient_seeds"
    group: dict = field(default_factory=dict)  # as Comparison.group

    def to_json(self) -> dict:
        return _without_empty_group(asdict(self))


@dataclass
class TrendPoint:
    cell: Cell  # "s", or "s-T1500" when the scale lists several budgets
    tokens_per_param: float  # training tokens per non-embedding parameter of the dense model
    params: float  # non-embedding parameters of the dense model
    n_seeds: int
    diff_mean: float
    ci95: list[float] | None
    used: bool = True  # False: its trust checks failed, it is left out of the fit


@dataclass
class Trend:
    """The primary gap (control − pruned), one mean per cell, fitted against log10 of an axis with one intercept per
    group (orchestration/report/trends.py): the common slope per decade with its t-interval on the cells' residual
    degrees of freedom, and per group where its line crosses zero (None when not within its swept range) with
    Fieller's interval."""

    family: str
    ratio: float
    control: str
    axis: str  # tokens_per_param | params
    slope: float | None  # None: the cells left out (failed trust checks) leave too few to fit
    slope_ci95: list[float] | None  # None: no residual degree of freedom (e.g. two cells of one scale)
    crossover: float | None  # the single group's, when the fit has one group (else per group in `groups`)
    crossover_ci95: list[float] | None
    established: bool  # some group's crossover in range with the slope's 95% interval excluding 0
    x_range: list[float]
    points: list[TrendPoint]
    fit: str = "within_scales"  # within_scales (intercept per scale) | across_scales (intercept per budget)
    df: int = 0
    n_cells: int = 0
    excluded: list[str] | None = None  # cells left out: a trust check failed
    unverified_cells: list[str] | None = None  # cells used whose checks could not run
    groups: list[dict] | None = None  # per group: intercept, range, crossover, its interval, established
    note: str | None = None
    budget: int | None = None  # across_scales: the step count of the scales fitted (None: a single-budget sweep)
    group: dict = field(default_factory=dict)  # as Comparison.group: the trend's value of every other grouped axis

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("points")
        return _without_empty_group(d)


@dataclass
class ProbeSlack:
    """Probes: the prunable fraction measured while the dense runs trained (mean over seeds), at init, at its lowest
    after init, and at the end; `late`: it grows again after its low (slack appears late in training)."""

    scale: Cell
    family: str
    init: float
    low: float
    low_step: int
    end: float
    end_step: int
    late: bool


@dataclass
class Redundancy:
    """Probes: mean pairwise CKA of a layer's head outputs at init and after training, paired over seeds;
    `verdict` of init − trained (supported: heads more similar at init)."""

    scale: Cell
    family: str
    n_seeds: int
    init: float
    init_ci95: list[float] | None
    trained: float
    trained_ci95: list[float] | None
    diff_mean: float
    ci95: list[float] | None
    verdict: str


@dataclass
class RecoveryTrend:
    """The recovery section: one (cell, family, ratio, control, objective)'s primary gap at each recovery budget F
    (increasing), each budget's sign at the Bonferroni level (+1: pruning better, −1: the control better, 0: not
    established) and the first pair of budgets between which the sign changes (None: no change established)."""

    scale: Cell
    family: str
    ratio: float
    control: str
    recovery: str
    budgets: list[int]
    diffs: list[float]
    signs: list[int]
    level: float
    change: list[int] | None
    group: dict = field(default_factory=dict)  # as Comparison.group

    def to_json(self) -> dict:
        return _without_empty_group(asdict(self))


@dataclass
class Replication:
    """Section 4: one primary comparison (cell, family, ratio, control) on every eval set — its verdict and mean
    difference per set (a set without the comparison is absent) and whether the verdicts agree."""

    scale: Cell
    family: str
    ratio: float
    control: str
    per_set: dict  # eval set -> (verdict, control − pruned mean)
    agree: bool
    group: dict = field(default_factory=dict)  # as Comparison.group

    def to_json(self) -> dict:
        return _without_empty_group(asdict(self))


@dataclass
class MethodGap:
    """Which scorer: a method's loss before fine-tune (its choice of heads alone) minus the reference method's,
    paired by seed, in one (cell, family, ratio, scope, schedule) on one eval set; Holm over the group's methods.
    Positive: the method's heads lose more than the reference's."""

    scale: Cell
    family: str
    ratio: float
    scope: str
    schedule: str
    eval_set: str
    method: str
    reference: str
    n_seeds: int
    method_loss: float
    reference_loss: float
    diff_mean: float
    ci95: list[float] | None
    p_value: float | None
    p_holm: float | None
    verdict: str  # worse | better (than the reference, Holm-adjusted) | indistinguishable | insufficient_seeds
    window_share: float | None
    group: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return _without_empty_group(asdict(self))


@dataclass
class Stability:
    """How stable a method's head ranking is in one (cell, family, scope): the split-half agreement its prune runs
    measured (lightning_modules/pruning/stability.py), mean over seeds. `overlap`/`chance`: {ratio: fraction}."""

    scale: Cell
    family: str
    method: str
    scope: str
    n_seeds: int
    spearman: float | None
    spearman_lowest_seed: float | None
    spearman_layer_min: float | None
    overlap: dict
    chance: dict
    low: bool  # Spearman below scorers.LOW_SPEARMAN

    def to_json(self) -> dict:
        return {**asdict(self), "overlap": {f"{r:g}": v for r, v in self.overlap.items()},
                "chance": {f"{r:g}": v for r, v in self.chance.items()}}


def other_axes(key) -> dict:
    """A group's axes that a Comparison does not name a field after (an axis registered later), by name."""
    return {a: v for a, v in key._asdict().items() if a not in Comparison.__dataclass_fields__}


def group_label(group: dict) -> str:
    """A row's values of the axes registered beyond the built-in ones, as their declarations label them ("" when
    the sweep has none): what tells two rows of one cell, ratio and control apart in the report, the console
    verdict and the summary."""
    from orchestration.design.axes import BY_NAME

    return " ".join(BY_NAME[a].label_of(v) if a in BY_NAME else f"{a}={v}" for a, v in group.items())


def _without_empty_group(d: dict) -> dict:
    """verdict.json rows carry `group` only when a sweep has such axes (its rows stay as they were otherwise)."""
    if not d.get("group"):
        d.pop("group", None)
    return d
