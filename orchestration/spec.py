"""Sweep files (`sweeps/*.yaml`) parsed once into validated objects.

Every later layer receives a `Sweep`, never a raw dict. Unknown keys are rejected and every error names its field
path (`prune.ratios[1]: must be in [0, 1)`), so `headroom sweep` fails with one line before torch or Ray is
imported. Cross-field checks (a ratio that empties a layer, a data path that matches nothing, a missing pretrained
checkpoint) run here too, for the same reason.

A sweep file, with the defaults of the fields it may leave out:

    name: quickstart                # the MLflow experiment and the reports/<name>/ folder
    family: decoder                 # or a list: [decoder, encoder]
    data: {source: stdlib}          # lightning_modules.config.DataConfig: source, shift, tokenizer, ...
    scales:                         # preset name -> its budget (absent with `pretrained`)
      xs: {steps: 300, heads: 8, overrides: {batch_size: 16, seq_len: 128, val_every: 50}}
                                    # overrides.eval_batches absent: every clean window of each eval set, up to
                                    # 2^20 tokens (lightning_modules.config.EVAL_CAP_TOKENS)
                                    # steps: [100, 300, 900]: several budgets, each its own dense run, controls
                                    # and prunes (the report's trend against tokens per parameter)
    seeds: [0, 1, 2]
    prune:
      ratios: [0.5]
      methods: [gradient, ablation, random]
      scope: [per_layer]            # per_layer | global
      schedule: [one_shot]          # one_shot | iterative (step: fraction removed per round)
      finetune_steps: 0             # recovery fine-tune F
      # finetune_lr: 3.0e-4         # a number fixes the fine-tune's rate; absent, it is chosen on val from:
      finetune_lr_grid: [0.03, 0.1, 0.3]    # multiples of the dense model's learning rate
      # curve_batches: 4            # batches per point of the mask-only curve (absent: the eval budget)
      tolerance: 0.05               # "prunable": pruned loss before fine-tune <= dense loss x (1 + tolerance)
      at: [1.0]                     # prune timing: fractions of T at which heads go (0: at init; p < 1: the
                                    # dense run keeps a checkpoint at p·T, the pruned model trains on to T)
    controls: [scratch_e, scratch_b, wide]
    lr: 3.0e-3                      # or {search: {trials: 4, low: 1.0e-3, high: 1.0e-2, steps: 40}}: one search
                                    # per architecture trained from scratch; absent: the scale preset's
    probes: {every: 50, method: gradient, batches: 2, redundancy: true}   # absent: no probes
    trust: {margin: 0.05, doubling_gain: 0.05}   # the report's trust diagnostics: margin, convergence threshold
    resources: {cpu: 1, gpu: 0, workers: 1}   # per trial: cpu and gpu per worker (gpu may be fractional:
                                    # trials share a GPU); workers > 1: data-parallel through Ray Train. A scale's
                                    # own `resources` (scales: {l: {resources: {gpu: 1, workers: 4}}}) replaces
                                    # the fields it gives
    retries: 2                      # Ray retries of a failed trial (it continues from its checkpoint)
    storage: ./ray_results          # or s3://bucket/prefix; CLI --storage overrides
    tracking_uri: sqlite:///mlflow.db   # CLI --tracking-uri overrides
    log_models: true                # each prune unit's pruned model as an MLflow transformers model (off: large models)
    pretrained: {checkpoint: DIR}   # instead of scales: prune a local checkpoint only (Michel et al. style)
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import AfterValidator, Field, ValidationError, field_validator, model_validator

from lightning_modules.arms import check_control
from lightning_modules.checkpoints import checkpoint_info
from lightning_modules.config import (
    DEFAULT_CALIBRATION_BATCHES,
    DEFAULT_FINETUNE_LR_GRID,
    DEFAULT_TOLERANCE,
    SCALES,
    DataConfig,
    Family,
    HeadroomInputError,
    Precision,
    PruneSchedule,
    Schedule,
    Scope,
    Strict,
    check_compatible,
    check_method,
    check_ratio_fits,
    model_config_for,
    train_config_for,
)
from lightning_modules.corpus import check_source


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


class TrainOverrides(Strict):
    """Per-scale changes to the training preset (lightning_modules.config.TrainConfig fields)."""

    batch_size: int | None = Field(default=None, gt=0)
    seq_len: int | None = Field(default=None, gt=1)
    warmup_steps: int | None = Field(default=None, ge=0)
    schedule: Schedule | None = None
    min_lr_ratio: float | None = Field(default=None, ge=0, le=1)
    weight_decay: float | None = Field(default=None, ge=0)
    grad_clip: float | None = Field(default=None, ge=0)
    precision: Precision | None = None
    val_every: int | None = Field(default=None, gt=0)
    val_batches: int | None = Field(default=None, gt=0)
    eval_batches: int | None = Field(default=None, gt=0)
    mlm_probability: float | None = Field(default=None, gt=0, lt=1)


class Resources(Strict):
    """What one trial asks of the cluster. `cpu` and `gpu` are per worker; `gpu` may be fractional (trials share
    a GPU); `workers > 1` trains data-parallel (DDP through Ray Train inside the Tune trial), each worker taking
    batch_size / workers of every global batch. Head scoring and pruning run on one worker's share."""

    cpu: float = Field(default=1, gt=0)
    gpu: float = Field(default=0, ge=0)
    workers: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _devices(self):
        if self.gpu > 1:
            raise ValueError("one worker trains on one GPU; for more, set workers (gpu is per worker)")
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


