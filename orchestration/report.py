"""`headroom report`: a sweep's MLflow runs → the verdict of DESIGN.md, with statistics a reviewer can check.

Reads the newest parent run of the sweep's experiment (an edited sweep file makes a new parent; the old one is not
mixed in) and its finished children, by the tag contract, and writes `reports/<sweep>/`:

    verdict.json    the schema of DESIGN.md; rows of `prunable` and `prune_curves` also name the family, scope,
                    schedule and number of seeds (a sweep may hold two families and two scopes)
    report.md       the report, plots beside it in plots/
    report.html     the same, self-contained (plots embedded)

and logs all of it as artifacts of the parent run (`report/`), with the headline numbers as parent metrics.

Statistics (orchestration/stats.py). Arms are paired by seed and evaluated on the same windows. For a comparison,
d_s = control loss − pruned loss of seed s (positive: pruning wins); the mean of d and a 95% Student-t interval on
n − 1 degrees of freedom whose standard error adds, to the spread over seeds, the sampling variance of the eval
windows (from the per-window losses each run records). `supported` when the interval lies above 0, `refuted` when
below, `inconclusive` otherwise, `insufficient_seeds` with fewer than two seeds (no interval is invented). A
scale's primary comparisons (ratios × controls) are one family: their p-values are Holm-adjusted, and the primary
verdicts are the adjusted ones (the raw ones are kept beside them). Half (1) is a mean comparison against the
declared tolerance (no interval): the tolerance is the stated effect size. Trust diagnostics
(orchestration/diagnostics.py) can turn a scale's headline into "untrustworthy".
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
import statistics
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from lightning_modules.config import (
    DEFAULT_TOLERANCE,
    HeadroomInputError,
    jsonable,
    prunable_fraction,
    within_tolerance,
)

from .diagnostics import Diagnostic, diagnose, untrustworthy
from .plan import WINDOWS_FILE, WORK_KINDS, expected_names
from .runstore import search_runs
from .spec import Sweep, TrustSpec
from .stats import ALPHA, holm, paired, t_interval, verdict_of

PRIMARY = {"method": "gradient", "scope": "per_layer", "schedule": "one_shot", "eval_set": "id"}
CONTROL_ARMS = ("scratch_e", "scratch_b", "wide")
CONTROL_NAMES = {"scratch_e": "Scratch-E", "scratch_b": "Scratch-B", "wide": "wide"}
VERDICTS = ("supported", "refuted", "inconclusive", "insufficient_seeds")
PROBE_METRICS = ("probe/prunable_fraction", "probe/importance_spread", "probe/redundancy")


# ------------------------------------------------------------------------------------------------ statistics


def paired_verdict(diffs: list[float]) -> tuple[float, tuple[float, float] | None, str]:
    """(mean of d, its 95% t-interval over seeds or None, verdict) for paired differences d."""
    res = paired(diffs)
    return res.mean, res.ci95, verdict_of(res.ci95)


# ------------------------------------------------------------------------------------------------ reading


@dataclass
class Run:
    """A finished child run: the headroom.* tags it is grouped by, its metrics (latest values) and params."""

    run_id: str
    name: str
    status: str
    tags: dict
    metrics: dict
    params: dict
    arm: str = field(init=False)
    scale: str = field(init=False)
    family: str = field(init=False)
    method: str = field(init=False)
    scope: str = field(init=False)
    schedule: str = field(init=False)
    seed: int = field(init=False)
    ratio: float | None = field(init=False)

    def tag(self, name: str) -> str:
        return self.tags.get(f"headroom.{name}", "none")

    def __post_init__(self):
        for t in ("arm", "scale", "family", "method", "scope", "schedule"):
            setattr(self, t, self.tag(t))
        self.seed = int(self.tag("seed"))
        self.ratio = None if self.tag("ratio") == "none" else float(self.tag("ratio"))


@dataclass
class SweepRuns:
    uri: str
    sweep: str
    spec_hash: str
    parent_id: str
    spec: Sweep | None
    runs: list[Run]  # finished children (lr_search aside)
    missing: list[str]  # planned units without a finished run
    histories: dict = field(default_factory=dict)  # run id -> {metric: [(step, value)]} (probes)


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        raise HeadroomInputError(f"no MLflow store at {uri[len('sqlite:///'):]} (pass --tracking-uri)")
    return MlflowClient(tracking_uri=uri)


def load_sweep_runs(uri: str, sweep_name: str) -> SweepRuns:
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    client = _client(uri)
    exp = client.get_experiment_by_name(sweep_name)
    if exp is None:
        raise HeadroomInputError(f"no sweep {sweep_name!r} in the MLflow store at {uri}")
    parents = search_runs(client, exp.experiment_id, "tags.`headroom.role` = 'parent'",
                          order_by=["attributes.start_time DESC"], limit=1)
    if not parents:
        raise HeadroomInputError(f"sweep {sweep_name!r}: its experiment holds no parent run")
    parent = parents[0]
    spec = None
    try:
        import mlflow.artifacts

        with tempfile.TemporaryDirectory() as tmp:
            p = mlflow.artifacts.download_artifacts(run_id=parent.info.run_id, artifact_path="sweep/resolved.json",
                                                    dst_path=tmp, tracking_uri=uri)
            spec = Sweep.model_validate(json.loads(Path(p).read_text()))
    except Exception:  # noqa: BLE001 - a store without the spec artifact still reports what it has
        spec = None
    children = search_runs(client, exp.experiment_id, f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    runs = [Run(r.info.run_id, r.info.run_name, r.info.status, dict(r.data.tags), dict(r.data.metrics),
                dict(r.data.params)) for r in children]
    done = [r for r in runs if r.status == "FINISHED" and r.tags.get("headroom.stage") != "lr_search"]
    names = {r.name for r in done}
    if spec is not None:
        missing = [n for n in expected_names(spec) if n not in names]
    else:
        missing = sorted(r.name for r in runs if r.status != "FINISHED" and r.tags.get("headroom.stage") != "lr_search")
    out = SweepRuns(uri, sweep_name, parent.data.tags.get("headroom.spec_hash", ""), parent.info.run_id, spec, done, missing)
    for r in done:
        if r.arm == "dense":  # probes and the training-loss curve (the `converged` diagnostic)
            keys = [k for k in r.metrics if k.startswith("probe/")] + ["train/loss"]
            out.histories[r.run_id] = {k: sorted((m.step, m.value) for m in client.get_metric_history(r.run_id, k))
                                       for k in keys}
    return out


class Windows:
    """Per-window losses of runs (their `eval_windows.json` artifact), downloaded once per run when a comparison
    asks for them. Runs without the artifact (or a store that cannot serve it) give None: their comparisons fall
    back to the spread over seeds alone, and say so."""

    def __init__(self, uri: str | None):
        self.uri, self._cache = uri, {}

    def get(self, run: Run, stage: str, split: str) -> dict | None:
        if self.uri is None:
            return None
        if run.run_id not in self._cache:
            self._cache[run.run_id] = self._download(run.run_id)
        return (self._cache[run.run_id] or {}).get(stage, {}).get(split)

    def _download(self, run_id: str) -> dict | None:
        import mlflow.artifacts

        try:
            with tempfile.TemporaryDirectory() as tmp:
                p = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=WINDOWS_FILE, dst_path=tmp,
                                                        tracking_uri=self.uri)
                return json.loads(Path(p).read_text())
        except Exception:  # noqa: BLE001 - no artifact: the seed-only interval, labelled as such
            return None


# ------------------------------------------------------------------------------------------------ analysis


def _heads(text: str | None):
    if not text or text == "none":
        return None
    v = [int(x) for x in text.split(",")]
    return v[0] if len(set(v)) == 1 else v


def eval_sets(runs: list[Run]) -> list[str]:
    sets = {k.split("/")[1] for r in runs for k in r.metrics if k.startswith("final/") and k.endswith("/loss")}
    sets.discard("val")
    return sorted(sets, key=lambda s: (s != "id", s))


def _mean(xs):
    return statistics.fmean(xs) if xs else float("nan")


def _control_runs(runs: list[Run]) -> dict:
    idx = defaultdict(dict)
    for r in runs:
        if r.arm in CONTROL_ARMS:
            idx[(r.arm, r.scale, r.family, r.ratio, r.method, r.scope, r.schedule)][r.seed] = r
    return idx


def _pruned_groups(runs: list[Run]) -> dict:
    groups = defaultdict(dict)
    for r in runs:
        if r.arm == "pruned":
            groups[(r.scale, r.family, r.ratio, r.method, r.scope, r.schedule)][r.seed] = r
    return groups


def _scale_rank(scale: str) -> int:
    """Scales in the order of the presets (xs, s, m, ...; a pretrained checkpoint last)."""
    from lightning_modules.config import SCALES

    names = list(SCALES)
    return names.index(scale) if scale in names else len(names)


def _sorted(groups: dict) -> list:
    """Items of a dict keyed by (scale, ...) tuples, scales in preset order."""
    return sorted(groups.items(), key=lambda kv: (_scale_rank(kv[0][0]), kv[0]))


def _finetune_steps(r: Run) -> int:
    return int(r.params.get("finetune_steps", 0))


def _window_diffs(pw: list[dict | None], cw: list[dict | None]) -> tuple[list[list[float]], list[float]] | None:
    """(seeds × windows summed-loss differences control − pruned, tokens per window), or None unless every seed
    of both arms recorded the same windows."""
    if any(x is None for x in pw + cw):
        return None
    tokens = pw[0]["tokens"]
    if any(x["tokens"] != tokens for x in pw + cw):
        return None
    return [[c - p for c, p in zip(c_["loss"], p_["loss"])] for p_, c_ in zip(pw, cw)], tokens


def comparisons(runs: list[Run], windows: Windows | None = None) -> list[dict]:
    """Every pruned group against every control of its head count, paired by seed, on every eval set, before
    (finetune_steps 0) and after recovery fine-tune; then Holm's adjustment over each (scale, family)'s primary
    comparisons, whose verdicts become the adjusted ones."""
    windows = windows or Windows(None)
    controls = _control_runs(runs)
    sets = eval_sets(runs)
    out = []
    for (scale, family, ratio, method, scope, schedule), by_seed in _sorted(_pruned_groups(runs)):
        first = by_seed[min(by_seed)]
        ft = _finetune_steps(first)
        for arm in CONTROL_ARMS:
            if scope == "per_layer" or arm == "wide":  # wide: the uniform "fewer heads" config of this ratio
                ctrl = controls.get((arm, scale, family, ratio, "none", "per_layer", "none"), {})
            else:  # global scope: the controls copying this prune's per-layer head counts
                ctrl = controls.get((arm, scale, family, ratio, method, scope, schedule), {})
            seeds = sorted(set(by_seed) & set(ctrl))
            if not seeds:
                continue
            for ev in sets:
                stages = [("final", ft)] if ft == 0 else [("pre_ft", 0), ("final", ft)]
                for stage, steps in stages:
                    key = f"{stage}/{ev}/loss"
                    paired_seeds = [s for s in seeds if key in by_seed[s].metrics
                                    and f"final/{ev}/loss" in ctrl[s].metrics and f"dense/{ev}/loss" in by_seed[s].metrics]
                    if not paired_seeds:
                        continue
                    pruned = [by_seed[s].metrics[key] for s in paired_seeds]
                    control = [ctrl[s].metrics[f"final/{ev}/loss"] for s in paired_seeds]
                    dense = [by_seed[s].metrics[f"dense/{ev}/loss"] for s in paired_seeds]
                    wd = _window_diffs([windows.get(by_seed[s], stage, ev) for s in paired_seeds],
                                       [windows.get(ctrl[s], "final", ev) for s in paired_seeds])
                    res = paired([c - p for c, p in zip(control, pruned)], *(wd or (None, None)))
                    primary = (method == PRIMARY["method"] and scope == PRIMARY["scope"]
                               and schedule == PRIMARY["schedule"] and ev == PRIMARY["eval_set"] and steps == ft)
                    verdict = verdict_of(res.ci95)
                    tokens = by_seed[paired_seeds[0]].metrics.get(f"{stage}/{ev}/tokens")
                    out.append({
                        "scale": scale, "family": family, "ratio": ratio, "heads_dense": _heads(first.tag("heads")),
                        "heads_kept": _heads(first.tag("kept")), "method": method, "scope": scope,
                        "schedule": schedule, "finetune_steps": steps, "control": arm, "eval_set": ev,
                        "primary": primary, "n_seeds": len(paired_seeds), "dense_loss": _mean(dense),
                        "pruned_loss": _mean(pruned), "control_loss": _mean(control), "diff_mean": res.mean,
                        "ci95": list(res.ci95) if res.ci95 else None, "verdict": verdict,
                        "p_value": res.p, "p_holm": None, "ci95_holm": None, "verdict_raw": verdict,
                        "eval_tokens": int(tokens) if tokens is not None else None,
                        "window_share": res.window_share,
                    })
    _holm_adjust(out)
    return out


def _holm_adjust(rows: list[dict]) -> None:
    """Per (scale, family), the primary comparisons (ratios × controls) are one family of tests."""
    fams = defaultdict(list)
    for r in rows:
        if r["primary"]:
            fams[(r["scale"], r["family"])].append(r)
    for fam in fams.values():
        adjusted = holm([r["p_value"] for r in fam], ALPHA)
        for r, h in zip(fam, adjusted):
            if h is None:
                continue
            r["p_holm"] = h.p_adjusted
            ci = _interval_at(r, h.level)
            r["ci95_holm"] = list(ci) if ci else None
            r["verdict"] = verdict_of(ci) if h.rejected else "inconclusive"


def _interval_at(row: dict, level: float) -> tuple[float, float] | None:
    """The row's interval at another confidence level (same standard error and degrees of freedom)."""
    from scipy import stats

    if row["ci95"] is None:
        return None
    n = row["n_seeds"]
    q95 = float(stats.t.ppf(0.975, n - 1))
    se = (row["ci95"][1] - row["ci95"][0]) / (2 * q95)
    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * se
    return (row["diff_mean"] - half, row["diff_mean"] + half)


