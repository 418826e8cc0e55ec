"""The sweep file's schema: the pydantic models a `sweeps/*.yaml` file validates into (field by field; what
one field cannot say alone is checked in spec.py, which also documents the file). Torch-free."""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Literal, Optional

from pydantic import AfterValidator, BaseModel, Field, create_model, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_core import to_jsonable_python

from lightning_modules.declarations.arms import check_control
from lightning_modules.declarations.bounds import Seed
from lightning_modules.declarations.config import SCALES, DataConfig, Family, Strict, TrainConfig
from lightning_modules.declarations.prune_plan import (
    DEFAULT_FINETUNE_LR_GRID,
    DEFAULT_STEP,
    DEFAULT_TOLERANCE,
    DistillSpec,
    IterativeStep,
    PruneData,
    PruneSchedule,
    RecoveryKind,
    Scope,
    check_method,
)


def _ratio(v: float) -> float:
    if not 0 <= v < 1:
        raise ValueError("must be in [0, 1)")
    return v


def _unique(v: list) -> list:
    seen = set()
    for x in v:
        if x in seen:
            raise ValueError(f"duplicate value {x!r}")
        seen.add(x)
    return v


def _as_list(v):
    return [v] if isinstance(v, (str, int, float)) else v


NonEmpty = Field(min_length=1)


# a sweep file's per-scale training overrides: these TrainConfig fields, each optional with TrainConfig's own
# constraints (the model below is derived from TrainConfig, so the two cannot drift apart)
OVERRIDABLE = ("batch_size", "seq_len", "warmup_steps", "schedule", "min_lr_ratio", "cooldown_fraction",
               "weight_decay", "grad_clip", "precision", "val_every", "val_batches", "eval_batches", "mlm_probability")


def _optional(name: str):
    f = TrainConfig.model_fields[name]
    return Optional[f.annotation], FieldInfo.merge_field_infos(f, default=None)  # noqa: UP045 - a runtime type


TrainOverrides = create_model(
    "TrainOverrides", __base__=Strict, __module__=__name__,
    __doc__="Per-scale changes to the training preset (lightning_modules.declarations.config.TrainConfig fields).",
    **{name: _optional(name) for name in OVERRIDABLE})


MIN_GPU_SHARE = 0.01  # a fractional GPU per trial: at most 100 trials share one GPU


class Resources(Strict):
    """What one trial asks of the cluster. `cpu` and `gpu` are per worker; `gpu` may be fractional (trials share
    a GPU); `workers > 1` trains data-parallel (DDP through Ray Train inside the Tune trial), each worker taking
    batch_size / workers of every global batch. Head scoring and pruning run on one worker's share."""

    cpu: float = Field(default=1, gt=0)
    gpu: float = Field(default=0, ge=0)
    workers: int = Field(default=1, ge=1)
    # the memory of one of the cluster's GPUs, decimal GB: `--plan` and the sweep refuse a fractional `gpu` that
    # packs more trials onto a GPU than their planned peaks fit (orchestration/design/packing.py)
    gpu_memory_gb: float = Field(default=80, gt=0)

    @model_validator(mode="after")
    def _devices(self):
        if self.gpu > 1:
            raise ValueError("one worker trains on one GPU; for more, set workers (gpu is per worker)")
        if 0 < self.gpu < MIN_GPU_SHARE:  # the packing check walks every trial one GPU could hold
            raise ValueError(f"gpu {self.gpu:g} shares one GPU among more than {round(1 / MIN_GPU_SHARE)} trials; "
                             f"use 0 (CPU) or at least {MIN_GPU_SHARE}")
        if self.workers > 1 and 0 < self.gpu < 1:
            raise ValueError("data-parallel workers cannot share a GPU; give each worker gpu: 1, or use workers: 1")
        return self

    def as_dict(self) -> dict:
        return {"cpu": self.cpu, "gpu": self.gpu, "workers": self.workers}


class ScaleResources(Strict):
    """A scale's own resources: the fields given replace the sweep's (`scales: {s: {resources: {gpu: 0.25}}}`)."""

    cpu: float | None = Field(default=None, gt=0)
    gpu: float | None = Field(default=None, ge=0)
    workers: int | None = Field(default=None, ge=1)


