"""The fault campaign's audit (benchmarks/faults.py): what MLflow holds after a campaign, against the sweep's plan
(units lost, runs and steps duplicated, steps and artifacts missing), and whether the campaign met its goal."""

from __future__ import annotations

import tempfile
from pathlib import Path

STEPPED = ("train/loss", "train/lr", "val/loss", "val/ppl")
ARTIFACTS = {"prune": {"scores.json", "scores.png", "metrics.json"}, "train": {"metrics.json"}}
MODEL_FILES = {"export/config.json", "export/model.safetensors", "export/tokenizer.json"}  # beside a logged model


FULL_FAULTS = 20  # the full campaign: at least this many faults, every kind among them


def judge(out: dict, requested: list[str], every_kind: tuple[str, ...] = ()) -> dict:
    """The campaign's goal: nothing lost, duplicated or missing, and every fault it was asked for injected (a sweep
    that ends first leaves faults uninjected: then the campaign did not test what it was asked to). The full goal
    (`meets_full_goal`) asks more of the same campaign: at least FULL_FAULTS faults injected, each of `every_kind`
    among them (the Ray head included)."""
    injected = {f.get("kind") for f in out["faults"]}
    out["faults_requested"] = len(requested)
    out["kinds_missing"] = sorted(set(requested) - injected)
    out["goal"] = ("faults_injected == faults_requested, every requested kind injected, and units_lost == "
                   "duplicate_runs == duplicate_steps == missing_steps == missing_artifacts == 0")
    out["meets_goal"] = out["faults_injected"] == len(requested) and not out["kinds_missing"] and all(
        out[k] == 0 for k in ("units_lost", "duplicate_runs", "duplicate_steps", "missing_steps", "missing_artifacts"))
    out["full_goal"] = f"the goal, with faults_injected >= {FULL_FAULTS} and every kind ({', '.join(every_kind)})"
    out["kinds_not_covered"] = sorted(set(every_kind) - injected)
    out["meets_full_goal"] = (out["meets_goal"] and out["faults_injected"] >= FULL_FAULTS
                              and not out["kinds_not_covered"])
    return out


def audit(c, sweep_name: str, plan: list[dict], models: bool = False) -> dict:
    """What MLflow holds, against the plan: lost, duplicated and missing things, each listed by unit name. With
    `models` (the sweep logs its pruned models), a finished prune unit also needs its logged model (tag
    `headroom.model` a `models:/` URI) and its exported directory (`export/`)."""
    exp = c.get_experiment_by_name(sweep_name)
    runs = list(c.search_runs([exp.experiment_id], max_results=5000)) if exp else []
    parents = [r for r in runs if r.data.tags.get("headroom.role") == "parent"]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    by_key: dict[str, list] = {}
    for r in children:
        by_key.setdefault(r.data.tags["headroom.key"], []).append(r)
    by_name: dict[str, list] = {}
    for r in children:
        by_name.setdefault(r.info.run_name, []).append(r)
    expected = [row["name"] for row in plan if row["stage"] != "lr_search"]
    lr_expected = sum(row["trials"] or 0 for row in plan if row["stage"] == "lr_search")
    finished = lambda rs: any(r.info.status == "FINISHED" for r in rs)
    lost = [n for n in expected if not finished(by_name.get(n, []))]
    lr_done = sum(1 for rs in by_key.values()
                  if rs[0].data.tags["headroom.stage"] == "lr_search" and finished(rs))
    # an lr candidate whose driver was killed is closed KILLED and the study samples another rate in its place
    lr_killed = sum(1 for rs in by_key.values()
                    if rs[0].data.tags["headroom.stage"] == "lr_search" and not finished(rs))
    dup_runs = {k: len(rs) - 1 for k, rs in by_key.items() if len(rs) > 1}
    dup_steps, missing_steps, missing_arts = {}, {}, {}
    for r in children:
        name, stage = r.info.run_name, r.data.tags["headroom.stage"]
        for metric in STEPPED:
            if metric not in r.data.metrics and stage == "prune":
                continue
            hist = c.get_metric_history(r.info.run_id, metric)
            if "headroom.restarted" in r.data.tags:  # started again from step 0 in this run: its newest attempt
                attempt = max(m.timestamp for m in hist if m.step == min(x.step for x in hist)) if hist else 0
                hist = [m for m in hist if m.timestamp >= attempt]
            steps = [m.step for m in hist]
            if len(steps) != len(set(steps)):
                dup_steps[f"{name} {metric}"] = len(steps) - len(set(steps))
            if r.info.status != "FINISHED" or stage == "prune":
                continue
            top = int(r.data.params["steps"]) if stage == "train" else max(steps, default=0)
            if metric.startswith("train/"):
                gone = set(range(1, top + 1)) - set(steps)
            else:  # validation every val_every steps (the training's own interval)
                every = int(r.data.params.get("val_every") or 0) or top
                gone = set(range(every, top + 1, every)) - set(steps)
            if gone:
                missing_steps[f"{name} {metric}"] = len(gone)
        if r.info.status == "FINISHED" and stage in ARTIFACTS:
            want = set(ARTIFACTS[stage])
            if stage == "prune" and r.data.tags.get("headroom.prune_at") == "1":
                want.add("prune_curve.png")
            have = {a.path: a.file_size for a in c.list_artifacts(r.info.run_id)}
            absent = [f for f in sorted(want) if not have.get(f)]
            with tempfile.TemporaryDirectory() as d:  # listed is not enough: read one back through the server
                probe = sorted(want)[0]
                if probe in have:
                    try:
                        if Path(c.download_artifacts(r.info.run_id, probe, d)).stat().st_size != have[probe]:
                            absent.append(probe)
                    except Exception:
                        absent.append(probe)
            if models and stage == "prune":
                if not r.data.tags.get("headroom.model", "").startswith("models:/"):
                    absent.append("logged model")
                files = {a.path: a.file_size for a in c.list_artifacts(r.info.run_id, "export")}
                absent += [f for f in sorted(MODEL_FILES) if not files.get(f)]
            if absent:
                missing_arts[name] = absent
    report = set()
    if parents:
        report = {a.path for a in c.list_artifacts(parents[0].info.run_id, "report")}
    for f in ("report/verdict.json", "report/report.html"):
        if f not in report:
            missing_arts.setdefault("parent", []).append(f)
    return {"units_expected": len(expected) + lr_expected,
            "units_finished": len(expected) - len(lost) + lr_done,
            "units_lost": len(lost) + max(0, lr_expected - lr_done), "lost": lost,
            "parent_runs": len(parents), "lr_candidates_replaced": lr_killed,
            "duplicate_runs": sum(dup_runs.values()), "duplicated": sorted(dup_runs),
            "duplicate_steps": sum(dup_steps.values()), "duplicated_steps": dup_steps,
            "missing_steps": sum(missing_steps.values()), "missing": missing_steps,
            "missing_artifacts": sum(len(v) for v in missing_arts.values()), "missing_files": missing_arts}