def prunable(runs: list[Run], tolerance: float) -> list[dict]:
    """Half (1): per (scale, family, method, ratio, scope, schedule, eval set), mean pruned loss before fine-tune
    within tolerance of the same dense models' mean loss."""
    out = []
    sets = eval_sets(runs)
    for (scale, family, ratio, method, scope, schedule), by_seed in _sorted(_pruned_groups(runs)):
        for ev in sets:
            rs = [r for r in by_seed.values() if f"pre_ft/{ev}/loss" in r.metrics and f"dense/{ev}/loss" in r.metrics]
            if not rs:
                continue
            dense = _mean([r.metrics[f"dense/{ev}/loss"] for r in rs])
            pruned = _mean([r.metrics[f"pre_ft/{ev}/loss"] for r in rs])
            out.append({"scale": scale, "family": family, "method": method, "eval_set": ev, "tolerance": tolerance,
                        "ratio": ratio, "scope": scope, "schedule": schedule, "n_seeds": len(rs),
                        "dense_loss": dense, "pruned_loss": pruned,
                        "verdict": "prunable" if within_tolerance(pruned, dense, tolerance) else "not_prunable"})
    return out


def _curve(r: Run, ev: str) -> dict[float, float]:
    pre = f"curve/{ev}/r"
    return {float(k[len(pre):]): v for k, v in r.metrics.items() if k.startswith(pre)}


