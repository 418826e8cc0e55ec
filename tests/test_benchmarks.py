"""Each benchmark runs at tiny size and writes its JSON, so none rots. Only the JSON is checked here — its shape,
and that its medians are the medians of its own samples; the ratios themselves are measured at full size and
reported, not asserted (timings flake on shared machines). tests/test_measure.py checks the measuring itself
against planted answers."""

import json
import statistics
import subprocess
import sys

import pytest
from conftest import ROOT

VERDICTS = (True, False, "inconclusive")


def _check_median(res_median, spread, ratios, repeats):
    """A median, recomputed from the raw samples, with its spread; fewer than 5 samples never decide a goal."""
    assert len(ratios) == repeats == spread["n"]
    assert res_median == pytest.approx(statistics.median(ratios))
    assert spread["interval"][0] <= res_median <= spread["interval"][1]
    assert spread["iqr"][0] <= res_median <= spread["iqr"][1]
    assert 0 <= spread["coverage"] < 1


def _alternating(samples, sides):
    """Interleaved rounds: every side measured in every round, the first side's place changing round to round."""
    orders = [s["order"] for s in samples]
    assert all(sorted(o) == sorted(sides) for o in orders)
    assert all(a[0] != b[0] for a, b in zip(orders, orders[1:]))


def test_train_overhead_writes_json(tmp_path):
    out = tmp_path / "train_overhead.json"
    r = subprocess.run([sys.executable, "benchmarks/train_overhead.py", "--steps", "6", "--warmup", "2",
                        "--batch-size", "4", "--seq-len", "32", "--repeats", "2", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["benchmark"] == "train_overhead" and res["goal"] == 0.9
    _alternating(res["samples"], ["plain", "lightning"])
    _check_median(res["median_ratio"], res["spread"], [s["lightning"] / s["plain"] for s in res["samples"]], 2)
    assert res["meets_goal"] == "inconclusive"  # 2 rounds: too few to decide
    assert res["plain_tokens_per_s"] == pytest.approx(statistics.median(s["plain"] for s in res["samples"]))
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
    assert res["goal"] == 3.0 and res["meets_goal"] == "inconclusive"
    _alternating(res["samples"], ["batched", "sequential"])
    _check_median(res["median_speedup"], res["spread"], [s["sequential"] / s["batched"] for s in res["samples"]], 2)
    sp = res["spread"]
    assert (f"ablation_batched: median speedup {res['median_speedup']:.3g} (IQR {sp['iqr'][0]:.3g}–{sp['iqr'][1]:.3g}; "
            f"50% interval {sp['interval'][0]:.3g}–{sp['interval'][1]:.3g}; n=2)") in r.stdout
    assert "ablation_batched: meets goal: inconclusive (goal 3.0;" in r.stdout


def test_prune_speed_writes_json(tmp_path):
    res = _run("prune_speed.py", tmp_path / "p.json", "--scale", "xs", "--batch-size", "2", "--seq-len", "32",
               "--repeats", "3", "--passes", "1", "--warmup", "1")
    assert res["benchmark"] == "prune_speed" and [r["ratio"] for r in res["rows"]] == [0.25, 0.5, 0.75]
    for r in res["rows"]:
        assert r["heads_kept"] == [8 - round(r["ratio"] * 8)] * 2
        assert r["speedup_predicted_from_flops"] > 1
        # the three models of a round are timed in the same moments, in rotating order
        rounds = [s for s in res["samples"] if s["ratio"] == r["ratio"]]
        _alternating(rounds, ["dense", "masked", "pruned"])
        assert [s["order"] for s in rounds] == [["masked", "pruned", "dense"], ["pruned", "dense", "masked"],
                                                ["masked", "dense", "pruned"]]  # after the warm-up round
        speedups = [s["dense"] / s["pruned"] for s in rounds]
        _check_median(r["median_speedup"], r["spread"], speedups, 3)
        assert res["median_speedup"][str(r["ratio"])] == r["median_speedup"]
        assert r["measured_over_predicted"] == pytest.approx(r["median_speedup"] / r["speedup_predicted_from_flops"])
        for k in ("dense", "masked", "pruned"):
            assert r["latency_ms"][k] == pytest.approx(statistics.median(s[k] for s in rounds))
        assert r["meets_goal"] == "inconclusive"
    assert res["meets_goal"] is False  # batch 2 < 16: the goal is not claimed at this size


def test_sweep_reuse_writes_json(tmp_path):
    """The real sweep machinery at tiny size against the naive grid; only the JSON's consistency is checked."""
    res = _run("sweep_reuse.py", tmp_path / "s.json", "--tiny")
    assert res["benchmark"] == "sweep_reuse" and res["goal"] == 0.2 and res["size"] == "tiny"
    assert res["dense_trials"] == res["prune_trials"] == res["naive_trials"] == 1
    # the prune trial and the naive trial are each paired with the train trial of the same dense unit
    (p,), (n,) = res["samples"], res["naive_samples"]
    assert p["dense"] == n["dense"] and p["unit"] == n["unit"]
    _check_median(res["median_ratio"], res["spread"], [p["prune"] / p["dense"]], 1)
    assert res["meets_goal"] == "inconclusive"
    # the work, not the seconds: a naive trial trains the dense model's steps again before it prunes; a prune
    # trial trains none of them (its run logs no train/loss), the dense run it reads logged every one
    assert n["dense_steps_trained"] == res["dense_steps"] == p["dense_run_steps"]
    assert p["dense_steps_trained"] == 0


def test_compute_share_of_the_smoke_sweep(tmp_path, smoke):
    """The smoke sweep's trials (run once for the suite) report where their seconds went; the share is recomputed
    here from the per-stage numbers the JSON also holds, and `headroom bench`'s lines print it against its goal.
    (`--tiny` runs a sweep of its own: the same code, not run twice in CI.)"""
    from orchestration.cli.bench import _bench_lines

    out = tmp_path / "compute_share.json"
    r = subprocess.run([sys.executable, "benchmarks/compute_share.py", "--store",
                        f"sqlite:///{smoke['cwd'] / 'mlflow.db'}", "--experiment", "smoke", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["benchmark"] == "compute_share" and res["goal"] == 0.6 and res["size"] == "store"
    # the smoke sweep: 13 train trials (one a half-budget dense run) and 8 prune trials report their timings
    # (lr candidates ASHA stopped early report none)
    stages = sorted(s["stage"] for s in res["samples"] if s["stage"] != "lr_search")
    assert stages == ["prune"] * 8 + ["train"] * 13 and res["trials"] == len(res["samples"])
    _check_median(res["median_ratio"], res["spread"], [s["share"] for s in res["samples"]], len(res["samples"]))
    assert res["meets_goal"] in VERDICTS
    # the pooled share weighs each trial's share by its seconds
    assert res["pooled_ratio"] == pytest.approx(sum(s["share"] * s["trial_s"] for s in res["samples"])
                                                / sum(s["trial_s"] for s in res["samples"]))
    # the trials' own timings cannot exceed the trials' time, nor the machine's
    assert 0 < res["median_ratio"] <= 1 and 0 < res["machine_share"] <= res["pooled_ratio"] <= 1
    assert {"train", "prune"} <= set(res["by_stage"]) and res["work_s"] <= res["trial_s"]
    lines = _bench_lines("compute_share", res)
    assert lines[0].startswith(f"compute_share: median ratio {res['median_ratio']:.3g} (IQR")


def test_kernels_writes_json_through_headroom_bench(tmp_path):
    """SDPA vs eager and torch.compile vs not, interleaved; bf16 and fused AdamW say they need a GPU."""
    r = subprocess.run([sys.executable, "-m", "orchestration.cli", "bench", "train_kernels", "--tiny", "--out-dir",
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "train_kernels.json").read_text())
    assert res["benchmark"] == "train_kernels" and res["device"] == "cpu" and res["compile_backend"] == "aot_eager"
    assert set(res["choices"]) == {"sdpa", "compile"} and set(res["not_measured"]) == {"bf16", "fused"}
    for name, samples in res["samples"].items():
        assert len(samples) == 1 and all(s["with"] > 0 and s["without"] > 0 for s in samples)
        _check_median(res["median_ratio"][name], res["spread"][name], [s["with"] / s["without"] for s in samples], 1)
    # SDPA is a default: its goal (at least as fast as eager) is undecided on one round; compile has no goal
    assert res["meets_goal_by"] == {"sdpa": "inconclusive", "compile": None} and res["meets_goal"] == "inconclusive"
    assert f"train_kernels sdpa: median ratio {res['median_ratio']['sdpa']:.3g} (IQR" in r.stdout
    assert "; meets goal: inconclusive" in r.stdout


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


def test_a_fault_campaign_that_injected_less_than_asked_does_not_meet_its_goal():
    """faults.judge: a clean audit meets the goal only when every requested fault was injected and every requested
    kind among them (a sweep that ended first leaves faults uninjected)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from fault_audit import judge

    clean = dict.fromkeys(("units_lost", "duplicate_runs", "duplicate_steps", "missing_steps", "missing_artifacts"), 0)
    kinds = ["worker", "driver", "mlflow", "postgres", "s3"] * 4
    five = [{"kind": k} for k in kinds[:5]]
    short = judge({**clean, "faults": five, "faults_injected": 5}, kinds)
    assert short["faults_requested"] == 20 and short["meets_goal"] is False and short["kinds_missing"] == []
    partial = judge({**clean, "faults": five[:3], "faults_injected": 3}, kinds[:3])
    assert partial["meets_goal"] is True and partial["faults_requested"] == 3
    missing = judge({**clean, "faults": [{"kind": "worker"}] * 3, "faults_injected": 3}, ["worker", "s3", "worker"])
    assert missing["kinds_missing"] == ["s3"] and missing["meets_goal"] is False
    lost = judge({**clean, "units_lost": 1, "faults": five, "faults_injected": 5}, kinds[:5])
    assert lost["meets_goal"] is False
    # the full goal: at least 20 faults with every kind among them, the Ray head included
    every = ("worker", "driver", "mlflow", "postgres", "s3", "head")
    twenty = [{"kind": k} for k in (list(every) * 4)[:20]]
    full = judge({**clean, "faults": twenty, "faults_injected": 20}, [f["kind"] for f in twenty], every)
    assert full["meets_goal"] is True and full["meets_full_goal"] is True and full["kinds_not_covered"] == []
    headless = [{"kind": k} for k in kinds]  # 20 faults, no head kill
    no_head = judge({**clean, "faults": headless, "faults_injected": 20}, kinds, every)
    assert no_head["meets_goal"] is True and no_head["meets_full_goal"] is False
    assert no_head["kinds_not_covered"] == ["head"]
    nineteen = judge({**clean, "faults": twenty[:19], "faults_injected": 19}, [f["kind"] for f in twenty[:19]], every)
    assert nineteen["meets_goal"] is True and nineteen["meets_full_goal"] is False


def test_gpu_memory_writes_json_and_the_gpu_check_refuses_a_machine_without_cuda(tmp_path, smoke):
    """The GPU check's memory script runs on the CPU at tiny size (devices only: a CPU has no allocator peak) and
    asserts where evaluation ran; the GPU check itself says in one line that there is no GPU, exit 2. Its summary
    gathers what is there into one JSON and fails here: evaluation ran on the CPU, the other benchmarks are
    missing; the smoke sweep stands in for the check sweep's MLflow runs."""
    out = tmp_path / "gpu_memory.json"
    r = subprocess.run([sys.executable, "benchmarks/gpu_memory.py", "--device", "cpu", "--configs",
                        "xs:2:16:bf16-mixed", "--steps", "4", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(out.read_text())
    (row,) = res["rows"]
    assert res["benchmark"] == "gpu_memory" and res["evaluation_on_device"] is True
    assert row["eval_devices"] == ["cpu"] and row["model_device_after_finetune"] == "cpu"
    assert row["peak_bytes_train_and_eval"] is None and row["params"] > 0
    assert row["plan_estimate_bytes"] > 16 * row["params"] and row["measured_over_plan"] is None
    import mlflow

    uri = f"sqlite:///{smoke['cwd'] / 'mlflow.db'}"
    (tmp_path / "sweep.json").write_text(json.dumps({"exit": 0, "tracking_uri": uri, "experiment": "smoke"}))
    r = subprocess.run([sys.executable, "benchmarks/gpu_summary.py", str(tmp_path)], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 1, r.stderr[-2000:]
    check = json.loads((tmp_path / "gpu_check.json").read_text())
    assert check["evaluation_on_cuda"] is False and check["meets_goal"] is False
    assert set(check["missing"]) == {"train_overhead", "ablation_batched", "prune_speed", "train_kernels"}
    assert check["peak_memory"] == [{k: row[k] for k in ("config", "peak_bytes_train_and_eval", "plan_estimate_bytes",
                                                          "measured_over_plan", "tokens_per_s")}]
    client = mlflow.MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("smoke").experiment_id], max_results=10000)
    evaluated = [x for x in runs if "eval_device" in x.data.params]
    assert evaluated and check["sweep"]["runs"] == len(runs)
    assert check["sweep"]["eval_devices"] == {"cpu": len(evaluated)}
    import os

    import torch

    if not torch.cuda.is_available():
        r = subprocess.run(["bash", "benchmarks/gpu_check.sh", str(tmp_path / "gpu")], cwd=ROOT, capture_output=True,
                           text=True, timeout=120, env={**os.environ, "PYTHON": sys.executable})
        assert r.returncode == 2
        assert r.stderr.strip().splitlines() == ["gpu_check: no CUDA GPU is visible on this machine"]


def test_plan_memory_measures_real_training_steps_against_the_plan(tmp_path):
    """The plan's estimate against the peak RSS of real training, evaluation and scoring on the CPU: the JSON's
    ratios are its own measurements over the estimates recomputed here, and nothing ever needed more than the plan
    gives it (an undercount would overpack GPUs). Memory, unlike time, does not flake with the machine's load."""
    from lightning_modules.declarations.config import model_config_for
    from lightning_modules.declarations.memory import train_memory
    from lightning_modules.declarations.methods import get_method

    res = _run("plan_memory.py", tmp_path / "m.json", "--tiny")
    assert res["benchmark"] == "plan_memory" and res["size"] == "tiny" and len(res["rows"]) == 5
    lo, hi = res["band"]
    kinds = set()
    for row in res["rows"]:
        family, scale, batch, seq, precision, vocab, *extra = row["config"].split(":")
        extra = dict(e.split("=") for e in extra)
        mc = model_config_for(scale, family=family, vocab_size=int(vocab))
        if "score" in extra:
            kinds.add(extra["score"])
            want = {"scoring": get_method(extra["score"]).memory(mc, int(batch), int(seq), True)}
        else:
            kinds.add("kd" if "kd" in extra else precision)
            est = train_memory(mc, int(batch), int(seq), precision, teacher=model_config_for(
                extra["kd"], family=family, vocab_size=int(vocab)) if "kd" in extra else None)
            want = {"train": est.train, "evaluation": est.evaluation}
            assert lo <= row["measured"]["train"] / est.train
        assert {k: row["estimate"][k] for k in want} == want and set(row["measured"]) == set(want)
        for k, v in want.items():
            assert row["ratios"][k] == pytest.approx(row["measured"][k] / v) and row["ratios"][k] <= hi, row
    assert kinds == {"32-true", "bf16-mixed", "kd", "ablation", "entropy"}
    assert res["meets_goal"] == all(lo <= x <= hi for r in res["rows"] for x in r["ratios"].values())


def test_data_scale_writes_json_through_headroom_bench(tmp_path):
    """Two corpora at least 4x apart; the driver prepared each once (tokens per split), every trial setup opened
    the prepared data in interleaved rounds, and the ratios are the medians of the rounds' own ratios. Run as
    every benchmark is, by `headroom bench`, which prints both medians."""
    r = subprocess.run([sys.executable, "-m", "orchestration.cli", "bench", "data_scale", "--tiny", "--out-dir",
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "data_scale.json").read_text())
    assert f"data_scale: median time_ratio {res['median_time_ratio']:.3g}" in r.stdout
    assert f"data_scale: median rss_ratio {res['median_rss_ratio']:.3g}" in r.stdout
    assert res["benchmark"] == "data_scale" and res["goal"] == 1.2
    assert res["corpus_ratio"] >= 4 and res["corpus_ratio"] == pytest.approx(
        res["corpora"]["large"]["characters"] / res["corpora"]["small"]["characters"])
    small, large = res["driver"]["small"], res["driver"]["large"]
    assert sum(large["tokens"].values()) > 3.5 * sum(small["tokens"].values())  # the same text, 4x as much
    assert res["driver_s_per_gb"] == pytest.approx(large["seconds"] / (res["corpora"]["large"]["characters"] / 1e9))
    # the line through the two corpora passes through both measurements, and TinyStories sits on it
    fit, gb = res["driver_fit"], {n: res["corpora"][n]["characters"] / 1e9 for n in ("small", "large")}
    for n, d in res["driver"].items():
        assert fit["fixed_mb"] + fit["mb_per_gb"] * gb[n] == pytest.approx(d["peak_rss_mb"])
        assert fit["fixed_s"] + fit["s_per_gb"] * gb[n] == pytest.approx(d["seconds"])
    assert fit["tinystories_mb"] == pytest.approx(fit["fixed_mb"] + 1.9 * fit["mb_per_gb"])
    _alternating(res["samples"], ["small", "large"])
    _check_median(res["median_time_ratio"], res["time_spread"],
                  [s["large_seconds"] / s["small_seconds"] for s in res["samples"]], 2)
    _check_median(res["median_rss_ratio"], res["rss_spread"],
                  [s["large_peak_rss_mb"] / s["small_peak_rss_mb"] for s in res["samples"]], 2)
    assert res["meets_goal"] == "inconclusive"  # 2 rounds: too few to decide


def test_ladder_writes_json_through_headroom_bench(tmp_path, cache_dir):
    """Two budgets of xxxs, each its own run: the gain is recomputed from the two losses, tokens per parameter from
    steps × batch × sequence ÷ the non-embedding parameters."""
    r = subprocess.run([sys.executable, "-m", "orchestration.cli", "bench", "ladder", "--tiny", "--out-dir",
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "ladder.json").read_text())
    rows = res["ladders"]["xxxs"]
    assert [x["steps"] for x in rows] == [8, 16]
    assert rows[1]["gain"] == pytest.approx((rows[0]["loss"]["id"] - rows[1]["loss"]["id"]) / rows[0]["loss"]["id"])
    for x in rows:
        assert x["tokens"] == x["steps"] * 4 * 32
        assert x["tokens_per_param"] == pytest.approx(x["tokens"] / x["params_nonembedding"])


def test_cpu_speed_writes_json_through_headroom_bench(tmp_path, cache_dir):
    """Four sides interleaved per scale; each fraction of the peak is recomputed from its own rounds, the measured
    peak and the training FLOPs per token (counted by hand from the config); bf16 ÷ fp32 from the same rounds."""
    from lightning_modules.declarations.config import model_config_for
    from lightning_modules.declarations.costs import flops_per_token

    r = subprocess.run([sys.executable, "-m", "orchestration.cli", "bench", "cpu_speed", "--tiny", "--out-dir",
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "cpu_speed.json").read_text())
    assert res["peak_flops"]["fp32"] > 1e9 and res["peak_flops"]["bf16"] > 1e9
    x = res["scales"]["xxxs"]
    assert x["train_flops_per_token"] == 3 * flops_per_token(model_config_for("xxxs"), 32).total
    _alternating(x["samples"], ["lightning_fp32", "plain_fp32", "lightning_bf16", "plain_bf16"])
    for short in ("fp32", "bf16"):
        fr = [s[f"lightning_{short}"] * x["train_flops_per_token"] / res["peak_flops"][short] for s in x["samples"]]
        _check_median(x[f"lightning_{short}_fraction_of_peak"]["median"], x[f"lightning_{short}_fraction_of_peak"][
            "spread"], fr, 2)
    assert x["bf16_speedup"]["median"] == pytest.approx(
        statistics.median(s["lightning_bf16"] / s["lightning_fp32"] for s in x["samples"]))
    assert res["meets_goal"] == "inconclusive"  # 2 rounds never decide


def test_onnx_latency_writes_json_through_headroom_bench(tmp_path):
    """Four sides interleaved (onnxruntime and PyTorch, dense and pruned); the graphs match PyTorch on export; the
    speedup is the median of its own rounds and the prediction is the FLOP count's (hand-checked below)."""
    from lightning_modules.declarations.config import model_config_for
    from lightning_modules.declarations.costs import flops_per_token

    r = subprocess.run([sys.executable, "-m", "orchestration.cli", "bench", "onnx_latency", "--tiny", "--out-dir",
                        str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads((tmp_path / "onnx_latency.json").read_text())
    assert res["benchmark"] == "onnx_latency" and [x["ratio"] for x in res["rows"]] == [0.5]
    x = res["rows"][0]
    assert x["heads_kept"] == [4, 4]
    for side in ("dense", "pruned"):
        chk = x["onnx_check"][side]
        assert chk["check_shape"] == [3, 12] and chk["max_abs_diff"] <= 1e-4 * max(1.0, chk["max_abs_logit"])
    _alternating(res["samples"], ["ort_dense", "ort_pruned", "torch_dense", "torch_pruned"])
    _check_median(x["median_speedup"], x["spread"], [s["ort_dense"] / s["ort_pruned"] for s in res["samples"]], 2)
    dense = model_config_for("xs")
    half = dense.with_heads([4, 4])
    assert x["speedup_predicted_from_flops"] == pytest.approx(flops_per_token(dense, 32).total
                                                              / flops_per_token(half, 32).total, rel=1e-6)
    assert res["meets_goal"] is False and "batch >= 16" in res["goal_note"]
