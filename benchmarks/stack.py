"""The production configuration of k8s/, run on loopback: what tests/test_stack.py, tests/test_cluster.py and the
fault campaign (benchmarks/faults.py) run against.

- PostgreSQL 15 (the server binaries in /usr/lib/postgresql/15/bin), initialised as k8s/base/postgres.yaml does:
  the database of POSTGRES_DB and the init SQL of ConfigMap postgres-init.
- An S3 server (benchmarks/s3server.py: moto with IAM enforced, state kept across restarts) with what the Job
  minio-buckets makes: the buckets of its script, and the Tune user with files/minio-tune-policy.json.
- MLflow started with exactly the command, arguments and environment of the rendered Deployment mlflow (basic auth,
  runs and users in PostgreSQL, artifacts proxied to S3), then the Job mlflow-users' script run with that Job's
  environment: the sweep user.
- Ray: a head and a worker node with token auth, both with the environment of the RayCluster's head container —
  the sweep user's MLflow login and the Tune user's S3 keys, nothing more.

Only the Services' host names become loopback addresses and the Secrets' values are generated; everything else is
read from the rendered manifests, so the stack and k8s/ cannot drift apart. Every service can be stopped, killed
and started again, for the fault campaign."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

import yaml
from loopback import agent_ports, free_port, kill_processes, ray_processes, stop_group, stop_processes, wait_http

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "k8s"
PG_BIN = Path("/usr/lib/postgresql/15/bin")
BIN = Path(sys.executable).parent


def missing() -> str | None:
    """Why the stack cannot run on this machine, or None."""
    if not (PG_BIN / "initdb").exists():
        return f"PostgreSQL server binaries not found in {PG_BIN}"
    if shutil.which("kubectl") is None:
        return "kubectl (with kustomize) is not installed"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "runuser (to start PostgreSQL as its own user under root) is not on PATH"
    return None


@cache
def _rendered(target: str = "base") -> tuple:
    r = subprocess.run(["kubectl", "kustomize", str(K8S / target)], capture_output=True, text=True, timeout=120,
                       check=True)
    return tuple(o for o in yaml.safe_load_all(r.stdout) if o)


def manifest(kind: str, name: str) -> dict:
    return next(o for o in _rendered() if o["kind"] == kind and o["metadata"]["name"] == name)


def container_env(container: dict, values: dict, local) -> dict:
    """A manifest container's env: Secret references → `values[(secret, key)]`, literals through `local`."""
    out = {}
    for e in container.get("env", []):
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        out[e["name"]] = values[(ref["name"], ref["key"])] if ref else local(e["value"])
    return out


# ------------------------------------------------------------------------------------------------ services


class Postgres:
    """A PostgreSQL cluster on loopback with password auth, initialised as the StatefulSet's image does."""

    def __init__(self, user: str):
        # in /tmp, not under `root` (pytest's temp tree is private): as root, the server runs as the postgres user,
        # who must reach its directory
        self.dir = Path(tempfile.mkdtemp(prefix="headroom-pg-"))
        self.as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.user, self.password, self.port = user, secrets.token_hex(12), free_port()
        self.host = "127.0.0.1"

    @property
    def env(self) -> dict:
        return {**os.environ, "PGPASSWORD": self.password, "PGUSER": self.user, "PGHOST": self.host,
                "PGPORT": str(self.port)}

    def _ctl(self, *args: str) -> None:
        subprocess.run([*self.as_pg, str(PG_BIN / "pg_ctl"), "-D", str(self.dir / "data"), *args], check=True,
                       capture_output=True, timeout=120)

    def start(self) -> None:
        first = not (self.dir / "data").exists()
        if first:
            (self.dir / "pw").write_text(self.password + "\n")
            if self.as_pg:
                shutil.chown(self.dir, "postgres")
                shutil.chown(self.dir / "pw", "postgres")
            subprocess.run([*self.as_pg, str(PG_BIN / "initdb"), "-D", str(self.dir / "data"), "-U", self.user,
                            "--pwfile", str(self.dir / "pw"), "--auth=scram-sha-256", "-E", "UTF8"], check=True,
                           capture_output=True, timeout=120)
        self._ctl("-l", str(self.dir / "log"), "-w", "-o", f"-h {self.host} -p {self.port} -k {self.dir}", "start")
        if first:
            sts = manifest("StatefulSet", "postgres")
            db = next(e["value"] for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]
                      if e["name"] == "POSTGRES_DB")
            subprocess.run([str(PG_BIN / "createdb"), db], env=self.env, check=True, timeout=60)
            for sql in manifest("ConfigMap", "postgres-init")["data"].values():
                self.psql(db, sql)

    def psql(self, db: str, sql: str) -> str:
        r = subprocess.run([str(PG_BIN / "psql"), "-At", "-v", "ON_ERROR_STOP=1", "-d", db, "-c", sql],
                           env=self.env, capture_output=True, text=True, timeout=60, check=True)
        return r.stdout

    def stop(self, mode: str = "fast") -> None:
        """`fast`: a clean shutdown (what a pod's SIGTERM does); `immediate`: no shutdown checkpoint (a crash)."""
        self._ctl("-m", mode, "-w", "stop")

    def remove(self) -> None:
        try:
            self.stop("immediate")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)


