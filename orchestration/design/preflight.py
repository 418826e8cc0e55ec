"""A sweep checked before any compute: every unit planned, its model built on the meta device (no memory, a few
seconds) and run forward once, its size and cost counted.

`headroom sweep FILE --plan [--json]` prints one row per unit; `headroom sweep FILE` runs the same check before Ray
starts, so a unit that cannot be built (a head size RoPE cannot rotate, a shape that does not fit) stops the sweep
with one line naming it instead of failing mid-sweep. Parameters and FLOPs per token come from the built model's
modules (`pruning.forward_flops`), not from the config formulas they are checked against elsewhere.

Costs are estimates of FLOPs: training (3 × forward per token), evaluation, head scoring and the recovery
fine-tune. Where a count depends on the data (a whole-split evaluation), its stated cap is used: an upper bound.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace

from lightning_modules.declarations.arms import Budget
from lightning_modules.declarations.config import (
    EVAL_CAP_TOKENS,
    HeadroomInputError,
    ModelConfig,
    TrainConfig,
    check_compatible,
    kept_counts,
)
from lightning_modules.declarations.methods import get_method, scoring_flops

from .axes import BY_NAME, registered
from .packing import check_packing, unit_memory
from .plan import Plan, unit_arm
from .resources import trial_resources
from .schema import Sweep
from .unit import ANY, Unit, stands_for

# the JSON field names other tools rely on (a row has more)
PLAN_FIELDS = ("stage", "arm", "scale", "family", "heads", "head_dim", "steps", "params", "flops_per_token",
               "train_flops", "ratio", "method", "seed", "resources")


@dataclass
class PlanRow:
    name: str
    stage: str  # lr_search | train | prune | controls
    arm: str
    scale: str
    family: str
    heads: list[int] | None  # per layer; None for a global prune and its controls (chosen by the scores)
    heads_total: int
    head_dim: int
    attention_width: int  # the widest layer's heads × head_dim
    vocab_size: int
    lr: float | str  # "searched" until the search has run
    lr_source: str
    steps: int  # training steps (a prune unit: its recovery fine-tune, per candidate rate)
    tokens: int  # training tokens of those steps
    params: int  # of the model the unit ends with
    flops_per_token: int  # forward, of that model
    train_flops: int  # 3 × forward × training tokens
    est_flops: int  # the unit's whole cost: training, evaluation, scoring
    ratio: float | None
    method: str | None
    scope: str | None
    seed: int
    resources: dict = field(default_factory=dict)
    trials: int | None = None  # lr_search: the candidates of this architecture's search
    budget: int | None = None  # the dense budget T this unit belongs to, when its scale lists several
    prune_at: float | None = None  # prune units: the fraction of T at which the heads go (1: the trained model)
    # prune units and the controls whose budget follows the recovery: the recovery budget F and objective
    finetune_steps: int | None = None
    recovery: str | None = None
    # the arm's training compute: a prune unit's whole pruned arm (the dense run's T steps, the steps after an
    # early prune, every candidate fine-tune with the teacher's forward passes when it distils); a trained unit's
    # own steps (a distilled control's teacher passes included). Scratch-B and scratch_kd equal their pruned arm
    # to within one of their steps
    arm_train_flops: int = 0
    # the planned peak memory of one worker of the unit's trial, bytes (orchestration/design/packing.py)
    memory_bytes: int = 0
    # the value of every axis registered beyond the built-in ones (orchestration/design/axes.py): "*" where the
    # unit stands for every value (a control), None where the axis does not apply
    axes: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------------------------------------ building

_BUILT: dict[str, tuple[int, int]] = {}


def build_on_meta(model: ModelConfig, seq_len: int) -> tuple[int, int]:
    """(parameters, forward FLOPs per token) of the model `build_model` makes of `model`, built on the meta device
    and run forward on one sequence of `seq_len`: every shape is checked, no memory is used."""
    key = json.dumps([model.model_dump(mode="json"), seq_len], sort_keys=True)
    if key not in _BUILT:
        torch, build_model, forward_flops = _frameworks()
        with torch.device("meta"):
            m = build_model(model, seed=0)
            m(input_ids=torch.zeros(1, seq_len, dtype=torch.long))
        params = sum(p.numel() for p in m.parameters())  # tied weights once (parameters() drops duplicates)
        _BUILT[key] = (params, forward_flops(m, seq_len)["total"])
    return _BUILT[key]


def _frameworks():
    """torch and headroom's model code, imported outside the checks: an import error is a bug, not bad input."""
    import torch

    from lightning_modules.models.build import build_model
    from lightning_modules.pruning.measure import forward_flops

    return torch, build_model, forward_flops