def prune_curves(runs: list[Run]) -> list[dict]:
    """Loss vs ratio per (scale, family, method, scope, schedule, eval set): the mask-only curve (finetune_steps
    0; one curve per dense model, the ranking does not depend on the ratio swept) and the swept ratios after
    recovery fine-tune. Mean and t-interval over seeds."""
    out = []
    sets = eval_sets(runs)
    per = defaultdict(lambda: defaultdict(dict))  # (scale, family, method, scope, schedule) -> seed -> ratio -> run
    for (scale, family, ratio, method, scope, schedule), by_seed in _pruned_groups(runs).items():
        for seed, r in by_seed.items():
            per[(scale, family, method, scope, schedule)][seed][ratio] = r
    for (scale, family, method, scope, schedule), seeds in _sorted(per):
        for ev in sets:
            curves = [_curve(by_ratio[min(by_ratio)], ev) for by_ratio in seeds.values()]
            curves = [c for c in curves if c]
            for ratio in sorted({x for c in curves for x in c}):
                vals = [c[ratio] for c in curves if ratio in c]
                ci = t_interval(vals)
                out.append({"scale": scale, "family": family, "method": method, "eval_set": ev, "ratio": ratio,
                            "finetune_steps": 0, "loss_mean": _mean(vals), "loss_ci95": list(ci) if ci else None,
                            "scope": scope, "schedule": schedule, "n_seeds": len(vals)})
            ft = {}
            for by_ratio in seeds.values():
                for ratio, r in by_ratio.items():
                    if f"final/{ev}/loss" in r.metrics and _finetune_steps(r) > 0:
                        ft.setdefault((ratio, _finetune_steps(r)), []).append(r.metrics[f"final/{ev}/loss"])
            for (ratio, steps), vals in sorted(ft.items()):
                ci = t_interval(vals)
                out.append({"scale": scale, "family": family, "method": method, "eval_set": ev, "ratio": ratio,
                            "finetune_steps": steps, "loss_mean": _mean(vals), "loss_ci95": list(ci) if ci else None,
                            "scope": scope, "schedule": schedule, "n_seeds": len(vals)})
    return out


def prunable_fractions(curves: list[dict], tolerance: float) -> dict:
    """(scale, family, method, scope, schedule, eval set) -> largest ratio of the mean mask-only curve within
    tolerance of dense (the curve's ratio 0)."""
    by = defaultdict(list)
    for c in curves:
        if c["finetune_steps"] == 0:
            by[(c["scale"], c["family"], c["method"], c["scope"], c["schedule"], c["eval_set"])].append(c)
    out = {}
    for k, rows in by.items():
        rows.sort(key=lambda c: c["ratio"])
        if rows[0]["ratio"] != 0:
            continue
        out[k] = prunable_fraction([c["ratio"] for c in rows], [c["loss_mean"] for c in rows],
                                   rows[0]["loss_mean"], tolerance)
    return out


def best_methods(runs: list[Run]) -> dict:
    """(scale, family, ratio, scope, schedule) -> (method, mean val loss after fine-tune): the best method is
    chosen on the validation set, never on an eval set."""
    by = defaultdict(dict)
    for (scale, family, ratio, method, scope, schedule), by_seed in _pruned_groups(runs).items():
        vals = [r.metrics["final/val/loss"] for r in by_seed.values() if "final/val/loss" in r.metrics]
        if vals:
            by[(scale, family, ratio, scope, schedule)][method] = _mean(vals)
    return {k: min(v.items(), key=lambda kv: kv[1]) for k, v in by.items()}


def _scale_params(runs: list[Run]) -> dict:
    """(scale, family) -> dense parameter count."""
    out = {}
    for r in runs:
        if r.arm == "pruned" and "params_dense" in r.metrics:
            out[(r.scale, r.family)] = r.metrics["params_dense"]
        elif r.arm == "dense" and "params" in r.metrics:
            out.setdefault((r.scale, r.family), r.metrics["params"])
    return out


def across_scales(comps: list[dict], params: dict) -> list[dict]:
    """Per (family, ratio, control): the primary gap (diff_mean) against log10(dense parameters), with the fitted
    slope (per decade of parameters) and, from three scales on, its 95% interval."""
    from scipy import stats

    by = defaultdict(list)
    for c in comps:
        if c["primary"] and (c["scale"], c["family"]) in params:
            by[(c["family"], c["ratio"], c["control"])].append(c)
    out = []
    for (family, ratio, control), rows in sorted(by.items()):
        rows.sort(key=lambda c: params[(c["scale"], family)])
        x = [math.log10(params[(c["scale"], family)]) for c in rows]
        y = [c["diff_mean"] for c in rows]
        fit = {"slope": None, "slope_ci95": None}
        if len(rows) >= 2 and len(set(x)) == len(x):
            lr = stats.linregress(x, y)
            fit["slope"] = float(lr.slope)
            if len(rows) >= 3:
                half = float(stats.t.ppf(0.975, len(rows) - 2)) * float(lr.stderr)
                fit["slope_ci95"] = [fit["slope"] - half, fit["slope"] + half]
        out.append({"family": family, "ratio": ratio, "control": control, "scales": [c["scale"] for c in rows],
                    "params": [params[(c["scale"], family)] for c in rows], "diff_mean": y,
                    "ci95": [c["ci95"] for c in rows], **fit})
    return out


