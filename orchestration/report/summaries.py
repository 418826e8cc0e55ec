"""What the report says beside the verdict: cost and compute share, the probes, every arm's learning rate, how the
eval sets were measured."""

from __future__ import annotations

from collections import defaultdict

from lightning_modules.declarations import names as M
from lightning_modules.declarations.names import WORK_KINDS

from .analysis import by_scale, is_primary, mean
from .read import Run, SweepRuns
from .rows import Cost, EvalInfo, LearningRate, ProbeSlack, Redundancy
from .stats import paired, t_interval, verdict_of


def costs(runs: list[Run]) -> list[Cost]:
    """CPU/GPU-hours per (scale, arm), and the share of trial seconds spent in training, evaluation and scoring
    steps (cost/train_s + eval_s + score_s over cost/wall_s): the rest is framework setup, data preparation,
    checkpoints and Tune's bookkeeping."""
    by = defaultdict(lambda: {"runs": 0, "cpu_h": 0.0, "gpu_h": 0.0, "work_s": 0.0, "wall_s": 0.0})
    for r in runs:
        row = by[(r.scale, r.arm)]
        row["runs"] += 1
        row["cpu_h"] += r.metrics.get(M.cost("cpu_s"), 0.0) / 3600
        row["gpu_h"] += r.metrics.get(M.cost("gpu_s"), 0.0) / 3600
        row["work_s"] += sum(r.metrics.get(M.cost(k), 0.0) for k in WORK_KINDS)
        row["wall_s"] += r.metrics.get(M.cost("wall_s"), 0.0)
    return [Cost(s, a, v["runs"], v["cpu_h"], v["gpu_h"], v["work_s"], v["wall_s"],
                 v["work_s"] / v["wall_s"] if v["wall_s"] else None) for (s, a), v in by_scale(by)]


def probes(data: SweepRuns) -> dict:
    """(scale, family) -> {probe metric: {step: [values over seeds]}} from the dense runs' probe histories."""
    out = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r in data.runs:
        for metric, hist in data.histories.get(r.run_id, {}).items():
            if metric.startswith(M.PROBE):
                for step, v in hist:
                    out[(r.scale, r.family)][metric][int(step)].append(v)
    return dict(by_scale(out))


def series(by_step: dict) -> list:
    """{step: [values over seeds]} -> [(step, mean, 95% interval or None)] for the plots."""
    return [(step, mean(v), t_interval(v)) for step, v in sorted(by_step.items())]


def redundancy_change(probe_series: dict) -> tuple[list[float], list[float]] | None:
    """Paired (init, final) mean CKA over seeds, from a probe series {step: [values per seed]}."""
    if not probe_series or 0 not in probe_series:
        return None
    last = max(probe_series)
    if last == 0 or len(probe_series[0]) != len(probe_series[last]):
        return None
    return probe_series[0], probe_series[last]


def probe_slack(probe_series: dict) -> list[ProbeSlack]:
    """Per (scale, family) with a prunable-fraction probe: its mean at init, its lowest after init, at the end."""
    out = []
    for (scale, family), by_metric in probe_series.items():
        pf = by_metric.get(M.PROBE_PRUNABLE, {})
        if pf:
            steps = sorted(pf)
            means = {s: mean(pf[s]) for s in steps}
            later = [s for s in steps if s > 0]
            low = min(later, key=lambda s: means[s]) if later else steps[0]
            out.append(ProbeSlack(scale, family, means[steps[0]], means[low], low, means[steps[-1]], steps[-1],
                                  bool(later) and means[steps[-1]] > means[low]))
    return out


def redundancy(probe_series: dict) -> list[Redundancy]:
    """Per (scale, family) with a redundancy probe at init and at the end: the paired change over seeds."""
    out = []
    for (scale, family), by_metric in probe_series.items():
        got = redundancy_change(by_metric.get(M.PROBE_REDUNDANCY, {}))
        if got is None:
            continue
        init, final = got
        res = paired([a - b for a, b in zip(init, final)])
        out.append(Redundancy(scale, family, len(init), mean(init), t_interval(init), mean(final), t_interval(final),
                              res.mean, res.ci95, verdict_of(res.ci95)))
    return out


def heatmap_runs(runs: list[Run]) -> list[Run]:
    """The prune run whose head scores the report draws, one per (scale, family, method): the primary scope and
    schedule first, then the lowest seed and ratio (heads of different seeds are not aligned: never averaged)."""
    pick = {}
    for r in runs:
        if r.arm != "pruned" or r.prune_at != 1.0:
            continue
        k = (r.scale, r.family, r.method)
        rank = (not is_primary(r, "scope"), not is_primary(r, "schedule"), r.seed, r.ratio or 0)
        if k not in pick or rank < pick[k][0]:
            pick[k] = (rank, r)
    return [r for _, (_, r) in sorted(pick.items())]


def learning_rates(runs: list[Run]) -> list[LearningRate]:
    """Every arm's learning rate and where it came from (preset, the sweep, searched for its architecture), and
    the recovery fine-tune's (the sweep's, or chosen on val from a grid)."""
    by = defaultdict(lambda: {"lrs": set(), "sources": set(), "ft": set(), "ft_source": set(), "runs": 0})
    for r in runs:
        arch = f"{r.tag('heads')}x{r.params.get('head_dim', '?')}"
        row = by[(r.scale, r.family, r.arm, r.ratio, r.scope, arch)]
        row["runs"] += 1
        if "lr" in r.params:
            row["lrs"].add(float(r.params["lr"]))
        row["sources"].add(r.params.get("lr_source", "unrecorded"))
        if r.arm == "pruned" and M.FINETUNE_LR in r.metrics:
            row["ft"].add(r.metrics[M.FINETUNE_LR])
            row["ft_source"].add("sweep" if r.params.get("finetune_lr", "val-grid") != "val-grid"
                                 else f"val-grid {r.params.get('finetune_lr_grid', '')}")
    return [LearningRate(scale, family, arm, ratio, scope, arch, v["runs"], sorted(v["lrs"]), sorted(v["sources"]),
                         sorted(v["ft"]), sorted(v["ft_source"]))
            for (scale, family, arm, ratio, scope, arch), v in by_scale(by)]


def evaluation_info(runs: list[Run]) -> list[EvalInfo]:
    """Per (scale, family, eval set): tokens each run is scored on and the windows left out as duplicates of
    training text."""
    by = {}
    for r in runs:
        if r.arm != "dense":
            continue
        for k, v in r.metrics.items():
            parts = k.split("/")
            if len(parts) == 3 and parts[0] == "final" and parts[2] == "tokens":
                by[(r.scale, r.family, parts[1])] = EvalInfo(
                    r.scale, r.family, parts[1], int(v), int(r.metrics.get(M.windows_excluded(parts[1]), 0)))
    return [v for _, v in by_scale(by)]