def _build(u_name: str, model: ModelConfig, train: TrainConfig) -> tuple[int, int]:
    _frameworks()
    try:
        check_compatible(model, train)
        return build_on_meta(model, train.seq_len)
    except HeadroomInputError as e:
        raise HeadroomInputError(f"unit {u_name}: {e}") from None
    except Exception as e:  # noqa: BLE001 - whatever transformers or torch raise, one line names the unit
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise HeadroomInputError(f"unit {u_name}: cannot be built ({msg})") from None


def spread_heads(total: int, layers: int, max_heads: int) -> list[int]:
    """`total` heads over `layers` layers as evenly as possible: a global prune's representative shape (its FLOPs
    and parameters depend on the total only; its per-layer split is chosen by the scores)."""
    base, extra = divmod(total, layers)
    return [min(max_heads, base + (1 if i < extra else 0)) for i in range(layers)]


# ------------------------------------------------------------------------------------------------ costs


def _eval_sets(sweep: Sweep) -> int:
    """val and the eval sets: `id` always, `shift` where the source has one."""
    shifted = sweep.data.source in ("stdlib", "mqar") or sweep.data.shift is not None
    return 2 + (1 if shifted else 0)


def _eval_tokens(t: TrainConfig, batches: int | None) -> int:
    return batches * t.batch_size * t.seq_len if batches is not None else EVAL_CAP_TOKENS