def costs(runs: list[Run]) -> list[dict]:
    """CPU/GPU-hours per (scale, arm), and the share of trial seconds spent in training, evaluation and scoring
    steps (cost/train_s + eval_s + score_s over cost/wall_s): the rest is framework setup, data preparation,
    checkpoints and Tune's bookkeeping."""
    by = defaultdict(lambda: {"runs": 0, "cpu_h": 0.0, "gpu_h": 0.0, "work_s": 0.0, "wall_s": 0.0})
    for r in runs:
        row = by[(r.scale, r.arm)]
        row["runs"] += 1
        row["cpu_h"] += r.metrics.get("cost/cpu_s", 0.0) / 3600
        row["gpu_h"] += r.metrics.get("cost/gpu_s", 0.0) / 3600
        row["work_s"] += sum(r.metrics.get(f"cost/{k}", 0.0) for k in WORK_KINDS)
        row["wall_s"] += r.metrics.get("cost/wall_s", 0.0)
    return [{"scale": s, "arm": a, **v, "compute_share": v["work_s"] / v["wall_s"] if v["wall_s"] else None}
            for (s, a), v in _sorted(by)]


def probes(data: SweepRuns) -> dict:
    """(scale, family) -> {metric: {step: [values over seeds]}} from the dense runs' probe histories."""
    out = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r in data.runs:
        for metric, hist in data.histories.get(r.run_id, {}).items():
            for step, v in hist:
                out[(r.scale, r.family)][metric][int(step)].append(v)
    return dict(_sorted(out))


def _series(by_step: dict) -> list:
    """{step: [values over seeds]} -> [(step, mean, 95% interval or None)] for the plots."""
    return [(step, _mean(v), t_interval(v)) for step, v in sorted(by_step.items())]


def redundancy_change(series: dict) -> tuple[list[float], list[float]] | None:
    """Paired (init, final) mean CKA over seeds, from a probe series {step: [values per seed]}."""
    if not series or 0 not in series:
        return None
    last = max(series)
    if last == 0 or len(series[0]) != len(series[last]):
        return None
    return series[0], series[last]


# ------------------------------------------------------------------------------------------------ document


class Doc:
    """Blocks rendered twice: Markdown (plots beside it) and self-contained HTML (plots embedded)."""

    def __init__(self, title: str):
        self.title, self.blocks = title, []

    def h(self, level: int, text: str):
        self.blocks.append(("h", level, text))

    def p(self, text: str):
        self.blocks.append(("p", text))

    def items(self, lines: list[str]):
        if lines:
            self.blocks.append(("ul", lines))

    def table(self, head: list[str], rows: list[list]):
        if rows:
            self.blocks.append(("table", head, [[_cell(c) for c in r] for r in rows]))

    def img(self, path: Path, alt: str):
        if path.exists():
            self.blocks.append(("img", path, alt))

    def markdown(self, root: Path) -> str:
        out = [f"# {self.title}", ""]
        for b in self.blocks:
            if b[0] == "h":
                out += ["#" * b[1] + " " + b[2], ""]
            elif b[0] == "p":
                out += [b[1], ""]
            elif b[0] == "ul":
                out += [f"- {x}" for x in b[1]] + [""]
            elif b[0] == "table":
                out += ["| " + " | ".join(b[1]) + " |", "|" + "---|" * len(b[1])]
                out += ["| " + " | ".join(r) + " |" for r in b[2]] + [""]
            elif b[0] == "img":
                out += [f"![{b[2]}]({b[1].relative_to(root).as_posix()})", ""]
        return "\n".join(out)

    def html(self) -> str:
        def inline(t: str) -> str:  # the Markdown we write: **bold** and `code`
            t = html.escape(t)
            parts = t.split("**")
            t = "".join(f"<strong>{x}</strong>" if i % 2 else x for i, x in enumerate(parts))
            parts = t.split("`")
            return "".join(f"<code>{x}</code>" if i % 2 else x for i, x in enumerate(parts))

        body = [f"<h1>{html.escape(self.title)}</h1>"]
        for b in self.blocks:
            if b[0] == "h":
                body.append(f"<h{b[1]}>{inline(b[2])}</h{b[1]}>")
            elif b[0] == "p":
                body.append(f"<p>{inline(b[1])}</p>")
            elif b[0] == "ul":
                body.append("<ul>" + "".join(f"<li>{inline(x)}</li>" for x in b[1]) + "</ul>")
            elif b[0] == "table":
                head = "".join(f"<th>{inline(x)}</th>" for x in b[1])
                rows = "".join("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in r) + "</tr>" for r in b[2])
                body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
            elif b[0] == "img":
                data = base64.b64encode(b[1].read_bytes()).decode()
                body.append(f'<figure><img alt="{html.escape(b[2])}" src="data:image/png;base64,{data}">'
                            f"<figcaption>{inline(b[2])}</figcaption></figure>")
        style = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
                 "table{border-collapse:collapse;margin:1em 0;font-size:.9em}td,th{border:1px solid #ccc;"
                 "padding:.25em .6em;text-align:left}th{background:#f3f3f3}img{max-width:100%}"
                 "figure{margin:1em 0}figcaption{font-size:.85em;color:#555}code{background:#f3f3f3}")
        return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{html.escape(self.title)}</title>"
                f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")


def _cell(v) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return "—" if math.isnan(v) else f"{v:.4f}"
    return str(v)


def _ci(ci) -> str:
    return "—" if not ci else f"[{ci[0]:+.4f}, {ci[1]:+.4f}]"


def _ratio(r) -> str:
    return f"{r:g}"


def _p(p) -> str:
    return "—" if p is None else (f"{p:.2g}" if p >= 1e-3 else "<0.001")


# ------------------------------------------------------------------------------------------------ the report


