"""k8s/ validated without a cluster: every overlay and job renders with `kubectl kustomize`; core objects validate
against the Kubernetes schemas (kubernetes-validate, strict); RayCluster and RayJob against the KubeRay v1.7.0
CRDs with unknown fields forbidden; the jobs, volumes, network policy and overlays; README's steps against the
manifests; the Ray pods' logins. The manifests' security invariants are in test_k8s_invariants.py, the images and
their locks in test_images.py."""

from __future__ import annotations

import copy
import re
import shlex
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

K8S = ROOT / "k8s"
CRDS = ROOT.parent / "shared" / "k8s-crds"  # ../shared beside the repository; never copied into it
TARGETS = ["overlays/dev", "overlays/gpu", "jobs/quickstart", "jobs/scales", "jobs/scales/staging"]
KUBERNETES_VERSION = "1.32.0"
RAY_KINDS = {"RayCluster": "ray.io_rayclusters.yaml", "RayJob": "ray.io_rayjobs.yaml"}

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with kustomize) is not installed")


@cache
def render(target: str) -> tuple:
    r = subprocess.run(["kubectl", "kustomize", str(K8S / target)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{target}: {r.stderr}"
    return tuple(d for d in yaml.safe_load_all(r.stdout) if d)


def all_objects():
    for t in TARGETS:
        for obj in render(t):
            yield t, obj


def pod_specs(obj):
    """(where, pod spec) of every pod an object makes, RayCluster and RayJob templates included."""
    kind, spec = obj["kind"], obj.get("spec", {})
    name = f"{kind}/{obj['metadata']['name']}"
    if kind in ("Deployment", "StatefulSet", "Job"):
        yield name, spec["template"]["spec"]
    cluster = spec if kind == "RayCluster" else spec.get("rayClusterSpec") if kind == "RayJob" else None
    if cluster:
        yield f"{name} head", cluster["headGroupSpec"]["template"]["spec"]
        for g in cluster.get("workerGroupSpecs", []):
            yield f"{name} worker {g['groupName']}", g["template"]["spec"]
    if kind == "RayJob" and spec.get("submitterPodTemplate"):
        yield f"{name} submitter", spec["submitterPodTemplate"]["spec"]


def containers(pod):
    return pod.get("initContainers", []) + pod["containers"]


# ------------------------------------------------------------------------------------------ render + schemas


@pytest.mark.parametrize("target", TARGETS)
def test_every_overlay_and_job_renders(target):
    kinds = [o["kind"] for o in render(target)]
    assert kinds, target
    if target.startswith("overlays/"):
        assert {"RayCluster", "Deployment", "StatefulSet", "Service", "Job", "NetworkPolicy", "Namespace"} <= set(kinds)
    elif target.startswith("jobs/") and not target.endswith("staging"):
        assert kinds == ["RayJob"]


def test_core_objects_validate_against_the_kubernetes_schemas():
    import kubernetes_validate

    n = 0
    for target, obj in all_objects():
        if obj["kind"] in RAY_KINDS:
            continue
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{target} {obj['kind']}/{obj['metadata']['name']}: {e.message} at {list(e.path)}")
        n += 1
    assert n >= 20


def _closed(schema):
    """The CRD schema with additionalProperties: false on every object that lists its properties and does not
    carry x-kubernetes-preserve-unknown-fields (the CRDs allow unknown keys, so a typo would pass)."""
    if isinstance(schema, dict):
        out = {k: _closed(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_closed(v) for v in schema]
    return schema


@cache
def crd_validator(kind: str):
    import jsonschema

    crd = yaml.safe_load((CRDS / RAY_KINDS[kind]).read_text())
    v1 = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema = _closed(copy.deepcopy(v1["schema"]["openAPIV3Schema"]))
    # metadata is validated by the API server, not by the CRD: a name and labels suffice here
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema)


needs_crds = pytest.mark.skipif(not CRDS.is_dir(), reason=f"KubeRay CRDs not found at {CRDS} (../shared/k8s-crds)")


@needs_crds
def test_ray_objects_validate_against_the_kuberay_crds_with_unknown_fields_forbidden():
    n = 0
    for target, obj in all_objects():
        if obj["kind"] in RAY_KINDS:
            errors = sorted(crd_validator(obj["kind"]).iter_errors(obj), key=lambda e: list(e.path))
            assert not errors, f"{target} {obj['kind']}: " + "; ".join(
                f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors[:5])
            n += 1
    assert n == 4  # the RayCluster of each overlay, and two RayJobs


@needs_crds
def test_a_misspelled_field_fails_the_crd_check():
    cluster = next(o for o in render("overlays/dev") if o["kind"] == "RayCluster")
    job = next(o for o in render("jobs/quickstart") if o["kind"] == "RayJob")
    bad = copy.deepcopy(cluster)
    bad["spec"]["enableInTreeAutoscalling"] = bad["spec"].pop("enableInTreeAutoscaling")
    assert crd_validator("RayCluster").is_valid(cluster)
    assert not crd_validator("RayCluster").is_valid(bad)
    bad = copy.deepcopy(cluster)
    bad["spec"]["workerGroupSpecs"][0]["maxReplica"] = bad["spec"]["workerGroupSpecs"][0].pop("maxReplicas")
    assert not crd_validator("RayCluster").is_valid(bad)
    bad = copy.deepcopy(job)
    bad["spec"]["shutdownAfterJobFinish"] = bad["spec"].pop("shutdownAfterJobFinishes")
    assert crd_validator("RayJob").is_valid(job) and not crd_validator("RayJob").is_valid(bad)
    bad = copy.deepcopy(job)
    bad["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    assert not crd_validator("RayJob").is_valid(bad)


def _mlflow_service():
    objs = render("overlays/dev")
    svc = next(o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == "mlflow")
    dep = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "mlflow")
    return svc, dep


def test_jobs_run_a_valid_sweep_against_the_mlflow_service():
    from orchestration.design.spec import load_sweep

    svc, dep = _mlflow_service()
    ns = svc["metadata"]["namespace"]
    name, port = svc["metadata"]["name"], svc["spec"]["ports"][0]["port"]
    hosts = {name, f"{name}.{ns}", f"{name}.{ns}.svc", f"{name}.{ns}.svc.cluster.local"}
    allowed = next(a.split("=", 1)[1] for a in dep["spec"]["template"]["spec"]["containers"][0]["args"]
                   if a.startswith("--allowed-hosts=")).split(",")
    jobs = [o for t in ("jobs/quickstart", "jobs/scales") for o in render(t)]
    assert [j["metadata"]["name"] for j in jobs] == ["headroom-quickstart", "headroom-scales"]
    for job in jobs:
        assert job["metadata"]["namespace"] == ns
        spec = job["spec"]
        assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] > 0
        argv = shlex.split(spec["entrypoint"])
        assert argv[:2] == ["headroom", "sweep"]
        sweep, _ = load_sweep(ROOT / argv[2])  # exists and passes validation (exit 2 otherwise)
        assert job["metadata"]["name"] == f"headroom-{sweep.name}"
        uri = argv[argv.index("--tracking-uri") + 1]
        m = re.fullmatch(r"http://([^:/]+):(\d+)", uri)
        assert m and m.group(1) in hosts and int(m.group(2)) == port, uri
        assert f"{m.group(1)}:{port}" in allowed
        storage = argv[argv.index("--storage") + 1]
        assert storage.startswith("s3://headroom-tune/")
    # the Ray pods' MLFLOW_TRACKING_URI comes from the Secret README creates, with the same URL
    cluster = next(o for o in render("overlays/dev") if o["kind"] == "RayCluster")
    env = {e["name"]: e for e in cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]}
    ref = env["MLFLOW_TRACKING_URI"]["valueFrom"]["secretKeyRef"]
    literal = re.search(rf"create secret generic {ref['name']} .*--from-literal={ref['key']}=(\S+)", _readme_section())
    assert literal and literal.group(1) == f"http://{name}:{port}"


