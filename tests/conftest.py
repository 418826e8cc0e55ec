"""Shared fixtures: one CLI-trained xs decoder and one xs encoder, one local smoke sweep, and one production stack
(benchmarks/stack.py) for the whole session (CI stays fast)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # stack.py: the production configuration on loopback
TRAIN_STEPS = 300  # the xs default; at 150 steps some heads still hurt the loss (negative ablation scores)
ENCODER_STEPS = 250  # masked LM gets a loss signal from 15% of positions only

# offline and quiet, for these tests and every process they start
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def headroom(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: int = 600):
    """Run the CLI in a fresh interpreter, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "orchestration.cli", *map(str, args)],
        cwd=cwd or ROOT, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout,
    )


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("headroom-cache")
    os.environ["HEADROOM_CACHE"] = str(d)
    return d


@pytest.fixture(scope="session")
def xs_decoder_run(tmp_path_factory, cache_dir) -> Path:
    """`headroom train` on the embedded stdlib corpus: the xs decoder every test shares."""
    out = tmp_path_factory.mktemp("xs-decoder") / "run"
    r = headroom("train", "--scale", "xs", "--family", "decoder", "--steps", TRAIN_STEPS, "--seed", 0,
                 "--eval-batches", 16, "--out", out, "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def xs_decoder_metrics(xs_decoder_run) -> dict:
    return json.loads((xs_decoder_run / "metrics.json").read_text())


@pytest.fixture(scope="session")
def xs_encoder(cache_dir):
    """An xs encoder trained in-process with the same code the CLI uses; returns the TrainResult."""
    from lightning_modules.declarations.config import DataConfig, model_config_for, train_config_for
    from lightning_modules.training.loop import train_lm

    return train_lm(model_config_for("xs", "encoder"), train_config_for("xs", steps=ENCODER_STEPS, seed=0, eval_batches=16),
                    DataConfig(), progress=False)


@pytest.fixture(scope="session")
def smoke(tmp_path_factory, cache_dir):
    """`headroom sweep sweeps/smoke.yaml --register` with the defaults (local Ray in-process, MLflow in ./mlflow.db)."""
    cwd = tmp_path_factory.mktemp("smoke")
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "orchestration.cli", "sweep", str(ROOT / "sweeps" / "smoke.yaml"),
                        "--register"],
                       cwd=cwd, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return {"cwd": cwd, "stdout": r.stdout, "seconds": time.time() - t0}


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    """PostgreSQL, S3 and MLflow as k8s/ configures them, on loopback (Ray nodes: `stack.start_ray()`)."""
    from stack import Stack, missing

    why = missing()
    if why:
        pytest.skip(why)
    s = Stack(tmp_path_factory.mktemp("stack"))
    try:
        s.start()
        yield s
    finally:
        s.stop()