@dataclass
class Report:
    data: SweepRuns
    tolerance: float
    comparisons: list[dict]
    prunable: list[dict]
    curves: list[dict]
    fractions: dict
    best: dict
    scales: list[dict]
    costs: list[dict]
    probes: dict
    diagnostics: list[Diagnostic] = field(default_factory=list)
    learning_rates: list[dict] = field(default_factory=list)
    evaluation: list[dict] = field(default_factory=list)

    def verdict_json(self) -> dict:
        return {"sweep": self.data.sweep, "spec_hash": self.data.spec_hash, "comparisons": self.comparisons,
                "prunable": self.prunable, "prune_curves": self.curves,
                "diagnostics": [d.to_json() for d in self.diagnostics],
                "headline": [{"scale": s, "family": f, "headline": self.headline(s, f),
                              "untrustworthy": bool(untrustworthy(self.diagnostics, s, f))}
                             for s, f in self.scale_families()],
                "learning_rates": self.learning_rates, "evaluation": self.evaluation}

    def primary(self) -> list[dict]:
        return [c for c in self.comparisons if c["primary"]]

    def scale_families(self) -> list[tuple[str, str]]:
        return _scale_families(self.prunable)

    def headline(self, scale: str, family: str) -> str:
        """The claim at one (scale, family): untrustworthy when a trust diagnostic failed; else half (1) at each
        ratio and half (2) per control, naming the controls behind each word (Holm-adjusted over the scale's
        primary comparisons)."""
        reasons = untrustworthy(self.diagnostics, scale, family)
        if reasons:
            return "untrustworthy: " + "; ".join(reasons)
        h1 = [p for p in self.prunable if (p["scale"], p["family"], p["method"], p["scope"], p["schedule"],
                                          p["eval_set"]) == (scale, family, PRIMARY["method"], PRIMARY["scope"],
                                                             PRIMARY["schedule"], PRIMARY["eval_set"])]
        rows = [c for c in self.primary() if (c["scale"], c["family"]) == (scale, family)]
        if not h1:
            return "not tested (the primary comparison is not in this sweep)"
        half1 = "; ".join(f"r{p['ratio']:g} {p['verdict'].replace('_', ' ')}" for p in sorted(h1, key=lambda p: p["ratio"]))
        if not rows:
            return f"half (1): {half1}; half (2) not tested (no controls)"
        words = defaultdict(list)
        for c in sorted(rows, key=lambda c: (c["ratio"], CONTROL_ARMS.index(c["control"]))):
            words[c["verdict"]].append(f"{CONTROL_NAMES[c['control']]} r{c['ratio']:g}")
        order = ("supported", "refuted", "inconclusive", "insufficient_seeds")
        half2 = "; ".join(f"{w.replace('_', ' ')} vs {', '.join(words[w])}" for w in order if words[w])
        return f"half (1): {half1}; half (2): {half2} (Holm-adjusted over {len(rows)} comparison(s))"


def learning_rates(runs: list[Run]) -> list[dict]:
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
        if r.arm == "pruned" and "finetune/lr" in r.metrics:
            row["ft"].add(r.metrics["finetune/lr"])
            row["ft_source"].add("sweep" if r.params.get("finetune_lr", "val-grid") != "val-grid"
                                 else f"val-grid {r.params.get('finetune_lr_grid', '')}")
    out = []
    for (scale, family, arm, ratio, scope, arch), v in _sorted(by):
        out.append({"scale": scale, "family": family, "arm": arm, "ratio": ratio, "scope": scope, "arch": arch,
                    "runs": v["runs"], "lr": sorted(v["lrs"]), "lr_source": sorted(v["sources"]),
                    "finetune_lr": sorted(v["ft"]), "finetune_lr_source": sorted(v["ft_source"])})
    return out


def evaluation_info(runs: list[Run]) -> list[dict]:
    """Per (scale, family, eval set): tokens each run is scored on and the windows left out as duplicates of
    training text."""
    by = {}
    for r in runs:
        if r.arm != "dense":
            continue
        for k, v in r.metrics.items():
            parts = k.split("/")
            if len(parts) == 3 and parts[0] == "final" and parts[2] == "tokens":
                by[(r.scale, r.family, parts[1])] = {
                    "scale": r.scale, "family": r.family, "eval_set": parts[1], "tokens": int(v),
                    "windows_excluded": int(r.metrics.get(f"eval/{parts[1]}/windows_excluded", 0))}
    return [v for _, v in _sorted(by)]


def build(data: SweepRuns, windows: Windows | None = None) -> Report:
    tol = data.spec.prune.tolerance if data.spec is not None else DEFAULT_TOLERANCE
    final_drop = data.spec.trust.final_drop if data.spec is not None else TrustSpec().final_drop
    runs = data.runs
    if not any(r.arm == "pruned" for r in runs):
        raise HeadroomInputError(f"sweep {data.sweep!r} (spec {data.spec_hash}) has no finished pruned run: "
                                 "nothing to compare yet")
    comps = comparisons(runs, windows)
    curves = prune_curves(runs)
    h1 = prunable(runs, tol)
    from lightning_modules.config import SCALES

    diags = diagnose(runs, data.histories, _scale_families(h1), [*SCALES], PRIMARY["method"], final_drop)
    return Report(data, tol, comps, h1, curves, prunable_fractions(curves, tol), best_methods(runs),
                  across_scales(comps, _scale_params(runs)), costs(runs), probes(data), diags, learning_rates(runs),
                  evaluation_info(runs))


def _scale_families(rows: list[dict]) -> list[tuple[str, str]]:
    pairs = {(r["scale"], r["family"]) for r in rows}
    return sorted(pairs, key=lambda p: (_scale_rank(p[0]), p))


