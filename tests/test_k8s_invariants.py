"""The manifests' invariants a deployment relies on, checked offline on the rendered k8s/ objects: no literal
credentials, cluster-internal services, pinned non-root limited containers, object stores that fit their shared
memory, headless services and probes, and Pod Security "restricted" everywhere."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from test_k8s import RAY_KINDS, all_objects, containers, pod_specs, render

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with kustomize) is not installed")


# ------------------------------------------------------------------------------------------------ invariants

CREDENTIAL = re.compile(r"PASSWORD|SECRET|TOKEN|ACCESS_KEY|_USER$|USERNAME", re.IGNORECASE)


def test_no_literal_credentials_anywhere():
    for target, obj in all_objects():
        assert obj["kind"] != "Secret", f"{target}: a Secret belongs to the user, not the manifests"
        for where, pod in pod_specs(obj):
            for c in containers(pod):
                for e in c.get("env", []):
                    if CREDENTIAL.search(e["name"]):
                        assert "valueFrom" in e and "value" not in e, f"{target} {where} {c['name']}: {e['name']}"
                for arg in c.get("args", []) + c.get("command", []):
                    assert not re.search(r"://[^/@\s]+:[^/@\s]+@", arg), f"{target} {where}: credential in {arg!r}"
        if obj["kind"] == "ConfigMap":
            for text in obj["data"].values():
                assert not re.search(r"://[^/@\s]+:[^/@\s]+@|password\s*=", text, re.IGNORECASE), target


def test_services_are_cluster_internal():
    for target, obj in all_objects():
        if obj["kind"] == "Service":
            assert obj["spec"].get("type", "ClusterIP") == "ClusterIP", target
        if obj["kind"] in RAY_KINDS:
            cluster = obj["spec"] if obj["kind"] == "RayCluster" else obj["spec"]["rayClusterSpec"]
            assert cluster["headGroupSpec"]["serviceType"] == "ClusterIP", target


def test_every_container_is_pinned_non_root_and_limited():
    seen = 0
    for target, obj in all_objects():
        for where, pod in pod_specs(obj):
            psec = pod.get("securityContext", {})
            for c in containers(pod):
                seen += 1
                tag = c["image"].rsplit("/", 1)[-1]
                assert ":" in tag and not tag.endswith(":latest"), f"{target} {where}: image {c['image']} not pinned"
                sec = {**psec, **c.get("securityContext", {})}
                assert sec.get("runAsNonRoot") is True, f"{target} {where} {c['name']}"
                assert isinstance(sec.get("runAsUser"), int) and sec["runAsUser"] > 0, f"{target} {where}"
                assert sec.get("allowPrivilegeEscalation") is False, f"{target} {where} {c['name']}"
                assert c["securityContext"]["capabilities"]["drop"] == ["ALL"], f"{target} {where}"
                assert c["securityContext"].get("readOnlyRootFilesystem") is True, f"{target} {where}"
                lim, req = c["resources"]["limits"], c["resources"]["requests"]
                assert {"cpu", "memory"} <= set(lim) and {"cpu", "memory"} <= set(req), f"{target} {where}"
                if "nvidia.com/gpu" in lim:
                    assert any(t.get("key") == "nvidia.com/gpu" for t in pod.get("tolerations", [])), where
    assert seen >= 15


def _bytes(q) -> int:
    """A Kubernetes quantity (4Gi, 512Mi, 3000000000) in bytes."""
    q = str(q)
    for suffix, f in (("Ki", 2**10), ("Mi", 2**20), ("Gi", 2**30), ("Ti", 2**40), ("k", 10**3), ("M", 10**6),
                      ("G", 10**9)):
        if q.endswith(suffix):
            return int(float(q[:-len(suffix)]) * f)
    return int(q)


def _ray_groups(obj):
    cluster = obj["spec"] if obj["kind"] == "RayCluster" else obj["spec"]["rayClusterSpec"]
    yield "head", cluster["headGroupSpec"]
    for g in cluster.get("workerGroupSpecs", []):
        yield g["groupName"], g


def test_ray_object_stores_fit_their_shared_memory_and_workers_carry_no_api_token():
    """Ray's default object store is 30% of the pod's memory; /dev/shm is a smaller memory volume: every group
    sets object-store-memory inside it. Workers run trials only and mount no service-account token."""
    seen = 0
    for target, obj in all_objects():
        if obj["kind"] not in RAY_KINDS:
            continue
        for name, g in _ray_groups(obj):
            pod = g["template"]["spec"]
            shm = next(v for v in pod["volumes"] if v["name"] == "shm")["emptyDir"]
            store = int(g["rayStartParams"]["object-store-memory"])
            assert store <= 0.9 * _bytes(shm["sizeLimit"]), (target, name, store, shm)
            if name != "head":  # the head runs the in-tree autoscaler, which talks to the API server
                assert pod.get("automountServiceAccountToken") is False, (target, name)
            seen += 1
    assert seen >= 8


def test_stateful_sets_have_headless_services_and_long_running_pods_have_probes():
    objs = render("overlays/dev")
    services = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Service"}
    for o in objs:
        if o["kind"] == "StatefulSet":
            gov = services[o["spec"]["serviceName"]]
            assert gov["spec"].get("clusterIP") == "None", o["metadata"]["name"]
            assert gov["spec"]["selector"].items() <= o["spec"]["template"]["metadata"]["labels"].items()
        if o["kind"] in ("StatefulSet", "Deployment"):
            for c in o["spec"]["template"]["spec"]["containers"]:
                assert c.get("readinessProbe") and c.get("livenessProbe"), (o["metadata"]["name"], c["name"])
    # MLflow migrates its schema at start: it waits for PostgreSQL instead of crash-looping
    mlflow = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "mlflow")
    init = mlflow["spec"]["template"]["spec"]["initContainers"]
    assert any("pg_isready -h postgres -p 5432" in " ".join(c["command"]) for c in init)


RESTRICTED_VOLUMES = {"emptyDir", "configMap", "secret", "persistentVolumeClaim", "projected", "downwardAPI", "csi",
                      "ephemeral"}


def test_the_namespace_enforces_pod_security_restricted_and_every_pod_meets_it():
    """The "restricted" profile of the Pod Security Standards, checked on every pod spec (Ray head, workers,
    submitters and autoscaler included): non-root, RuntimeDefault seccomp, no privilege escalation, every capability
    dropped, no host namespaces, allowed volume types only."""
    ns = next(o for o in render("overlays/dev") if o["kind"] == "Namespace")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    checked = 0
    for target, obj in all_objects():
        for where, pod in pod_specs(obj):
            psc = pod.get("securityContext", {})
            assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")), (target, where)
            for v in pod.get("volumes", []):
                assert set(v) - {"name"} <= RESTRICTED_VOLUMES, (target, where, v)
            for c in containers(pod):
                sc = c.get("securityContext", {})
                what = (target, where, c["name"])
                assert sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True, what
                assert sc.get("runAsUser", psc.get("runAsUser", 1)) != 0, what
                assert (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type") == "RuntimeDefault", what
                assert sc.get("allowPrivilegeEscalation") is False and not sc.get("privileged"), what
                assert "ALL" in sc.get("capabilities", {}).get("drop", []), what
                assert set(sc.get("capabilities", {}).get("add", [])) <= {"NET_BIND_SERVICE"}, what
                checked += 1
        if obj["kind"] == "RayCluster" and obj["spec"].get("enableInTreeAutoscaling"):
            asc = obj["spec"]["autoscalerOptions"]["securityContext"]  # the autoscaler sidecar KubeRay adds
            assert asc["allowPrivilegeEscalation"] is False and "ALL" in asc["capabilities"]["drop"]
    assert checked >= 15


# The scales RayJob's head runs the sweep's driver, which prepares TinyStories before the first trial
# (lightning_modules/data/prepared.py). Its memory is sized from measurements, not guessed:
#  - docs/measured/data_scale.json: `python benchmarks/data_scale.py --small-mb 200` on this project's CPU machine
#    (synthetic TinyStories-shaped corpora of 200 and 800 MB, BPE 8192): the driver's peak RSS as fixed + per GB,
#    extrapolated to TinyStories' 1.9 GB of text;
#  - VOCABULARY_MARGIN: real stories have a far larger vocabulary than the benchmark's grammar (the BPE trainer's
#    word counts grow with it), so the extrapolation is taken 1.5 times;
#  - TUNE_DRIVER_MB: the driver's peak RSS through a whole Tune sweep on the embedded data (the recovery and timing
#    sweeps, README: 0.8 GB); it follows the data preparation, whose documents are freed by then;
#  - RAY_HEAD_MB: the summed RSS of `ray start --head --num-cpus 0` with its dashboard (GCS, raylet, dashboard
#    and its modules, runtime-env agent) 25 s after start, Ray 2.60: 1585 MB;
#  - the /dev/shm volume is memory (emptyDir medium Memory): a full object store counts in the pod's limit.
MEASURED = Path(__file__).resolve().parents[1] / "docs" / "measured" / "data_scale.json"
VOCABULARY_MARGIN = 1.5
TUNE_DRIVER_MB = 800
RAY_HEAD_MB = 1585


def head_memory_needed(shm_limit: int) -> int:
    fit = json.loads(MEASURED.read_text())["driver_fit"]
    driver_mb = max(VOCABULARY_MARGIN * fit["tinystories_mb"], TUNE_DRIVER_MB)
    return int((driver_mb + RAY_HEAD_MB) * 2**20) + shm_limit


@pytest.mark.parametrize("target,kind", [("jobs/scales", "RayJob"), ("overlays/gpu", "RayCluster")])
def test_the_head_that_runs_the_scales_driver_holds_it_ray_and_a_full_object_store(target, kind):
    """Where the driver of sweeps/scales.yaml runs — the head of its RayJob, or of the long-lived GPU cluster a
    researcher submits it to with `ray job submit` — the memory request and limit hold the driver's measured peak
    on TinyStories, Ray's head processes and a full /dev/shm; and not more than twice that (a head that asks for
    far more than it needs is hard to schedule)."""
    (obj,) = [o for o in render(target) if o["kind"] == kind]
    spec = obj["spec"]["rayClusterSpec"] if kind == "RayJob" else obj["spec"]
    head = spec["headGroupSpec"]["template"]["spec"]
    shm = _bytes(next(v for v in head["volumes"] if v["name"] == "shm")["emptyDir"]["sizeLimit"])
    need = head_memory_needed(shm)
    (c,) = head["containers"]
    for kind in ("requests", "limits"):
        have = _bytes(c["resources"][kind]["memory"])
        assert need <= have <= 2 * need, (kind, have / 2**30, need / 2**30)


def test_head_memory_needed_grows_with_the_measured_driver(tmp_path, monkeypatch):
    """The check reads the measurement: a driver that needed 8 GB more would need 8 GB more of the head."""
    data = json.loads(MEASURED.read_text())
    base = head_memory_needed(0)
    data["driver_fit"]["tinystories_mb"] += 8192 / VOCABULARY_MARGIN
    fake = tmp_path / "data_scale.json"
    fake.write_text(json.dumps(data))
    monkeypatch.setattr(sys.modules[__name__], "MEASURED", fake)
    assert head_memory_needed(0) - base == pytest.approx(8192 * 2**20, rel=1e-6)
