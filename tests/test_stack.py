"""The production MLflow configuration, executed (benchmarks/stack.py, one for the session): PostgreSQL 15 and an
S3 server with IAM enforced on loopback, and the MLflow server started with exactly the command, arguments and
environment of the rendered `k8s/base/mlflow.yaml` (read from the manifest; only the Services' host names become
loopback addresses and the Secrets' values are generated). Basic auth, runs and users in PostgreSQL, artifacts
proxied to S3; the sweep user and the Tune-bucket user the setup Jobs create."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
import urllib.error
import urllib.request
from base64 import b64encode
from pathlib import Path

import pytest
from conftest import ROOT
from loopback import free_port
from stack import K8S, PG_BIN


def _get(url: str, auth: tuple[str, str] | None = None) -> int:
    req = urllib.request.Request(url)
    if auth:
        req.add_header("Authorization", "Basic " + b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


# ------------------------------------------------------------------------------------------------ the tests


def test_the_manifests_mlflow_starts_with_auth_on_postgres_and_s3(stack, tmp_path, monkeypatch):
    url, admin = stack.mlflow.url, stack.mlflow.admin
    search = f"{url}/api/2.0/mlflow/experiments/search?max_results=1"
    assert _get(search) == 401  # basic auth is on
    assert _get(search, ("admin", "wrong")) == 401
    assert _get(search, admin) == 200
    # a run through the authenticated server: its record lands in PostgreSQL, its artifact in S3 (proxied)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", admin[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", admin[1])
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "MLFLOW_S3_ENDPOINT_URL"):
        monkeypatch.delenv(k, raising=False)  # the client needs no S3 credentials: the server proxies
    from orchestration.running.runstore import mlflow_client

    c = mlflow_client(url)  # headroom's client: artifacts through the server (test below)
    exp = c.create_experiment("stack-check")
    run = c.create_run(exp)
    c.log_metric(run.info.run_id, "final/id/loss", 1.25)
    (tmp_path / "note.txt").write_text("proxied")
    c.log_artifact(run.info.run_id, str(tmp_path / "note.txt"))
    c.set_terminated(run.info.run_id)
    got = Path(c.download_artifacts(run.info.run_id, "note.txt", str(tmp_path / "back")))
    assert got.read_text() == "proxied"
    root = stack.s3.client("s3", stack.s3.root_keys)
    keys = [o["Key"] for o in root.list_objects_v2(Bucket="mlflow-artifacts").get("Contents", [])]
    assert any(k.endswith("/note.txt") for k in keys), keys
    out = subprocess.run([str(PG_BIN / "psql"), "-At", "-d", "mlflow", "-c",
                          f"select value from metrics where run_uuid = '{run.info.run_id}'"],
                         env=stack.postgres.env, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "1.25"
    users = subprocess.run([str(PG_BIN / "psql"), "-At", "-d", "mlflow_auth", "-c", "select username from users"],
                           env=stack.postgres.env, capture_output=True, text=True, timeout=60, check=True)
    assert "admin" in users.stdout.split()


def test_without_its_secret_key_basic_auth_refuses_to_start(stack, tmp_path):
    """The defect the manifest had: no MLFLOW_FLASK_SERVER_SECRET_KEY, and the server does not come up."""
    env = {k: v for k, v in stack.mlflow.env.items() if k != "MLFLOW_FLASK_SERVER_SECRET_KEY"}
    port = free_port()
    args = [a if not a.startswith("--port=") else f"--port={port}" for a in stack.mlflow.args]
    args = [a if not a.startswith("--allowed-hosts=") else f"--allowed-hosts=127.0.0.1:{port}" for a in args]
    r = subprocess.run([str(Path(sys.executable).parent / "mlflow"), *args], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "MLFLOW_FLASK_SERVER_SECRET_KEY" in (r.stdout + r.stderr)


def test_missing_or_wrong_credentials_stop_headroom_before_anything_starts(stack, tmp_path, monkeypatch):
    """One line, exit 2, nothing started or written: no Ray results, no experiment or run on the server (the
    session's stack is shared: what it held before is what it holds after)."""
    from orchestration.running.runstore import mlflow_client

    url = stack.mlflow.url

    def held() -> list:
        with monkeypatch.context() as m:
            m.setenv("MLFLOW_TRACKING_USERNAME", stack.mlflow.admin[0])
            m.setenv("MLFLOW_TRACKING_PASSWORD", stack.mlflow.admin[1])
            c = mlflow_client(url)
            exps = c.search_experiments()
            return sorted((e.name, len(c.search_runs([e.experiment_id], max_results=5000))) for e in exps)

    before = held()
    base = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_")}
    cases = [({}, "requires a login"),
             ({"MLFLOW_TRACKING_USERNAME": "admin", "MLFLOW_TRACKING_PASSWORD": "wrong"}, "credentials rejected")]
    for creds, needle in cases:
        for argv in (["sweep", str(ROOT / "sweeps" / "smoke.yaml")], ["report", "--sweep", "smoke"]):
            r = subprocess.run([sys.executable, "-m", "orchestration.cli", *argv, "--tracking-uri", url],
                               cwd=tmp_path, env={**base, **creds}, capture_output=True, text=True, timeout=300)
            lines = r.stderr.strip().splitlines()
            assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], (argv, creds, r.stderr[-2000:])
    assert list(tmp_path.iterdir()) == []
    assert held() == before


