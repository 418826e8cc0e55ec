"""A validated Sweep → its units of work, each with a deterministic key and the MLflow tags of DESIGN.md.

Torch-free. A unit is what one Ray Tune trial does and one MLflow child run records: train one model (`dense`,
`scratch_e`, `scratch_b`, `wide`, or an `lr_search` candidate), or prune one dense checkpoint (`pruned`). Its key
hashes everything that decides its result — stage, arm, model, training and data configs, the corpus hash, the
prune plan and the key of the dense model it prunes — so a retried, resumed or re-run unit finds its own run.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace

from lightning_modules.config import (
    SCALES,
    DataConfig,
    ModelConfig,
    PrunePlan,
    TrainConfig,
    heads_kept,
    model_config_for,
    scratch_b_steps,
    train_config_for,
    wide_head_dim,
)

from .spec import Sweep

NONE = "none"

# what a trial's reports carry besides metrics (trainables → tracking)
HISTORY = "headroom_history"  # JSON list of [metric, step, value] since the previous report
KEPT = "headroom_kept"  # prune: JSON list of the heads kept per layer
DONE = "headroom_done"  # 1 on a unit's final report
WORK = "work_s"  # seconds of the unit's own work in this attempt (framework imports excluded)
RESUMED = "resumed_at_step"  # the step a train trial started from (0: from scratch)
LIGHTNING_FILE = "checkpoint"  # the Lightning checkpoint's file name inside a Tune checkpoint
TAG_FIELDS = ("stage", "arm", "scale", "family", "heads", "method", "ratio", "scope", "schedule", "seed", "key")


@dataclass(frozen=True)
class Unit:
    stage: str  # lr_search | train | prune
    arm: str  # dense | pruned | scratch_e | scratch_b | wide
    scale: str
    family: str
    seed: int
    model: dict | None  # ModelConfig (None: a pretrained checkpoint's own)
    train: dict  # TrainConfig: the budget (train) or the batch shape and eval budget (prune)
    data: dict  # DataConfig
    corpus_hash: str
    heads: str  # "8", or "3,4,5" for per-layer counts
    method: str = NONE
    ratio: float | None = None
    scope: str = NONE
    schedule: str = NONE
    plan: dict | None = None  # PrunePlan (prune stage)
    dense_key: str | None = None  # the dense unit a prune unit or a global-scope control derives from
    calibration_batches: int = 8
    curve: bool = True
    probes: dict | None = None  # ProbeSpec + tolerance (dense train units of a sweep with `probes`)
    key: str = ""

    def with_key(self) -> "Unit":
        body = {k: v for k, v in asdict(self).items() if k != "key" and not (k == "probes" and v is None)}
        digest = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]
        return replace(self, key=digest)

    @property
    def name(self) -> str:
        """Run name: what the MLflow UI lists, sortable by scale, family, arm, method, ratio, seed."""
        parts = [self.scale, self.family, self.arm]
        if self.stage == "lr_search":
            parts = [self.scale, self.family, "lr", f"{self.train['lr']:.2e}"]
        else:
            if self.method != NONE:
                parts.append(self.method)
            if self.ratio is not None:
                parts.append(f"r{self.ratio:g}")
            if self.scope == "global":
                parts.append("global")
            if self.schedule == "iterative":
                parts.append("iter")
            parts.append(f"s{self.seed}")
        return "-".join(parts)

    def tags(self) -> dict[str, str]:
        d = {
            "stage": self.stage, "arm": self.arm, "scale": self.scale, "family": self.family, "heads": self.heads,
            "method": self.method, "ratio": NONE if self.ratio is None else f"{self.ratio:g}", "scope": self.scope,
            "schedule": self.schedule, "seed": str(self.seed), "key": self.key,
        }
        return {f"headroom.{k}": str(d[k]) for k in TAG_FIELDS}

    def params(self) -> dict[str, str]:
        """MLflow params: the numbers a reader compares runs by (the UI's columns)."""
        p = {"steps": self.train["steps"], "lr": self.train["lr"], "batch_size": self.train["batch_size"],
             "seq_len": self.train["seq_len"], "corpus_hash": self.corpus_hash, "data": self.data["source"]}
        if self.model:
            p.update(d_model=self.model["d_model"], n_layers=self.model["n_layers"], head_dim=self.model["head_dim"],
                     n_heads=self.model["n_heads"])
        if self.plan:
            p.update(finetune_steps=self.plan["finetune_steps"], finetune_lr=self.plan["finetune_lr"],
                     calibration_batches=self.calibration_batches)
        return {k: str(v) for k, v in p.items()}

    def model_config(self) -> ModelConfig | None:
        return ModelConfig(**self.model) if self.model else None

    def train_config(self) -> TrainConfig:
        return TrainConfig(**self.train)

    def data_config(self) -> DataConfig:
        return DataConfig(**self.data)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Unit":
        return cls(**d)


def _heads(h) -> str:
    if isinstance(h, int):
        return str(h)
    return str(h[0]) if len(set(h)) == 1 else ",".join(map(str, h))


def _train_cfg(sweep: Sweep, scale: str, seed: int, lr: float | None, steps: int | None = None) -> TrainConfig:
    sc = sweep.scales[scale]
    return train_config_for(scale, steps=steps or sc.steps, lr=lr, seed=seed,
                            **sc.overrides.model_dump(exclude_none=True))


def lr_for(sweep: Sweep, scale: str, family: str, searched: dict | None = None) -> float:
    """The learning rate of every training run at (scale, family): the searched best, the sweep's, or the preset."""
    if searched and (scale, family) in searched:
        return searched[(scale, family)]
    if sweep.lr is not None and sweep.lr.value is not None:
        return sweep.lr.value
    return SCALES[scale].lr


def lr_search_base(sweep: Sweep, scale: str, family: str, corpus_hash: str) -> Unit:
    """The template of one lr_search candidate (its `train.lr` is set per Optuna sample by `lr_candidate`)."""
    s = sweep.lr.search
    train = _train_cfg(sweep, scale, s.seed, SCALES[scale].lr, steps=s.steps)
    model = model_config_for(scale, family, n_heads=sweep.dense_heads(scale))
    return Unit("lr_search", "dense", scale, family, s.seed, model.model_dump(mode="json"),
                train.model_dump(mode="json"), sweep.data.model_dump(mode="json"), corpus_hash,
                _heads(model.n_heads)).with_key()


def lr_candidate(base: Unit, lr: float) -> Unit:
    return replace(base, train={**base.train, "lr": float(lr)}).with_key()


def _trained(sweep, arm, scale, family, seed, model: ModelConfig, train: TrainConfig, corpus_hash, ratio=None,
             method=NONE, scope=NONE, schedule=NONE, dense_key=None) -> Unit:
    probes = None
    if arm == "dense" and sweep.probes is not None:
        probes = {**sweep.probes.model_dump(mode="json"), "tolerance": sweep.prune.tolerance}
    return Unit("train", arm, scale, family, seed, model.model_dump(mode="json"), train.model_dump(mode="json"),
                sweep.data.model_dump(mode="json"), corpus_hash, _heads(list(model.layer_heads)), method=method,
                ratio=ratio, scope=scope, schedule=schedule, dense_key=dense_key, probes=probes).with_key()


def train_units(sweep: Sweep, corpus_hash: str, lrs: dict | None = None) -> list[Unit]:
    """Stage 2: dense runs, and the controls whose architecture is known before pruning (uniform head counts of a
    per_layer prune: Scratch-E, Scratch-B, wide). Ordered so that dense runs start first."""
    dense, controls = [], []
    for scale in sweep.scales or {}:
        h = sweep.dense_heads(scale)
        for family in sweep.families:
            lr = lr_for(sweep, scale, family, lrs)
            for seed in sweep.seeds:
                model = model_config_for(scale, family, n_heads=h)
                train = _train_cfg(sweep, scale, seed, lr)
                dense.append(_trained(sweep, "dense", scale, family, seed, model, train, corpus_hash))
                if "per_layer" not in sweep.prune.scope:
                    continue
                for ratio in sweep.prune.ratios:
                    k = heads_kept(h, ratio)
                    small = model_config_for(scale, family, n_heads=k)
                    for arm in sweep.controls:
                        if arm == "wide":
                            m = model_config_for(scale, family, n_heads=k,
                                                 head_dim=wide_head_dim(SCALES[scale].d_model, k))
                            controls.append(_trained(sweep, arm, scale, family, seed, m, train, corpus_hash, ratio,
                                                     scope="per_layer"))
                        elif arm == "scratch_e":
                            controls.append(_trained(sweep, arm, scale, family, seed, small, train, corpus_hash,
                                                     ratio, scope="per_layer"))
                        elif arm == "scratch_b":
                            steps = scratch_b_steps(model, small, train.steps, sweep.prune.finetune_steps,
                                                    train.seq_len)
                            tb = train.model_copy(update={"steps": steps})
                            controls.append(_trained(sweep, arm, scale, family, seed, small, tb, corpus_hash, ratio,
                                                     scope="per_layer"))
    return dense + controls


def _plans(sweep: Sweep, seed: int):
    p = sweep.prune
    for method in p.methods:
        for ratio in p.ratios:
            for scope in p.scope:
                for schedule in p.schedule:
                    yield PrunePlan(method=method, ratio=ratio, scope=scope, schedule=schedule, step=p.step,
                                    finetune_steps=p.finetune_steps, finetune_lr=p.finetune_lr, seed=seed)


def prune_units(sweep: Sweep, dense: list[Unit]) -> list[Unit]:
    """Stage 3: one unit per (dense checkpoint × method × ratio × scope × schedule). Train once, prune many."""
    out = []
    for d in dense:
        for plan in _plans(sweep, d.seed):
            out.append(Unit("prune", "pruned", d.scale, d.family, d.seed, d.model, d.train, d.data, d.corpus_hash,
                            d.heads, method=plan.method, ratio=plan.ratio, scope=plan.scope,
                            schedule=plan.schedule, plan=plan.model_dump(mode="json"), dense_key=d.key,
                            calibration_batches=sweep.prune.calibration_batches, curve=sweep.prune.curve).with_key())
    return out


def global_control_units(sweep: Sweep, pruned: Unit, dense: Unit, kept_per_layer: list[int]) -> list[Unit]:
    """Controls of a `global` prune: the pruned model's exact per-layer head counts, trained from scratch."""
    out = []
    d_model = dense.model_config()
    small = d_model.with_heads(kept_per_layer)
    train = dense.train_config()
    for arm in sweep.controls:
        if arm == "wide":
            continue  # wide is the uniform "fewer heads" config; it is planned with the per_layer controls
        t = train
        if arm == "scratch_b":
            t = train.model_copy(update={"steps": scratch_b_steps(d_model, small, train.steps,
                                                                  sweep.prune.finetune_steps, train.seq_len)})
        out.append(_trained(sweep, arm, pruned.scale, pruned.family, pruned.seed, small, t, pruned.corpus_hash,
                            pruned.ratio, method=pruned.method, scope="global", schedule=pruned.schedule,
                            dense_key=dense.key))
    return out


def pretrained_units(sweep: Sweep, family: str, checkpoint_id: str, heads: list[int], corpus_hash: str) -> list[Unit]:
    """A pretrained sweep: the prune stage only, on one checkpoint (its `checkpoint_id` stands in as dense key)."""
    pt = sweep.pretrained
    train = TrainConfig(steps=1, batch_size=pt.batch_size, seq_len=pt.seq_len, eval_batches=pt.eval_batches,
                        val_batches=pt.eval_batches)
    dense = Unit("train", "dense", "pretrained", family, 0, None, train.model_dump(mode="json"),
                 sweep.data.model_dump(mode="json"), corpus_hash, _heads(heads), key=checkpoint_id)
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
                controls += global_control_units(sweep, p, dense, list(dense.model_config().layer_heads))
    return [u.name for u in trained + pruned + controls]
