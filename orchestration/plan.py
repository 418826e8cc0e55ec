"""A validated Sweep → its units of work, each with a deterministic key and the MLflow tags of DESIGN.md.

Torch-free. A unit is what one Ray Tune trial does and one MLflow child run records: train one model (`dense`,
`scratch_e`, `scratch_b`, `wide`, `dense_half`, or an `lr_search` candidate), or prune one dense checkpoint
(`pruned`). Its key hashes everything that decides its result — stage, arm, model, training and data configs, the
corpus hash, the prune plan and the key of the dense model it prunes — so a retried, resumed or re-run unit finds
its own run.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, replace

from pydantic import Field

from lightning_modules.config import (
    BYTE_VOCAB_SIZE,
    DEFAULT_CALIBRATION_BATCHES,
    SCALES,
    DataConfig,
    HeadroomInputError,
    ModelConfig,
    PrunePlan,
    Strict,
    TrainConfig,
    heads_kept,
    model_config_for,
    train_config_for,
    wide_head_dim,
)
from lightning_modules.costs import scratch_b_steps

from .spec import ProbeSpec, Sweep

NONE = "none"
HALF_ARM = "dense_half"  # the dense model of one seed trained to half the smallest budget (the converged check)

# what a trial's reports carry besides metrics (trainables → tracking)
HISTORY = "headroom_history"  # JSON list of [metric, step, value] since the previous report
KEPT = "headroom_kept"  # prune: JSON list of the heads kept per layer
DONE = "headroom_done"  # 1 on a unit's final report
WORK = "work_s"  # seconds of the unit's own work in this attempt (framework imports excluded)
RESUMED = "resumed_at_step"  # the step a train trial started from (0: from scratch)
LIGHTNING_FILE = "checkpoint"  # the Lightning checkpoint's file name inside a Tune checkpoint
WINDOWS_FILE = "eval_windows.json"  # per-window losses of a unit's evaluations (an artifact the report reads)
EVAL_PARAMS = ("eval_device", "eval_precision")  # every run's evaluation: where and at which precision (MLflow params)
WORK_KINDS = ("train_s", "eval_s", "score_s")  # cost/<kind>: seconds of a unit in training, evaluation, scoring steps


TAG_FIELDS = ("stage", "arm", "scale", "family", "heads", "method", "ratio", "scope", "schedule", "seed", "key",
              "steps", "prune_at")
SNAPSHOTS_DIR = "snapshots"  # a dense run's kept checkpoints (step<k>.ckpt) for pruning at p·T, beside its model


def cell_label(scale: str, budget: int | None) -> str:
    """What the report and summaries call a scale trained at one of several budgets T: "s-T1500" (a single
    budget: "s"), as in the run names."""
    return scale if budget is None else f"{scale}-T{budget}"


def split_label(label: str) -> tuple[str, int | None]:
    """cell_label's inverse: ("s", 1500) or ("s", None)."""
    scale, _, budget = label.partition("-T")
    return scale, int(budget) if budget else None


def scale_rank(label: str) -> tuple[int, int]:
    """Scale labels in the order of the presets (xs, s, m, ...; a pretrained checkpoint last); the budgets of one
    scale ("s-T500", "s-T1500") in increasing order."""
    name, budget = split_label(label)
    names = list(SCALES)
    return (names.index(name) if name in names else len(names)), budget or 0


class ProbeRun(ProbeSpec):
    """A dense train unit's mechanism probes: the sweep's ProbeSpec and the prune tolerance they compare with."""

    tolerance: float = Field(gt=0)


class PruneRun(Strict):
    """How a prune unit prunes, beyond which heads it selects (the unit's method, ratio, scope and schedule):
    the iterative step, the recovery fine-tune, the calibration data and the mask-only curve."""

    step: float = Field(default=0.1, gt=0, le=1)
    finetune_steps: int = Field(default=0, ge=0)
    finetune_lr: float | None = Field(default=None, gt=0)
    finetune_lr_grid: tuple[float, ...] = ()  # absolute rates (the sweep's multiples × the dense model's rate)
    calibration_batches: int = Field(default=DEFAULT_CALIBRATION_BATCHES, gt=0)
    curve: bool = True
    curve_batches: int | None = Field(default=None, gt=0)  # batches per point of the curve (None: the eval budget)


