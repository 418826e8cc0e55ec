"""What `headroom sweep` prints when its stages are done, before the verdict: mean final losses per arm, wall
time per stage, the median trial's seconds per stage and the median compute share of a trial. Read from the
sweep's MLflow runs (as the driver's tracker holds them)."""

from __future__ import annotations

import statistics

from lightning_modules.declarations import names as M
from lightning_modules.declarations.names import WORK_KINDS
from orchestration.design.axes import BY_NAME, read_tags, registered
from orchestration.design.unit import Cell, scale_rank

WALL = M.cost("wall_s")  # a trial's seconds, as its tracker logged them


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile), linear interpolation between order statistics (numpy's default
    percentile; benchmarks/measure.py uses these too)."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def has_timing(metrics: dict) -> bool:
    """Whether a run recorded where its trial's seconds went (lr candidates ASHA stopped early did not)."""
    return M.cost("train_s") in metrics and bool(metrics.get(WALL))


def compute_share(metrics: list[dict]) -> dict | None:
    """Of each trial's seconds (cost/wall_s), the share spent in training, evaluation and scoring steps: the
    median over trials and its interquartile range (one slow trial, or a busy moment of the machine, moves the
    median little), the medians by kind, and the pooled share (all work seconds ÷ all trial seconds); None when no
    run recorded them. "shares" lists each timed run's share, in the order given. The rest is framework setup, data preparation, checkpoints and Tune's bookkeeping."""
    timed = [m for m in metrics if has_timing(m)]
    if not timed:
        return None
    shares = [sum(m.get(M.cost(k), 0.0) for k in WORK_KINDS) / m[WALL] for m in timed]
    q1, med, q3 = quartiles(shares)
    wall = sum(m[WALL] for m in timed)
    by = {k: statistics.median(m.get(M.cost(k), 0.0) / m[WALL] for m in timed) for k in WORK_KINDS}
    pooled = sum(sum(m.get(M.cost(k), 0.0) for k in WORK_KINDS) for m in timed) / wall
    return {"share": med, "iqr": [q1, q3], **by, "pooled": pooled, "trial_s": wall, "trials": len(timed),
            "shares": shares}


def trial_seconds(runs: list) -> dict[str, dict]:
    """Per stage: {"median", "iqr", "trials"} of its trials' seconds (cost/wall_s)."""
    by: dict[str, list[float]] = {}
    for r in runs:
        if r.data.metrics.get(WALL):
            by.setdefault(r.data.tags.get("headroom.stage", "?"), []).append(r.data.metrics[WALL])
    out = {}
    for stage, v in by.items():
        q1, med, q3 = quartiles(v)
        out[stage] = {"median": med, "iqr": [q1, q3], "trials": len(v)}
    return out


def loss_table(sweep_name: str, runs: list) -> str:
    """Mean final loss over seeds, per (scale, family, ratio) and arm, on `id` (else val); "" with no rows."""
    rows: dict[tuple, dict[str, list[float]]] = {}
    tags = [(run, read_tags(run.data.tags)) for run in runs]
    ratio_text = BY_NAME["ratio"].to_tag
    pruned_ratios = sorted({ratio_text(v["ratio"]) for _, v in tags if v["arm"] == "pruned"})
    several_f = len({v["finetune_steps"] for _, v in tags if v["arm"] == "pruned"}) > 1
    for run, v in tags:
        if v["stage"] == "lr_search" or run.info.status != "FINISHED":
            continue
        m = run.data.metrics
        split = "id" if M.loss(M.FINAL, "id") in m else "val"
        loss = m.get(M.loss(M.FINAL, split))
        if loss is None:
            continue
        arm = v["arm"]
        if arm == "pruned":
            arm = f"pruned:{v['method']}" + ("" if v["scope"] == "per_layer" else "/global")
            if v["prune_at"] != 1.0:
                arm += f"@{v['prune_at']:g}"  # pruned at that fraction of training
        elif v["scope"] == "global":
            arm = f"{arm}:{v['method']}/global"
        if v["finetune_steps"] is not None and (several_f or not arm.startswith("pruned")):
            arm += f" F{v['finetune_steps']}"  # the recovery budget, when the sweep has several
        if v["recovery"] == "distill":
            arm += " kd"
        for a in registered():  # an axis registered beyond the built-in ones: its value, as it labels it
            if v[a.name] != a.default:
                arm += " " + a.label_of(v[a.name])
        for r in [ratio_text(v["ratio"])] if v["ratio"] is not None else pruned_ratios:  # a dense run: every ratio
            rows.setdefault((Cell(v["scale"], v["budget"]), v["family"], r, split), {}).setdefault(
                arm, []).append(loss)
    if not rows:
        return ""
    arms = sorted({a for v in rows.values() for a in v}, key=lambda a: (a != "dense", not a.startswith("pruned"), a))
    head = ["scale", "family", "ratio", "set"] + arms
    table = [head]
    for (scale, family, ratio, split), v in sorted(rows.items(), key=lambda kv: (scale_rank(kv[0][0]), kv[0][1:])):
        table.append([scale, family, str(ratio), split] + [
            f"{statistics.fmean(v[a]):.4f} (n={len(v[a])})" if a in v else "—" for a in arms])
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    lines = [f"\nsweep {sweep_name}: mean final loss (nats/token) over seeds, lower is better"]
    for i, r in enumerate(table):
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def timing(wall: float, stage_seconds: dict[str, float], runs: list) -> str:
    """Wall time per stage, the median trial's seconds per stage, and how much of a trial's time was the work
    itself (train/eval/score steps): medians over trials with their interquartile ranges."""
    lines = []
    if stage_seconds:
        lines.append(f"\nwall time {wall:.0f} s: " + ", ".join(f"{k} {v:.0f} s" for k, v in stage_seconds.items())
                     + f", other {wall - sum(stage_seconds.values()):.0f} s (plan, data, Ray start, MLflow)")
    finished = [r for r in runs if r.info.status == "FINISHED"]
    per_stage = trial_seconds(finished)
    if per_stage:
        lines.append("trial seconds, median (IQR) over trials: " + ", ".join(
            f"{k} {v['median']:.1f} s ({v['iqr'][0]:.1f}–{v['iqr'][1]:.1f}; {v['trials']} trials)"
            for k, v in per_stage.items()))
    share = compute_share([r.data.metrics for r in finished])
    if share is not None:
        lines.append(f"compute share: median {share['share']:.0%} of a trial (IQR {share['iqr'][0]:.0%}–"
                     f"{share['iqr'][1]:.0%}, {share['trials']} trials) in training, evaluation and scoring steps "
                     f"(medians: train {share['train_s']:.0%}, eval {share['eval_s']:.0%}, score "
                     f"{share['score_s']:.0%}); pooled {share['pooled']:.0%} of {share['trial_s']:.0f} trial-seconds; "
                     "the rest is setup, data, checkpoints (lr candidates stopped early by ASHA report no timings)")
    return "\n".join(lines)