def render(rep: Report, out: Path) -> Doc:
    """Plots into out/plots/, and the document."""
    from . import plots

    d = rep.data
    pdir = out / "plots"
    pdir.mkdir(parents=True, exist_ok=True)
    doc = Doc(f"headroom verdict: sweep {d.sweep}")
    sets = eval_sets(d.runs)
    scale_fams = _scale_families(rep.prunable)
    ft = max((c["finetune_steps"] for c in rep.comparisons), default=0)

    doc.p(f"The claim: many attention heads of a trained transformer can be removed with little loss (half 1), yet "
          f"the smaller head count trained from scratch does worse (half 2: over-provisioning). Spec "
          f"`{d.spec_hash}`, MLflow parent run `{d.parent_id}`; {len(d.runs)} finished unit(s). Losses are "
          f"mean per-token cross-entropy (nats; lower is better). Differences are control − pruned, paired by seed: "
          f"positive means pruning wins. Intervals are 95% Student-t intervals whose standard error adds the "
          f"sampling variance of the eval windows to the spread over seeds (section 9); a scale's primary "
          f"comparisons are Holm-adjusted as one family.")
    if d.missing:
        doc.p(f"**Partial report**: {len(d.missing)} planned unit(s) have no finished run; rows that need them "
              f"are absent. Missing: " + ", ".join(f"`{m}`" for m in d.missing[:40])
              + (" …" if len(d.missing) > 40 else ""))

    # ---- 1. headline
    doc.h(2, "1. Headline")
    doc.p(f"Primary comparison: method `{PRIMARY['method']}`, scope `{PRIMARY['scope']}`, schedule "
          f"`{PRIMARY['schedule']}`, after {ft} recovery fine-tune steps, eval set `{PRIMARY['eval_set']}`. "
          f"Half (1) uses the loss before fine-tune, within the sweep's declared tolerance of "
          f"{rep.tolerance:.0%} of dense. Half (2) is stated per control (Holm-adjusted over the scale's ratios × "
          f"controls). A scale whose trust diagnostics fail (section 2) is **untrustworthy**: no verdict is given "
          f"on it.")
    lines, table = [], []
    for scale, family in scale_fams:
        lines.append(f"**{scale} {family}**: {rep.headline(scale, family)}.")
        for ratio in sorted({c["ratio"] for c in rep.prunable if (c["scale"], c["family"]) == (scale, family)}):
            h1 = [p for p in rep.prunable if (p["scale"], p["family"], p["ratio"], p["eval_set"], p["scope"],
                                              p["schedule"]) == (scale, family, ratio, "id", "per_layer", "one_shot")]
            prim = {c["control"]: c for c in rep.primary() if (c["scale"], c["family"], c["ratio"]) ==
                    (scale, family, ratio)}
            table.append([scale, family, _ratio(ratio),
                          ", ".join(f"{p['method']} {p['verdict']}" for p in h1) or "—",
                          *[(f"{prim[a]['verdict']} ({prim[a]['diff_mean']:+.4f}, Holm {_ci(prim[a]['ci95_holm'])}"
                             f", p_Holm {_p(prim[a]['p_holm'])})" if a in prim else "—") for a in CONTROL_ARMS]])
    doc.items(lines)
    doc.table(["scale", "family", "ratio", "half (1): prunable before fine-tune (id)",
               *[f"half (2) vs {CONTROL_NAMES[a]}: verdict (diff, adjusted CI, adjusted p)" for a in CONTROL_ARMS]],
              table)
    if not rep.comparisons:
        doc.p("Half (2) was not tested: the sweep has no controls trained from scratch.")

    # ---- 2. trust diagnostics
    doc.h(2, "2. Trust diagnostics")
    doc.p("Checks that the models are trained enough for the question (orchestration/diagnostics.py). A failed "
          "check makes the scale's headline untrustworthy; `not tested` means the sweep lacks what the check needs. "
          "`converged` uses the sweep's declared threshold (`trust.final_drop`).")
    doc.table(["scale", "family", "check", "result", "detail"],
              [[g.scale, g.family, g.check, {True: "passed", False: "**failed**", None: "not tested"}[g.passed],
                g.detail] for g in rep.diagnostics])

    # ---- 3. prune vs control
    doc.h(2, "3. Pruned vs controls at matched head counts")
    doc.p("Each row pairs the pruned models with the controls of the same seeds. `pre-FT` is the masked model before "
          "recovery fine-tuning; `best on val` is the method with the lowest validation loss after fine-tuning "
          "(chosen on the validation set, never an eval set). Verdicts: supported (pruned better, CI above 0), "
          "refuted (control better, CI below 0), inconclusive, insufficient_seeds (n < 2, no interval). The primary "
          "rows' verdicts are Holm-adjusted (`Holm CI`, `p Holm`: the scale's ratios × controls are one family); "
          "secondary rows are unadjusted.")
    forest = pdir / "comparisons.png"
    plots.forest_plot([c for c in rep.comparisons if c["eval_set"] == "id" and c["scope"] == "per_layer"
                       and c["schedule"] == "one_shot" and c["method"] == PRIMARY["method"]], forest)
    doc.img(forest, "Primary method: control − pruned loss on id, mean and 95% CI per ratio and control "
                    "(right of 0: pruning wins)")
    main_rows, second = [], []
    for c in rep.comparisons:
        best = rep.best.get((c["scale"], c["family"], c["ratio"], c["scope"], c["schedule"]))
        is_best = best is not None and best[0] == c["method"]
        label = c["method"] + (" (best on val)" if is_best else "")
        row = [c["scale"], c["family"], _ratio(c["ratio"]), c["heads_dense"], c["heads_kept"], label,
               c["scope"], c["schedule"], "pre-FT" if c["finetune_steps"] == 0 and ft else c["finetune_steps"],
               CONTROL_NAMES[c["control"]], c["eval_set"], c["n_seeds"], c["pruned_loss"], c["control_loss"],
               f"{c['diff_mean']:+.4f}", _ci(c["ci95"]), _p(c["p_value"]), _ci(c["ci95_holm"]), _p(c["p_holm"]),
               c["verdict"]]
        main_method = c["method"] == PRIMARY["method"] or is_best
        if (main_method and c["scope"] == "per_layer" and c["schedule"] == "one_shot"
                and c["eval_set"] == PRIMARY["eval_set"]):
            main_rows.append(row)
        else:
            second.append(row)
    head = ["scale", "family", "ratio", "H", "kept", "method", "scope", "schedule", "fine-tune", "control", "set",
            "n", "pruned", "control", "diff", "95% CI", "p", "Holm CI", "p Holm", "verdict"]
    doc.table(head, main_rows)
    if second:
        doc.h(3, "Secondary combinations")
        doc.p("Other methods, scopes, schedules and eval sets. Secondary: reported, not the headline.")
        doc.table(head, second)

    # ---- 4. replication across eval sets
    doc.h(2, "4. Eval-set replication")
    if len(sets) < 2:
        doc.p("Replication was not tested: the data source offers no shifted eval set.")
    else:
        rows = []
        by = defaultdict(dict)
        for c in rep.comparisons:
            if (c["method"], c["scope"], c["schedule"]) == (PRIMARY["method"], PRIMARY["scope"],
                                                           PRIMARY["schedule"]) and c["finetune_steps"] == ft:
                by[(c["scale"], c["family"], c["ratio"], c["control"])][c["eval_set"]] = c
        agree = 0
        for k, per in sorted(by.items()):
            vs = [per[s]["verdict"] if s in per else "—" for s in sets]
            same = len({v for v in vs if v != "—"}) == 1
            agree += same
            rows.append([k[0], k[1], _ratio(k[2]), CONTROL_NAMES[k[3]],
                         *[f"{per[s]['verdict']} ({per[s]['diff_mean']:+.4f})" if s in per else "—" for s in sets],
                         "yes" if same else "**no**"])
        doc.p(f"The primary comparison on every eval set ({', '.join(sets)}): the verdicts agree in {agree} of "
              f"{len(rows)} case(s). Disagreement would make a verdict a benchmark artifact.")
        doc.table(["scale", "family", "ratio", "control", *sets, "agree"], rows)

    # ---- 5. prune curves
    doc.h(2, "5. Prune curves")
    doc.p(f"Loss vs fraction of heads removed, mask only (no fine-tune; the heads ranked once by each method), mean "
          f"over seeds with a 95% band; crosses: the swept ratios after {ft} fine-tune steps. The prunable fraction "
          f"is the largest ratio up to which the mean curve stays within {rep.tolerance:.0%} of dense (Michel et "
          f"al. 2019 report about 20% for WMT and 40% for BERT with no noticeable loss).")
    frac_rows = []
    for scale, family in scale_fams:
        for ev in sets[:2]:
            rows = [c for c in rep.curves if (c["scale"], c["family"], c["eval_set"], c["scope"], c["schedule"]) ==
                    (scale, family, ev, "per_layer", "one_shot")]
            if not rows:
                rows = [c for c in rep.curves if (c["scale"], c["family"], c["eval_set"]) == (scale, family, ev)]
            if not rows:
                continue
            path = pdir / f"prune_curve_{scale}_{family}_{ev}.png"
            plots.curves_plot(rows, rep.tolerance, path, f"{scale} {family}, eval set {ev}")
            doc.img(path, f"Prune curves, {scale} {family}, eval set {ev}")
        for (s, f, method, scope, schedule, ev), frac in sorted(rep.fractions.items()):
            if (s, f) == (scale, family):
                frac_rows.append([s, f, method, scope, schedule, ev, _ratio(frac)])
    doc.table(["scale", "family", "method", "scope", "schedule", "set", "prunable fraction"], frac_rows)
    h1_rows = [[p["scale"], p["family"], p["method"], p["scope"], p["schedule"], p["eval_set"], _ratio(p["ratio"]),
                p["n_seeds"], p["dense_loss"], p["pruned_loss"], p["verdict"]] for p in rep.prunable]
    doc.h(3, "Half (1) at the swept ratios")
    doc.table(["scale", "family", "method", "scope", "schedule", "set", "ratio", "n", "dense", "pruned (pre-FT)",
               "verdict"], h1_rows)

    # ---- 6. across scales
    doc.h(2, "6. Across scales")
    fits = [s for s in rep.scales if len(s["scales"]) >= 2]
    if not fits:
        doc.p("One scale only: whether the gap grows or shrinks with size is not tested by this sweep.")
    else:
        path = pdir / "across_scales.png"
        plots.scales_plot(rep.scales, path)
        doc.img(path, "Primary gap (control − pruned, id) against dense parameters, with a least-squares line")
        rows = []
        for s in fits:
            trend = ("grows" if s["slope"] > 0 else "shrinks") if s["slope"] is not None else "—"
            if s["slope_ci95"] and s["slope_ci95"][0] <= 0 <= s["slope_ci95"][1]:
                trend += " (CI includes 0)"
            rows.append([s["family"], _ratio(s["ratio"]), CONTROL_NAMES[s["control"]], ", ".join(s["scales"]),
                         ", ".join(f"{v:+.4f}" for v in s["diff_mean"]),
                         f"{s['slope']:+.4f}" if s["slope"] is not None else "—", _ci(s["slope_ci95"]), trend])
        doc.p("Slope of the gap per decade of parameters: positive means pruning's advantage grows with model size "
              "(over-provisioning matters more for larger models). With two scales the slope is a difference of two "
              "points and has no interval.")
        doc.table(["family", "ratio", "control", "scales", "gap per scale", "slope / decade", "95% CI",
                   "pruning's advantage"], rows)

    # ---- 7. probes
    doc.h(2, "7. Mechanism probes")
    if not rep.probes:
        doc.p("Not measured: the sweep has no `probes` section.")
    else:
        doc.p("Measured by the dense runs while training. Importance over training: at each probed step the heads are "
              "scored and a mask-only curve on validation batches gives the prunable fraction at that step; the "
              "spread is the coefficient of variation of head importance. Redundancy: mean pairwise linear CKA of the "
              "outputs of the heads of a layer (1 = linearly equivalent), at initialisation and after training.")
        path = pdir / "probes_importance.png"
        plots.probes_plot({k: {m: _series(v) for m, v in series.items()} for k, series in rep.probes.items()}, path)
        doc.img(path, "Prunable fraction and spread of head importance vs training step (mean over seeds, 95% band)")
        rows = []
        for (scale, family), series in rep.probes.items():
            pf = series.get("probe/prunable_fraction", {})
            if pf:
                steps = sorted(pf)
                means = {s: _mean(pf[s]) for s in steps}
                later = [s for s in steps if s > 0]
                low = min(later, key=lambda s: means[s]) if later else steps[0]
                late = bool(later) and means[steps[-1]] > means[low]
                rows.append([scale, family, _ratio(means[steps[0]]), f"{means[low]:.2f} (step {low})",
                             f"{means[steps[-1]]:.2f} (step {steps[-1]})",
                             "yes: the fraction grows again after its low" if late else "no"])
        doc.table(["scale", "family", "prunable fraction at init", "lowest after init", "at the end",
                   "slack appears late"], rows)
        red_rows, pairs = [], {}
        for (scale, family), series in rep.probes.items():
            got = redundancy_change(series.get("probe/redundancy", {}))
            if got is None:
                continue
            init, final = got
            pairs[(scale, family)] = ((_mean(init), t_interval(init)), (_mean(final), t_interval(final)))
            diff, ci, verdict = paired_verdict([a - b for a, b in zip(init, final)])
            word = {"supported": "more similar at init", "refuted": "more similar after training"}.get(verdict, verdict)
            red_rows.append([scale, family, len(init), _mean(init), _mean(final), f"{diff:+.4f}", _ci(ci), word])
        if pairs:
            path = pdir / "probes_redundancy.png"
            plots.redundancy_plot(pairs, path)
            doc.img(path, "Mean pairwise CKA of head outputs at initialisation and after training (mean over seeds, "
                          "95% CI)")
            doc.table(["scale", "family", "n", "CKA at init", "CKA trained", "init − trained", "95% CI", "heads are"],
                      red_rows)
    heat = []
    for (scale, family), method, run in _heatmap_runs(d.runs):
        heat.append((scale, family, method, run))
    if heat:
        doc.h(3, "Head importance (layers × heads)")
        doc.p("From the prune runs' calibration scores, lowest seed, one per scale and method (heads of different "
              "seeds are not aligned, so scores are not averaged).")
        for scale, family, method, run in heat:
            path = pdir / f"heatmap_{scale}_{family}_{method}.png"
            if _heatmap(d.uri, run, path, f"{scale} {family} seed {run.seed}: {method} importance"):
                doc.img(path, f"{method} importance, {scale} {family}, seed {run.seed}")

    # ---- 8. learning rates
    doc.h(2, "8. Learning rates")
    doc.p("Every arm's peak learning rate and where it came from: `preset` (the scale's), `sweep` (one number for "
          "all), `searched` (Optuna over this architecture, the same trials and steps for every architecture; "
          "`searched:<arch>` for a global prune's controls, which take the rate of the uniform shape with the same "
          "ratio). A pruned arm trains at its dense model's rate; its recovery fine-tune's rate is the sweep's or "
          "chosen on the validation split from a grid of multiples of the dense rate. Without a search every arm "
          "trains at the same rate, tuned for none of them.")
    doc.table(["scale", "family", "arm", "ratio", "scope", "heads × head_dim", "runs", "lr", "source",
               "fine-tune lr", "fine-tune source"],
              [[x["scale"], x["family"], x["arm"], "—" if x["ratio"] is None else _ratio(x["ratio"]), x["scope"],
                x["arch"], x["runs"], ", ".join(f"{v:.3g}" for v in x["lr"]) or "—", ", ".join(x["lr_source"]),
                ", ".join(f"{v:.3g}" for v in x["finetune_lr"]) or "—", ", ".join(x["finetune_lr_source"]) or "—"]
               for x in rep.learning_rates])

    # ---- 9. evaluation and statistics
    doc.h(2, "9. Evaluation data and statistics")
    doc.p("Every run is scored on the same windows of each eval set: every window of the split (up to a stated cap "
          "of 2^20 tokens, or the sweep's `eval_batches`), leaving out windows whose tokens also occur verbatim "
          "in the training stream (documents repeated across splits are removed before splitting; shared "
          "boilerplate can remain). Tokens scored per run and windows left out:")
    doc.table(["scale", "family", "eval set", "tokens per run", "windows left out (in train)"],
              [[e["scale"], e["family"], e["eval_set"], e["tokens"], e["windows_excluded"]] for e in rep.evaluation])
    shares = [c["window_share"] for c in rep.primary() if c["window_share"] is not None]
    if shares:
        doc.p(f"Which windows an eval set happens to hold is a second source of chance besides the seeds. Each "
              f"interval's standard error adds the windows' sampling variance (per-window losses, paired across "
              f"arms) to the spread over seeds. In the primary comparisons the windows make "
              f"{min(shares):.0%}–{max(shares):.0%} of that variance (median {statistics.median(shares):.0%}): "
              + ("the seeds dominate." if statistics.median(shares) < 0.5 else "the windows dominate: a larger "
                 "eval set would tighten the intervals more than more seeds."))
    else:
        doc.p("The runs recorded no per-window losses: the intervals are over seeds alone, and the sampling "
              "variance of the eval windows is not included.")

    # ---- 10. cost
    doc.h(2, "10. Cost")
    total_cpu = sum(c["cpu_h"] for c in rep.costs)
    total_gpu = sum(c["gpu_h"] for c in rep.costs)
    work = sum(c["work_s"] for c in rep.costs)
    wall = sum(c["wall_s"] for c in rep.costs)
    doc.p(f"Trial time × resources per trial (MLflow `cost/cpu_s`, `cost/gpu_s`), in hours: {total_cpu:.3f} "
          f"CPU-hours and {total_gpu:.3f} GPU-hours in all. The price of over-provisioning is the dense arm against "
          "the Scratch-E arm of the same steps. Compute share: the fraction of trial seconds spent in training, "
          "evaluation and scoring steps" + (f" ({work / wall:.0%} in all)." if wall else "."))
    doc.table(["scale", "arm", "runs", "CPU-hours", "GPU-hours", "compute share"],
              [[c["scale"], c["arm"], c["runs"], f"{c['cpu_h']:.3f}", f"{c['gpu_h']:.3f}",
                "—" if c["compute_share"] is None else f"{c['compute_share']:.0%}"] for c in rep.costs])
    return doc


