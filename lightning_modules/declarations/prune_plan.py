"""What a prune does, as data: the PrunePlan (which fraction of the heads goes, chosen how, and the recovery
fine-tune after), the defaults every prune is set up with, and the check that a ratio leaves a head in every
layer. Torch-free, like config.py."""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from lightning_modules.declarations.bounds import Seed
from lightning_modules.declarations.config import HeadroomInputError, Strict, heads_removed
from lightning_modules.declarations.methods import compensates, get_method

# defaults used wherever a prune is set up (sweep files, `headroom prune`, the prune trials)
DEFAULT_TOLERANCE = 0.05  # "prunable": pruned loss before fine-tune <= dense loss x (1 + tolerance)
DEFAULT_CALIBRATION_BATCHES = 8
DEFAULT_FINETUNE_LR = 3e-4  # `headroom prune`'s fixed fine-tune rate (a sweep chooses one from the grid)
DEFAULT_FINETUNE_LR_GRID = (0.03, 0.1, 0.3)  # multiples of the dense model's rate, chosen on val


def check_method(v: str) -> str:
    """A declared scoring method's name (lightning_modules.declarations.methods); ValueError naming the choices otherwise."""
    return get_method(v).name


Scope = Literal["per_layer", "global"]
RecoveryKind = Literal["lm", "distill"]  # what the recovery fine-tune minimises (lightning_modules/training/distill.py)
PruneSchedule = Literal["one_shot", "iterative"]


IterativeStep = Annotated[float, Field(gt=0, le=1)]  # the fraction of the heads an iterative prune removes per round
DEFAULT_STEP = 0.1


class PruneData(Strict):
    """What data a prune reads besides its checkpoint: calibration batches to score heads on, and whether to draw
    the mask-only prune curve (the achievable fractions of heads removed up to 0.9) and on how many batches per
    point (None: the eval budget). Declared once: a sweep's `prune` block and a unit's PruneRun both extend it."""

    calibration_batches: int = Field(default=DEFAULT_CALIBRATION_BATCHES, gt=0)
    curve: bool = True
    curve_batches: int | None = Field(default=None, gt=0)

    def prune_data(self) -> dict:
        return {k: getattr(self, k) for k in PruneData.model_fields}


def candidate_rates(finetune_lr: float | None, finetune_lr_grid) -> tuple[float, ...]:
    """The recovery rates a fine-tune tries: the fixed rate, else every rate of the grid — the one rule that a
    prune's recovery, Scratch-B's charge (`recovery_steps`) and the report's check of that charge all read."""
    return (finetune_lr,) if finetune_lr is not None else tuple(finetune_lr_grid)


class RecoveryRecipe(Strict):
    """How a prune proceeds once its method, ratio, scope and schedule say which heads go, whatever the length of
    its recovery: the iterative `step`, then recovery training at `finetune_lr`, or at each rate of
    `finetune_lr_grid` (the one with the lowest validation loss kept). Declared once: Recovery adds the budget F;
    a sweep unit's PruneRun extends this alone, since the unit holds its F (orchestration/design/unit.py)."""

    step: IterativeStep = DEFAULT_STEP
    finetune_lr: float | None = Field(default=None, gt=0)
    finetune_lr_grid: tuple[Annotated[float, Field(gt=0)], ...] = ()
    # up to this many more rates, one at a time, while the best rate tried is the lowest or the highest tried: one
    # step of the grid (its geometric mean ratio) past it (pruning.recover)
    finetune_lr_extend: int = Field(default=0, ge=0, le=8)
    # FLAP's bias compensation when the heads are removed (lightning_modules/pruning/compensate.py); None: the method's
    # recipe (methods.Method.compensates: on for flap)
    bias_compensation: bool | None = None

    def recipe(self) -> dict:
        """The fields declared here, to build the other model that extends this one."""
        return {k: getattr(self, k) for k in RecoveryRecipe.model_fields}

    @property
    def finetune_lrs(self) -> tuple[float, ...]:
        """The fine-tune rates to try: the fixed one, or the grid."""
        return candidate_rates(self.finetune_lr, self.finetune_lr_grid)


