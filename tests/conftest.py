"""Shared fixtures: one CLI-trained xs decoder and one xs encoder for the whole session (CI stays fast)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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
    from lightning_modules.config import DataConfig, model_config_for, train_config_for
    from lightning_modules.train import train_lm

    return train_lm(model_config_for("xs", "encoder"), train_config_for("xs", steps=ENCODER_STEPS, seed=0, eval_batches=16),
                    DataConfig(), progress=False)
