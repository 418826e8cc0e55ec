"""Pruned models in MLflow: each prune unit's model logged with MLflow's transformers flavour, its tokenizer with it,
so that `mlflow.transformers.load_model("runs:/<run id>/pruned_model")` loads it; `headroom sweep --register` puts the
primary method's pruned models in the Model Registry.

Only models that transformers alone computes exactly as headroom does are logged that way: decoders with the same
head count in every layer (transformers' Llama config says so). The encoder's attention is headroom's rotary one,
and a global-scope prune leaves different counts per layer: transformers would load those without error and compute
something else, so they stay headroom checkpoints (`headroom.checkpoint`; `lightning_modules.models.load_model`).
Runs in the driver, like all MLflow writes (orchestration/running/tracking.py).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from importlib.metadata import version
from pathlib import Path

from . import metrics as M

MODEL_NAME = "pruned_model"  # the logged model's name (its artifact path in the run)
LOGGED = "headroom.model"  # child tag: the logged model's URI, or why none was logged
REQUIREMENTS = ("torch", "transformers", "tokenizers", "safetensors")


def transformers_loadable(model_dir: str | Path) -> str | None:
    """None when transformers alone loads the checkpoint faithfully; else why not (one phrase)."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    if cfg.get("model_type") != "llama":
        return "its attention is headroom's rotary encoder attention, which plain transformers lacks"
    meta = cfg.get("headroom") or {}
    plain = (cfg.get("num_attention_heads"), cfg.get("num_key_value_heads"))
    if any((int(x["heads"]), int(x.get("kv_heads", x["heads"]))) != plain for x in meta.get("layers", [])):
        return "its layers keep different head counts, which transformers' config cannot express"
    return None


def _with_tokenizer(model_dir: Path, into: Path, tokenizer: str) -> Path:
    """A copy of the checkpoint with its tokenizer: its own files, or the byte tokenizer as a transformers one."""
    shutil.copytree(model_dir, into)
    if not (into / "tokenizer.json").exists() and not (into / "tokenizer_config.json").exists():
        if tokenizer != "byte":
            raise ValueError(f"checkpoint {model_dir} has no tokenizer files ({tokenizer})")
        from lightning_modules.tokens import ByteTokenizer

        ByteTokenizer.for_transformers().save_pretrained(str(into))
    return into


def log_pruned_model(uri: str, run_id: str, model_dir: str | Path, tokenizer: str) -> str:
    """Log the checkpoint in `model_dir` to the run as an MLflow transformers model; returns its model URI. The
    model is loaded first: MLflow 3.17 cannot log a checkpoint directory by path with transformers v5."""
    import mlflow
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri  # the caller's MLflow URI stays as it was
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as tf_logging

    tf_logging.disable_progress_bar()
    # a local checkpoint has no Hub model card or license to look up: MLflow's two warnings per model say only that
    logging.getLogger("mlflow.transformers").setLevel(logging.ERROR)

    with tempfile.TemporaryDirectory() as tmp, _use_tracking_uri(uri):
        ckpt = _with_tokenizer(Path(model_dir), Path(tmp) / "checkpoint", tokenizer)
        parts = {"model": AutoModelForCausalLM.from_pretrained(str(ckpt)),
                 "tokenizer": AutoTokenizer.from_pretrained(str(ckpt))}
        with mlflow.start_run(run_id=run_id):
            info = mlflow.transformers.log_model(
                parts, name=MODEL_NAME, task="text-generation",
                pip_requirements=[f"{p}=={version(p)}" for p in REQUIREMENTS])  # no inference: it loads the model
    return info.model_uri


def registered_name(sweep: str, cell: str, family: str, ratio: float) -> str:
    return f"{sweep}-{cell}-{family}-r{ratio:g}-pruned"


def register_primary(rep, tracking_uri: str, say=print) -> list[tuple[str, str]]:
    """Register the primary method's pruned models of the report's sweep (one registered model per scale, family
    and ratio, a version per seed), tagged with the verdict and the losses; a version already registered for a
    run is not registered twice. Returns (name, version) of each."""
    import mlflow
    from mlflow import MlflowClient
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    from lightning_modules.arms import label as arm_label
    from orchestration.report.analysis import PRIMARY, is_primary

    client = MlflowClient(tracking_uri)
    out, skipped = [], 0
    dense = {(r.scale, r.family, r.seed): r for r in rep.data.runs if r.arm == "dense"}
    for r in rep.data.runs:
        if r.arm != "pruned" or not is_primary(r, "method", "scope", "schedule") or r.prune_at != 1.0:
            continue
        uri = r.tags.get(LOGGED, "")
        if not uri.startswith("models:/"):
            skipped += 1
            continue
        name = registered_name(rep.data.sweep, r.scale, r.family, r.ratio)
        have = client.search_model_versions(f"name = '{name}' and run_id = '{r.run_id}'")
        if have:
            out.append((name, have[0].version))
            continue
        d = dense.get((r.scale, r.family, r.seed))
        split = "id" if M.loss(M.FINAL, "id") in r.metrics else "val"
        key = M.loss(M.FINAL, split)
        tags = {"headroom.verdict": rep.headline(r.scale, r.family), "headroom.seed": str(r.seed),
                "headroom.pruned_loss": f"{r.metrics.get(key, float('nan')):.4f}",
                "headroom.dense_loss": f"{d.metrics[key]:.4f}" if d and key in d.metrics else "none",
                "headroom.run_id": r.run_id}
        for c in rep.primary():
            if (c.scale, c.family, c.ratio) == (r.scale, r.family, r.ratio):
                tags[f"headroom.verdict.{c.control}"] = (f"{c.verdict} vs {arm_label(c.control)} "
                                                         f"(diff {c.diff_mean:+.4f})")
        with _use_tracking_uri(tracking_uri):
            mv = mlflow.register_model(uri, name, tags=tags)
        out.append((name, mv.version))
    say(f"registered {len(out)} pruned model version(s) of method {PRIMARY['method']}"
        + (f"; {skipped} without a transformers model (see their `{LOGGED}` tag)" if skipped else ""))
    return out