class PruneSpec(Strict):
    ratios: Annotated[list[Annotated[float, AfterValidator(_ratio)]], NonEmpty, AfterValidator(_unique)]
    methods: Annotated[list[Annotated[str, AfterValidator(check_method)]], NonEmpty, AfterValidator(_unique)]
    scope: Annotated[list[Scope], NonEmpty, AfterValidator(_unique)] = ["per_layer"]
    schedule: Annotated[list[PruneSchedule], NonEmpty, AfterValidator(_unique)] = ["one_shot"]
    step: float = Field(default=0.1, gt=0, le=1)  # iterative: fraction of the heads removed per round
    finetune_steps: int = Field(default=0, ge=0)
    # the recovery fine-tune's rate: a number fixes it; absent, it is chosen on the validation split from the
    # grid below, multiples of the dense model's own learning rate
    finetune_lr: float | None = Field(default=None, gt=0)
    finetune_lr_grid: Annotated[list[Annotated[float, Field(gt=0)]], NonEmpty, AfterValidator(_unique)] = list(
        DEFAULT_FINETUNE_LR_GRID)
    calibration_batches: int = Field(default=DEFAULT_CALIBRATION_BATCHES, gt=0)
    tolerance: float = Field(default=DEFAULT_TOLERANCE, gt=0)  # relative: pruned loss <= dense loss * (1 + tolerance)
    curve: bool = True  # the mask-only prune curve (the achievable fractions of heads removed up to 0.9)
    curve_batches: int | None = Field(default=None, gt=0)  # batches per point of the curve (default: eval's)
    # prune timing: fractions p of the dense run's steps T at which its heads are removed (the dense run keeps a
    # checkpoint at each p·T < T; the pruned model trains on to T, then the recovery fine-tune). 0: at init.
    at: Annotated[list[Annotated[float, Field(ge=0, le=1)]], NonEmpty, AfterValidator(_unique)] = [1.0]

    _lists = field_validator("scope", "schedule", "at", mode="before")(classmethod(lambda cls, v: _as_list(v)))


class LrSearch(Strict):
    """Optuna (TPE) over a log-uniform learning rate, trials stopped early by ASHA."""

    trials: int = Field(ge=2)
    low: float = Field(gt=0)
    high: float = Field(gt=0)
    steps: int = Field(gt=0)  # training steps of one search trial
    grace_period: int = Field(default=1, gt=0)  # validation reports before ASHA may stop a trial
    seed: int = Field(default=0, ge=0)

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
    """Mechanism probes of the dense runs (lightning_modules/probes.py), read by the verdict report."""

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