class ScaleSpec(Strict):
    # dense budget T (default: the preset's); a list trains each budget as its own dense run with its own
    # controls and prunes (the training-budget axis of the report's trend)
    steps: int | list[int] | None = None
    heads: int | None = Field(default=None, gt=0)  # dense head count H (default: the preset's)
    overrides: TrainOverrides = TrainOverrides()
    resources: ScaleResources | None = None  # per trial at this scale (default: the sweep's)
    # this scale's recovery budgets F (default: prune.finetune_steps): a ladder in proportion to its own T
    finetune_steps: Annotated[list[Annotated[int, Field(ge=0)]], NonEmpty, AfterValidator(_unique)] | None = None

    _f = field_validator("finetune_steps", mode="before")(classmethod(lambda cls, v: _as_list(v)))

    @field_validator("steps", mode="before")
    @classmethod
    def _steps(cls, v):
        ok = lambda x: isinstance(x, int) and not isinstance(x, bool) and x > 0  # noqa: E731
        if v is None or ok(v):
            return v
        if isinstance(v, list) and v and all(ok(x) for x in v):
            return _unique(v)
        raise ValueError("must be a positive integer or a non-empty list of them")

    def budgets(self, scale: str) -> list[int]:
        """The dense budgets T of this scale, smallest first."""
        if self.steps is None:
            return [SCALES[scale].steps]
        return sorted(self.steps) if isinstance(self.steps, list) else [self.steps]


class PruneSpec(PruneData):
    """A sweep's `prune` block: its axes (ratios, methods, scope, schedule, at, finetune_steps, recovery) as lists,
    the iterative step, the recovery fine-tune's rate or grid (multiples of the dense rate), the tolerance, and
    the data a prune reads (PruneData's calibration_batches, curve, curve_batches)."""

    ratios: Annotated[list[Annotated[float, AfterValidator(_ratio)]], NonEmpty, AfterValidator(_unique)]
    methods: Annotated[list[Annotated[str, AfterValidator(check_method)]], NonEmpty, AfterValidator(_unique)]
    scope: Annotated[list[Scope], NonEmpty, AfterValidator(_unique)] = ["per_layer"]
    schedule: Annotated[list[PruneSchedule], NonEmpty, AfterValidator(_unique)] = ["one_shot"]
    step: IterativeStep = DEFAULT_STEP  # iterative: fraction of the heads removed per round
    # the recovery budget F (a list: an axis, each value its own prune units and its own budget-matched controls)
    finetune_steps: Annotated[list[Annotated[int, Field(ge=0)]], NonEmpty, AfterValidator(_unique)] = [0]
    # the methods whose prunes are recovered at every F (absent: all); the others are planned before fine-tune only
    # (F = 0: enough for half (1) and the report's informed-beats-random check, at a fraction of the cost)
    recover_methods: Annotated[list[Annotated[str, AfterValidator(check_method)]], NonEmpty,
                               AfterValidator(_unique)] | None = None
    # what the recovery fine-tune minimises: the LM loss, or the KL divergence to the dense teacher (an axis too)
    recovery: Annotated[list[RecoveryKind], NonEmpty, AfterValidator(_unique)] = ["lm"]
    distill: DistillSpec = DistillSpec()  # temperature and LM-term weight of `distill` (lightning_modules/training/distill.py)
    # the recovery fine-tune's rate: a number fixes it; absent, it is chosen on the validation split from the
    # grid below, multiples of the dense model's own learning rate
    finetune_lr: float | None = Field(default=None, gt=0)
    finetune_lr_grid: Annotated[list[Annotated[float, Field(gt=0)]], NonEmpty, AfterValidator(_unique)] = list(
        DEFAULT_FINETUNE_LR_GRID)
    # while the val-chosen rate is the lowest or highest tried, up to this many more, one grid step past it (the
    # report checks that the chosen rate sits strictly inside the rates tried). Scratch-B is charged the grid
    finetune_lr_extend: int = Field(default=0, ge=0, le=8)
    # FLAP's bias compensation as the heads go (the removed heads' mean output into the bias); absent: each
    # method's own recipe (on for flap, off for the others)
    bias_compensation: bool | None = None
    tolerance: float = Field(default=DEFAULT_TOLERANCE, gt=0)  # relative: pruned loss <= dense loss * (1 + tolerance)
    # prune timing: fractions p of the dense run's steps T at which its heads are removed (the dense run keeps a
    # checkpoint at each p·T < T; the pruned model trains on to T, then the recovery fine-tune). 0: at init.
    at: Annotated[list[Annotated[float, Field(ge=0, le=1)]], NonEmpty, AfterValidator(_unique)] = [1.0]

    _lists = field_validator("scope", "schedule", "at", "finetune_steps", "recovery", mode="before")(
        classmethod(lambda cls, v: _as_list(v)))


