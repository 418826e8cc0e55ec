"""A validated Sweep → its units of work (orchestration/design/unit.py), in the stages they run in: the learning-rate
search, dense runs and the controls known before pruning, the prunes of every dense checkpoint, and the controls of
a `global` prune once its kept heads are known. Torch-free.
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager
from dataclasses import dataclass, replace

from lightning_modules.declarations.arms import ARMS, Budget, Shape, control_names, pruned_shape
from lightning_modules.declarations.config import (
    BYTE_VOCAB_SIZE,
    SCALES,
    HeadroomInputError,
    ModelConfig,
    TrainConfig,
    heads_kept,
    model_config_for,
    train_config_for,
)
from lightning_modules.declarations.methods import (
    charged_method,
    compensates,
    get_method,
    scoring_flops,
    scoring_passes,
)
from lightning_modules.declarations.prune_plan import PrunePlan

from .axes import BY_NAME, registered
from .schema import Sweep
from .trunks import share_trunks
from .unit import _KEYING_LEFT, HALF_ARM, NONE, PlanTooLarge, ProbeRun, PruneRun, Unit, _heads, arch_key


def _train_cfg(sweep: Sweep, scale: str, seed: int, lr: float | None, steps: int) -> TrainConfig:
    sc = sweep.scales[scale]
    return train_config_for(scale, steps=steps, lr=lr, seed=seed,
                            **sc.overrides.model_dump(exclude_none=True))


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
        if sweep.scratch_curve:  # the from-scratch curve trains the Scratch-E shape: searched as Scratch-E
            m = pruned_shape(Shape(scale, family, dense, h, heads_kept(h, ratio), vocab_size,
                                   f"{scale}-{family}-scratch_curve-r{ratio:g} (lr search)"))
            out.setdefault(arch_key(m), ("scratch_e", m))
        for name in control_names():  # in declaration order; arms of one shape share its search (search_as)
            if name in sweep.controls:
                arm = ARMS[name]
                m = arm.architecture(Shape(scale, family, dense, h, heads_kept(h, ratio), vocab_size,
                                           f"{scale}-{family}-{name}-r{ratio:g} (lr search)"))
                out.setdefault(arch_key(m), (arm.search_as or name, m))
    return out


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
             method=NONE, scope=NONE, schedule=NONE, dense_key=None, lr_source="preset", budget=None,
             recovery: tuple[int, str] | None = None) -> Unit:
    probes, snapshots = None, ()
    if arm == "dense":
        if sweep.probes is not None:
            probes = ProbeRun(**sweep.probes.model_dump(), tolerance=sweep.prune.tolerance)
        snapshots = tuple(sorted({snapshot_step(p, train.steps) for p in sweep.prune.at if p < 1}))
    extra = {} if recovery is None else _recovery_fields(sweep, scale, *recovery)
    # only a control that learns from a teacher distils; Scratch-B matched to a distilled arm trains on the LM loss
    extra["distill"] = sweep.prune.distill if ARMS[arm].teacher else None
    return Unit("train", arm, scale, family, seed, model, train, sweep.data, corpus_hash,
                _heads(list(model.layer_heads)), method=method,
                ratio=ratio, scope=scope, schedule=schedule, dense_key=dense_key, probes=probes,
                lr_source=lr_source, budget=budget, snapshots=snapshots, **extra).with_key()


def pruned_arm(sweep: Sweep | None, dense: ModelConfig, small: ModelConfig, train: TrainConfig, finetune_steps: int,
               recovery: str, method: str, rounds: int = 1, at: float = 1.0, run: PruneRun | None = None) -> Budget:
    """The pruned arm of `dense` trained with `train`, pruned to `small` at fraction `at` of its T steps by `method`
    over `rounds` scoring rounds and recovered by `finetune_steps` of `recovery`: the one account of its compute.
    Scratch-B and Scratch-KD budgets are its FLOPs; `--plan` shows them for every prune unit (`unit_arm`). `run`:
    the prune settings (else the sweep's, for a dense model trained at train.lr)."""
    run = run or _prune_run(sweep, train.lr, finetune_steps)
    bt = train.batch_size * train.seq_len
    snap = snapshot_step(at, train.steps) if at < 1 else train.steps
    rec = PrunePlan(ratio=0.0, finetune_steps=finetune_steps, **run.recipe()).recovery_steps  # every rate's fine-tune
    passes = scoring_passes(method, sum(dense.layer_heads), bt, run.calibration_batches * bt, rounds,
                            compensates(method, run.bias_compensation))
    return Budget(dense, small, snap, rec, train.seq_len, recovery, passes, continued_steps=train.steps - snap)


def unit_arm(u: Unit, small: ModelConfig) -> Budget:
    """Prune unit `u`'s pruned arm (`pruned_arm`), pruned to `small`."""
    return pruned_arm(None, u.model, small, u.train, u.finetune_steps, u.recovery, u.method,
                      u.plan.scoring_rounds, u.prune_at, u.prune)


def unit_scoring_flops(u: Unit, n_heads: int, fwd_dense: float) -> float:
    """The FLOPs prune unit `u`'s method spends scoring a dense model of `n_heads` heads in all and `fwd_dense`
    forward FLOPs per token on the unit's calibration batches, every round of its schedule: what `--plan` counts and
    the prune trial logs as cost/scoring_flops."""
    bt = u.train.batch_size * u.train.seq_len
    return scoring_flops(u.method, n_heads, bt, u.prune.calibration_batches * bt, fwd_dense, u.plan.scoring_rounds,
                         u.plan.compensates)


def recoveries(sweep: Sweep, scale: str | None = None) -> list[tuple[int, str]]:
    """(F, objective) of every recovery the prunes at `scale` run: each budget F of the scale (its own
    `finetune_steps`, else `prune.finetune_steps`) with each objective of `prune.recovery`; F = 0 (no fine-tune,
    so no objective) once, as "lm"."""
    p = sweep.prune
    return [(f, kind) for f in sweep.finetune_steps(scale) for kind in (p.recovery if f > 0 else ["lm"])]


def _recovery_fields(sweep: Sweep, scale: str, f: int, kind: str) -> dict:
    """A unit's recovery fields: F, whether its scale lists several (then the name and key carry it), the
    objective, and the distillation settings of a distilled unit."""
    return {"finetune_steps": f, "f_varies": len(sweep.finetune_steps(scale)) > 1, "recovery": kind,
            "distill": sweep.prune.distill if kind == "distill" else None}


def expand(sweep: Sweep, u: Unit, control: bool = False) -> list[Unit]:
    """Unit `u` × the values of every registered axis (orchestration/design/axes.py: register_axis), each value
    recorded in the unit's `axes` and given its effect (`Axis.apply`): a prune unit once per value of each axis, a
    control once per value of an axis declared `controls="each"` (and once, standing for every value, of the
    others). Without registered axes: [u]."""
    out = [u]
    for a in registered():
        values = a.expansion(sweep, u.scale)
        if not values or (control and a.controls == "every"):
            continue
        out = [_with_value(a, x, v) for x in out for v in values]
    return out if out == [u] else [x.with_key() for x in out]


def _with_value(axis, u: Unit, value) -> Unit:
    u = replace(u, axes=(*u.axes, (axis.name, value)))
    return axis.apply(u, value) if axis.apply is not None else u


def _control_variants(sweep: Sweep, arm, scale: str) -> list[tuple[int, str] | None]:
    """The recoveries a control is planned for: one per (F, objective) of its `recoveries` when its budget follows
    the recovery (`per_recovery`), else one unit standing for every recovery (None)."""
    if not arm.per_recovery:
        return [None]
    return [(f, kind) for f, kind in recoveries(sweep, scale) if kind in arm.recoveries]


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
        if budget == min(budgets) and (sweep.trust.half_budget == "every" or seed == sweep.seeds[0]) \
                and budget >= 2:
            # the converged check: the same model on its own full schedule to half the budget (a scale's larger
            # budgets are checked against its next smaller one)
            half = train.model_copy(update={"steps": budget // 2})
            controls.append(_trained(sweep, HALF_ARM, scale, family, seed, model, half, corpus_hash,
                                     lr_source=source, budget=tag))
        if "per_layer" not in sweep.prune.scope:
            continue
        for ratio in sweep.prune.ratios:
            for name in sweep.controls:
                arm = ARMS[name]
                m = arm.architecture(Shape(scale, family, model, h, heads_kept(h, ratio), vocab_size,
                                           f"{scale}-{family}-{name}-r{ratio:g}-s{seed}"))
                lr_c, source_c = lr_for(sweep, scale, family, arch_key(m), lrs)
                for variant in _control_variants(sweep, arm, scale):
                    # a control standing for every recovery is charged the primary one (its steps do not follow it)
                    f, kind = variant or sweep.primary_recovery(scale)
                    t = _train_cfg(sweep, scale, seed, lr_c, budget)
                    # per-layer controls stand for every method and schedule: charged the primary method's one
                    # scoring round (methods.charged_method)
                    t = t.model_copy(update={"steps": arm.steps(
                        pruned_arm(sweep, model, m, train, f, kind, charged_method(sweep.prune.methods)))})
                    controls += expand(sweep, _trained(
                        sweep, name, scale, family, seed, m, t, corpus_hash, ratio, scope="per_layer",
                        lr_source=source_c, budget=tag, recovery=variant,
                        dense_key=dense[-1].key if arm.teacher else None), control=True)
            if sweep.scratch_curve:  # the pruned shape's learning curve (the report's parent-free savings)
                m = pruned_shape(Shape(scale, family, model, h, heads_kept(h, ratio), vocab_size,
                                       f"{scale}-{family}-scratch_curve-r{ratio:g}-s{seed}"))
                lr_c, source_c = lr_for(sweep, scale, family, arch_key(m), lrs)
                for frac in sweep.scratch_curve:
                    t = _train_cfg(sweep, scale, seed, lr_c, max(1, round(frac * budget)))
                    controls += expand(sweep, _trained(sweep, "scratch_curve", scale, family, seed, m, t,
                                                       corpus_hash, ratio, scope="per_layer", lr_source=source_c,
                                                       budget=tag), control=True)
    return dense + controls


def _prune_run(sweep: Sweep, dense_lr: float | None, finetune_steps: int) -> PruneRun:
    p = sweep.prune
    grid = () if p.finetune_lr is not None or dense_lr is None else tuple(m * dense_lr for m in p.finetune_lr_grid)
    return PruneRun(step=p.step, finetune_lr=p.finetune_lr,
                    finetune_lr_grid=grid if finetune_steps else (), bias_compensation=p.bias_compensation,
                    finetune_lr_extend=p.finetune_lr_extend if grid and finetune_steps else 0,
                    **p.prune_data())


def _compensation(method: str, setting: bool | None, at: float = 1.0) -> bool | None:
    """A prune unit's bias compensation as its key holds it: what the prune does (the setting, or the method's
    recipe; a prune during training, p < 1, never compensates), None where that is the default of a method that
    does not compensate — so a unit's key, and its charge, change exactly when what it does changes."""
    on = compensates(method, setting) and at == 1
    return on if on or get_method(method).compensates else None


def prune_units(sweep: Sweep, dense: list[Unit]) -> list[Unit]:
    """Stage 3: one unit per (dense checkpoint × method × ratio × scope × schedule). Train once, prune many. The
    recovery fine-tune's rate is the sweep's `finetune_lr`, or chosen on val from `finetune_lr_grid` × the dense
    model's own rate."""
    out = []
    p = sweep.prune
    for d in dense:
        for (f, kind), at, method, ratio, scope, schedule in itertools.product(
                recoveries(sweep, d.scale), p.at, p.methods, p.ratios, p.scope, p.schedule):
            if p.recover_methods is not None and method not in p.recover_methods:
                if (f, kind) != min(recoveries(sweep, d.scale)):
                    continue  # planned once, before fine-tune only
                f, kind = 0, "lm"
            run = _prune_run(sweep, d.train.lr if d.model is not None else None, f)  # None: a pretrained model's
            run = run.model_copy(update={"bias_compensation": _compensation(method, p.bias_compensation, at)})
            out += expand(sweep, Unit(
                "prune", "pruned", d.scale, d.family, d.seed, d.model, d.train, d.data, d.corpus_hash, d.heads,
                method=method, ratio=ratio, scope=scope, schedule=schedule,
                # the mask-only curve is of the trained model: a prune during training draws none
                prune=run if at == 1 else run.model_copy(update={"curve": False}), dense_key=d.key,
                lr_source=d.lr_source, budget=d.budget, prune_at=at,
                **_recovery_fields(sweep, d.scale, f, kind)).with_key())
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
    what = f"{pruned.name} controls"
    for name in sweep.controls:
        arm = ARMS[name]
        if not arm.for_global:
            continue  # a uniform shape (wide: the usual "fewer heads" config), planned with the per_layer controls
        shape = Shape(pruned.scale, pruned.family, d_model, d_model.n_heads, list(kept_per_layer),
                      d_model.vocab_size, what)
        small = arm.architecture(shape)
        uniform = arm.architecture(replace(shape, kept=heads_kept(d_model.n_heads, pruned.ratio)))
        lr, source = lr_for(sweep, pruned.scale, pruned.family, arch_key(uniform), lrs)
        if source == "searched":
            source = f"searched:{arch_key(uniform)}"
        train = dense.train.model_copy(update={"lr": lr})
        f, kind = pruned.finetune_steps, pruned.recovery
        t = train.model_copy(update={"steps": arm.steps(
            pruned_arm(sweep, d_model, small, dense.train, f, kind, pruned.method, pruned.plan.scoring_rounds))})
        c = _trained(sweep, name, pruned.scale, pruned.family, pruned.seed, small, t, pruned.corpus_hash,
                     pruned.ratio, method=pruned.method, scope="global", schedule=pruned.schedule,
                     dense_key=dense.key, lr_source=source, budget=dense.budget,
                     recovery=(f, kind) if arm.per_recovery else None)
        for axis, v in pruned.axes:  # a registered axis of one control per value: the prune's value
            if BY_NAME[axis].controls == "each":
                c = _with_value(BY_NAME[axis], c, v)
        out.append(c.with_key())
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


@dataclass(frozen=True)
class Plan:
    """The plan of a scales sweep, built once (`build_plan`) and read by `--plan`, the stages and the report's
    expected-units check: the units trained before pruning (dense runs, half-budget runs, the controls whose shape
    the spec fixes), the prune units with their dense models, and — a late expansion — the controls of each
    `global` prune, whose shape only its kept heads decide (`controls_of`)."""

    sweep: Sweep
    lr_search: list[Unit]  # one template per architecture trained from scratch, when the sweep searches rates
    trained: list[Unit]
    pruned: list[Unit]
    lrs: dict | None = None  # (scale, family, arch_key) -> a searched rate
    # controls that learn from the dense run of their cell and seed (arms.Arm.teacher: scratch_kd), trained once
    # that run has finished (with the global controls, after the prunes)
    taught: list[Unit] = ()
    corpus_hash: str = "-"
    vocab_size: int = BYTE_VOCAB_SIZE

    def with_rates(self, lrs: dict) -> Plan:
        """The plan once the learning-rate search has run: its training units take the searched rates (their keys
        hash the rate, and the prune units' dense keys follow)."""
        return build_plan(self.sweep, self.corpus_hash, self.vocab_size, lrs)

    def expected_names(self) -> list[str]:
        """Run names of every unit the plan runs (lr_search candidates aside), a global prune's controls with the
        dense heads (names do not depend on the kept heads): what the report lists when one did not finish."""
        dense = {u.key: u for u in self.dense}
        controls = self.global_controls(lambda p: list(dense[p.dense_key].model.layer_heads))
        return [u.name for u in self.trained + self.pruned + controls + list(self.taught)]

    def to_json(self) -> dict:
        """What a sweep records beside its parent run (`sweep/plan.json`): the report of a finished sweep reads
        its expected units from there, never from re-planning with the code of the day."""
        return plan_record(self.lr_search + self.trained + self.pruned + list(self.taught), self.expected_names(),
                           self.corpus_hash, self.vocab_size)


    @property
    def dense(self) -> list[Unit]:
        return [u for u in self.trained if u.arm == "dense"]

    def dense_links(self) -> dict[str, str]:
        """unit key -> the key of the dense run of its cell and seed, for every trained unit but the dense ones
        (a prune unit carries its own: `dense_key`)."""
        of = {(u.scale, u.family, u.seed, u.budget): u.key for u in self.dense}
        return {u.key: of[(u.scale, u.family, u.seed, u.budget)] for u in self.trained if u.arm != "dense"}

    def has_global_controls(self) -> bool:
        return bool(self.sweep.controls) and "global" in self.sweep.prune.scope

    def controls_of(self, pruned: Unit, kept_per_layer: list[int]) -> list[Unit]:
        """The controls of one global prune, given the heads it kept per layer."""
        if pruned.scope != "global" or not self.sweep.controls:
            return []
        dense = next(u for u in self.dense if u.key == pruned.dense_key)
        return global_control_units(self.sweep, pruned, dense, kept_per_layer, self.lrs)

    def global_controls(self, kept_of, pruned: list[Unit] | None = None) -> list[Unit]:
        """The controls of every global prune (of `pruned`, default all) whose kept heads `kept_of(unit)` gives
        (None: not known, no controls)."""
        out = {}
        for p in self.pruned if pruned is None else pruned:
            if p.scope == "global" and self.sweep.controls:
                kept = kept_of(p)
                if kept is not None:
                    # a control whose budget does not follow the recovery stands for the prunes of every F and
                    # objective of one (method, ratio, schedule): planned once
                    out.update((u.key, u) for u in self.controls_of(p, kept))
        return list(out.values())


def plan_record(units: list[Unit], expected: list[str], corpus_hash: str, vocab_size: int | None = None) -> dict:
    """`sweep/plan.json`: every unit's name, key and stage, and the run names the report expects."""
    return {"corpus_hash": corpus_hash, "vocab_size": vocab_size, "expected": expected,
            "units": [{"name": u.name, "key": u.key, "stage": u.stage} for u in units]}


def build_plan(sweep: Sweep, corpus_hash: str, vocab_size: int = BYTE_VOCAB_SIZE, lrs: dict | None = None) -> Plan:
    """The plan of a scales sweep (a pretrained sweep's units: `pretrained_units`). Its training units take the
    searched rates `lrs` when given (the stages build the plan again once the search has run)."""
    global BUILDS
    BUILDS += 1
    search = lr_search_bases(sweep, corpus_hash, vocab_size) if sweep.lr is not None and sweep.lr.search else []
    units = share_trunks(train_units(sweep, corpus_hash, lrs, vocab_size))  # wsd: one trunk per architecture
    trained = [u for u in units if not ARMS[u.arm].teacher]
    taught = [u for u in units if ARMS[u.arm].teacher]
    return Plan(sweep, search, trained, prune_units(sweep, [u for u in trained if u.arm == "dense"]), lrs, taught,
                corpus_hash, vocab_size)


BUILDS = 0  # plans built in this process: one `headroom sweep` builds one (and once more with the searched rates)


MAX_UNITS = 20_000  # the most units one sweep may plan: about 17× the largest shipped sweep's 1,132 (scales.yaml with its global controls)


@contextmanager
def bounded(n: int):
    """Plans built inside may key at most `n` units; past that, `Unit.with_key` raises PlanTooLarge — so a plan
    too large to hold costs at most n units' work to refuse."""
    _KEYING_LEFT.append(n)
    try:
        yield
    finally:
        _KEYING_LEFT.pop()


def check_plan_size(sweep: Sweep, limit: int = MAX_UNITS) -> int:
    """An upper bound on the units `sweep` runs, counted before any plan of the whole sweep is built, and
    HeadroomInputError with the count when it passes `limit`. The count: the plan of its first seed (built under
    `bounded`) times its seeds — every seed plans what the first does, or less (the first seed's half-budget run) —
    where each global prune counts its controls as if no two prunes kept the same heads (a shared control is
    planned once), plus every learning-rate search's candidates (`trials` + `extend` per architecture, once for
    all seeds). Building the one-seed plan keys each of its units once and each search template once, and a
    template stands for at least `trials` >= 2 candidates, so keying stops after 2 x `limit` keys: a plan too large
    to hold costs at most that much work to refuse."""
    global BUILDS
    one, builds = sweep.model_copy(update={"seeds": sweep.seeds[:1]}), BUILDS
    search = 0
    try:
        with bounded(2 * limit):
            if sweep.pretrained is not None:
                per_seed = len(pretrained_units(one, sweep.families[0], "plan", [1], "plan"))
            else:
                p = build_plan(one, "plan")
                per_seed = len(p.trained) + len(p.pruned) + len(p.taught)
                for u in p.pruned:  # a global prune's controls, of any kept shape: one head a layer will do
                    if u.scope == "global":
                        per_seed += len(p.controls_of(u, [1] * u.model.n_layers))
                if p.lr_search:
                    s = sweep.lr.search
                    search = len(p.lr_search) * (s.trials + s.extend)
    except PlanTooLarge:
        raise HeadroomInputError(f"the sweep plans more than {limit} units for one seed alone, more than one sweep "
                                 "may plan: split it into smaller sweeps") from None
    finally:
        BUILDS = builds  # a count, not a plan of the sweep: BUILDS counts those
    total = per_seed * len(sweep.seeds) + search
    if total > limit:
        searched = f" + {search} learning-rate search candidates" if search else ""
        raise HeadroomInputError(f"the sweep plans up to {total} units ({per_seed} per seed × {len(sweep.seeds)} "
                                 f"seeds{searched}), more than the {limit} one sweep may plan: split it into "
                                 "smaller sweeps")
    return total


def expected_names(sweep: Sweep) -> list[str]:
    """Run names of every unit the sweep plans (lr_search candidates aside), known from the spec alone: names do
    not depend on the corpus hash, the learning rate or (for global-scope controls) the kept head counts. For the
    report of a sweep recorded before its plan was (no `sweep/plan.json`)."""
    if sweep.pretrained is not None:
        units = pretrained_units(sweep, sweep.families[0], "-", [1], "-")
        return [u.name for u in units]
    return build_plan(sweep, "-").expected_names()
