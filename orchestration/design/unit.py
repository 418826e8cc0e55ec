"""A unit of work: what one Ray Tune trial does and one MLflow child run records — train one model (an arm of
lightning_modules/declarations/arms.py, or an `lr_search` candidate) or prune one dense checkpoint (`pruned`) — with the configs
it runs with, its deterministic key, its MLflow tags (orchestration/design/axes.py), name, description and params,
and its serialised form (what crosses the Ray boundary). Its key hashes everything that decides its result, so a
retried, resumed or re-run unit finds its own run. Torch-free; `plan.py` makes the units of a sweep.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import MISSING, dataclass, fields, replace
from functools import cache, partial
from typing import Any

from pydantic import BaseModel, Field, TypeAdapter

from lightning_modules.declarations.arms import ARMS
from lightning_modules.declarations.config import SCALES, DataConfig, ModelConfig, TrainConfig
from lightning_modules.declarations.prune_plan import DistillSpec, PruneData, PruneJob, PrunePlan, RecoveryRecipe

from .axes import AXES, BY_NAME, grouped, registered, run_name, tags_of
from .schema import ProbeSpec

NONE = "none"
HALF_ARM = "dense_half"  # the dense model of one seed trained to half the smallest budget (the converged check)

# what a trial's reports carry besides metrics (trainables → tracking)
HISTORY = "headroom_history"  # JSON list of [metric, step, value] since the previous report
KEPT = "headroom_kept"  # prune: JSON list of the heads kept per layer
DONE = "headroom_done"  # 1 on a unit's final report
WORK = "work_s"  # seconds of the unit's own work in this attempt (framework imports excluded)
RESUMED = "resumed_at_step"  # the step a train trial started from (0: from scratch)
RESTARTED = "headroom_restarted"  # a train trial's first report after its checkpoint proved damaged: why
LIGHTNING_FILE = "checkpoint"  # the Lightning checkpoint's file name inside a Tune checkpoint
SCORES_FILE = "scores.json"  # a prune unit's head scores {"method", "scores", "kept", "heads_dense"}: the heatmaps
PLAN_FILE = "sweep/plan.json"  # on a sweep's parent run: the plan it ran (Plan.to_json), what its report expects
WINDOWS_FILE = "eval_windows.json"  # per-window losses of a unit's evaluations (an artifact the report reads)
EVAL_PARAMS = ("eval_device", "eval_precision")  # every run's evaluation: where and at which precision (MLflow params)
TRAIN_PRECISION = "train_precision"  # MLflow param: the precision a run trained (or fine-tuned) at, resolved


TAG_FIELDS = tuple(a.tag or a.name for a in AXES)  # headroom.<field>: declared in orchestration/design/axes.py
SNAPSHOTS_DIR = "snapshots"  # a dense run's kept checkpoints (step<k>.ckpt) for pruning at p·T, beside its model


class PlanTooLarge(Exception):
    """A plan built under `plan.bounded(n)` keyed more than n units (orchestration/design/plan.py: check_plan_size)."""


_KEYING_LEFT: list[int] = []  # while a plan is built under plan.bounded(n): how many more units it may key


class Cell(str):
    """A cell of the report: a scale trained at one dense budget T. Its text is what the report, the summaries and
    the run names call it — "s-T1500", or "s" when the scale has one budget — and it carries both parts, so that
    nothing parses the text back: `cell.scale` ("s"), `cell.budget` (1500 or None). It compares, hashes, sorts and
    serialises as its text."""

    __slots__ = ("budget", "scale")

    def __new__(cls, scale: str, budget: int | None):
        self = super().__new__(cls, scale if budget is None else f"{scale}-T{budget}")
        self.scale, self.budget = str(scale), budget
        return self

    def __reduce__(self):
        return Cell, (self.scale, self.budget)


ANY = "*"  # a comparison group's value where a control stands for every value of the axis


def stands_for(arm: str, scope: str, finetune_steps: int | None) -> frozenset[str]:
    """The grouped axes a run of `arm` stands for every value of — decided here once, read by the plan's tag and by
    the report for runs logged before the tag. A control trained for a per-layer prune's shape stands for every
    method and schedule (a uniform shape, not planned per global prune: every scope too); one whose budget does
    not follow the recovery stands for every recovery budget and objective, and one that follows it, planned
    when the sweep lists one F (None), for every F. A pruned run stands for none; the other arms are in no
    group (None). A registered axis declared `controls="every"` has one control for all its values: stands for
    every value."""
    if arm == "pruned":
        return frozenset()
    a = ARMS.get(arm)
    if a is None or not a.control:
        return None
    wild = {x.name for x in registered() if x.groups and x.controls == "every"}
    if scope != "global":
        wild |= {"method", "schedule"} | (set() if a.for_global else {"scope"})
    if not a.per_recovery:
        wild |= {"finetune_steps", "recovery"}
    elif finetune_steps is None:
        wild.add("finetune_steps")
    return frozenset(wild)


def group_text(values: dict, wild: frozenset, axes: tuple[str, ...] | None = None) -> str:
    """A comparison group as its tag: `axis=value` for every grouped axis (`axes`, default all, in declaration
    order), the value as the run's tags read it back (the scale: the cell), `*` where the run stands for every
    value. The plan stamps it; the report writes runs.csv's group column with it."""
    def text(a):
        return ANY if a in wild else str(values[a]) if a == "scale" else BY_NAME[a].to_tag(values[a])
    return ";".join(f"{a}={text(a)}" for a in (axes or grouped()))


