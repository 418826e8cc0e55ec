"""The production MLflow configuration, executed: a throwaway PostgreSQL cluster and an S3-compatible server on
loopback, and the MLflow server started with exactly the command, arguments and environment of the rendered
`k8s/base/mlflow.yaml` (read from the manifest; only the Services' host names become loopback addresses and the
Secrets' values are generated). Basic auth, runs and users in PostgreSQL, artifacts proxied to S3."""

from __future__ import annotations

import configparser
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from base64 import b64encode
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

PG_BIN = Path("/usr/lib/postgresql/15/bin")
K8S = ROOT / "k8s"

pytestmark = [
    pytest.mark.skipif(not (PG_BIN / "initdb").exists(), reason=f"PostgreSQL server binaries not found in {PG_BIN}"),
    pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with kustomize) is not installed"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 60.0, proc: subprocess.Popen | None = None, log: Path | None = None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{url}: the server exited with {proc.returncode}:\n"
                                 + (log.read_text()[-4000:] if log else ""))
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"{url} did not answer in {timeout} s:\n" + (log.read_text()[-4000:] if log else ""))


def rendered(kind: str, name: str) -> dict:
    r = subprocess.run(["kubectl", "kustomize", str(K8S / "base")], capture_output=True, text=True, timeout=120,
                       check=True)
    return next(o for o in yaml.safe_load_all(r.stdout) if o and o["kind"] == kind and o["metadata"]["name"] == name)


# ------------------------------------------------------------------------------------------------ services


@pytest.fixture(scope="module")
def postgres():
    """A PostgreSQL 15 cluster on loopback with password auth, initialised as the manifest's init script does."""
    # outside pytest's private temp tree: as root, the server runs as the postgres user, who must reach it
    d = Path(tempfile.mkdtemp(prefix="headroom-pg-"))
    as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    user, password, port = "mlflow", secrets.token_hex(12), free_port()
    (d / "pw").write_text(password + "\n")
    if as_pg:
        shutil.chown(d, "postgres")
        shutil.chown(d / "pw", "postgres")
    subprocess.run([*as_pg, str(PG_BIN / "initdb"), "-D", str(d / "data"), "-U", user, "--pwfile", str(d / "pw"),
                    "--auth=scram-sha-256", "-E", "UTF8"], check=True, capture_output=True, timeout=120)
    subprocess.run([*as_pg, str(PG_BIN / "pg_ctl"), "-D", str(d / "data"), "-l", str(d / "log"), "-w", "-o",
                    f"-h 127.0.0.1 -p {port} -k {d}", "start"], check=True, capture_output=True, timeout=120)
    env = {**os.environ, "PGPASSWORD": password, "PGUSER": user, "PGHOST": "127.0.0.1", "PGPORT": str(port)}
    # the database the image creates (POSTGRES_DB) and the manifest's init SQL (the auth store's database)
    statefulset = rendered("StatefulSet", "postgres")
    db = next(e["value"] for e in statefulset["spec"]["template"]["spec"]["containers"][0]["env"]
              if e["name"] == "POSTGRES_DB")
    subprocess.run([str(PG_BIN / "createdb"), db], env=env, check=True, timeout=60)
    for sql in rendered("ConfigMap", "postgres-init")["data"].values():
        subprocess.run([str(PG_BIN.parent / "bin" / "psql"), "-v", "ON_ERROR_STOP=1", "-d", db, "-c", sql], env=env,
                       check=True, capture_output=True, timeout=60)
    yield {"host": "127.0.0.1", "port": port, "user": user, "password": password, "env": env}
    subprocess.run([*as_pg, str(PG_BIN / "pg_ctl"), "-D", str(d / "data"), "-m", "immediate", "stop"],
                   capture_output=True, timeout=60)
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """An S3-compatible server on loopback (moto's server mode) with the manifest's buckets."""
    port = free_port()
    log = tmp_path_factory.mktemp("s3") / "log"
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    wait_http(url, proc=proc, log=log)
    import boto3

    keys = {"aws_access_key_id": "headroom", "aws_secret_access_key": secrets.token_hex(12)}
    client = boto3.client("s3", endpoint_url=url, region_name="us-east-1", **keys)
    for bucket in ("mlflow-artifacts", "headroom-tune"):
        client.create_bucket(Bucket=bucket)
    yield {"url": url, "port": port, "client": client, **keys}
    proc.kill()
    proc.wait(30)