class S3:
    """benchmarks/s3server.py on loopback, provisioned as the Job minio-buckets provisions MinIO."""

    def __init__(self, root: Path):
        self.dir = root / "s3"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.root_keys: dict | None = None  # minio-credentials
        self.tune_keys: dict | None = None  # minio-tune-credentials

    def start(self) -> None:
        first = not (self.dir / "state.pickle").exists()
        log = self.dir / "log"
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("s3server.py")), "--port", str(self.port), "--state",
             str(self.dir / "state.pickle")],
            stdout=log.open("a"), stderr=subprocess.STDOUT, start_new_session=True,
            env={k: v for k, v in os.environ.items() if not k.startswith("AWS_")})
        wait_http(f"{self.url}/moto-api/", proc=self.proc, log=log)
        if first:
            self._provision()

    def client(self, service: str, keys: dict):
        import boto3

        return boto3.client(service, endpoint_url=self.url, region_name="us-east-1",
                            aws_access_key_id=keys["access-key"], aws_secret_access_key=keys["secret-key"])

    def _user(self, iam, name: str, policy: dict) -> dict:
        iam.create_user(UserName=name)
        k = iam.create_access_key(UserName=name)["AccessKey"]
        iam.put_user_policy(UserName=name, PolicyName=name, PolicyDocument=json.dumps(policy))
        return {"access-key": k["AccessKeyId"], "secret-key": k["SecretAccessKey"]}

    def _provision(self) -> None:
        allow_all = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        # the server's three unsigned requests: MinIO's root user exists from the start
        self.root_keys = self._user(self.client("iam", {"access-key": "bootstrap", "secret-key": "x"}), "root",
                                    allow_all)
        # the Job minio-buckets: its buckets, and the Tune user with the policy of its ConfigMap
        job = manifest("Job", "minio-buckets")["spec"]["template"]["spec"]
        script = job["containers"][0]["args"][0]
        s3 = self.client("s3", self.root_keys)
        for line in script.splitlines():
            words = line.split()
            if words[:3] == ["mc", "mb", "--ignore-existing"]:
                s3.create_bucket(Bucket=words[3].split("/", 1)[1])
        vol = next(v for v in job["volumes"] if "configMap" in v)
        cm = manifest("ConfigMap", vol["configMap"]["name"])
        (policy,) = cm["data"].values()
        self.tune_keys = self._user(self.client("iam", self.root_keys), "headroom-tune", json.loads(policy))
        self.buckets = [b["Name"] for b in s3.list_buckets()["Buckets"]]

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """SIGTERM: the server saves its state (a restart keeps it); SIGKILL: it does not."""
        stop_group(self.proc, sig, timeout=120)