def _heatmap_runs(runs: list[Run]):
    pick = {}
    for r in runs:
        if r.arm != "pruned":
            continue
        k = (r.scale, r.family, r.method)
        rank = (r.scope != "per_layer", r.schedule != "one_shot", r.seed, r.ratio or 0)
        if k not in pick or rank < pick[k][0]:
            pick[k] = (rank, r)
    for (scale, family, method), (_, r) in sorted(pick.items()):
        yield (scale, family), method, r


def _heatmap(uri: str, run: Run, path: Path, title: str) -> bool:
    import mlflow.artifacts

    from .plots import heatmap

    try:
        with tempfile.TemporaryDirectory() as tmp:
            p = mlflow.artifacts.download_artifacts(run_id=run.run_id, artifact_path="scores.json", dst_path=tmp,
                                                    tracking_uri=uri)
            scores = json.loads(Path(p).read_text())["scores"]
    except Exception:  # noqa: BLE001 - a run without the artifact gets no heatmap
        return False
    heatmap(scores, path, title)
    return True


def headline_metrics(rep: Report) -> dict[str, float]:
    """Parent-run metrics: the primary gap per (scale, family, ratio, control) and the prunable fractions."""
    out = {}
    for c in rep.primary():
        k = f"verdict/{c['scale']}/{c['family']}/r{c['ratio']:g}/{c['control']}"
        out[f"{k}/diff_mean"] = c["diff_mean"]
        if c["ci95"]:
            out[f"{k}/ci_lo"], out[f"{k}/ci_hi"] = c["ci95"]
    for (scale, family, method, scope, schedule, ev), frac in rep.fractions.items():
        if (scope, schedule) == (PRIMARY["scope"], PRIMARY["schedule"]):
            out[f"prunable_fraction/{scale}/{family}/{method}/{ev}"] = frac
    return out


