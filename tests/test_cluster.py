"""A real Ray cluster on loopback — `ray start --head` plus a second `ray start --address` worker node, token
auth on — and a real `mlflow server`; the smoke sweep submitted with `ray job submit`, as a user on a cluster
would. Every process the test starts is stopped at the end."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, seconds: float = 120, headers: dict | None = None) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=3).read()
            return
        except Exception:
            time.sleep(0.5)
    raise AssertionError(f"{url} did not answer within {seconds} s")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, cache_dir):
    work = tmp_path_factory.mktemp("cluster")
    temp_dir = tempfile.mkdtemp(prefix="hr-ray-", dir="/tmp")  # short: Ray's socket paths have a length limit
    worker_temp = tempfile.mkdtemp(prefix="hr-rayw-", dir="/tmp")
    token = secrets.token_hex(32)
    gcs, dash, mlflow_port = free_port(), free_port(), free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token, "RAY_USAGE_STATS_ENABLED": "0",
           "PATH": f"{BIN}:{os.environ['PATH']}"}
    env.pop("RAY_ADDRESS", None)
    common = ["--num-cpus", "1", "--object-store-memory", str(100 * 1024 * 1024), "--node-ip-address", "127.0.0.1",
              "--disable-usage-stats"]
    procs: list[subprocess.Popen] = []
    started_head = False
    try:
        # the MLflow server starts while the Ray nodes do
        backend = f"sqlite:///{work / 'mlflow-server.db'}"
        log = open(work / "mlflow-server.log", "w")
        procs.append(subprocess.Popen(
            [BIN / "mlflow", "server", "--host", "127.0.0.1", "--port", str(mlflow_port), "--backend-store-uri",
             backend, "--artifacts-destination", str(work / "artifacts"), "--workers", "1"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        r = subprocess.run([BIN / "ray", "start", "--head", "--port", str(gcs), "--dashboard-host", "127.0.0.1",
                            "--dashboard-port", str(dash), "--temp-dir", temp_dir, *common],
                           env=env, capture_output=True, text=True, timeout=180)
        started_head = True
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        # its own temp dir: two raylets on one machine must not share (and garbage-collect) runtime_resources/
        r = subprocess.run([BIN / "ray", "start", "--address", f"127.0.0.1:{gcs}", "--temp-dir", worker_temp, *common],
                           env=env, capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        wait_http(f"http://127.0.0.1:{mlflow_port}/health")
        wait_http(f"http://127.0.0.1:{dash}/api/version", headers={"Authorization": f"Bearer {token}"})
        yield {"env": env, "dash": f"http://127.0.0.1:{dash}", "mlflow": f"http://127.0.0.1:{mlflow_port}",
               "work": work, "gcs": gcs}
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, 15)
                p.wait(30)
            except Exception:
                os.killpg(p.pid, 9)
        if started_head:
            subprocess.run([BIN / "ray", "stop", "--force", "--grace-period", "2"], env=env, capture_output=True,
                           timeout=120)
        shutil.rmtree(temp_dir, ignore_errors=True)
        shutil.rmtree(worker_temp, ignore_errors=True)


def test_cluster_has_two_nodes_and_demands_the_token(cluster):
    import json

    r = subprocess.run([BIN / "ray", "list", "nodes", "--address", f"127.0.0.1:{cluster['gcs']}", "--format", "json"],
                       env=cluster["env"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    nodes = [n for n in json.loads(r.stdout) if n["state"] == "ALIVE"]
    assert len(nodes) == 2
    # the job API refuses a caller without the token
    anon = {k: v for k, v in cluster["env"].items() if k not in ("RAY_AUTH_TOKEN",)}
    anon["RAY_AUTH_MODE"] = "disabled"
    r = subprocess.run([BIN / "ray", "job", "list", "--address", cluster["dash"]], env=anon, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0


def test_smoke_sweep_submitted_as_a_ray_job_lands_on_the_mlflow_server(cluster):
    storage = cluster["work"] / "storage"
    sid = f"headroom-smoke-{secrets.token_hex(4)}"
    entry = (f"headroom sweep sweeps/smoke.yaml --tracking-uri {cluster['mlflow']} --storage {storage}")
    r = subprocess.run([BIN / "ray", "job", "submit", "--address", cluster["dash"], "--submission-id", sid,
                        "--working-dir", str(ROOT), "--", *entry.split()],
                       env=cluster["env"], capture_output=True, text=True, timeout=900)
    status = subprocess.run([BIN / "ray", "job", "status", "--address", cluster["dash"], sid], env=cluster["env"],
                            capture_output=True, text=True, timeout=120)
    assert f"Job '{sid}' succeeded" in status.stdout, r.stdout[-4000:] + r.stderr[-2000:] + status.stdout
    assert "mean final loss" in r.stdout  # the driver's summary, in the job's log

    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=cluster["mlflow"])
    exp = c.get_experiment_by_name("smoke")
    runs = list(c.search_runs([exp.experiment_id], max_results=1000))
    parents = [x for x in runs if x.data.tags.get("headroom.role") == "parent"]
    children = [x for x in runs if "mlflow.parentRunId" in x.data.tags]
    # 16 lr candidates (2 architectures), 24 trained (2 budgets), 32 pruned (2 budgets × 2 timings)
    assert len(parents) == 1 and len(children) == 72
    assert all(x.info.status == "FINISHED" for x in runs)
    pruned = [x for x in children
              if x.data.tags["headroom.arm"] == "pruned" and x.data.tags["headroom.prune_at"] == "1"]
    # artifacts went through the server's proxied artifact store
    files = {a.path for a in c.list_artifacts(pruned[0].info.run_id)}
    assert {"scores.json", "scores.png", "prune_curve.png"} <= files
    assert any((cluster["work"] / "artifacts").rglob("scores.png"))
    # checkpoints of the train stage sit in the storage path both nodes share
    assert any(storage.glob("smoke-*-train-*/*/checkpoint_*"))
    # and the trials (Tune's function actors) ran on both nodes
    import json

    r = subprocess.run([BIN / "ray", "list", "actors", "--address", f"127.0.0.1:{cluster['gcs']}", "--filter",
                        "class_name=ImplicitFunc", "--detail", "--format", "json", "--limit", "1000"],
                       env=cluster["env"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len({a["address"]["node_id"] if "address" in a else a["node_id"] for a in json.loads(r.stdout)}) == 2