def test_scales_job_reads_the_staged_volume():
    job = render("jobs/scales")[0]
    pvc = next(o for o in render("jobs/scales/staging") if o["kind"] == "PersistentVolumeClaim")
    stage = next(o for o in render("jobs/scales/staging") if o["kind"] == "Job")
    cluster = job["spec"]["rayClusterSpec"]
    pods = [cluster["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in cluster["workerGroupSpecs"]]
    home = next(e["value"] for e in stage["spec"]["template"]["spec"]["containers"][0]["env"] if e["name"] == "HF_HOME")
    for pod in pods:
        claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
        assert pvc["metadata"]["name"] in claims
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert env["HF_HOME"] == home and env["HF_HUB_OFFLINE"] == "1" and env["HF_DATASETS_OFFLINE"] == "1"
    from orchestration.design.spec import load_sweep

    sweep, _ = load_sweep(ROOT / "sweeps" / "scales.yaml")
    dataset = sweep.data.source.split(":", 1)[1]
    assert f"load_dataset('{dataset}')" in " ".join(stage["spec"]["template"]["spec"]["containers"][0]["command"])
    assert any(g["template"]["spec"]["containers"][0]["resources"]["limits"].get("nvidia.com/gpu")
               for g in cluster["workerGroupSpecs"])


def test_network_policy_admits_only_ray_pods_to_mlflow():
    objs = render("overlays/dev")
    pol = next(o for o in objs if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "mlflow-ingress")
    assert pol["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "mlflow"}
    froms = [f for rule in pol["spec"]["ingress"] for f in rule["from"]]
    assert froms == [{"podSelector": {"matchLabels": {"ray.io/is-ray-node": "yes"}}},
                     {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "mlflow-users"}}}]
    users = next(o for o in objs if o["kind"] == "Job" and o["metadata"]["name"] == "mlflow-users")
    assert users["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == "mlflow-users"
    # and the selectors select something: the MLflow pods carry the label
    dep = next(o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "mlflow")
    assert dep["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == "mlflow"


def test_dev_overlay_is_cpu_only_and_gpu_overlay_scales_gpus():
    dev = next(o for o in render("overlays/dev") if o["kind"] == "RayCluster")
    gpu = next(o for o in render("overlays/gpu") if o["kind"] == "RayCluster")
    assert [g["groupName"] for g in dev["spec"]["workerGroupSpecs"]] == ["cpu"]
    g = next(g for g in gpu["spec"]["workerGroupSpecs"] if g["groupName"] == "gpu")
    assert g["minReplicas"] >= 1 and g["maxReplicas"] > g["minReplicas"]
    assert g["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    for c in (dev, gpu):
        assert c["spec"]["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
        assert c["spec"]["enableInTreeAutoscaling"] is True
        assert c["spec"]["authOptions"] == {"mode": "token", "secretName": "ray-auth"}


# --------------------------------------------------------------------------------------------- README steps


def _readme_section() -> str:
    """The steps a user follows: docs/kubernetes.md (README's "On a cluster" links there)."""
    assert "docs/kubernetes.md" in (ROOT / "README.md").read_text()
    return (ROOT / "docs" / "kubernetes.md").read_text()


def test_readme_secrets_and_names_match_the_manifests():
    sec = _readme_section()
    created = {}
    for m in re.finditer(r"kubectl -n (\S+) create secret generic (\S+) (.+)", sec):
        assert m.group(1) == "headroom"
        created[m.group(2)] = set(re.findall(r"--from-literal=([\w.-]+)=", m.group(3)))
    used: dict[str, set] = {}
    for target, obj in all_objects():
        assert obj["metadata"].get("namespace", "headroom") == "headroom" or obj["kind"] == "Namespace"
        for _, pod in pod_specs(obj):
            for c in containers(pod):
                for e in c.get("env", []):
                    ref = e.get("valueFrom", {}).get("secretKeyRef")
                    if ref:
                        used.setdefault(ref["name"], set()).add(ref["key"])
        if obj["kind"] in RAY_KINDS:
            cluster = obj["spec"] if obj["kind"] == "RayCluster" else obj["spec"]["rayClusterSpec"]
            used.setdefault(cluster["authOptions"]["secretName"], set()).add("auth_token")  # KubeRay's key
    assert created == used
    # port-forwards name Services that exist, on their ports
    objs = render("overlays/dev")
    services = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Service"}
    cluster = next(o for o in objs if o["kind"] == "RayCluster")
    head_ports = {p["containerPort"] for p in cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]}
    for name, local, remote in re.findall(r"port-forward svc/(\S+) (\d+):(\d+)", sec):
        if name == f"{cluster['metadata']['name']}-head-svc":  # the Service KubeRay makes for the head
            assert int(remote) in head_ports
        else:
            assert int(remote) in {p["port"] for p in services[name]["spec"]["ports"]}, name
    for path in re.findall(r"kubectl apply -k (k8s/[\w./-]+)", sec):
        assert (ROOT / path / "kustomization.yaml").is_file(), path
    assert "--tracking-uri http://mlflow:5000" in sec and "s3://headroom-tune/" in sec
    bucket_job = next(o for o in objs if o["kind"] == "Job" and o["metadata"]["name"] == "minio-buckets")
    script = " ".join(bucket_job["spec"]["template"]["spec"]["containers"][0]["args"])
    for bucket in ("mlflow-artifacts", "headroom-tune"):
        assert f"store/{bucket}" in script and bucket in sec


def test_mlflow_basic_auth_has_what_it_needs_to_start():
    """`--app-name basic-auth` imports Flask-WTF, which only MLflow's `auth` extra installs (read from the installed
    MLflow's own metadata), and MLflow refuses basic-auth without MLFLOW_FLASK_SERVER_SECRET_KEY."""
    from importlib.metadata import requires

    auth_extra = [r for r in requires("mlflow") or [] if "extra == \"auth\"" in r or "extra == 'auth'" in r]
    assert any(r.lower().startswith("flask-wtf") for r in auth_extra), auth_extra
    deploy = next(o for o in render("overlays/dev") if o["kind"] == "Deployment" and o["metadata"]["name"] == "mlflow")
    c = deploy["spec"]["template"]["spec"]["containers"][0]
    assert "--app-name=basic-auth" in c["args"]
    dockerfile = (K8S / "images" / "mlflow.Dockerfile").read_text()
    pins = re.findall(r"'?mlflow(\[[\w,]+\])?==([\d.]+)'?", dockerfile)
    assert pins and all("auth" in extra for extra, _ in pins), pins
    assert c["image"].endswith(":" + pins[0][1])  # the image tag is the MLflow it installs
    env = {e["name"]: e for e in c["env"]}
    ref = env["MLFLOW_FLASK_SERVER_SECRET_KEY"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "mlflow-credentials", "key": "flask-secret-key"}  # README creates it (test above)


def test_the_shared_data_volume_names_a_read_write_many_storage_class():
    pvc = next(o for o in render("jobs/scales/staging") if o["kind"] == "PersistentVolumeClaim")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"] and pvc["spec"].get("storageClassName")
    assert pvc["spec"]["storageClassName"] in _readme_section()  # documented where a user sets it


def _env(container) -> dict:
    return {e["name"]: e for e in container.get("env", [])}


def test_ray_pods_hold_their_own_logins_and_share_one_cache_volume():
    """No Ray pod sees MLflow's admin or MinIO's root (they log in as the sweep user and the Tune-bucket user the
    setup Jobs create from the same Secrets), and HEADROOM_CACHE lies on the one ReadWriteMany claim every Ray pod
    mounts (the dev overlay, on one node, uses ReadWriteOnce)."""
    admin = {"mlflow-credentials", "minio-credentials"}
    seen = 0
    for target, obj in all_objects():
        if obj["kind"] not in RAY_KINDS:
            continue
        for where, pod in pod_specs(obj):
            if where.endswith("submitter"):
                continue
            c = pod["containers"][0]
            env = _env(c)
            refs = {e["valueFrom"]["secretKeyRef"]["name"] for e in env.values() if "valueFrom" in e}
            assert refs == {"mlflow-sweep-credentials", "minio-tune-credentials"}, (target, where, refs)
            assert not refs & admin
            cache = env["HEADROOM_CACHE"]["value"]
            mount = next(m for m in c["volumeMounts"] if cache.startswith(m["mountPath"].rstrip("/") + "/"))
            vol = next(v for v in pod["volumes"] if v["name"] == mount["name"])
            assert vol.get("persistentVolumeClaim", {}).get("claimName") == "headroom-cache", (target, where)
            seen += 1
    assert seen >= 8
    base = next(o for o in render("overlays/gpu") if o["kind"] == "PersistentVolumeClaim")
    assert base["metadata"]["name"] == "headroom-cache" and base["spec"]["accessModes"] == ["ReadWriteMany"]
    assert base["spec"]["storageClassName"] in _readme_section() and "k8s/base/kustomization.yaml" in _readme_section()
    dev = next(o for o in render("overlays/dev") if o["kind"] == "PersistentVolumeClaim")
    assert dev["spec"]["accessModes"] == ["ReadWriteOnce"] and "storageClassName" not in dev["spec"]


def test_the_setup_jobs_create_the_ray_pods_logins_from_the_same_secrets():
    """The Ray pods' MinIO keys are the user the bucket Job creates and attaches the Tune policy to; their MLflow
    login is the user the mlflow-users Job creates (both scripts are executed in tests/test_cluster.py)."""
    objs = render("overlays/dev")
    jobs = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Job"}
    ray = _env(next(o for o in objs if o["kind"] == "RayCluster")["spec"]["headGroupSpec"]["template"]["spec"]
               ["containers"][0])
    buckets = jobs["minio-buckets"]["spec"]["template"]["spec"]
    env = _env(buckets["containers"][0])
    for var, key in (("TUNE_ACCESS_KEY", "AWS_ACCESS_KEY_ID"), ("TUNE_SECRET_KEY", "AWS_SECRET_ACCESS_KEY")):
        assert env[var]["valueFrom"] == ray[key]["valueFrom"]
    script = buckets["containers"][0]["args"][0]
    assert 'mc admin user add store "$TUNE_ACCESS_KEY" "$TUNE_SECRET_KEY"' in script
    assert "mc admin policy attach store headroom-tune --user \"$TUNE_ACCESS_KEY\"" in script
    policy_file = re.search(r"mc admin policy create store headroom-tune (\S+)", script).group(1)
    mount = next(m for m in buckets["containers"][0]["volumeMounts"] if policy_file.startswith(m["mountPath"]))
    cm_name = next(v for v in buckets["volumes"] if v["name"] == mount["name"])["configMap"]["name"]
    cm = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == cm_name)
    import json

    policy = json.loads(cm["data"][Path(policy_file).name])
    resources = {r for s in policy["Statement"] for r in s["Resource"]}
    assert resources == {"arn:aws:s3:::headroom-tune", "arn:aws:s3:::headroom-tune/*"}
    users = jobs["mlflow-users"]["spec"]["template"]["spec"]
    env = _env(users["containers"][0])
    assert env["SWEEP_USERNAME"]["valueFrom"] == ray["MLFLOW_TRACKING_USERNAME"]["valueFrom"]
    assert env["SWEEP_PASSWORD"]["valueFrom"] == ray["MLFLOW_TRACKING_PASSWORD"]["valueFrom"]
    assert env["MLFLOW_TRACKING_USERNAME"]["valueFrom"]["secretKeyRef"]["name"] == "mlflow-credentials"
    script = users["containers"][0]["command"][-1]
    cm_name = next(v for v in users["volumes"] if "configMap" in v)["configMap"]["name"]
    cm = next(o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == cm_name)
    assert cm["data"][Path(script).name] == (K8S / "base" / "files" / Path(script).name).read_text()