class PretrainedSpec(Strict):
    checkpoint: str  # a `headroom train` run directory or a Hugging Face model directory
    batch_size: int = Field(default=8, gt=0)
    seq_len: int = Field(default=128, gt=1)
    eval_batches: int | None = Field(default=None, gt=0)  # None: every window of each eval set (capped)


class Sweep(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=100)
    # default [decoder]; a pretrained sweep takes it from the checkpoint
    family: Annotated[list[Family], NonEmpty, AfterValidator(_unique)] | None = None
    data: DataConfig = DataConfig()
    scales: dict[str, ScaleSpec] | None = None
    seeds: Annotated[list[Annotated[int, Field(ge=0)]], NonEmpty, AfterValidator(_unique)] = [0]
    prune: PruneSpec
    controls: Annotated[list[Annotated[str, AfterValidator(check_control)]], AfterValidator(_unique)] = []
    lr: LrSpec | None = None
    probes: ProbeSpec | None = None
    trust: TrustSpec = TrustSpec()
    resources: Resources = Resources()
    retries: int = Field(default=2, ge=0)
    storage: str | None = None
    tracking_uri: str | None = None
    # each prune unit's pruned model as an MLflow transformers model (orchestration/registry.py); off for models
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
        retries, model logging)."""
        science = self.model_dump(mode="json", exclude={"storage", "tracking_uri", "resources", "retries",
                                                        "log_models"})
        for sc in (science.get("scales") or {}).values():
            del sc["resources"]  # a scale's resources too (and sweeps from before they existed keep their hash)
        if science["prune"]["at"] == [1.0]:  # the default (pruning the trained model): sweeps from before keep
            del science["prune"]["at"]  # their hash, so --resume finds their runs
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
        return Resources(**{**self.resources.as_dict(), **own.model_dump(exclude_none=True)})

    def dense_heads(self, scale: str) -> int:
        s = (self.scales or {})[scale]
        return s.heads or SCALES[scale].n_heads


def resolve_tracking_uri(uri: str | None) -> str:
    """The MLflow tracking URI; default `sqlite:///mlflow.db` in the working directory, made absolute (here, in
    the driver: trials run in their own working directories)."""
    uri = uri or "sqlite:///mlflow.db"
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(uri[len("sqlite:///"):]).resolve())
    if "://" not in uri:  # a plain directory: MLflow's file store
        return Path(uri).resolve().as_uri()
    return uri


# ------------------------------------------------------------------------------------------------ loading


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML keeps the last of two equal keys silently; a sweep file with `seeds:` twice is a mistake."""