MAX_TRIALS = 200  # candidates one architecture's search may draw: a log-range is bracketed by far fewer


class LrSearch(Strict):
    """Optuna (TPE) over a log-uniform learning rate, trials stopped early by ASHA."""

    trials: int = Field(ge=2, le=MAX_TRIALS)
    low: float = Field(gt=0)
    high: float = Field(gt=0)
    steps: int = Field(gt=0)  # training steps of one search trial
    grace_period: int = Field(default=1, gt=0)  # validation reports before ASHA may stop a trial
    seed: Seed = 0
    # how the first `trials` candidates are drawn: by TPE (its first ones are random start-up draws), or as a
    # log-spaced grid over [low, high], both ends included (every architecture the same rates, the range covered)
    start: Literal["tpe", "grid"] = "tpe"
    # up to this many more candidates, one at a time, while the best rate tried is the lowest or the highest tried:
    # one grid step (the log-range over trials - 1) past it, beyond the declared range if need be. The report's
    # check asks that the best rate sit strictly inside the rates tried
    extend: int = Field(default=0, ge=0, le=8)

    def grid(self) -> list[float]:
        """The log-spaced start: `trials` rates from low to high."""
        r = (self.high / self.low) ** (1 / (self.trials - 1))
        return [self.low * r ** i for i in range(self.trials - 1)] + [self.high]

    @property
    def step(self) -> float:
        """The factor between neighbouring rates of the grid: how far an extension goes past an edge."""
        return (self.high / self.low) ** (1 / (self.trials - 1))

    @model_validator(mode="after")
    def _bounds(self):
        if self.low >= self.high:
            raise ValueError(f"low {self.low} must be below high {self.high}")
        return self


class LrSpec(Strict):
    """`lr: 3.0e-3` (one rate for every scale) or `lr: {search: {...}}`."""

    value: float | None = Field(default=None, gt=0)
    search: LrSearch | None = None

    @model_validator(mode="before")
    @classmethod
    def _number(cls, v):
        return v if isinstance(v, dict) else {"value": v}

    @model_validator(mode="after")
    def _one(self):
        if (self.value is None) == (self.search is None):
            raise ValueError("give a number or {search: {trials, low, high, steps}}")
        return self


class ProbeSpec(Strict):
    """Mechanism probes of the dense runs (lightning_modules/pruning/probes.py), read by the verdict report."""

    every: int = Field(gt=0)  # probe at step 0, every `every` steps and at the last step
    method: Annotated[str, AfterValidator(check_method)] = "gradient"  # importance over training
    batches: int = Field(default=2, gt=0)  # calibration batches to score, val batches for the curve and CKA
    redundancy: bool = True  # pairwise CKA of head outputs


class TrustSpec(Strict):
    """Thresholds of the report's trust diagnostics, declared before running like the tolerance."""

    # non-inferiority margin of dense vs Scratch-E and larger vs smaller scale: the upper 95% bound of the loss
    # difference must be at most this fraction of the reference model's loss (default: the default prune tolerance)
    margin: float = Field(default=0.05, gt=0, lt=1)
    # converged: the dense loss may improve by at most this fraction per doubling of the training budget
    doubling_gain: float = Field(default=0.05, gt=0, lt=1)
    # the half-budget dense runs the converged check compares with: the first seed's only (a point estimate), or
    # every seed's (the check then passes only when the upper 95% bound of the gain is within doubling_gain)
    half_budget: Literal["first", "every"] = "first"


class PretrainedSpec(Strict):
    checkpoint: str  # a `headroom train` run directory or a Hugging Face model directory
    batch_size: int = Field(default=8, gt=0)
    seq_len: int = Field(default=128, gt=1)
    eval_batches: int | None = Field(default=None, gt=0)  # None: every window of each eval set (capped)


