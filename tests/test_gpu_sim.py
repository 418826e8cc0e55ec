"""The GPU path on a machine without a GPU (orchestration/running/devices.py): a trial that holds a GPU torch cannot use
stops with one line, and on a simulated cluster (a local Ray that declares GPUs) fractional-GPU trials are packed
as Ray packs them on a GPU node — each records the GPU it was given — while training on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT
from test_sweep import client, run_sweep, runs_of, split

pytestmark = pytest.mark.slow

_CLAIM = """
import json, os, ray
from orchestration.running.devices import GPUUnusable, claim_gpu
ray.init(num_cpus=1, num_gpus=1, include_dashboard=False, logging_level="ERROR")

@ray.remote(num_gpus=1)
def claim():
    try:
        return {"ok": claim_gpu(), "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES")}
    except GPUUnusable as e:
        return {"error": str(e)}

@ray.remote(num_gpus=0)
def none():
    return {"ok": claim_gpu()}

real = ray.get(claim.remote())
sim = ray.get(claim.options(runtime_env={"env_vars": {"HEADROOM_SIMULATED_GPUS": "1"}}).remote())
print(json.dumps({"real": real, "sim": sim, "none": ray.get(none.remote())}))
"""


def test_a_gpu_torch_cannot_use_stops_the_trial_and_a_simulated_one_is_recorded():
    """Ray gives a task GPU 0 on a machine that has none: without the simulation switch the claim fails with one
    line naming the GPU, the torch build and the switch; with it the task keeps GPU 0 as its record and CUDA is
    hidden from torch; a task without a GPU claims nothing."""
    r = subprocess.run([sys.executable, "-c", _CLAIM], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    err = out["real"]["error"]
    assert "\n" not in err and "was given GPU 0 but torch" in err and "HEADROOM_SIMULATED_GPUS=1" in err
    assert out["sim"] == {"ok": {"gpu_ids": "0"}, "cuda_visible": ""}
    assert out["none"] == {"ok": {}}


PACKING = """name: packing
family: [decoder]
data: {source: stdlib}
scales:
  xs:
    steps: 30
    overrides: {batch_size: 8, seq_len: 64, warmup_steps: 4, val_every: 30, val_batches: 2, eval_batches: 2}
    resources: {cpu: 0.25, gpu: 0.5}   # two trials to a GPU; the CPUs would allow eight
seeds: [0, 1, 2, 3]
prune: {ratios: [0.5], methods: [random], finetune_steps: 0, calibration_batches: 1, curve: false}
log_models: false
"""


def _most_at_once(runs) -> int:
    """The most runs alive at one moment (MLflow start and end times: the tracker opens a run when Tune starts its
    trial and closes it when the trial completes); a run is counted alive from 0.5 s after its start."""
    spans = [(r.info.start_time / 1000, r.info.end_time / 1000) for r in runs]
    return max(sum(1 for s, e in spans if s <= t + 0.5 < e) for t, _ in spans)


def test_fractional_gpu_trials_pack_two_to_a_simulated_gpu(tmp_path, cache_dir):
    """`headroom sweep --simulate-gpus 1` with `gpu: 0.5` per trial: Tune runs two trials at once on the one
    declared GPU — never more, though the CPUs would allow eight — every run records GPU 0, and the sweep ends
    with its report. `--simulate-gpus` with a cluster address is refused."""
    (tmp_path / "packing.yaml").write_text(PACKING)
    r = run_sweep(tmp_path, "packing.yaml", "--simulate-gpus", "1", "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    parents, children = split(runs_of(client(tmp_path), "packing"))
    assert len(parents) == 1 and len(children) >= 8
    assert {c.data.params.get("gpu_ids") for c in children} == {"0"}
    assert {c.data.params.get("train_precision") for c in children} == {"32-true"}  # "auto" on the CPU it ran on
    for stage in ("train", "prune"):
        runs = [c for c in children if c.data.tags["headroom.stage"] == stage]
        assert len(runs) >= 4 and _most_at_once(runs) == 2, (stage, _most_at_once(runs))
    assert (tmp_path / "reports" / "packing" / "verdict.json").exists()

    bad = run_sweep(tmp_path, "packing.yaml", "--simulate-gpus", "1", "--address", "127.0.0.1:6379")
    assert bad.returncode == 2 and "--simulate-gpus starts a local Ray" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    (tmp_path / "ddp.yaml").write_text(PACKING.replace("name: packing", "name: ddp").replace(
        "resources: {cpu: 0.25, gpu: 0.5}", "resources: {cpu: 1, gpu: 1, workers: 2}"))
    bad = run_sweep(tmp_path, "ddp.yaml", "--simulate-gpus", "2")
    assert bad.returncode == 2 and "data-parallel" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
