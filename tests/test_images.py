"""The container images and what pins them, checked offline: pyproject pins what the images' lock files lock (and
README says so), one lock per image from the matching torch index, Ray's version in the manifests and the image
base, the images run as a numeric non-root user, and the image's install script in a fresh virtual environment."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import ROOT
from test_k8s import K8S, RAY_KINDS, _readme_section, all_objects, containers, pod_specs

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with kustomize) is not installed")


def _lock(kind: str) -> dict[str, str]:
    """name (normalised) -> pinned version of k8s/images/requirements-<kind>.lock."""
    out = {}
    for line in (K8S / "images" / f"requirements-{kind}.lock").read_text().splitlines():
        if line.strip() and not line.startswith(("#", "--")):
            name, version = line.split("==")
            out[re.sub(r"\[.*\]", "", name).lower().replace("_", "-")] = version
    return out


def _lock_ray() -> str:
    rays = {_lock(k)["ray"] for k in ("cpu", "gpu")}
    assert len(rays) == 1, rays
    return rays.pop()


def test_pyproject_pins_what_the_images_lock():
    """README's install and CI's resolve from pyproject: the packages it pins are the lock files' versions, so the
    suite, a newcomer's install and the images run the same torch, Lightning, transformers, Ray and MLflow."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = {re.sub(r"\[.*\]", "", d.split("==")[0]).lower(): d.split("==")[1] for d in deps if "==" in d}
    assert set(pins) == {"torch", "pytorch-lightning", "transformers", "ray", "mlflow"}
    for kind in ("cpu", "gpu"):
        lock = _lock(kind)
        assert {n: lock[n].split("+")[0] for n in pins} == pins, kind
    # the versions README says the suite last passed with
    for name, version in pins.items():
        assert f"{name} {version}" in (ROOT / "README.md").read_text(), name


def test_one_lock_per_image_from_the_matching_torch_index():
    """The CPU image's lock takes torch from PyTorch's CPU index and holds no CUDA runtime and no triton; the GPU
    image's takes PyPI's torch (built for CUDA 13.0) with every CUDA wheel pinned to that one major version; both
    pin everything else alike. The GPU image is the same CPU base: the CUDA runtime comes from the lock only."""
    cpu, gpu = _lock("cpu"), _lock("gpu")
    cuda = re.compile(r"^(nvidia-|cuda-|triton$)")
    assert not [n for n in cpu if cuda.match(n)]
    assert cpu["torch"] == "2.13.0+cpu"
    head = (K8S / "images" / "requirements-cpu.lock").read_text()
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in head.splitlines()
    assert gpu["torch"] == "2.13.0" and "--extra-index-url" not in (K8S / "images" / "requirements-gpu.lock").read_text()
    extra = {n: v for n, v in gpu.items() if n not in cpu}
    assert {"nvidia-cuda-runtime", "cuda-toolkit", "nvidia-cudnn-cu13", "nvidia-nccl-cu13", "triton"} <= set(extra)
    assert all(cuda.match(n) for n in extra), extra
    assert extra["nvidia-cuda-runtime"].split(".")[0] == extra["cuda-toolkit"].split(".")[0] == "13"
    assert not [n for n in extra if re.search(r"-cu(\d+)$", n) and not n.endswith("-cu13")]
    assert {n: v for n, v in gpu.items() if n in cpu and n != "torch"} == {n: v for n, v in cpu.items() if n != "torch"}
    dockerfile = (K8S / "images" / "headroom.Dockerfile").read_text()
    assert re.search(r"^ARG BASE=rayproject/ray:[\w.]+-py311-cpu$", dockerfile, re.MULTILINE)  # no CUDA of its own
    assert "--build-arg LOCK=requirements-gpu.lock" in dockerfile and "--build-arg BASE" not in dockerfile
    assert re.search(r"NVIDIA_DRIVER_CAPABILITIES=compute,utility", dockerfile)
    assert "driver" in _readme_section() and "580" in _readme_section()


def test_ray_version_matches_the_lock_and_the_image_base():
    ray = _lock_ray()
    for target, obj in all_objects():
        if obj["kind"] in RAY_KINDS:
            cluster = obj["spec"] if obj["kind"] == "RayCluster" else obj["spec"]["rayClusterSpec"]
            assert cluster["rayVersion"] == ray, target
    base = re.search(r"^ARG BASE=rayproject/ray:([\w.]+)-", (K8S / "images" / "headroom.Dockerfile").read_text(), re.MULTILINE)
    assert base.group(1) == ray


def test_images_run_the_install_script_as_a_numeric_non_root_user():
    for name in ("headroom.Dockerfile", "mlflow.Dockerfile"):
        text = (K8S / "images" / name).read_text()
        users = re.findall(r"^USER (\S+)", text, re.MULTILINE)
        assert users and re.fullmatch(r"[1-9]\d*(:\d+)?", users[-1]), (name, users)
    text = (K8S / "images" / "headroom.Dockerfile").read_text()
    assert "k8s/images/install.sh" in text and "requirements-cpu.lock" in text and "requirements-gpu.lock" in text
    images = {c["image"] for _, o in all_objects() for _, pod in pod_specs(o) for c in containers(pod)}
    assert "ghcr.io/headroom-project/mlflow:3.17.2" in images
    assert re.search(r"'mlflow\[auth\]==3\.17\.2' 'psycopg\[binary\]==\S+' boto3==",
                     (K8S / "images" / "mlflow.Dockerfile").read_text())


# --------------------------------------------------------------------------------------------- install script


def test_install_script_in_a_fresh_venv(tmp_path):
    """The image's install steps, run by the same script in a fresh venv. The venv sees this environment's
    packages through a .pth file, so pip checks every pin of the lock against them (installing only what differs)
    instead of downloading gigabytes; headroom itself is installed from the working tree into the venv."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "_parent_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    src = tmp_path / "src"  # a copy: the script must not depend on this checkout's egg-info or caches
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv", ".git", "*.egg-info", "__pycache__", ".cache",
                                                              "mlruns", "reports", "ray_results", "runs"))
    # PIP_RETRIES: offline, the lock's extra index (PyTorch's CPU wheels) is unreachable; ask it once, not 5 times
    env = {**os.environ, "PYTHON": str(py), "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_RETRIES": "0"}
    r = subprocess.run(["bash", str(src / "k8s" / "images" / "install.sh"), str(src)], capture_output=True,
                       text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    h = subprocess.run([str(venv / "bin" / "headroom"), "--help"], capture_output=True, text=True, timeout=120)
    assert h.returncode == 0 and "sweep" in h.stdout and "report" in h.stdout
    where = subprocess.run([str(py), "-c", "import orchestration; print(orchestration.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path).stdout
    assert where.startswith(site), where  # headroom from the venv, not from this checkout