class MLflow:
    """`mlflow` with the Deployment's command, args and env: Services → loopback, Secrets → `values`."""

    def __init__(self, root: Path, hosts: dict[str, str], values: dict):
        self.dir = root / "mlflow"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.hosts, self.values = hosts, values
        self.proc: subprocess.Popen | None = None
        dep = manifest("Deployment", "mlflow")
        c = dep["spec"]["template"]["spec"]["containers"][0]
        self.image = c["image"]
        args = []
        for a in c["args"]:
            if a.startswith("--host="):
                a = "--host=127.0.0.1"  # loopback only
            elif a.startswith("--port="):
                a = f"--port={self.port}"
            elif a.startswith("--allowed-hosts="):
                a = f"--allowed-hosts=127.0.0.1:{self.port},localhost:{self.port}"
            args.append(self.local(a))
        self.args = args
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "AWS_", "PG"))}
        env.update(container_env(c, values, self.local))
        # the auth config from its ConfigMap, at the path the Deployment mounts it (under this directory)
        cm = manifest("ConfigMap", "mlflow-auth-config")
        mount = next(m for m in c["volumeMounts"] if m["name"] == "auth-config")["mountPath"]
        self.cfg = self.dir / mount.strip("/")
        self.cfg.mkdir(parents=True, exist_ok=True)
        for name, text in cm["data"].items():
            (self.cfg / name).write_text(self.local(text))
        env["MLFLOW_AUTH_CONFIG_PATH"] = str(self.dir / env["MLFLOW_AUTH_CONFIG_PATH"].strip("/"))
        env["HOME"] = str(self.dir)
        self.env = env
        self.admin = (values[("mlflow-credentials", "username")], values[("mlflow-credentials", "password")])

    def local(self, v: str) -> str:
        for k, new in self.hosts.items():
            v = v.replace(k, new)
        return v

    def start(self) -> None:
        log = self.dir / "log"
        self.proc = subprocess.Popen([str(BIN / "mlflow"), *self.args], env=self.env, cwd=self.dir,
                                     stdout=log.open("a"), stderr=subprocess.STDOUT, start_new_session=True)
        wait_http(f"{self.url}/health", timeout=180, proc=self.proc, log=log)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        stop_group(self.proc, sig)

    def create_sweep_user(self) -> str:
        """The Job mlflow-users: its script (from its ConfigMap) with its environment. Returns the script's output."""
        job = manifest("Job", "mlflow-users")["spec"]["template"]["spec"]
        c = job["containers"][0]
        vol = next(v for v in job["volumes"] if "configMap" in v)
        (name, text), = manifest("ConfigMap", vol["configMap"]["name"])["data"].items()
        script = self.dir / name
        script.write_text(text)
        assert Path(c["command"][-1]).name == name
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        env.update(container_env(c, self.values, self.local))
        env["HOME"] = str(self.dir)
        r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"the mlflow-users script failed: {r.stderr[-3000:]}")
        return r.stdout


