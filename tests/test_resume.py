"""Faults, kills and resumes on one real sweep (a local Ray, MLflow in SQLite): a trial killed by the fault switch
is retried by Ray and continues its own run; a killed driver resumes without rerunning or duplicating a unit; the
resumed sweep's report has its prune-timing rows; global-scope controls copy the pruned head counts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from test_sweep import client, run_sweep, runs_of, split, steps_of, sweep_cmd

from orchestration.report.read import newest_per_step

# ------------------------------------------------------------------------- fault, kill, resume (one sweep)

RESUME_SWEEP = """\
name: resume
family: decoder
data: {source: stdlib}
scales:
  xs: {steps: 100, overrides: {batch_size: 8, seq_len: 64, warmup_steps: 5, val_every: 10, val_batches: 2,
       eval_batches: 2}}
seeds: [0, 1]
prune: {ratios: [0.5], methods: [random], scope: [per_layer, global], finetune_steps: 5, calibration_batches: 2,
        curve: false, at: [0.2, 1]}
controls: [scratch_e]
retries: 2
"""
FAULT_STEP = 25
UNITS = 15  # 2 dense, 1 half-budget dense, 2 scratch_e (per_layer), 8 pruned (2 scopes × 2 timings), 2 scratch_e of
# the global prunes


def _descendants(pid):
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


@pytest.fixture(scope="session")
def interrupted(tmp_path_factory, cache_dir):
    """The resume sweep with the fault switch on (one dense trial kills itself at step 25 and Ray retries it);
    the driver is killed once the retried trial has finished and other units have not; then `--resume`."""
    cwd = tmp_path_factory.mktemp("resume")
    (cwd / "resume.yaml").write_text(RESUME_SWEEP)
    env = {**os.environ, "HEADROOM_TEST_FAULT_STEP": str(FAULT_STEP)}
    proc = subprocess.Popen(sweep_cmd("resume.yaml"), cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.time() + 600
    c = None
    killed_state = None
    try:
        while time.time() < deadline and proc.poll() is None:
            time.sleep(0.5)
            if not any("[headroom] train:" in line for line in lines):
                continue  # the driver has created the MLflow tables once it starts training
            c = c or client(cwd)
            try:
                _, children = split(runs_of(c, "resume"))
            except Exception:  # the driver is creating tables
                continue
            done = [r for r in children if r.info.status == "FINISHED"]
            retried = [r for r in done if r.data.metrics.get("resumed_at_step", 0) > 0]
            # kill once Ray's retry has finished and another unit is mid-training with a checkpoint
            mid = [r for r in children if r.info.status == "RUNNING" and "headroom.checkpoint" in r.data.tags
                   and r.data.tags["headroom.stage"] == "train"]  # (a finishing prune unit has one too)
            if retried and mid:
                procs = _descendants(proc.pid)
                os.killpg(proc.pid, signal.SIGKILL)
                for p in procs:
                    try:
                        p.kill()
                    except Exception:
                        pass
                proc.wait(30)
                killed_state = {r.info.run_id: (r.info.status, r.info.end_time, dict(r.data.metrics))
                                for r in split(runs_of(c, "resume"))[1]}
                break
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    reader.join(10)
    log = "".join(lines)
    assert killed_state is not None, "the driver finished before the kill point:\n" + log[-3000:]
    no_flag = run_sweep(cwd, "resume.yaml")
    resumed = run_sweep(cwd, "resume.yaml", "--resume")
    return {"cwd": cwd, "killed_state": killed_state, "no_flag": no_flag, "resumed": resumed, "log": log}


def test_fault_switch_trial_retried_by_ray_continues_its_run(interrupted):
    cwd = interrupted["cwd"]
    assert len(list(cwd.glob("ray_results/resume-????????/fault-fired"))) == 1
    c = client(cwd)
    _, children = split(runs_of(c, "resume"))
    retried = [r for r in children if r.data.metrics.get("resumed_at_step", 0) > 0
               and r.info.run_id in interrupted["killed_state"]
               and interrupted["killed_state"][r.info.run_id][0] == "FINISHED"]
    assert len(retried) == 1
    r = retried[0]
    assert r.data.tags["headroom.arm"] == "dense"
    # killed at step 25, restored from the checkpoint of step 20 (val_every 10): steps 21..25 ran twice and
    # were logged once
    assert r.data.metrics["resumed_at_step"] == 20
    assert steps_of(c, r) == list(range(1, 101))
    assert len(c.get_metric_history(r.info.run_id, "train/loss")) == 100
    # its checkpoint of step 20, kept for pruning at 0.2 of training, survived the restart: the early prunes of
    # this dense model started from it
    early = [x for x in children if x.data.tags["headroom.prune_at"] == "0.2"
             and x.data.tags["headroom.seed"] == r.data.tags["headroom.seed"]]
    assert len(early) == 2 and all(x.info.status == "FINISHED" and x.data.metrics["prune_step"] == 20 for x in early)


def test_killed_driver_resumes_without_rerunning_or_duplicating(interrupted):
    cwd, before = interrupted["cwd"], interrupted["killed_state"]
    # without --resume an interrupted sweep is not silently restarted
    no_flag = interrupted["no_flag"]
    assert no_flag.returncode == 2 and "pass --resume" in no_flag.stderr
    assert len(no_flag.stderr.strip().splitlines()) == 1
    r = interrupted["resumed"]
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    c = client(cwd)
    parents, children = split(runs_of(c, "resume"))
    assert len(parents) == 1
    keys = [x.data.tags["headroom.key"] for x in children]
    assert len(keys) == len(set(keys)) == UNITS
    assert all(x.info.status == "FINISHED" for x in children)
    unfinished_at_kill = [k for k, v in before.items() if v[0] != "FINISHED"]
    assert len([v for v in before.values() if v[0] == "FINISHED"]) < UNITS
    for x in children:
        rid = x.info.run_id
        if rid in before and before[rid][0] == "FINISHED":  # finished before the kill: untouched
            assert (x.info.status, x.info.end_time) == before[rid][:2]
            assert x.data.metrics == before[rid][2]
        if x.data.tags["headroom.stage"] == "train":
            T = int(x.data.params["steps"])
            hist = c.get_metric_history(rid, "train/loss")
            assert sorted(m.step for m in hist) == list(range(1, T + 1)), x.info.run_name
    # a unit caught mid-training continued its own run (same run id as at the kill)
    assert unfinished_at_kill and all(rid in {x.info.run_id for x in children} for rid in unfinished_at_kill)
    continued = [x for x in children if x.info.run_id in unfinished_at_kill and x.data.tags["headroom.stage"] == "train"]
    assert any(x.data.metrics.get("resumed_at_step", 0) > 0 for x in continued)  # from its checkpoint, not step 0
    # pruned models: each logged once (a unit finished again after the kill finds its model logged), a global
    # prune's (different head counts per layer) with its modeling file; the exported directory in the run's artifacts
    pruned = [x for x in children if x.data.tags["headroom.arm"] == "pruned"]
    for x in pruned:
        found = c.search_logged_models([x.info.experiment_id], filter_string=f"source_run_id = '{x.info.run_id}'")
        assert len(found) == 1 and x.data.tags["headroom.model"] == f"models:/{found[0].model_id}", x.info.run_name
        uniform = len(set(x.data.tags["headroom.kept"].split(","))) == 1
        files = {a.path for a in c.list_artifacts(x.info.run_id, "export")}
        assert {"export/config.json", "export/model.safetensors", "export/tokenizer.json"} <= files
        assert ("export/modeling_headroom.py" in files) == (not uniform), x.info.run_name
    assert any(len(set(x.data.tags["headroom.kept"].split(","))) > 1 for x in pruned)


LOAD = """
import importlib.util, json, sys, mlflow, torch
assert not importlib.util.find_spec("lightning_modules"), "headroom found"
out = {}
for name, uri, store, ids in json.loads(sys.argv[1]):
    mlflow.set_tracking_uri(store)
    pipe = mlflow.transformers.load_model(uri)
    x = torch.tensor([ids])
    with torch.no_grad():
        r = {"logits": pipe.model(input_ids=x).logits.tolist(), "class": type(pipe.model).__name__}
        if name == "decoder":
            r["generated"] = pipe.model.generate(x, max_new_tokens=4, do_sample=False).tolist()
            r["text"] = pipe("def ", max_new_tokens=4, do_sample=False)[0]["generated_text"]
    out[name] = r