def write_report(uri: str, sweep_name: str, out: Path | None = None, log: bool = True) -> tuple[Path, Report]:
    """Build the report of the sweep's newest parent, write it to `out` (default reports/<sweep>/) and log it to
    the parent run. Raises HeadroomInputError when there is nothing to report (before writing anything)."""
    data = load_sweep_runs(uri, sweep_name)
    rep = build(data, Windows(uri))
    out = Path(out or Path("reports", sweep_name)).resolve()
    out.mkdir(parents=True, exist_ok=True)
    doc = render(rep, out)
    (out / "verdict.json").write_text(json.dumps(jsonable(rep.verdict_json()), indent=2) + "\n")
    (out / "report.md").write_text(doc.markdown(out) + "\n")
    (out / "report.html").write_text(doc.html())
    if log:
        from mlflow.entities import Metric

        client = _client(uri)
        client.log_artifacts(data.parent_id, str(out), "report")
        now = int(time.time() * 1000)
        ms = [Metric(k, float(v), now, 0) for k, v in headline_metrics(rep).items()]
        for i in range(0, len(ms), 1000):
            client.log_batch(data.parent_id, metrics=ms[i:i + 1000])
    return out, rep


def headline_table(rep: Report) -> str:
    """The headline as plain text for the terminal."""
    lines = [f"verdict of sweep {rep.data.sweep} (spec {rep.data.spec_hash}):"]
    if rep.comparisons:
        for scale, family in rep.scale_families():
            lines.append(f"  {scale} {family}: {rep.headline(scale, family)}")
            for d in rep.primary():
                if (d["scale"], d["family"]) == (scale, family):
                    lines.append(f"      r{d['ratio']:g} vs {CONTROL_NAMES[d['control']]:<9} {d['verdict']:<18} "
                                 f"diff {d['diff_mean']:+.4f} CI {_ci(d['ci95'])} p_Holm {_p(d['p_holm'])} "
                                 f"(n={d['n_seeds']})")
            for g in rep.diagnostics:
                if (g.scale, g.family) == (scale, family) and g.passed is False:
                    lines.append(f"      failed check {g.check}: {g.detail}")
    else:  # no controls (a pretrained sweep): half (1) only
        for p in rep.prunable:
            if (p["scope"], p["schedule"], p["eval_set"]) == (PRIMARY["scope"], PRIMARY["schedule"], "id"):
                lines.append(f"  {p['scale']} {p['family']} r{p['ratio']:g} {p['method']}: {p['verdict']} "
                             f"(before fine-tune {p['pruned_loss']:.4f} vs dense {p['dense_loss']:.4f}, "
                             f"tolerance {p['tolerance']:.0%})")
        if len(lines) == 1:
            lines.append("  no primary comparison in this sweep; see the report")
        else:
            lines.append("  half (2) not tested: the sweep trains no controls")
    if rep.data.missing:
        lines.append(f"  partial: {len(rep.data.missing)} planned unit(s) missing")
    return "\n".join(lines)