def read_group(text: str) -> tuple[tuple[str, ...], frozenset] | None:
    """A group tag back: (the grouped axes, in order; those that are `*`), or None for "none"."""
    if text in (NONE, ""):
        return None
    pairs = [p.split("=", 1) for p in text.split(";")]
    return tuple(a for a, _ in pairs), frozenset(a for a, v in pairs if v == ANY)


def scale_rank(cell: Cell) -> tuple[int, int]:
    """Cells in the order of the presets (xs, s, m, ...; a pretrained checkpoint last); the budgets of one scale
    ("s-T500", "s-T1500") in increasing order."""
    names = list(SCALES)
    scale, budget = getattr(cell, "scale", cell), getattr(cell, "budget", None)  # a plain scale name too
    return (names.index(scale) if scale in names else len(names)), budget or 0


class ProbeRun(ProbeSpec):
    """A dense train unit's mechanism probes: the sweep's ProbeSpec and the prune tolerance they compare with."""

    tolerance: float = Field(gt=0)


class PruneRun(RecoveryRecipe, PruneData):
    """How a prune unit prunes, beyond which heads it selects (the unit's method, ratio, scope and schedule) and
    how long it recovers (the unit's `finetune_steps`): the iterative step and the recovery's recipe
    (RecoveryRecipe's fields; its grid holds absolute rates, the sweep's multiples × the dense model's rate), the
    calibration data and the mask-only curve (PruneData's)."""


# What a key hashes: the unit's fields, less the derived ones (its key, its budget: train.steps and the dense key
# say it), each field hashed only when it differs from its default — but for the fields a key has hashed since
# keys were first written (below), hashed always, and in the layout they were first hashed in: a prune unit's
# settings as "plan" (PrunePlan's fields), the calibration data's fields at the top (PruneRun's defaults on units
# that do not prune). The one compatibility rule: it keeps every shipped sweep's keys, and a field added anywhere
# later (on the unit, a config or the prune settings) enters the key as soon as a sweep sets it, with no list to edit.
# how a unit is computed, not what it computes, is never hashed either: a cooldown branch of a longer run's trunk
# (orchestration/design/trunks.py) is the run of its own budget, and a trunk the run of its own
_NOT_HASHED = frozenset(a.name for a in AXES if a.key == "derived") | {"trunk_key", "branch_step", "branch_points"}
# F is hashed as the grouped axis reads it (`Unit.f_label`: only where the cell lists several) besides in `plan`,
# where a prune's budget always was; `f_varies` is in that label
_NOT_HASHED |= {"f_varies"}
_FIRST_KEYED: dict[object, frozenset] = {k: frozenset(v.split()) for k, v in {
    "Unit": "stage arm scale family seed model train data corpus_hash heads method ratio scope schedule plan "
            "dense_key calibration_batches curve curve_batches lr_source",
    ModelConfig: "family d_model n_layers n_heads head_dim d_ff vocab_size max_seq_len heads_per_layer",
    TrainConfig: "steps batch_size seq_len lr warmup_steps schedule min_lr_ratio weight_decay grad_clip betas "
                 "precision seed val_every val_batches eval_batches mlm_probability",
    DataConfig: "source shift tokenizer bpe_vocab_size val_fraction calibration_fraction eval_fraction text_column",
    PrunePlan: "step finetune_steps finetune_lr finetune_lr_grid method ratio scope schedule seed",
    ProbeRun: "every method batches redundancy tolerance",
    DistillSpec: "temperature lm_weight"}.items()}