_PLAN_FIELDS = ("step", "finetune_steps", "finetune_lr", "finetune_lr_grid")
# what a key hashes: the serialised unit, less its key and its budget (derived: train.steps and the dense key say
# it); fields added after keys were first written enter only when they differ from their default, so units of
# sweeps that do not use them keep their keys
_NOT_HASHED = ("key", "budget")
_HASHED_WHEN_SET = {"probes": None, "prune_at": 1.0, "snapshots": []}


@dataclass(frozen=True)
class Unit:
    """One unit of work, holding its validated configs. `to_dict`/`from_dict` are its serialised form: what
    crosses the Ray boundary, what its key hashes, what a prune trial's metrics.json records."""

    stage: str  # lr_search | train | prune
    arm: str  # dense | dense_half | pruned | scratch_e | scratch_b | wide
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
    key: str = ""

    @property
    def plan(self) -> PrunePlan | None:
        """A prune unit's PrunePlan (None for the other stages)."""
        if self.prune is None:
            return None
        return PrunePlan(method=self.method, ratio=self.ratio, scope=self.scope, schedule=self.schedule,
                         seed=self.seed, **{k: getattr(self.prune, k) for k in _PLAN_FIELDS})

    def with_key(self) -> Unit:
        body = {k: v for k, v in self.to_dict().items()
                if k not in _NOT_HASHED and not (k in _HASHED_WHEN_SET and v == _HASHED_WHEN_SET[k])}
        digest = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]
        return replace(self, key=digest)

    @property
    def name(self) -> str:
        """Run name: what the MLflow UI lists, sortable by scale, family, arm, method, ratio, seed."""
        parts = [self.scale, self.family, self.arm]
        if self.stage == "lr_search":
            parts = [self.scale, self.family, "lr", arch_key(self.model), f"{self.train.lr:.2e}"]
        else:
            if self.budget is not None:
                parts.insert(2, f"T{self.budget}")
            if self.method != NONE:
                parts.append(self.method)
            if self.ratio is not None:
                parts.append(f"r{self.ratio:g}")
            if self.scope == "global":
                parts.append("global")
            if self.schedule == "iterative":
                parts.append("iter")
            if self.prune_at != 1.0:
                parts.append(f"at{self.prune_at:g}")
            parts.append(f"s{self.seed}")
        return "-".join(parts)

    def tags(self) -> dict[str, str]:
        d = {
            "stage": self.stage, "arm": self.arm, "scale": self.scale, "family": self.family, "heads": self.heads,
            "method": self.method, "ratio": NONE if self.ratio is None else f"{self.ratio:g}", "scope": self.scope,
            "schedule": self.schedule, "seed": str(self.seed), "key": self.key,
            "steps": NONE if self.budget is None else str(self.budget),
            "prune_at": f"{self.prune_at:g}" if self.stage == "prune" else NONE,
        }
        return {f"headroom.{k}": str(d[k]) for k in TAG_FIELDS}

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
            tail = (f", fine-tuned {self.prune.finetune_steps} steps" if self.prune.finetune_steps else "")
            return (f"Pruned: {when} ({what}, {heads}) with {self.ratio:.0%} of its heads removed by "
                    f"{self.method} importance ({self.scope.replace('_', ' ')}, "
                    f"{self.schedule.replace('_', '-')}){tail}.")
        return {
            "dense": f"Dense: {what}, {heads}, trained from scratch for {steps}.",
            HALF_ARM: f"Half-budget dense run: {what}, {heads}, trained from scratch for {steps}, half the dense "
                      f"run's budget on its own schedule (the report's converged check).",
            "scratch_e": f"Scratch-E control: the pruned architecture ({heads}) trained from scratch for the dense "
                         f"run's steps, {steps} ({what}).",
            "scratch_b": f"Scratch-B control: the pruned architecture ({heads}) trained from scratch until its "
                         f"training FLOPs match dense training plus fine-tuning, {steps} ({what}).",
            "wide": f"wide control: {heads} of {self.model.head_dim} dims, as wide as the dense model's attention "
                    f"allows (the usual fewer-heads model), trained from scratch for {steps} ({what}).",
        }[self.arm]

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
            p.update(finetune_steps=r.finetune_steps,
                     finetune_lr=r.finetune_lr if r.finetune_lr is not None else "val-grid",
                     finetune_lr_grid=",".join(f"{x:.3g}" for x in r.finetune_lr_grid) or "none",
                     calibration_batches=r.calibration_batches)
        return {k: str(v) for k, v in p.items()}

    def to_dict(self) -> dict:
        """The serialised unit (JSON-able; the layout keys have always hashed, so keys stay stable)."""
        dump = lambda c: None if c is None else c.model_dump(mode="json")
        r = self.prune or PruneRun()
        return {
            "stage": self.stage, "arm": self.arm, "scale": self.scale, "family": self.family, "seed": self.seed,
            "model": dump(self.model), "train": dump(self.train), "data": dump(self.data),
            "corpus_hash": self.corpus_hash, "heads": self.heads, "method": self.method, "ratio": self.ratio,
            "scope": self.scope, "schedule": self.schedule, "plan": dump(self.plan), "dense_key": self.dense_key,
            "calibration_batches": r.calibration_batches, "curve": r.curve, "curve_batches": r.curve_batches,
            "probes": dump(self.probes), "lr_source": self.lr_source, "budget": self.budget,
            "prune_at": self.prune_at, "snapshots": list(self.snapshots), "key": self.key,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Unit:
        plan = d.get("plan")
        prune = None
        if plan is not None:
            prune = PruneRun(**{k: plan[k] for k in _PLAN_FIELDS}, calibration_batches=d["calibration_batches"],
                             curve=d["curve"], curve_batches=d["curve_batches"])
        return cls(d["stage"], d["arm"], d["scale"], d["family"], d["seed"],
                   ModelConfig(**d["model"]) if d["model"] else None, TrainConfig(**d["train"]),
                   DataConfig(**d["data"]), d["corpus_hash"], d["heads"], method=d["method"], ratio=d["ratio"],
                   scope=d["scope"], schedule=d["schedule"], prune=prune, dense_key=d["dense_key"],
                   probes=ProbeRun(**d["probes"]) if d.get("probes") else None, lr_source=d["lr_source"],
                   budget=d.get("budget"), prune_at=d.get("prune_at", 1.0), snapshots=tuple(d.get("snapshots", ())),
                   key=d["key"])


def _heads(h) -> str:
    if isinstance(h, int):
        return str(h)
    return str(h[0]) if len(set(h)) == 1 else ",".join(map(str, h))


def _train_cfg(sweep: Sweep, scale: str, seed: int, lr: float | None, steps: int) -> TrainConfig:
    sc = sweep.scales[scale]
    return train_config_for(scale, steps=steps, lr=lr, seed=seed,
                            **sc.overrides.model_dump(exclude_none=True))


def arch_key(model: ModelConfig) -> str:
    """An architecture trained from scratch, as the learning-rate search knows it: heads × head_dim ("4x16"; per
    layer counts "3,4,5x16")."""
    return f"{_heads(list(model.layer_heads))}x{model.head_dim}"


def scratch_architectures(sweep: Sweep, scale: str, family: str, vocab_size: int = BYTE_VOCAB_SIZE
                          ) -> dict[str, tuple[str, ModelConfig]]:
    """Every architecture the sweep trains from scratch at (scale, family), by arch_key: (the arm it is, model).
    The dense model; for each ratio the Scratch-E/B shape (the kept heads at the dense head_dim) and the wide
    shape. Global-scope controls copy per-layer counts known only after pruning; they take the rate of the
    uniform Scratch-E/B shape of their ratio (the same heads in all, spread evenly)."""
    h = sweep.dense_heads(scale)
    dense = model_config_for(scale, family, n_heads=h, vocab_size=vocab_size)
    out = {arch_key(dense): ("dense", dense)}
    for ratio in sweep.prune.ratios:
        k = heads_kept(h, ratio)
        if {"scratch_e", "scratch_b"} & set(sweep.controls):  # one architecture: Scratch-E and -B share it
            small = model_config_for(scale, family, n_heads=k, vocab_size=vocab_size)
            out.setdefault(arch_key(small), ("scratch_e", small))
        if "wide" in sweep.controls:
            wide = _wide_model(scale, family, h, k, vocab_size, f"{scale}-{family}-wide-r{ratio:g} (lr search)")
            out.setdefault(arch_key(wide), ("wide", wide))
    return out


def _wide_model(scale: str, family: str, dense_heads: int, k: int, vocab_size: int, what: str) -> ModelConfig:
    """The `wide` architecture of k heads, no wider than the dense model's attention (`dense_heads` × the preset's
    head_dim; see wide_head_dim); a shape it cannot have raises naming the unit (`what`)."""
    sc = SCALES[scale]
    try:
        return model_config_for(scale, family, n_heads=k, vocab_size=vocab_size,
                                head_dim=wide_head_dim(sc.d_model, k, width=dense_heads * sc.head_dim))
    except HeadroomInputError as e:
        raise HeadroomInputError(f"unit {what}: {e}") from None


def lr_for(sweep: Sweep, scale: str, family: str, arch: str, searched: dict | None = None) -> tuple[float, str]:
    """(learning rate, where it came from) of a run of architecture `arch` at (scale, family): the rate the search
    found for that architecture ("searched"), the sweep's one number ("sweep"), or the scale preset's ("preset").
    Without a search every architecture trains at the same rate, and the report says so."""
    if searched and (scale, family, arch) in searched:
        return searched[(scale, family, arch)], "searched"
    if sweep.lr is not None and sweep.lr.value is not None:
        return sweep.lr.value, "sweep"
    return SCALES[scale].lr, "preset"


def lr_search_bases(sweep: Sweep, corpus_hash: str, vocab_size: int = BYTE_VOCAB_SIZE) -> list[Unit]:
    """Templates of the lr_search candidates, one per architecture trained from scratch (each searched with the
    same trials and steps; a candidate's `train.lr` is set per Optuna sample by `lr_candidate`)."""
    s = sweep.lr.search
    out = []
    for scale in sweep.scales:
        for family in sweep.families:
            for arch, (arm, model) in scratch_architectures(sweep, scale, family, vocab_size).items():
                train = _train_cfg(sweep, scale, s.seed, SCALES[scale].lr, steps=s.steps)
                out.append(Unit("lr_search", arm, scale, family, s.seed, model, train, sweep.data, corpus_hash,
                                _heads(list(model.layer_heads)), lr_source="searching").with_key())
    return out


def lr_candidate(base: Unit, lr: float) -> Unit:
    return replace(base, train=base.train.model_copy(update={"lr": float(lr)})).with_key()


def snapshot_step(at: float, steps: int) -> int:
    """The dense step at which a prune at fraction `at` of `steps` starts (floor: always before the end)."""
    return int(at * steps)


def _trained(sweep, arm, scale, family, seed, model: ModelConfig, train: TrainConfig, corpus_hash, ratio=None,
             method=NONE, scope=NONE, schedule=NONE, dense_key=None, lr_source="preset", budget=None) -> Unit:
    probes, snapshots = None, ()
    if arm == "dense":
        if sweep.probes is not None:
            probes = ProbeRun(**sweep.probes.model_dump(), tolerance=sweep.prune.tolerance)
        snapshots = tuple(sorted({snapshot_step(p, train.steps) for p in sweep.prune.at if p < 1}))
    return Unit("train", arm, scale, family, seed, model, train, sweep.data, corpus_hash,
                _heads(list(model.layer_heads)), method=method,
                ratio=ratio, scope=scope, schedule=schedule, dense_key=dense_key, probes=probes,
                lr_source=lr_source, budget=budget, snapshots=snapshots).with_key()


def recovery_steps(sweep: Sweep, dense_lr: float | None) -> int:
    """Steps the pruned arm of a dense model trained at `dense_lr` trains at its pruned size in recovery, as its
    prune units plan them (PrunePlan.recovery_steps): F for each candidate rate it fine-tunes. Scratch-B's budget
    counts every one: the pruned arm trained them all to pick its best."""
    run = _prune_run(sweep, dense_lr)
    return PrunePlan(ratio=0.0, **{k: getattr(run, k) for k in _PLAN_FIELDS}).recovery_steps


def _cells(sweep: Sweep):
    """(scale, budget T, family, seed) of every dense run, in plan order."""
    for scale, sc in (sweep.scales or {}).items():
        for budget in sc.budgets(scale):
            for family in sweep.families:
                for seed in sweep.seeds:
                    yield scale, budget, family, seed


def train_units(sweep: Sweep, corpus_hash: str, lrs: dict | None = None,
                vocab_size: int = BYTE_VOCAB_SIZE) -> list[Unit]:
    """Stage 2: dense runs (one per budget of a scale), and the controls whose architecture is known before
    pruning (uniform head counts of a per_layer prune: Scratch-E, Scratch-B, wide). Ordered so that dense runs
    start first. Models carry the vocabulary actually trained (`vocab_size`, the tokenizer's), so Scratch-B's
    compute matches the pruned arm's. `lrs` maps (scale, family, arch_key) to a searched rate."""
    dense, controls = [], []
    for scale, budget, family, seed in _cells(sweep):
        h = sweep.dense_heads(scale)
        model = model_config_for(scale, family, n_heads=h, vocab_size=vocab_size)
        lr, source = lr_for(sweep, scale, family, arch_key(model), lrs)
        train = _train_cfg(sweep, scale, seed, lr, budget)
        budgets = sweep.scales[scale].budgets(scale)
        tag = budget if len(budgets) > 1 else None
        dense.append(_trained(sweep, "dense", scale, family, seed, model, train, corpus_hash, lr_source=source,
                              budget=tag))
        if budget == min(budgets) and seed == sweep.seeds[0] and budget >= 2:
            # the converged check: the same model on its own full schedule to half the budget (a scale's larger
            # budgets are checked against its next smaller one)
            half = train.model_copy(update={"steps": budget // 2})
            controls.append(_trained(sweep, HALF_ARM, scale, family, seed, model, half, corpus_hash,
                                     lr_source=source, budget=tag))
        if "per_layer" not in sweep.prune.scope:
            continue
        for ratio in sweep.prune.ratios:
            k = heads_kept(h, ratio)
            small = model_config_for(scale, family, n_heads=k, vocab_size=vocab_size)
            for arm in sweep.controls:
                m = small
                if arm == "wide":
                    m = _wide_model(scale, family, h, k, vocab_size, f"{scale}-{family}-wide-r{ratio:g}-s{seed}")
                lr_c, source_c = lr_for(sweep, scale, family, arch_key(m), lrs)
                t = _train_cfg(sweep, scale, seed, lr_c, budget)
                if arm == "scratch_b":
                    t = t.model_copy(update={"steps": scratch_b_steps(
                        model, m, train.steps, recovery_steps(sweep, train.lr), train.seq_len)})
                controls.append(_trained(sweep, arm, scale, family, seed, m, t, corpus_hash, ratio,
                                         scope="per_layer", lr_source=source_c, budget=tag))
    return dense + controls


def _prune_run(sweep: Sweep, dense_lr: float | None) -> PruneRun:
    p = sweep.prune
    grid = () if p.finetune_lr is not None or dense_lr is None else tuple(m * dense_lr for m in p.finetune_lr_grid)
    return PruneRun(step=p.step, finetune_steps=p.finetune_steps, finetune_lr=p.finetune_lr,
                    finetune_lr_grid=grid if p.finetune_steps else (), calibration_batches=p.calibration_batches,
                    curve=p.curve, curve_batches=p.curve_batches)


def prune_units(sweep: Sweep, dense: list[Unit]) -> list[Unit]:
    """Stage 3: one unit per (dense checkpoint × method × ratio × scope × schedule). Train once, prune many. The
    recovery fine-tune's rate is the sweep's `finetune_lr`, or chosen on val from `finetune_lr_grid` × the dense
    model's own rate."""
    out = []
    for d in dense:
        run = _prune_run(sweep, d.train.lr if d.model is not None else None)  # None: a pretrained checkpoint's
        p = sweep.prune
        for at, method, ratio, scope, schedule in itertools.product(p.at, p.methods, p.ratios, p.scope, p.schedule):
            out.append(Unit("prune", "pruned", d.scale, d.family, d.seed, d.model, d.train, d.data, d.corpus_hash,
                            d.heads, method=method, ratio=ratio, scope=scope, schedule=schedule,
                            # the mask-only curve is of the trained model: a prune during training draws none
                            prune=run if at == 1 else run.model_copy(update={"curve": False}),
                            dense_key=d.key, lr_source=d.lr_source, budget=d.budget, prune_at=at).with_key())
    return out


def global_control_units(sweep: Sweep, pruned: Unit, dense: Unit, kept_per_layer: list[int],
                         lrs: dict | None = None) -> list[Unit]:
    """Controls of a `global` prune: the pruned model's exact per-layer head counts, trained from scratch, at the
    rate of the uniform Scratch-E/B shape of the same ratio (`scratch_architectures`). Only a prune of the trained
    model (prune_at 1) gets them; pruning earlier is compared with the same controls."""
    out = []
    if pruned.prune_at != 1.0:
        return out
    d_model = dense.model
    small = d_model.with_heads(kept_per_layer)
    uniform = d_model.with_heads(heads_kept(d_model.n_heads, pruned.ratio))
    lr, source = lr_for(sweep, pruned.scale, pruned.family, arch_key(uniform), lrs)
    if source == "searched":
        source = f"searched:{arch_key(uniform)}"
    train = dense.train.model_copy(update={"lr": lr})
    for arm in sweep.controls:
        if arm == "wide":
            continue  # wide is the uniform "fewer heads" config; it is planned with the per_layer controls
        t = train
        if arm == "scratch_b":
            t = train.model_copy(update={"steps": scratch_b_steps(d_model, small, train.steps,
                                                                  recovery_steps(sweep, dense.train.lr),
                                                                  train.seq_len)})
        out.append(_trained(sweep, arm, pruned.scale, pruned.family, pruned.seed, small, t, pruned.corpus_hash,
                            pruned.ratio, method=pruned.method, scope="global", schedule=pruned.schedule,
                            dense_key=dense.key, lr_source=source, budget=dense.budget))
    return out

def pretrained_units(sweep: Sweep, family: str, checkpoint_id: str, heads: list[int], corpus_hash: str) -> list[Unit]:
    """A pretrained sweep: the prune stage only, on one checkpoint (its `checkpoint_id` stands in as dense key)."""
    pt = sweep.pretrained
    train = TrainConfig(steps=1, batch_size=pt.batch_size, seq_len=pt.seq_len, eval_batches=pt.eval_batches,
                        val_batches=pt.eval_batches)
    dense = Unit("train", "dense", "pretrained", family, 0, None, train, sweep.data, corpus_hash, _heads(heads),
                 key=checkpoint_id)
    seeds = sorted(set(sweep.seeds))
    units = []
    for seed in seeds:
        units += prune_units(sweep, [replace(dense, seed=seed)])
    return units


def expected_names(sweep: Sweep) -> list[str]:
    """Run names of every unit the sweep plans (lr_search candidates aside), known from the spec alone: names do
    not depend on the corpus hash, the learning rate or (for global-scope controls) the kept head counts. The
    report lists the ones that did not finish."""
    if sweep.pretrained is not None:
        units = pretrained_units(sweep, sweep.families[0], "-", [1], "-")
        return [u.name for u in units]
    trained = train_units(sweep, "-")
    pruned = prune_units(sweep, [u for u in trained if u.arm == "dense"])
    by_key = {u.key: u for u in trained}
    controls = []
    if sweep.controls:
        for p in pruned:
            if p.scope == "global":
                dense = by_key[p.dense_key]
                controls += global_control_units(sweep, p, dense, list(dense.model.layer_heads))
    return [u.name for u in trained + pruned + controls]
