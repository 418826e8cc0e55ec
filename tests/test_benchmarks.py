"""Each benchmark runs at tiny size and writes its JSON, so none rots. Only the JSON is checked here; the
ratios themselves are measured at full size and reported, not asserted (timings flake on shared machines)."""

import json
import subprocess
import sys

import pytest
from conftest import ROOT


def test_train_overhead_writes_json(tmp_path):
    out = tmp_path / "train_overhead.json"
    r = subprocess.run([sys.executable, "benchmarks/train_overhead.py", "--steps", "6", "--warmup", "2",
                        "--batch-size", "4", "--seq-len", "32", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["benchmark"] == "train_overhead" and res["goal"] == 0.9
    assert res["plain_tokens_per_s"] > 0 and res["lightning_tokens_per_s"] > 0
    # the baseline is the same work, not a strawman: the same tokens timed, and the plain loop trains the model
    # exactly as the LightningModule does (same init, data order, optimizer, schedule, clipping)
    assert res["window_tokens"]["plain"] == res["window_tokens"]["lightning"] == (6 - 2) * 4 * 32
    assert res["final_train_loss"]["plain"] == pytest.approx(res["final_train_loss"]["lightning"], rel=1e-5)
    # MFU is a GPU measurement: here the JSON says it was not measured rather than printing a number
    assert res["mfu"] is None and res["meets_goal_mfu"] is None and "no GPU" in res["mfu_note"]


def _run(script, out, *args):
    r = subprocess.run([sys.executable, f"benchmarks/{script}", *args, "--out", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(out.read_text())


def test_ablation_batched_writes_json_through_headroom_bench(tmp_path):
    """`headroom bench` runs the script at its CI size and prints the ratio the JSON holds."""
    r = subprocess.run([sys.executable, "-m", "orchestration.cli", "bench", "ablation_batched", "--tiny", "--out-dir",
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "ablation_batched.json").read_text())
    assert res["benchmark"] == "ablation_batched" and res["heads"] == 16
    assert res["identical_to_1e-5"] is True and res["max_abs_diff"] <= 1e-5
    assert res["goal"] == 3.0
    assert f"ablation_batched: speedup {res['speedup']:.3g}; goal 3.0; meets goal: {res['meets_goal']}" in r.stdout


def test_prune_speed_writes_json(tmp_path):
    res = _run("prune_speed.py", tmp_path / "p.json", "--scale", "xs", "--batch-size", "2", "--seq-len", "32",
               "--repeats", "2", "--warmup", "1")
    assert res["benchmark"] == "prune_speed" and [r["ratio"] for r in res["rows"]] == [0.25, 0.5, 0.75]
    for r in res["rows"]:
        assert r["heads_kept"] == [8 - round(r["ratio"] * 8)] * 2
        assert r["speedup_predicted_from_flops"] > 1 and r["speedup_measured"] > 0
        assert set(r["latency_ms"]) == {"dense", "masked", "pruned"}
    assert res["meets_goal"] is False  # batch 2 < 16: the goal is not claimed at this size


def test_sweep_reuse_writes_json(tmp_path):
    """The real sweep machinery at tiny size against the naive grid; only the JSON's consistency is checked."""
    res = _run("sweep_reuse.py", tmp_path / "s.json", "--tiny")
    assert res["benchmark"] == "sweep_reuse" and res["goal"] == 0.2 and res["size"] == "tiny"
    assert res["dense_trials"] == res["prune_trials"] == res["naive_trials"] == 1
    # a naive trial trains a dense model and then prunes it: it must cost more than pruning alone
    assert res["naive_ratio"] > res["ratio"]


def test_compute_share_through_headroom_bench(tmp_path):
    """A real (tiny) sweep's trials report where their seconds went; the share is recomputed here from the
    per-stage numbers the JSON also holds, and `headroom bench` prints it against its goal."""
    r = subprocess.run([sys.executable, "-m", "orchestration.cli", "bench", "compute_share", "--tiny", "--out-dir",
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "compute_share.json").read_text())
    assert res["benchmark"] == "compute_share" and res["goal"] == 0.6 and res["size"] == "tiny"
    # 1 scale × 1 seed × (dense, 2 controls) trained, 1 dense × 2 methods pruned (quickstart's arms)
    assert res["trials"] == 3 + 2
    # the trials' own timings cannot exceed the trials' time, nor the machine's
    assert 0 < res["ratio"] <= 1 and 0 < res["machine_share"] <= res["ratio"]
    assert set(res["by_stage"]) == {"train", "prune"} and res["work_s"] <= res["trial_s"]
    assert f"compute_share: ratio {res['ratio']:.3g}; goal 0.6" in r.stdout


def test_kernels_writes_json_through_headroom_bench(tmp_path):
    """SDPA vs eager and torch.compile vs not, interleaved; bf16 and fused AdamW say they need a GPU."""
    r = subprocess.run([sys.executable, "-m", "orchestration.cli", "bench", "train_kernels", "--tiny", "--out-dir",
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "train_kernels.json").read_text())
    assert res["benchmark"] == "train_kernels" and res["device"] == "cpu" and res["compile_backend"] == "aot_eager"
    assert set(res["choices"]) == {"sdpa", "compile"} and set(res["not_measured"]) == {"bf16", "fused"}
    for c in res["choices"].values():
        assert len(c["samples"]) == 1 and all(s["with"] > 0 and s["without"] > 0 for s in c["samples"])
        assert c["median_ratio"] == pytest.approx(c["samples"][0]["with"] / c["samples"][0]["without"])


def test_headroom_bench_gpu_says_there_is_no_gpu_here():
    r = subprocess.run([sys.executable, "-m", "orchestration.cli", "bench", "--gpu"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["headroom: error: bench --gpu: no CUDA GPU is visible on this machine"]


def test_headroom_bench_refuses_an_unknown_benchmark():
    r = subprocess.run([sys.executable, "-m", "orchestration.cli", "bench", "nonesuch"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "unknown benchmark 'nonesuch'" in r.stderr


def test_fault_campaign_refuses_bad_input_with_one_line(tmp_path):
    """The campaign itself runs in tests/test_cluster.py (on the session's stack); here its input checks, which
    stop it before any service starts."""
    for args, needle in ((["--faults", "0"], "--faults: at least 1"), (["--kinds", "worker,flood"], "unknown flood"),
                         (["--sweep", str(tmp_path / "nope.yaml")], "not a file"),
                         (["--sweep", str(tmp_path)], "not a file")):
        r = subprocess.run([sys.executable, "benchmarks/faults.py", *args, "--out", str(tmp_path / "f.json")],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], r.stderr
    outside = tmp_path / "sweep.yaml"
    outside.write_text((ROOT / "sweeps" / "smoke.yaml").read_text())
    r = subprocess.run([sys.executable, "benchmarks/faults.py", "--sweep", str(outside)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "inside the repository" in r.stderr
    assert not (tmp_path / "f.json").exists()