class Recovery(RecoveryRecipe):
    """A recovery whole: its recipe and its budget, `finetune_steps` (F) of recovery training."""

    finetune_steps: int = Field(default=0, ge=0)

    def recovery(self) -> dict:
        """The fields declared here and in the recipe, to build the other model that extends this one."""
        return {k: getattr(self, k) for k in Recovery.model_fields}

    @property
    def recovery_steps(self) -> int:
        """Steps trained at the pruned size in recovery: F for each rate tried (Scratch-B's budget counts them all)."""
        return self.finetune_steps * len(self.finetune_lrs)


class PrunePlan(Recovery):
    """What to remove: a fraction `ratio` of the heads, chosen per layer or globally (at least one head stays in
    every layer), in one shot or iteratively (`step` of the heads at a time, re-scoring in between, as Michel et
    al. 2019), then `finetune_steps` of recovery training (the fields of Recovery).

    The recovery fine-tune's learning rate is `finetune_lr` when given; otherwise each rate of
    `finetune_lr_grid` fine-tunes a copy of the pruned model and the one with the lowest validation loss is kept
    (chosen on the validation split, never on an eval set)."""

    method: str = "gradient"
    ratio: float = Field(ge=0, lt=1)
    scope: Scope = "per_layer"
    schedule: PruneSchedule = "one_shot"
    seed: Seed = 0

    @model_validator(mode="after")
    def _finetune_rate(self):
        if self.finetune_steps and self.finetune_lr is None and not self.finetune_lr_grid:
            raise ValueError("a recovery fine-tune needs finetune_lr or a finetune_lr_grid to choose it from")
        return self

    _method = field_validator("method")(classmethod(lambda cls, v: check_method(v)))

    @property
    def compensates(self) -> bool:
        """Whether removing the heads compensates the bias (the setting, or the method's recipe)."""
        return compensates(self.method, self.bias_compensation)

    @property
    def scoring_rounds(self) -> int:
        """How often the heads are scored: once, or once before each iterative step (pruning.select_heads)."""
        return 1 if self.schedule == "one_shot" else max(1, math.ceil(self.ratio / self.step - 1e-9))


class DistillSpec(Strict):
    """How a distilled run learns from its teacher: temperature τ and the weight of the LM term (the formula and
    why these defaults, Minitron's: lightning_modules/training/distill.py)."""

    temperature: float = Field(default=1.0, gt=0)
    lm_weight: float = Field(default=0.0, ge=0, le=1)


def check_ratio_fits(layer_heads: list[int], ratio: float, scope: str) -> None:
    """Per-layer scope removes round(ratio·n_l) heads of each layer: that must leave at least one everywhere."""
    if not 0 <= ratio < 1:
        raise HeadroomInputError(f"ratio {ratio} must be in [0, 1)")
    if scope == "per_layer":
        for l, n in enumerate(layer_heads):
            if n - heads_removed(n, ratio) < 1:
                raise HeadroomInputError(f"ratio {ratio} would empty layer {l} ({n} heads) under per_layer scope")
    elif sum(layer_heads) - heads_removed(sum(layer_heads), ratio) < len(layer_heads):
        raise HeadroomInputError(f"ratio {ratio} leaves fewer heads than layers")


RANDOM_DRAWS = 4  # extra random choices a `random` prune evaluates besides its own (pruning/run.py)


class PruneJob(Strict):
    """One prune, whole: which heads go and how the model recovers (`plan`), the data it reads besides its
    checkpoint (`data`: calibration, the mask-only curve), its evaluation budget (None: every clean window of
    each split, up to the stated cap), what the recovery fine-tune minimises and how it distils, and the side
    measurements (latency, the extra random draws of a `random` prune). What `run_prune` and
    `prune_and_continue` take: a sweep's prune unit gives its own (`Unit.prune_job`), `headroom prune` builds one
    from its flags."""

    plan: PrunePlan
    data: PruneData = PruneData()
    eval_batches: int | None = Field(default=None, gt=0)
    recovery: RecoveryKind = "lm"
    distill: DistillSpec | None = None
    latency_batch_size: int = Field(default=16, gt=0)
    latency_repeats: int = Field(default=20, gt=0)
    random_draws: int = Field(default=RANDOM_DRAWS, ge=0)