def _train_cost(sweep: Sweep, t: TrainConfig, fwd: int, final_eval: bool = True, start: int = 0) -> int:
    """A train trial's compute from step `start` (a cooldown branch's, orchestration/design/trunks.py) to its end:
    its training steps, the validations on the way and the final evaluation."""
    tokens = (t.steps - start) * t.batch_size * t.seq_len
    val = (t.steps // t.val_every - start // t.val_every) * t.val_batches * t.batch_size * t.seq_len
    final = _eval_sets(sweep) * _eval_tokens(t, t.eval_batches) if final_eval else 0
    return 3 * fwd * tokens + fwd * (val + final)


def _prune_cost(sweep: Sweep, u: Unit, arm: Budget, fwd_dense: int, fwd_pruned: int) -> int:
    """A prune trial's compute: the arm's work after the dense checkpoint (scoring, every candidate fine-tune with
    its teacher passes; a prune during training's continued steps are its own term), the mask-only curve, the
    evaluations before and after recovery, each candidate's validation and the split-half re-scoring."""
    t = u.train
    sets = _eval_sets(sweep)
    ev = _eval_tokens(t, t.eval_batches)
    curve = 0
    if u.prune.curve:
        points = 10  # at most: the achievable fractions of the nominal 0.0 .. 0.9
        curve = points * sets * _eval_tokens(t, u.prune.curve_batches or t.eval_batches) * fwd_dense
    evals = sets * ev * (fwd_dense + fwd_pruned)  # before and after fine-tune (dense: its train trial measured)
    candidates = len(u.plan.finetune_lrs) * ev * fwd_pruned
    work = replace(arm, dense_steps=0, continued_steps=0).arm_flops_per_token(fwd_dense, fwd_pruned)
    bt = t.batch_size * t.seq_len
    # the split-half stability scores each half of the calibration batches once more (not the arm's compute)
    halves = scoring_flops(u.method, sum(arm.dense.layer_heads), bt, u.prune.calibration_batches * bt,
                           fwd_dense) if get_method(u.method).needs_calibration else 0
    return int(work * bt + curve + evals + candidates + halves)


# ------------------------------------------------------------------------------------------------ rows


def _row(u: Unit, stage: str, model: ModelConfig, params: int, fwd: int, steps: int, est: int, sweep: Sweep,
         heads: list[int] | None, lr, trials=None, arm_flops: int | None = None,
         dense: ModelConfig | None = None) -> PlanRow:
    t = u.train
    tokens = steps * t.batch_size * t.seq_len
    arm_flops = 3 * fwd * tokens if arm_flops is None else arm_flops
    source = "searched" if lr == "searched" else u.lr_source
    return PlanRow(
        name=u.name, stage=stage, arm=u.arm, scale=u.scale, family=u.family, heads=heads,
        heads_total=sum(model.layer_heads), head_dim=model.head_dim,
        attention_width=max(model.layer_heads) * model.head_dim, vocab_size=model.vocab_size, lr=lr,
        lr_source=source, steps=steps, tokens=tokens, params=params, flops_per_token=fwd,
        train_flops=3 * fwd * tokens, est_flops=int(est), ratio=u.ratio, method=None if u.method == "none" else
        u.method, scope=None if u.scope == "none" else u.scope, seed=u.seed,
        resources=trial_resources(sweep, u), trials=trials, budget=u.budget,
        prune_at=u.prune_at if u.stage == "prune" else None,
        finetune_steps=u.finetune_steps if u.prune else u.f_label,
        recovery=u.recovery if u.prune or u.f_label is not None or u.recovery != "lm" else None,
        arm_train_flops=int(arm_flops), memory_bytes=unit_memory(sweep, u, model, dense), axes=_axes(u))


def _axes(u: Unit) -> dict:
    """A unit's values of the registered axes: its own, "*" where it stands for every value, None elsewhere."""
    wild = stands_for(u.arm, u.scope, u.f_label) or frozenset()
    return {a.name: ANY if a.name in wild else None if a.value(u) == a.default else a.value(u)
            for a in registered()}


def plan_rows(sweep_plan: Plan) -> list[PlanRow]:
    """Every unit of a scales sweep's plan (a pretrained sweep has its checkpoint's model: nothing to plan here),
    its model built on meta. Raises HeadroomInputError naming the first unit that cannot be built, or the first
    scale whose trials share a GPU their planned memory does not fit (orchestration/design/packing.py)."""
    sweep = sweep_plan.sweep
    if sweep.pretrained is not None:
        return []
    searched = sweep.lr is not None and sweep.lr.search is not None
    rows: list[PlanRow] = []
    if searched:
        s = sweep.lr.search
        for base in sweep_plan.lr_search:
            model, t = base.model, base.train
            params, fwd = _build(base.name, model, t)
            est = s.trials * _train_cost(sweep, t, fwd, final_eval=False)
            rows.append(_row(base, "lr_search", model, params, fwd, t.steps, est, sweep, list(model.layer_heads),
                             "searched", trials=s.trials))
    for u in sweep_plan.trained:
        model, t = u.model, u.train
        params, fwd = _build(u.name, model, t)
        rows.append(_row(u, "train", model, params, fwd, t.steps, _train_cost(sweep, t, fwd, start=u.branch_step),
                         sweep, list(model.layer_heads), "searched" if searched else t.lr))
    dense_of = {d.key: d for d in sweep_plan.dense}
    for u in sweep_plan.taught:  # trained from scratch by distillation: every step pays a teacher pass
        model, t = u.model, u.train
        params, fwd = _build(u.name, model, t)
        _, fwd_teacher = _build(u.name, dense_of[u.dense_key].model, t)
        teacher = fwd_teacher * t.steps * t.batch_size * t.seq_len
        rows.append(_row(u, "controls", model, params, fwd, t.steps, _train_cost(sweep, t, fwd) + teacher, sweep,
                         list(model.layer_heads), "searched" if searched else t.lr,
                         arm_flops=3 * fwd * t.steps * t.batch_size * t.seq_len + teacher,
                         dense=dense_of[u.dense_key].model))
    for u in sweep_plan.pruned:
        d_model, t = u.model, u.train
        _, fwd_dense = _build(u.name, d_model, t)
        plan = u.plan
        heads, total = kept_counts(list(d_model.layer_heads), plan.ratio, plan.scope)
        pruned = d_model.with_heads(heads if heads is not None else
                                    spread_heads(total, d_model.n_layers, d_model.n_heads))
        params, fwd = _build(u.name, pruned, t)
        arm = unit_arm(u, pruned)  # the plan's account of the arm: its steps at each size, scoring, teacher
        est = _prune_cost(sweep, u, arm, fwd_dense, fwd)
        if arm.continued_steps:  # pruned during training: trained on from p·T to T before the recovery
            est += _train_cost(sweep, t.model_copy(update={"steps": arm.continued_steps}), fwd, final_eval=False)
        steps = arm.recovery_steps + arm.continued_steps
        flops = arm.arm_flops_per_token(fwd_dense, fwd) * t.batch_size * t.seq_len
        row = _row(u, "prune", pruned, params, fwd, steps, est, sweep, heads,
                   plan.finetune_lr if plan.finetune_lr is not None else "val-grid", arm_flops=flops, dense=d_model)
        # the fine-tune's rate: fixed by the sweep, or chosen on val from a grid of multiples of the dense rate
        row.lr_source = "sweep" if plan.finetune_lr is not None else (
            "grid " + ",".join(f"{m:g}" for m in sweep.prune.finetune_lr_grid) + " × dense lr")
        rows.append(row)
        if plan.scope == "global":  # its controls' shape: the kept heads spread over the layers
            shape = spread_heads(total, d_model.n_layers, d_model.n_heads)
            rows += [_control_row(sweep, c, searched, d_model) for c in sweep_plan.controls_of(u, shape)]
    check_packing(sweep, rows)
    return rows


def _control_row(sweep: Sweep, u: Unit, searched: bool, dense: ModelConfig) -> PlanRow:
    """A global prune's control: its heads are the prune's choice, so the row lists their total only. `dense`:
    its dense model, the teacher of a distilled control."""
    model, t = u.model, u.train
    params, fwd = _build(u.name, model, t)
    return _row(u, "controls", model, params, fwd, t.steps, _train_cost(sweep, t, fwd), sweep, None,
                "searched" if searched else t.lr, dense=dense if u.distill is not None else None)


# ------------------------------------------------------------------------------------------------ printing


def _si(x: float) -> str:
    for unit, f in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= f:
            return f"{x / f:.3g}{unit}"
    return f"{x:.3g}"


def format_table(rows: list[PlanRow], vocab_note: str) -> str:
    head = ["stage", "scale", "T", "family", "arm", "method", "ratio", "at", "F", "seed", "heads", "head_dim",
            "width", "lr", "steps", "tokens", "params", "FLOPs/tok", "train FLOPs", "arm FLOPs", "est. FLOPs",
            "memory", "resources"]
    extra = [a.name for a in registered()]  # a column per registered axis, before the seed
    head[head.index("seed"):head.index("seed")] = extra
    table = [head]
    for r in rows:
        heads = (",".join(map(str, r.heads)) if r.heads and len(set(r.heads)) > 1 else
                 str(r.heads[0]) if r.heads else f"{r.heads_total} (global)")
        lr = r.lr if isinstance(r.lr, str) else f"{r.lr:.3g} ({r.lr_source})"
        seed = f"×{r.trials} trials" if r.trials else str(r.seed)
        table.append([r.stage, r.scale, "—" if r.budget is None else str(r.budget), r.family, r.arm,
                      r.method or "—", "—" if r.ratio is None else f"{r.ratio:g}",
                      "—" if r.prune_at is None else f"{r.prune_at:g}", _show_recovery(r),
                      *(_show_axis(a, r.axes.get(a)) for a in extra), seed, heads,
                      str(r.head_dim), str(r.attention_width), lr, str(r.steps), _si(r.tokens), _si(r.params),
                      _si(r.flops_per_token), _si(r.train_flops), _si(r.arm_train_flops), _si(r.est_flops),
                      _si(r.memory_bytes) + "B", _show_resources(r.resources)])
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    by_stage: dict[str, float] = {}
    for r in rows:
        by_stage[r.stage] = by_stage.get(r.stage, 0.0) + r.est_flops
    total = sum(by_stage.values())
    lines.append("")
    lines.append(f"{len(rows)} unit(s); estimated {_si(total)}FLOP in all ("
                 + ", ".join(f"{k} {_si(v)}" for k, v in by_stage.items()) + "); vocabulary " + vocab_note)
    lines.append("Estimates count training (3 × forward), evaluation, scoring and fine-tuning; a whole-split "
                 "evaluation is counted at its cap. Global-scope rows show the total kept heads: the scores choose "
                 "each layer's. F: the recovery budget (kd: by distillation, each step with the dense teacher's "
                 "forward pass, a third of a dense training step). Arm FLOPs: a prune row's whole pruned arm "
                 "(dense training + scoring + recovery), a trained row's own training; Scratch-B and Scratch-KD "
                 "match their pruned arm's. Memory: the planned peak of one worker of the unit's trial (weights, "
                 "gradients, AdamW moments, activations at its batch and precision, the loss's logits).")
    lines.append(cluster_note(rows))
    return "\n".join(lines)


def _show_axis(name: str, v) -> str:
    return "—" if v is None else "all" if v == ANY else BY_NAME[name].to_tag(v)


def _show_recovery(r: PlanRow) -> str:
    if r.finetune_steps is None and r.recovery is None:
        return "—"
    f = "all" if r.finetune_steps is None else str(r.finetune_steps)
    return f + (" kd" if r.recovery == "distill" else "")


def _show_resources(r: dict) -> str:
    one = f"{r['cpu']:g} CPU" + (f" {r['gpu']:g} GPU" if r["gpu"] else "")
    return one if r["workers"] == 1 else f"{r['workers']}×({one})"


def cluster_needs(rows: list[PlanRow]) -> dict[str, dict]:
    """Per stage: {"trials", "cpu", "gpu"}: what running all of its trials at once holds (lr_search: the
    largest search's candidates; the searches run one after another). A cluster of that size runs the stage in
    one wave; a smaller one queues its trials."""
    out: dict[str, dict] = {}
    for r in rows:
        n = r.trials or 1
        w = r.resources["workers"]
        need = {"trials": n, "cpu": n * w * r.resources["cpu"], "gpu": n * w * r.resources["gpu"]}
        s = out.setdefault(r.stage, {"trials": 0, "cpu": 0.0, "gpu": 0.0})
        if r.stage == "lr_search":  # one search at a time: the largest one's candidates
            if (need["gpu"], need["cpu"]) > (s["gpu"], s["cpu"]):
                out[r.stage] = need
            continue
        for k in s:
            s[k] += need[k]
    return out


def cluster_note(rows: list[PlanRow]) -> str:
    needs = cluster_needs(rows)
    if not needs:
        return ""
    parts = [f"{stage} {v['trials']} trial(s): {v['cpu']:g} CPU" + (f", {v['gpu']:g} GPU" if v["gpu"] else "")
             for stage, v in needs.items()]
    widest = max(needs.values(), key=lambda v: (v["gpu"], v["cpu"]))
    gpus = f" and {widest['gpu']:g} GPUs" if widest["gpu"] else ""
    return ("Resources to run each stage's trials all at once (lr_search: its largest search) — " + "; ".join(parts)
            + f". A cluster of {widest['cpu']:g} CPUs{gpus} runs the widest stage in one wave; a smaller one "
            "queues its trials, and any cluster with at least one trial's resources finishes the sweep.")


# nominal peaks the absurd-compute note divides by: a CPU core's fp32 vector peak (2 FMA units × 16 lanes × 2 FLOPs
# × ~3 GHz) and a datacenter GPU's dense bf16 peak (H100: about 1e15)
CPU_PEAK, GPU_PEAK = 2e11, 1e15
ABSURD_S = 365 * 86400  # a year


def compute_note(rows: list[PlanRow]) -> str:
    """A line for the plan's summary when the sweep's estimated compute is absurd for the resources it declares:
    more than a year at the nominal peak of the widest stage's CPUs and GPUs (every trial of a stage at once);
    empty otherwise. A note, not a refusal: a long sweep may be meant."""
    needs = cluster_needs(rows)
    if not needs:
        return ""
    widest = max(needs.values(), key=lambda v: (v["gpu"], v["cpu"]))
    rate = widest["cpu"] * CPU_PEAK + widest["gpu"] * GPU_PEAK
    total = sum(r.est_flops * (r.trials or 1) for r in rows)
    seconds = total / rate
    if seconds <= ABSURD_S:
        return ""
    return (f"Note: the estimated {_si(total)}FLOP would take about {seconds / ABSURD_S:.3g} years on "
            f"{widest['cpu']:g} CPUs" + (f" and {widest['gpu']:g} GPUs" if widest["gpu"] else "")
            + f" at their nominal peak ({_si(CPU_PEAK)}FLOP/s per CPU, {_si(GPU_PEAK)}FLOP/s per GPU): check the "
            "step counts and the resources before running it.")