# The schema's fields when the spec hash's default rule was written (`Sweep.spec_hash`): any other field is hashed
# only when it is not at its default.
_FIRST_HASHED: dict[str, frozenset[str]] = {k: frozenset(v.split()) for k, v in {
    "Sweep": "controls data family log_models lr name pretrained probes prune resources retries scales seeds storage "
             "tracking_uri trust",
    "DataConfig": "bpe_vocab_size calibration_fraction eval_fraction shift source text_column tokenizer val_fraction",
    "ScaleSpec": "heads overrides resources steps",
    "TrainOverrides": "batch_size eval_batches grad_clip min_lr_ratio mlm_probability precision schedule seq_len "
                      "val_batches val_every warmup_steps weight_decay",
    "ScaleResources": "cpu gpu workers",
    "PruneSpec": "at bias_compensation calibration_batches curve curve_batches distill finetune_lr finetune_lr_grid "
                 "finetune_steps methods ratios recovery schedule scope step tolerance",
    "DistillSpec": "lm_weight temperature",
    "LrSpec": "search value",
    "LrSearch": "grace_period high low seed steps trials",
    "ProbeSpec": "batches every method redundancy",
    "TrustSpec": "doubling_gain margin",
    "Resources": "cpu gpu gpu_memory_gb workers",
    "PretrainedSpec": "batch_size checkpoint eval_batches seq_len"}.items()}


def _hashed_dump(m: BaseModel) -> dict:
    """`m.model_dump(mode="json")`, less the fields added since `_FIRST_HASHED` that hold their default."""
    first = _FIRST_HASHED.get(type(m).__name__)
    out = {}
    for name, f in type(m).model_fields.items():
        v = getattr(m, name)
        if first is not None and name not in first and v == f.get_default(call_default_factory=True):
            continue
        out[name] = _hashed_value(v)
    return out