def _first_layout(unit) -> list[tuple[str, object, object]]:
    """The unit's (field, value, default) in the layout keys were first hashed in: its own fields but the derived
    ones and `prune`; then the prune settings' data fields at the top (PruneRun's defaults on a unit that does not
    prune) and the rest as `plan`, a PrunePlan."""
    default = lambda f: (f.default if f.default is not MISSING else
                         f.default_factory() if f.default_factory is not MISSING else MISSING)
    r = unit.prune or PruneRun()
    value = lambda n: unit.f_label if n == "finetune_steps" else getattr(unit, n)
    items = [(f.name, value(f.name), default(f)) for f in fields(unit)
             if f.name not in _NOT_HASHED and f.name != "prune"]
    items += [(n, getattr(r, n), f.get_default(call_default_factory=True))
              for n, f in type(r).model_fields.items() if n not in PrunePlan.model_fields]
    return items + [("plan", unit.plan, None)]


def _kept(items, first: frozenset) -> dict:
    """(name, value, default) → the key body's entries: a first-keyed field always, any other when not at its
    default; a config as its own key body."""
    return {n: _hashed(v) if isinstance(v, BaseModel) else _JSON(v) for n, v, d in items if n in first or v != d}


def _hashed(config: BaseModel) -> dict:
    items = [(n, getattr(config, n), f.get_default(call_default_factory=True)) for n, f in config.model_fields.items()]
    return _kept(items, _FIRST_KEYED.get(type(config), frozenset()))


_JSON = partial(TypeAdapter(Any).dump_python, mode="json")