def _secret_values(s3) -> dict:
    return {("postgres-credentials", "username"): None, ("postgres-credentials", "password"): None,
            ("mlflow-credentials", "username"): "admin",
            ("mlflow-credentials", "password"): secrets.token_hex(12),
            ("mlflow-credentials", "flask-secret-key"): secrets.token_hex(32),
            ("minio-credentials", "access-key"): s3["aws_access_key_id"],
            ("minio-credentials", "secret-key"): s3["aws_secret_access_key"]}


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory, postgres, s3):
    """`mlflow` with the Deployment's args and env: Services → loopback, Secrets → generated values."""
    d = tmp_path_factory.mktemp("mlflow")
    dep = rendered("Deployment", "mlflow")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    port = free_port()
    hosts = {"postgres:5432": f"127.0.0.1:{postgres['port']}", "http://minio:9000": s3["url"]}

    def local(v: str) -> str:
        for k, new in hosts.items():
            v = v.replace(k, new)
        return v

    args = []
    for a in c["args"]:
        if a.startswith("--host="):
            a = "--host=127.0.0.1"  # loopback only
        elif a.startswith("--port="):
            a = f"--port={port}"
        elif a.startswith("--allowed-hosts="):
            a = f"--allowed-hosts=127.0.0.1:{port},localhost:{port}"
        args.append(local(a))
    values = _secret_values(s3)
    values[("postgres-credentials", "username")] = postgres["user"]
    values[("postgres-credentials", "password")] = postgres["password"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "AWS_", "PG"))}
    for e in c["env"]:
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        env[e["name"]] = values[(ref["name"], ref["key"])] if ref else local(e["value"])
    # the auth config from its ConfigMap, at the path the Deployment mounts it
    cm = rendered("ConfigMap", "mlflow-auth-config")
    mount = next(m for m in c["volumeMounts"] if m["name"] == "auth-config")["mountPath"]
    cfg_dir = d / mount.strip("/")
    cfg_dir.mkdir(parents=True)
    for name, text in cm["data"].items():
        (cfg_dir / name).write_text(local(text))
    env["MLFLOW_AUTH_CONFIG_PATH"] = str(d / env["MLFLOW_AUTH_CONFIG_PATH"].strip("/"))
    env["HOME"] = str(d)
    log = d / "log"
    cmd = [str(Path(sys.executable).parent / "mlflow"), *args]
    assert Path(c["image"]).name.split(":")[0] == "mlflow" and "--app-name=basic-auth" in args
    proc = subprocess.Popen(cmd, env=env, cwd=d, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health", timeout=120, proc=proc, log=log)
        yield {"url": url, "admin": ("admin", values[("mlflow-credentials", "password")]), "env": env, "log": log,
               "args": args, "cfg": cfg_dir}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


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


def test_the_manifests_mlflow_starts_with_auth_on_postgres_and_s3(mlflow_server, postgres, s3, tmp_path, monkeypatch):
    url = mlflow_server["url"]
    search = f"{url}/api/2.0/mlflow/experiments/search?max_results=1"
    assert _get(search) == 401  # basic auth is on
    assert _get(search, ("admin", "wrong")) == 401
    assert _get(search, mlflow_server["admin"]) == 200
    # a run through the authenticated server: its record lands in PostgreSQL, its artifact in S3 (proxied)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", mlflow_server["admin"][0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", mlflow_server["admin"][1])
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "MLFLOW_S3_ENDPOINT_URL"):
        monkeypatch.delenv(k, raising=False)  # the client needs no S3 credentials: the server proxies
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=url)
    exp = c.create_experiment("stack-check")
    run = c.create_run(exp)
    c.log_metric(run.info.run_id, "final/id/loss", 1.25)
    (tmp_path / "note.txt").write_text("proxied")
    c.log_artifact(run.info.run_id, str(tmp_path / "note.txt"))
    c.set_terminated(run.info.run_id)
    got = Path(c.download_artifacts(run.info.run_id, "note.txt", str(tmp_path / "back")))
    assert got.read_text() == "proxied"
    keys = [o["Key"] for o in s3["client"].list_objects_v2(Bucket="mlflow-artifacts").get("Contents", [])]
    assert any(k.endswith("/note.txt") for k in keys), keys
    out = subprocess.run([str(PG_BIN / "psql"), "-At", "-d", "mlflow", "-c",
                          f"select value from metrics where run_uuid = '{run.info.run_id}'"],
                         env=postgres["env"], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "1.25"
    users = subprocess.run([str(PG_BIN / "psql"), "-At", "-d", "mlflow_auth", "-c", "select username from users"],
                           env=postgres["env"], capture_output=True, text=True, timeout=60, check=True)
    assert "admin" in users.stdout.split()


def test_without_its_secret_key_basic_auth_refuses_to_start(mlflow_server, tmp_path):
    """The defect the manifest had: no MLFLOW_FLASK_SERVER_SECRET_KEY, and the server does not come up."""
    env = {k: v for k, v in mlflow_server["env"].items() if k != "MLFLOW_FLASK_SERVER_SECRET_KEY"}
    port = free_port()
    args = [a if not a.startswith("--port=") else f"--port={port}" for a in mlflow_server["args"]]
    args = [a if not a.startswith("--allowed-hosts=") else f"--allowed-hosts=127.0.0.1:{port}" for a in args]
    r = subprocess.run([str(Path(sys.executable).parent / "mlflow"), *args], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "MLFLOW_FLASK_SERVER_SECRET_KEY" in (r.stdout + r.stderr)


def test_missing_or_wrong_credentials_stop_headroom_before_anything_starts(mlflow_server, tmp_path):
    """One line, exit 2, nothing started or written: no Ray results, no experiment on the server."""
    url = mlflow_server["url"]
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
    from mlflow.tracking import MlflowClient

    os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"] = mlflow_server["admin"]
    try:
        assert MlflowClient(tracking_uri=url).get_experiment_by_name("smoke") is None
    finally:
        del os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"]


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


def test_the_auth_config_names_the_manifests_auth_database(mlflow_server):
    cfg = configparser.ConfigParser()
    cfg.read(mlflow_server["cfg"] / "basic_auth.ini")
    assert cfg["mlflow"]["database_uri"].endswith("/mlflow_auth")
    assert cfg["mlflow"]["default_permission"] == "READ"