class Ray:
    """A head and a worker node (`ray start`), token auth on, both with the RayCluster head container's env."""

    def __init__(self, root: Path, env: dict, num_cpus: int = 1, object_store: int = 100 * 1024 * 1024):
        self.work = root / "ray"
        self.work.mkdir(parents=True, exist_ok=True)
        self.token = secrets.token_hex(32)
        self.gcs, self.dash_port = free_port(), free_port()
        self.dashboard = f"http://127.0.0.1:{self.dash_port}"
        self.address = f"127.0.0.1:{self.gcs}"
        base = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "AWS_", "RAY_ADDRESS"))}
        self.env = {**base, **env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token,
                    "RAY_USAGE_STATS_ENABLED": "0", "PATH": f"{BIN}:{os.environ['PATH']}"}
        self.common = ["--num-cpus", str(num_cpus), "--object-store-memory", str(object_store),
                       "--node-ip-address", "127.0.0.1", "--disable-usage-stats"]
        self.temp_dirs: list[str] = []
        self.started = False

    def ray(self, *args: str, env: dict | None = None, timeout: int = 180) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "ray"), *args], env=env or self.env, capture_output=True, text=True,
                              timeout=timeout)

    def start(self) -> None:
        # short temp dirs (Ray's socket paths have a length limit), one per node: two raylets on one machine must
        # not share (and garbage-collect) each other's runtime_resources/
        head, worker = (tempfile.mkdtemp(prefix=p, dir="/tmp") for p in ("hr-ray-", "hr-rayw-"))
        self.temp_dirs += [head, worker]
        self.started = True
        r = self.ray("start", "--head", "--port", str(self.gcs), "--dashboard-host", "127.0.0.1",
                     "--dashboard-port", str(self.dash_port), "--temp-dir", head, *self.common, *agent_ports())
        if r.returncode != 0:
            raise RuntimeError(r.stdout[-2000:] + r.stderr[-2000:])
        r = self.ray("start", "--address", self.address, "--temp-dir", worker, *self.common, *agent_ports())
        if r.returncode != 0:
            raise RuntimeError(r.stdout[-2000:] + r.stderr[-2000:])
        wait_http(f"{self.dashboard}/api/version", headers={"Authorization": f"Bearer {self.token}"}, timeout=120)

    def processes(self) -> list:
        return ray_processes(self.temp_dirs)

    def kill(self) -> None:
        """kill -9 of both nodes and everything they started; `start()` brings up new ones on the same address,
        dashboard port and token (new temp dirs, as a restarted pod's)."""
        kill_processes(self.processes(), timeout=30)

    def stop(self) -> None:
        if self.started:
            stop_processes(self.processes())
        for d in self.temp_dirs:
            shutil.rmtree(d, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ the stack


class Stack:
    """Everything above, wired as the manifests wire it. `start()` brings up PostgreSQL, S3 and MLflow and creates
    the sweep user; `start_ray()` adds the Ray nodes."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.postgres = Postgres(user="mlflow")
        self.s3 = S3(self.root)
        self.mlflow: MLflow | None = None
        self.ray: Ray | None = None
        self.cache = self.root / "cache"  # the headroom-cache volume every Ray pod mounts
        self.values: dict = {}

    def start(self) -> None:
        self.postgres.start()
        self.s3.start()
        v = {("postgres-credentials", "username"): self.postgres.user,
             ("postgres-credentials", "password"): self.postgres.password,
             ("mlflow-credentials", "username"): "admin",
             ("mlflow-credentials", "password"): secrets.token_hex(12),
             ("mlflow-credentials", "flask-secret-key"): secrets.token_hex(32),
             ("minio-credentials", "access-key"): self.s3.root_keys["access-key"],
             ("minio-credentials", "secret-key"): self.s3.root_keys["secret-key"],
             ("minio-tune-credentials", "access-key"): self.s3.tune_keys["access-key"],
             ("minio-tune-credentials", "secret-key"): self.s3.tune_keys["secret-key"],
             ("mlflow-sweep-credentials", "username"): "headroom",
             ("mlflow-sweep-credentials", "password"): secrets.token_hex(12)}
        hosts = {"postgres:5432": f"127.0.0.1:{self.postgres.port}", "http://minio:9000": self.s3.url}
        self.mlflow = MLflow(self.root, hosts, v)
        hosts["http://mlflow:5000"] = self.mlflow.url
        v[("mlflow-sweep-credentials", "tracking-uri")] = self.mlflow.url
        self.values = v
        self.mlflow.start()
        self.mlflow.create_sweep_user()

    @property
    def sweep_login(self) -> tuple[str, str]:
        return (self.values[("mlflow-sweep-credentials", "username")],
                self.values[("mlflow-sweep-credentials", "password")])

    def ray_env(self) -> dict:
        """The RayCluster head container's env: Secrets → values, Services → loopback, paths → under root."""
        c = manifest("RayCluster", "headroom")["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
        env = container_env(c, self.values, self.mlflow.local)
        env["HOME"] = str(self.root / "home")
        env["HEADROOM_CACHE"] = str(self.cache)
        return env

    def start_ray(self) -> Ray:
        self.ray = Ray(self.root, self.ray_env())
        self.ray.start()
        return self.ray

    def stop(self) -> None:
        if self.ray is not None:
            self.ray.stop()
        if self.mlflow is not None:
            self.mlflow.stop()
        self.s3.stop(signal.SIGKILL)
        self.postgres.remove()