@dataclass(frozen=True)
class Unit:
    """One unit of work, holding its validated configs. `to_dict`/`from_dict` are its serialised form: what
    crosses the Ray boundary and what a prune trial's metrics.json records; `key_body` is what its key hashes."""

    stage: str  # lr_search | train | prune
    arm: str  # a name of ARMS (lightning_modules/declarations/arms.py); an lr_search unit: the arm whose rate it searches
    scale: str
    family: str
    seed: int
    model: ModelConfig | None  # None: a pretrained checkpoint's own
    train: TrainConfig  # the budget (train) or the batch shape and eval budget (prune)
    data: DataConfig
    corpus_hash: str
    heads: str  # "8", or "3,4,5" for per-layer counts
    # which heads: what a prune unit removes, or what a control stands in for
    method: str = NONE
    ratio: float | None = None
    scope: str = NONE
    schedule: str = NONE
    prune: PruneRun | None = None  # prune stage: how
    dense_key: str | None = None  # the dense unit a prune unit or a global-scope control derives from
    probes: ProbeRun | None = None  # dense train units of a sweep with `probes`
    lr_source: str = "preset"  # where train.lr came from: preset | sweep | searched | searched:<arch> (see lr_for)
    # the training budget T of the dense run this unit belongs to, when its scale lists several (None: one)
    budget: int | None = None
    prune_at: float = 1.0  # prune stage: the fraction of T at which the heads are removed (1: the trained model)
    snapshots: tuple[int, ...] = ()  # dense train units: the steps whose checkpoints prune units start from
    # the recovery budget F, held here alone: a prune unit's (its fine-tune's length), or the F of the pruned arm a
    # control whose budget follows the recovery is matched to (arms.Arm.per_recovery); None on the other units
    finetune_steps: int | None = None
    # whether the cell lists several F: then F is an axis of the unit's group, name, tags and key (`f_label`)
    f_varies: bool = False
    recovery: str = "lm"  # the recovery objective of a prune unit, or of the pruned arm a control is matched to
    distill: DistillSpec | None = None  # how a distilled unit learns from its teacher (recovery distill, scratch_kd)
    # a wsd train unit that starts from another's checkpoint (orchestration/design/trunks.py): the trunk's key and
    # the step of its checkpoint this unit's cooldown starts from; a trunk keeps a checkpoint at each branch point
    trunk_key: str | None = None
    branch_step: int = 0
    branch_points: tuple[int, ...] = ()
    # the values of the axes registered beyond the built-in ones ((name, value) pairs, orchestration/design/axes.py:
    # register_axis); hashed when not empty
    axes: tuple[tuple[str, Any], ...] = ()
    key: str = ""

    @property
    def f_label(self) -> int | None:
        """F as the grouped axis reads it: the budget where the cell lists several, else None (a control of a cell
        with one F stands for it; a prune's F then enters no name or group)."""
        return self.finetune_steps if self.f_varies else None

    @property
    def plan(self) -> PrunePlan | None:
        """A prune unit's PrunePlan (None for the other stages)."""
        if self.prune is None:
            return None
        return PrunePlan(method=self.method, ratio=self.ratio, scope=self.scope, schedule=self.schedule,
                         seed=self.seed, finetune_steps=self.finetune_steps, **self.prune.recipe())

    def prune_job(self, **side) -> PruneJob:
        """What a prune unit's trial runs (`run_prune`, `prune_and_continue`): its plan, its calibration and curve
        data, its eval budget, its recovery objective and distillation; `side`: the side measurements' settings
        (latency repeats ...), which do not enter the key."""
        return PruneJob(plan=self.plan, data=PruneData(**self.prune.prune_data()),
                        eval_batches=self.train.eval_batches, recovery=self.recovery, distill=self.distill, **side)

    def with_key(self) -> Unit:
        if _KEYING_LEFT:  # a plan built under plan.bounded(): one unit more of the most it may hold
            _KEYING_LEFT[-1] -= 1
            if _KEYING_LEFT[-1] < 0:
                raise PlanTooLarge
        digest = hashlib.sha256(json.dumps(self.key_body(), sort_keys=True, default=str).encode()).hexdigest()[:16]
        return replace(self, key=digest)

    @property
    def name(self) -> str:
        """Run name: what the MLflow UI lists, sortable by scale, family, arm, method, ratio, seed — each axis's
        declared part (axes.run_name); a learning-rate candidate names its architecture and rate."""
        if self.stage == "lr_search":
            return "-".join([self.scale, self.family, "lr", arch_key(self.model), f"{self.train.lr:.2e}"])
        return run_name(self)

    def tags(self) -> dict[str, str]:
        return tags_of(self)

    def comparison_group(self) -> str:
        """Its headroom.group tag: the pruned group it is (a prune unit), or the pruned groups it is compared
        with (a control: `stands_for`); "none" for the other arms. The scale is the cell (with its budget)."""
        wild = stands_for(self.arm, self.scope, self.f_label) if self.stage != "lr_search" else None
        if wild is None:
            return NONE
        return group_text(self._group_values(), wild)

    def control_groups(self) -> dict[str, str] | None:
        """A prune unit's controls, as the plan decides them: for every declared control arm, the comparison group
        (`comparison_group`'s text) of the control units it pairs with — the tag `headroom.controls` that the
        report pairs by. A control of a per-layer shape (not planned per global prune) is the per-layer one.
        None for the other units."""
        if self.arm != "pruned" or self.stage != "prune":
            return None
        values = self._group_values()  # a per-layer control of a global prune stands for every scope: `*` there
        return {name: group_text(values, stands_for(name, self.scope if arm.for_global else "per_layer",
                                                    self.f_label))
                for name, arm in ARMS.items() if arm.control}

    def _group_values(self) -> dict:
        """Each grouped axis's value as its tag reads back (a control's "none" F or recovery: the axis's default),
        as the report sees it; the scale as the cell."""
        values = {a: BY_NAME[a].read({BY_NAME[a].tag_name: BY_NAME[a].to_tag(BY_NAME[a].value(self))})
                  for a in grouped()}
        values["scale"] = Cell(self.scale, self.budget)
        return values

    def note(self) -> str:
        """What the unit is, in one sentence: its run's description in the MLflow UI."""
        what = f"{self.scale} {self.family}, seed {self.seed}"
        heads = f"{self.heads} heads per layer" if "," not in self.heads else f"heads per layer {self.heads}"
        steps = f"{self.train.steps} steps at lr {self.train.lr:.3g}"
        if self.stage == "lr_search":
            return (f"Learning-rate candidate {self.train.lr:.3g} for {what} ({heads}), {self.train.steps} steps; "
                    "Optuna proposes, ASHA stops poor candidates early.")
        if self.arm == "pruned":
            when = "the trained dense model" if self.prune_at == 1.0 else f"the dense run at {self.prune_at:g} of T"
            tail = (f", fine-tuned {self.finetune_steps} steps" if self.finetune_steps else "")
            if tail and self.recovery == "distill":
                tail += " by distillation from the dense model"
            return (f"Pruned: {when} ({what}, {heads}) with {self.ratio:.0%} of its heads removed by "
                    f"{self.method} importance ({self.scope.replace('_', ' ')}, "
                    f"{self.schedule.replace('_', '-')}){tail}.")
        note = ARMS[self.arm].description.format(what=what, heads=heads, steps=steps, head_dim=self.model.head_dim)
        if ARMS[self.arm].per_recovery and (self.f_label is not None or self.recovery != "lm"):
            budget = "" if self.f_label is None else f"{self.f_label} "
            how = " by distillation" if self.recovery == "distill" else ""
            note = note[:-1] + f"; matched to the pruned arm fine-tuned {budget}steps{how}."
        return note

    def params(self) -> dict[str, str]:
        """MLflow params: the numbers a reader compares runs by (the UI's columns)."""
        t = self.train
        p = {"steps": t.steps, "lr": t.lr, "lr_source": self.lr_source, "batch_size": t.batch_size,
             "seq_len": t.seq_len, "val_every": min(t.val_every, t.steps), "corpus_hash": self.corpus_hash,
             "data": self.data.source}
        if self.model:
            m = self.model
            p.update(d_model=m.d_model, n_layers=m.n_layers, head_dim=m.head_dim, n_heads=m.n_heads,
                     vocab_size=m.vocab_size)
        if self.prune:
            r = self.prune
            p.update(finetune_steps=self.finetune_steps,
                     finetune_lr=r.finetune_lr if r.finetune_lr is not None else "val-grid",
                     finetune_lr_grid=",".join(f"{x:.3g}" for x in r.finetune_lr_grid) or "none",
                     calibration_batches=r.calibration_batches)
        if self.distill is not None:
            p.update(recovery=self.recovery if self.prune else "distill", distill_temperature=self.distill.temperature,
                     distill_lm_weight=self.distill.lm_weight)
        return {k: str(v) for k, v in p.items()}

    def key_body(self) -> dict:
        """What the key hashes: the rule above `_FIRST_KEYED`, in `_first_layout`'s layout."""
        return _kept(_first_layout(self), _FIRST_KEYED["Unit"])

    def to_dict(self) -> dict:
        """The serialised unit: every field, by pydantic from the dataclass's own declarations (JSON-able)."""
        return _adapter(type(self)).dump_python(self, mode="json")

    @classmethod
    def from_dict(cls, d: dict) -> Unit:
        """The unit back; a unit serialised before F lived on the unit alone (its prune settings held the budget,
        the unit only the label) is read as it is now."""
        if "f_varies" not in d:
            d = {**d, "f_varies": d.get("finetune_steps") is not None}
            if isinstance(d.get("prune"), dict):
                prune = dict(d["prune"])
                d.update(prune=prune, finetune_steps=prune.pop("finetune_steps", 0))
        return _adapter(cls).validate_python(d)


@cache
def _adapter(cls) -> TypeAdapter:
    return TypeAdapter(cls)


def _heads(h) -> str:
    if isinstance(h, int):
        return str(h)
    return str(h[0]) if len(set(h)) == 1 else ",".join(map(str, h))



def arch_key(model: ModelConfig) -> str:
    """An architecture trained from scratch, as the learning-rate search knows it: heads × head_dim ("4x16"; per
    layer counts "3,4,5x16")."""
    return f"{_heads(list(model.layer_heads))}x{model.head_dim}"