def _hashed_value(v):
    if isinstance(v, BaseModel):
        return _hashed_dump(v)
    if isinstance(v, dict):
        return {k: _hashed_value(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_hashed_value(x) for x in v]
    return to_jsonable_python(v)


class Sweep(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=100)
    # default [decoder]; a pretrained sweep takes it from the checkpoint
    family: Annotated[list[Family], NonEmpty, AfterValidator(_unique)] | None = None
    data: DataConfig = DataConfig()
    scales: dict[str, ScaleSpec] | None = None
    seeds: Annotated[list[Seed], NonEmpty, AfterValidator(_unique)] = [0]
    prune: PruneSpec
    controls: Annotated[list[Annotated[str, AfterValidator(check_control)]], AfterValidator(_unique)] = []
    # the from-scratch learning curve of each pruned shape: fractions of the dense budget T at which it is also
    # trained from scratch (arm scratch_curve), for the parent-free accounting — the from-scratch steps a pruned
    # start saves (the report's savings)
    scratch_curve: Annotated[list[Annotated[float, Field(gt=0, le=4)]], AfterValidator(_unique)] = []
    lr: LrSpec | None = None
    probes: ProbeSpec | None = None
    trust: TrustSpec = TrustSpec()
    resources: Resources = Resources()
    retries: int = Field(default=2, ge=0)
    storage: str | None = None
    tracking_uri: str | None = None
    # each prune unit's pruned model as an MLflow transformers model (orchestration/running/registry.py); off for models
    # too large to copy into the artifact store once per prune unit
    log_models: bool = True
    pretrained: PretrainedSpec | None = None

    _family = field_validator("family", mode="before")(classmethod(lambda cls, v: _as_list(v)))

    @field_validator("scales")
    @classmethod
    def _scale_names(cls, v):
        if v is not None:
            if not v:
                raise ValueError("give at least one scale")
            for name in v:
                if name not in SCALES:
                    raise ValueError(f"unknown scale {name!r}; choose from {', '.join(SCALES)}")
        return v

    # ---- derived
    def spec_hash(self) -> str:
        """Hash of the resolved spec, without where it runs and what it records (storage, tracking, resources,
        retries, model logging). A field added to the schema after `_FIRST_HASHED` was written enters the hash only
        when a sweep sets it away from its default: every sweep from before keeps its hash (and `--resume` its
        parent run) with no list to edit. The rules below that rule keep the hashes of fields added before it."""
        science = {k: v for k, v in _hashed_dump(self).items()
                   if k not in {"storage", "tracking_uri", "resources", "retries", "log_models"}}
        for sc in (science.get("scales") or {}).values():
            del sc["resources"]  # a scale's resources too (and sweeps from before they existed keep their hash)
        prune = science["prune"]
        if prune["at"] == [1.0]:  # the default (pruning the trained model): sweeps from before keep
            del prune["at"]  # their hash, so --resume finds their runs
        if len(prune["finetune_steps"]) == 1:  # one recovery budget hashes as the number it was before the axis
            prune["finetune_steps"] = prune["finetune_steps"][0]
        if prune["recovery"] == ["lm"] and prune["distill"] == DistillSpec().model_dump(mode="json"):
            del prune["recovery"], prune["distill"]  # the defaults: no distillation, the hash of before
        if prune["bias_compensation"] is None:  # each method's recipe: the hash of before (a unit's key says what
            del prune["bias_compensation"]  # its prune does: plan.prune_units)
        return hashlib.sha256(json.dumps(science, sort_keys=True).encode()).hexdigest()[:12]

    @property
    def families(self) -> list[str]:
        return self.family or ["decoder"]

    def resources_for(self, scale: str | None) -> Resources:
        """A trial's resources at `scale`: the scale's own fields over the sweep's (a scale the sweep does not
        list, or None: the sweep's)."""
        own = ((self.scales or {}).get(scale) or ScaleSpec()).resources if scale else None
        if own is None:
            return self.resources
        return Resources(**{**self.resources.model_dump(), **own.model_dump(exclude_none=True)})

    def finetune_steps(self, scale: str | None = None) -> list[int]:
        """The recovery budgets F of the prunes at `scale` (its own list, else `prune.finetune_steps`)."""
        own = (self.scales or {}).get(scale) if scale else None
        return own.finetune_steps if own is not None and own.finetune_steps is not None else self.prune.finetune_steps

    def primary_recovery(self, scale: str | None = None) -> tuple[int, str]:
        """The primary comparison's recovery (F, objective) at `scale` — the strongest the sweep file declares: the
        largest F of the scale's ladder (its own `finetune_steps`, else `prune.finetune_steps`), by distillation
        when `prune.recovery` lists it, else by the LM loss. Decided here once: the report reads it, and the plan
        charges a control that stands for every recovery with it."""
        return max(self.finetune_steps(scale)), ("distill" if "distill" in self.prune.recovery else "lm")

    def every_finetune_steps(self) -> list[int]:
        """Every recovery budget any scale's prunes run."""
        lists = [self.finetune_steps(s) for s in (self.scales or {})] or [self.prune.finetune_steps]
        return sorted({f for fs in lists for f in fs})

    def dense_heads(self, scale: str) -> int:
        s = (self.scales or {})[scale]
        return s.heads or SCALES[scale].n_heads


# ------------------------------------------------------------------------------------------------ registered axes

_BLOCKS = {"": lambda: Sweep, "prune": lambda: PruneSpec}  # where a registered axis's sweep field may live


def _block(path: str) -> tuple[type[BaseModel], str]:
    where, _, name = path.rpartition(".")
    if where not in _BLOCKS:
        raise ValueError(f"a registered axis's sweep field goes at the top level or in `prune`, not {path!r}")
    return _BLOCKS[where](), name


def add_field(path: str, annotation, default) -> None:
    """Add a registered axis's sweep field (`prune.<name>` or `<name>`) to the schema: the sweep files that set it
    validate it, the others get its default (and keep their spec hash: a field not in `_FIRST_HASHED` is hashed
    only away from its default)."""
    model, name = _block(path)
    if name in model.model_fields:
        raise ValueError(f"the sweep schema has a field {path!r} already")
    model.__pydantic_fields__[name] = FieldInfo.from_annotated_attribute(annotation, default)
    model.model_rebuild(force=True)
    Sweep.model_rebuild(force=True)


def remove_field(path: str) -> None:
    model, name = _block(path)
    del model.__pydantic_fields__[name]
    model.model_rebuild(force=True)
    Sweep.model_rebuild(force=True)