def _mapping(loader: _UniqueKeyLoader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
# YAML 1.1 reads 3e-3 (no dot) as a string; sweep authors mean a number
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _path(loc: tuple) -> str:
    out = ""
    for part in loc:
        if part == "[key]":
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _message(err: dict) -> str:
    kind = err.get("type")
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required"
    return err.get("msg", "invalid").removeprefix("Value error, ")


def format_error(e: ValidationError) -> str:
    """One line for the first error; an unknown key comes first (a misspelt key also makes its field missing)."""
    errors = e.errors()
    err = next((x for x in errors if x.get("type") == "extra_forbidden"), errors[0])
    path = _path(tuple(err.get("loc", ())))
    return f"{path}: {_message(err)}" if path else _message(err)


def parse_sweep(text: str, source: str = "sweep") -> Sweep:
    """YAML text → a validated Sweep (schema and cross-field checks). Raises HeadroomInputError with one line."""
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise HeadroomInputError(f"{source}: {where}{what}") from None
    if not isinstance(raw, dict):
        raise HeadroomInputError(f"{source}: expected a mapping of sweep fields at the top level")
    try:
        sweep = Sweep.model_validate(raw)
    except ValidationError as e:
        raise HeadroomInputError(f"{source}: {format_error(e)}") from None
    try:
        check_sweep(sweep)
    except HeadroomInputError as e:
        raise HeadroomInputError(f"{source}: {e}") from None
    return sweep


def load_sweep(path: str | Path) -> tuple[Sweep, str]:
    """Read and validate a sweep file; returns (sweep, file text)."""
    p = Path(path)
    if not p.is_file():
        raise HeadroomInputError(f"sweep file {path}: no such file")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise HeadroomInputError(f"sweep file {path}: cannot read it ({e.__class__.__name__})") from None
    return parse_sweep(text, source=str(path)), text


def _check_ratios(s: Sweep, layer_heads: list[int], what: str) -> None:
    for i, r in enumerate(s.prune.ratios):
        for scope in s.prune.scope:
            try:
                check_ratio_fits(layer_heads, r, scope)
            except HeadroomInputError as e:
                raise HeadroomInputError(f"prune.ratios[{i}]: {e} of {what}") from None


def _check_resources(s: Sweep, scale: str, batch_size: int) -> None:
    where = f"scales.{scale}.resources" if s.scales[scale].resources is not None else "resources"
    try:
        r = s.resources_for(scale)
    except ValidationError as e:
        raise HeadroomInputError(f"scales.{scale}.resources: {_message(e.errors()[0])}") from None
    if batch_size % r.workers:
        raise HeadroomInputError(f"{where}.workers: scale {scale}'s batch_size {batch_size} is not divisible by "
                                 f"{r.workers} workers (each takes an equal share of every batch)")


def check_sweep(s: Sweep) -> None:
    """What one field cannot say alone. Raises HeadroomInputError('field.path: message')."""
    if s.pretrained is not None:
        if s.prune.at != [1.0]:
            raise HeadroomInputError("prune.at: a pretrained checkpoint has no training history to prune early in; "
                                     "remove prune.at")
        for field, bad in (("scales", s.scales), ("controls", s.controls), ("lr", s.lr), ("family", s.family),
                           ("probes", s.probes)):
            if bad:
                raise HeadroomInputError(f"{field}: a pretrained sweep runs the prune stage only; remove {field}")
        try:
            info = checkpoint_info(s.pretrained.checkpoint)
        except HeadroomInputError as e:
            raise HeadroomInputError(f"pretrained.checkpoint: {e}") from None
        _check_ratios(s, info.layer_heads, "the checkpoint")
        if s.prune.finetune_steps and s.prune.finetune_lr is None:
            raise HeadroomInputError("prune.finetune_lr: required to fine-tune a pretrained checkpoint (the grid is "
                                     "relative to a learning rate this sweep did not train with)")
        if info.max_positions and s.pretrained.seq_len > info.max_positions:
            raise HeadroomInputError(f"pretrained.seq_len: {s.pretrained.seq_len} exceeds the checkpoint's "
                                     f"maximum {info.max_positions}")
    elif not s.scales:
        raise HeadroomInputError("scales: required (or name a pretrained checkpoint)")
    for name, sc in (s.scales or {}).items():
        h = s.dense_heads(name)
        try:
            model = model_config_for(name, s.families[0], n_heads=h)
            for steps in sc.budgets(name):
                train = train_config_for(name, steps=steps, **sc.overrides.model_dump(exclude_none=True))
                check_compatible(model, train)
        except HeadroomInputError as e:
            raise HeadroomInputError(f"scales.{name}: {e}") from None
        _check_ratios(s, model.layer_heads, f"scale {name}")
        _check_resources(s, name, train.batch_size)
    if s.lr is not None and s.lr.search is not None:
        for name in s.scales or {}:
            if s.lr.search.steps > min(s.scales[name].budgets(name)):
                raise HeadroomInputError(f"lr.search.steps: {s.lr.search.steps} exceeds scale {name}'s budget")
    try:
        check_source(s.data)
    except HeadroomInputError as e:
        raise HeadroomInputError(f"data.source: {e}") from None
    if s.data.tokenizer.startswith("pretrained:") and not Path(s.data.tokenizer[11:]).is_dir():
        raise HeadroomInputError(f"data.tokenizer: {s.data.tokenizer[11:]} is not a directory")