assert not [m for m in sys.modules if m.startswith(("lightning_modules", "orchestration"))]
print(json.dumps(out))
"""


def test_pruned_models_logged_to_mlflow_load_in_a_fresh_process_without_headroom(interrupted, tmp_path):
    """MLflow's own loader, in a virtual environment without headroom, builds a global prune's decoder (its layers
    keep different head counts) and a pruned rotary encoder from the modeling file each carries, and they compute
    what headroom's own models compute; the decoder generates headroom's greedy tokens. The decoder is the resume
    sweep's, logged by its driver; the encoder is logged here the same way (registry.log_pruned_model)."""
    import mlflow
    import torch
    from test_export import _bare_python

    from lightning_modules.declarations.config import model_config_for
    from lightning_modules.models.build import build_model, load_model, save_model
    from lightning_modules.models.heads import prune_heads
    from orchestration.running.registry import log_pruned_model

    cwd = interrupted["cwd"]
    _, children = split(runs_of(client(cwd), "resume"))
    x = next(x for x in children if x.data.tags["headroom.arm"] == "pruned"
             and len(set(x.data.tags["headroom.kept"].split(","))) > 1)
    decoder = load_model(x.data.tags["headroom.checkpoint"].removeprefix("file://") + "/model")
    encoder = prune_heads(build_model(model_config_for("xs", "encoder"), seed=0).eval(), [[0, 1, 2], [4, 5, 6, 7]])
    save_model(encoder, tmp_path / "encoder")
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = mlflow.MlflowClient(store)
    run = c.create_run(c.create_experiment("encoder"))
    enc_uri = log_pruned_model(store, run.info.run_id, tmp_path / "encoder", "byte")
    assert {"export/config.json", "export/modeling_headroom.py"} <= {a.path for a in c.list_artifacts(
        run.info.run_id, "export")}
    ids = list(b"import os\nfor name in os.listdir('.'):\n")
    cases = [["decoder", x.data.tags["headroom.model"], f"sqlite:///{cwd / 'mlflow.db'}", ids],
             ["encoder", enc_uri, store, ids]]
    r = subprocess.run([str(_bare_python(tmp_path)), "-I", "-c", LOAD, json.dumps(cases)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    for name, model in (("decoder", decoder), ("encoder", encoder)):
        with torch.no_grad():
            want = model(input_ids=torch.tensor([ids])).logits
        torch.testing.assert_close(torch.tensor(got[name]["logits"]), want, rtol=1e-4, atol=1e-5)
    assert (got["decoder"]["class"], got["encoder"]["class"]) == ("HeadroomLlamaForCausalLM", "HeadroomBertForMaskedLM")
    with torch.no_grad():
        greedy = decoder.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False)
    assert got["decoder"]["generated"] == greedy.tolist() and len(greedy[0]) == len(ids) + 4
    assert got["decoder"]["text"].startswith("def ") and len(got["decoder"]["text"]) > len("def ")


def test_resumed_sweeps_report_prune_timing(interrupted):
    """Pruning at 0.2 of training against pruning the trained model, in the resumed sweep's report."""
    cwd = interrupted["cwd"]
    v = json.loads((cwd / "reports" / "resume" / "verdict.json").read_text())
    c = client(cwd)
    _, children = split(runs_of(c, "resume"))
    timing = {(t["scale"], t["family"], t["method"], t["prune_at"]): t for t in v["timing"]}
    assert set(timing) == {("xs", "decoder", "random", 0.2), ("xs", "decoder", "random", 1.0)}
    assert timing[("xs", "decoder", "random", 1.0)]["vs_late"] == "reference"
    for (_, _, _, at), t in timing.items():
        losses = [x.data.metrics["final/id/loss"] for x in children if x.data.tags["headroom.stage"] == "prune"
                  and x.data.tags["headroom.scope"] == "per_layer" and float(x.data.tags["headroom.prune_at"]) == at]
        assert t["n_seeds"] == len(losses) == 2 and t["loss_mean"] == pytest.approx(sum(losses) / 2, abs=1e-9)


def test_global_scope_controls_copy_the_pruned_head_counts(interrupted):
    c = client(interrupted["cwd"])
    _, children = split(runs_of(c, "resume"))
    pruned = {x.data.tags["headroom.seed"]: x for x in children
              if x.data.tags["headroom.arm"] == "pruned" and x.data.tags["headroom.scope"] == "global"}
    controls = [x for x in children if x.data.tags["headroom.scope"] == "global" and x.data.tags["headroom.arm"]
                == "scratch_e"]
    assert len(pruned) == 2 and len(controls) == 2
    for x in controls:
        p = pruned[x.data.tags["headroom.seed"]]
        kept = p.data.tags["headroom.kept"]
        assert sum(map(int, kept.split(","))) == 8  # half of 2 × 8 heads, wherever they scored lowest
        want = kept.split(",")[0] if len(set(kept.split(","))) == 1 else kept
        assert x.data.tags["headroom.heads"] == want
        assert (x.data.tags["headroom.method"], x.data.tags["headroom.ratio"]) == ("random", "0.5")
        assert x.data.params["steps"] == "100" and x.info.status == "FINISHED"
        assert x.data.tags["headroom.dense_run_id"] == p.data.tags["headroom.dense_run_id"]  # the same dense run


# -------------------------------------------------------------------------------------------- pretrained


def test_sigterm_stops_a_background_driver_and_resume_finishes_it(tmp_path, cache_dir):
    """A driver a shell started in the background inherits SIGINT ignored; `kill PID` (SIGTERM) must still end it as
    Ctrl-C does: exit 130, the parent run KILLED, no child left RUNNING; `--resume` then finishes every unit. The
    checkpoint a stopped trial left is then truncated, as a full disk or a lost node leaves one: the resume says
    so, restarts that unit from step 0 in its own MLflow run, and its step history has every step once."""
    text = RESUME_SWEEP.replace("name: resume", "name: sigterm").replace("steps: 100", "steps: 140").replace(
        "seeds: [0, 1]", "seeds: [0]").replace("at: [0.2, 1]", "at: [1]").replace("scope: [per_layer, global]",
                                                                             "scope: [per_layer]")
    text += "log_models: false\n"  # the models are not what this test checks (CI time)
    (tmp_path / "s.yaml").write_text(text)
    proc = subprocess.Popen(sweep_cmd("s.yaml"), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if "train:" in line:  # Ray is up and the train stage's trials are starting: stop once one has a checkpoint
            deadline = time.time() + 240
            while time.time() < deadline and not _checkpointed(tmp_path, "sigterm"):
                time.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            break
    rest, _ = proc.communicate(timeout=120)
    log = "".join(lines) + rest
    assert proc.returncode == 130, log[-3000:]
    c = client(tmp_path)
    parents, children = split(runs_of(c, "sigterm"))
    assert [p.info.status for p in parents] == ["KILLED"], log[-3000:]
    assert all(r.info.status != "RUNNING" for r in children)
    damaged = {x.info.run_id: x for x in children if x.info.status != "FINISHED" and "headroom.checkpoint" in x.data.tags}
    assert damaged, "no stopped trial had a checkpoint to damage:\n" + log[-3000:]
    for x in damaged.values():
        f = Path(x.data.tags["headroom.checkpoint"].removeprefix("file://")) / "checkpoint"
        os.truncate(f, f.stat().st_size // 2)
    resumed_at = time.time() * 1000
    r = run_sweep(tmp_path, "s.yaml", "--resume")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    parents, children = split(runs_of(c, "sigterm"))
    assert sorted(p.info.status for p in parents) == ["FINISHED"]
    assert len({ch.data.tags["headroom.key"] for ch in children if ch.info.status == "FINISHED"}) == 4
    assert len(children) == 4  # no unit got a second run
    for rid, before in damaged.items():
        said = [line for line in (r.stdout + r.stderr).splitlines() if "checkpoint is damaged" in line]
        assert any(before.info.run_name in line for line in said), (r.stdout + r.stderr)[-3000:]
        x = c.get_run(rid)
        assert x.info.status == "FINISHED" and x.data.metrics.get("resumed_at_step", 0) == 0
        assert "checkpoint" in x.data.tags["headroom.restarted"]  # why, on the run itself
        hist = c.get_metric_history(rid, "train/loss")
        steps = list(range(1, int(x.data.params["steps"]) + 1))
        # the restarted attempt logged every step once, from step 1, beside the stopped attempt's rows (MLflow
        # keeps both); a reader's one row per step is the restarted attempt's
        assert sorted(m.step for m in hist if m.timestamp >= resumed_at) == steps
        old = {m.step for m in hist if m.timestamp < resumed_at}
        assert old and max(old) < steps[-1]
        newest = {(m.step, m.value) for m in hist if m.timestamp >= resumed_at}
        assert set(newest_per_step(hist)) == newest


def _checkpointed(cwd, sweep: str) -> bool:
    """Whether some unfinished train unit of `sweep` has a checkpoint tagged (MLflow's tables may not exist yet)."""
    try:
        _, children = split(runs_of(client(cwd), sweep))
    except Exception:
        return False
    return any(x.info.status == "RUNNING" and "headroom.checkpoint" in x.data.tags
               and x.data.tags["headroom.stage"] == "train" for x in children)
