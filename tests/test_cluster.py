"""The production configuration with Ray, executed: the session's stack (benchmarks/stack.py: PostgreSQL, S3 with
IAM enforced, MLflow with basic auth, all as k8s/ configures them) plus a Ray head and a worker node with token
auth, whose environment is the RayCluster head container's — the sweep user's MLflow login, the Tune user's S3
keys. The smoke sweep is submitted with `ray job submit` on s3:// storage while the fault campaign
(benchmarks/faults.py, at its CI size) kills a trial worker and restarts PostgreSQL and S3; then the
audit, and `headroom report` read back through the authenticated server against the local default run of the
same sweep."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(stack):
    ray = stack.start_ray()
    try:
        yield stack
    finally:
        ray.stop()
        stack.ray = None


@pytest.fixture(scope="module")
def campaign(cluster, cache_dir):
    from faults import TINY, Campaign

    c = Campaign(cluster, ROOT / "sweeps" / "smoke.yaml", n_faults=len(TINY), seed=0, kinds=TINY, gap=(3.0, 10.0),
                 say=lambda m: print(m, flush=True))  # short gaps: every fault lands before the sweep ends
    res = c.run(timeout=1500)
    res["logs"] = c.logs(c.jobs[-1])
    return res


def test_cluster_has_two_nodes_and_refuses_a_missing_or_wrong_token(cluster):
    ray = cluster.ray
    r = ray.ray("list", "nodes", "--address", ray.address, "--format", "json", timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len([n for n in json.loads(r.stdout) if n["state"] == "ALIVE"]) == 2
    assert ray.ray("job", "list", "--address", ray.dashboard).returncode == 0
    anon = {k: v for k, v in ray.env.items() if k != "RAY_AUTH_TOKEN"}
    wrong = {**ray.env, "RAY_AUTH_TOKEN": "0" * 64}
    for env in ({**anon, "RAY_AUTH_MODE": "disabled"}, anon, wrong):
        r = ray.ray("job", "list", "--address", ray.dashboard, env=env)
        assert r.returncode != 0, (env.get("RAY_AUTH_MODE"), r.stdout[-500:])
    r = ray.ray("job", "submit", "--address", ray.dashboard, "--", "true", env=wrong)
    assert r.returncode != 0


def test_the_faulted_sweep_loses_and_duplicates_nothing(campaign):
    """A trial worker killed -9; PostgreSQL and S3 restarted (the driver kill and `--resume`, a minute more, is in
    tests/test_resume.py; MLflow restarts, about 50 s more, in the full campaign)."""
    assert campaign["faults_injected"] == campaign["faults_requested"] == 3, campaign["faults"]
    assert campaign["kinds_missing"] == []
    assert {f["kind"] for f in campaign["faults"]} == {"worker", "postgres", "s3"}
    # 21 units (one a half-budget dense run) and 2 searches × 2 lr candidates
    assert campaign["units_expected"] == 25 and campaign["parent_runs"] == 1
    bad = {k: campaign[k] for k in ("units_lost", "duplicate_runs", "duplicate_steps", "missing_steps",
                                    "missing_artifacts")}
    assert bad == dict.fromkeys(bad, 0), {k: campaign[k] for k in ("lost", "duplicated", "duplicated_steps",
                                                                  "missing", "missing_files")}
    assert campaign["units_finished"] == 25 and campaign["meets_goal"] is True
    # the recovery times are samples: their median and spread, each fault's time kept
    rec = [f["recovery_s"] for f in campaign["faults"]]
    assert [s["recovery_s"] for s in campaign["samples"]] == rec and campaign["spread"]["n"] == 3
    assert campaign["median_recovery_s"] == statistics.median(rec)
    assert "mean final loss" in campaign["logs"]  # the last driver's summary, in its job's log


def test_the_report_through_the_authenticated_server_finds_the_local_runs_verdict(campaign, cluster, smoke, tmp_path):
    login = cluster.sweep_login
    env = {**os.environ, "MLFLOW_TRACKING_USERNAME": login[0], "MLFLOW_TRACKING_PASSWORD": login[1]}
    r = subprocess.run([sys.executable, "-m", "orchestration.cli", "report", "--sweep", "smoke", "--tracking-uri",
                        cluster.mlflow.url], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads((tmp_path / "reports" / "smoke" / "verdict.json").read_text())
    ref = json.loads((smoke["cwd"] / "reports" / "smoke" / "verdict.json").read_text())
    assert got["spec_hash"] == ref["spec_hash"]
    ident = lambda c: tuple(str(c.get(k)) for k in ("scale", "family", "ratio", "method", "scope", "schedule",
                                                    "control", "eval_set", "steps", "prune_at", "finetune_steps"))
    a, b = {ident(c): c for c in got["comparisons"]}, {ident(c): c for c in ref["comparisons"]}
    assert a.keys() == b.keys() and len(a) == len(got["comparisons"])
    for k in a:
        assert a[k]["verdict"] == b[k]["verdict"], k
        for f in ("dense_loss", "pruned_loss", "control_loss", "diff_mean"):
            assert a[k][f] == pytest.approx(b[k][f], abs=2e-3), (k, f)
    assert [p["verdict"] for p in got["prunable"]] == [p["verdict"] for p in ref["prunable"]]


def test_checkpoints_lie_in_s3_and_trials_ran_on_both_nodes(campaign, cluster):
    tune = cluster.s3.client("s3", cluster.s3.tune_keys)
    prefix = campaign["storage"].split("headroom-tune/", 1)[1] + "/"
    keys = [o["Key"] for page in tune.get_paginator("list_objects_v2").paginate(Bucket="headroom-tune", Prefix=prefix)
            for o in page.get("Contents", [])]
    assert any("-train-" in k and "/checkpoint_" in k for k in keys), keys[:20]
    ray = cluster.ray
    r = ray.ray("list", "actors", "--address", ray.address, "--filter", "class_name=ImplicitFunc", "--detail",
                "--format", "json", "--limit", "1000", timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    nodes = {a["address"]["node_id"] if "address" in a else a["node_id"] for a in json.loads(r.stdout)}
    assert len(nodes) == 2


def test_stopping_the_stack_stops_its_own_ray_and_no_other(cluster):
    """Another Ray on the machine (a sweep running beside the tests) outlives the stack's: `ray stop --force`
    stopped every Ray of the user, and killed a running sweep's cluster this way."""
    import tempfile

    import psutil
    from loopback import free_port, ray_processes, stop_processes
    from stack import BIN

    def alive(p) -> bool:  # a zombie has exited (its parent, init here, has not reaped it yet)
        try:
            return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    other = tempfile.mkdtemp(prefix="hr-other-", dir="/tmp")
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    r = subprocess.run([str(BIN / "ray"), "start", "--head", "--port", str(free_port()), "--temp-dir", other,
                        "--num-cpus", "0", "--include-dashboard", "false", "--node-ip-address", "127.0.0.1",
                        "--disable-usage-stats"], env=env, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    try:
        theirs, ours = ray_processes([other]), cluster.ray.processes()
        assert theirs and len(ours) > len(theirs)  # two raylets, a GCS, the dashboard and the trials' workers
        cluster.ray.stop()
        assert not [p.pid for p in ours if alive(p)]
        assert all(alive(p) for p in theirs)
        assert cluster.ray.processes() == []
    finally:
        stop_processes(ray_processes([other]))