def test_the_image_installs_what_this_server_needed():
    """The server above ran with this environment's packages; the image must install the same ones: MLflow with
    its auth extra, psycopg 3 (what SQLAlchemy 2.1 uses for postgresql://; psycopg2 is not enough), boto3."""
    import re

    text = (K8S / "images" / "mlflow.Dockerfile").read_text()
    pins = dict(re.findall(r"'?([a-zA-Z0-9_-]+(?:\[[\w,]+\])?)==([\w.]+)'?", text))
    assert {"mlflow[auth]", "psycopg[binary]", "boto3"} <= set(pins), pins
    assert not any(name.startswith("psycopg2") for name in pins)
    from sqlalchemy.dialects import registry

    assert registry.load("postgresql").driver == "psycopg"  # the driver postgresql:// resolves to


def test_the_auth_config_names_the_manifests_auth_database(stack):
    cfg = configparser.ConfigParser()
    cfg.read(stack.mlflow.cfg / "basic_auth.ini")
    assert cfg["mlflow"]["database_uri"].endswith("/mlflow_auth")
    assert cfg["mlflow"]["default_permission"] == "READ"
    # MLflow reads the credential cache's lifetime from it: a sweep's requests skip the scrypt check within it
    from mlflow.server.auth.config import read_auth_config

    os.environ["MLFLOW_AUTH_CONFIG_PATH"] = str(stack.mlflow.cfg / "basic_auth.ini")
    try:
        assert read_auth_config().auth_cache_ttl_seconds == 60
    finally:
        del os.environ["MLFLOW_AUTH_CONFIG_PATH"]


def test_the_sweep_user_logs_runs_but_is_no_admin(stack, monkeypatch):
    """The user the Job mlflow-users creates (its script ran at stack start, with the Job's env): it logs in, creates
    an experiment and a run (it manages what it creates), and may not manage users. The script run again keeps
    one user and resets its password to the Secret's."""
    from mlflow.exceptions import MlflowException
    from mlflow.server import get_app_client

    url, login = stack.mlflow.url, stack.sweep_login
    assert login[0] != stack.mlflow.admin[0]
    assert _get(f"{url}/api/2.0/mlflow/experiments/search?max_results=1", login) == 200
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", login[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", login[1])
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=url)
    run = c.create_run(c.create_experiment("sweep-user-check"))
    c.log_metric(run.info.run_id, "train/loss", 2.0, step=1)
    c.set_terminated(run.info.run_id)
    auth = get_app_client("basic-auth", tracking_uri=url)
    with pytest.raises(MlflowException, match="403"):
        auth.create_user("intruder", "intruder-password")
    assert "exists" in stack.mlflow.create_sweep_user()
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", stack.mlflow.admin[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", stack.mlflow.admin[1])
    user = get_app_client("basic-auth", tracking_uri=url).get_user(login[0])
    assert user.is_admin is False
    assert _get(f"{url}/api/2.0/mlflow/experiments/search?max_results=1", login) == 200


def test_the_tune_user_reaches_the_tune_bucket_and_nothing_else(stack):
    """The keys every Ray pod gets (minio-tune-credentials), with the policy of files/minio-tune-policy.json that
    the bucket Job attaches, enforced by the server: the Tune bucket read and written, MLflow's artifacts not."""
    from botocore.exceptions import ClientError

    tune = stack.s3.client("s3", stack.s3.tune_keys)
    tune.put_object(Bucket="headroom-tune", Key="policy-check/x", Body=b"tune")
    assert tune.get_object(Bucket="headroom-tune", Key="policy-check/x")["Body"].read() == b"tune"
    assert [o["Key"] for o in tune.list_objects_v2(Bucket="headroom-tune", Prefix="policy-check/")["Contents"]] \
        == ["policy-check/x"]
    tune.delete_object(Bucket="headroom-tune", Key="policy-check/x")
    root = stack.s3.client("s3", stack.s3.root_keys)
    root.put_object(Bucket="mlflow-artifacts", Key="policy-check/secret", Body=b"artifact")
    for call in (lambda: tune.list_objects_v2(Bucket="mlflow-artifacts"),
                 lambda: tune.get_object(Bucket="mlflow-artifacts", Key="policy-check/secret"),
                 lambda: tune.put_object(Bucket="mlflow-artifacts", Key="policy-check/y", Body=b"no"),
                 lambda: tune.create_bucket(Bucket="another-bucket")):
        with pytest.raises(ClientError, match="AccessDenied"):
            call()
    with pytest.raises(ClientError, match="InvalidAccessKeyId|SignatureDoesNotMatch"):
        stack.s3.client("s3", {**stack.s3.tune_keys, "secret-key": "wrong"}).list_objects_v2(Bucket="headroom-tune")


def test_a_restarted_s3_server_keeps_what_it_stored(stack):
    """What the fault campaign's S3 restarts rely on (MinIO keeps its data on a volume)."""
    root = stack.s3.client("s3", stack.s3.root_keys)
    body = os.urandom(200_000)
    root.put_object(Bucket="headroom-tune", Key="restart-check/blob", Body=body)
    stack.s3.stop()
    stack.s3.start()
    assert root.get_object(Bucket="headroom-tune", Key="restart-check/blob")["Body"].read() == body
    # users, keys and policies too
    tune = stack.s3.client("s3", stack.s3.tune_keys)
    assert tune.get_object(Bucket="headroom-tune", Key="restart-check/blob")["Body"].read() == body
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError, match="AccessDenied"):
        tune.list_objects_v2(Bucket="mlflow-artifacts")


def test_headroom_takes_artifacts_through_the_server_not_from_the_object_store(stack, tmp_path, monkeypatch):
    """A server proxying S3 tells MLflow 3.17's clients to fetch artifacts from the object store with presigned URLs:
    on Kubernetes, http://minio:9000, which a laptop behind `kubectl port-forward svc/mlflow` cannot reach.
    headroom's client (sweep driver and report alike) downloads through the server."""
    import json as json_

    from orchestration.running.runstore import PROXY_DOWNLOAD_ENV, mlflow_client

    monkeypatch.delenv(PROXY_DOWNLOAD_ENV, raising=False)
    login = stack.sweep_login
    req = urllib.request.Request(f"{stack.mlflow.url}/api/3.0/mlflow/server-info")
    req.add_header("Authorization", "Basic " + b64encode(f"{login[0]}:{login[1]}".encode()).decode())
    info = json_.loads(urllib.request.urlopen(req, timeout=10).read())
    assert info["multipart_downloads_enabled"] is True  # what the server advertises: the setting matters
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", login[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", login[1])
    c = mlflow_client(stack.mlflow.url)
    run = c.create_run(c.create_experiment("proxied-download-check"))
    (tmp_path / "verdict.json").write_text('{"ok": true}')
    c.log_artifact(run.info.run_id, str(tmp_path / "verdict.json"))
    repo_uri = c.get_run(run.info.run_id).info.artifact_uri
    from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

    monkeypatch.setenv("MLFLOW_TRACKING_URI", stack.mlflow.url)
    assert get_artifact_repository(repo_uri)._is_multipart_download_enabled() is False
    got = Path(c.download_artifacts(run.info.run_id, "verdict.json", str(tmp_path / "back")))
    assert json_.loads(got.read_text()) == {"ok": True}
