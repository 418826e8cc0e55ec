"""Pruned models in MLflow: each prune unit's model exported (lightning_modules/models/export.py) into the run's artifacts
as `export/` — the directory `headroom export` writes, which loads with torch and transformers alone — and logged
from it with MLflow's transformers flavour, its tokenizer with it, so that
`mlflow.transformers.load_model("runs:/<run id>/pruned_model")` loads it in a process without headroom. A model whose
shape transformers cannot build itself (a `global` prune's per-layer head counts, the rotary encoder) carries its
modeling file, and MLflow loads it through the `auto_map` with trust_remote_code. `headroom sweep --register` puts
the primary method's pruned models in the Model Registry. Runs in the driver, like all MLflow writes
(orchestration/running/tracking.py).
"""

from __future__ import annotations

import logging
import tempfile
from importlib.metadata import version
from pathlib import Path

from lightning_modules.declarations import names as M

MODEL_NAME = "pruned_model"  # the logged model's name (its artifact path in the run)
EXPORT_DIR = "export"  # the exported directory's artifact path in the run
LOGGED = "headroom.model"  # child tag: the logged model's URI, or why none was logged
REQUIREMENTS = ("torch", "transformers", "tokenizers", "safetensors")
TASKS = {"AutoModelForCausalLM": "text-generation", "AutoModelForMaskedLM": "fill-mask"}


def log_pruned_model(uri: str, run_id: str, model_dir: str | Path, tokenizer: str, logged: str | None = None) -> str:
    """Export the checkpoint in `model_dir`, log it from the exported directory as an MLflow transformers model
    (unless `logged`, the URI of one this run already has), then the directory itself as the run's `export/`
    artifacts; returns the model's URI. The model first, the directory after: a failure leaves no `export/` beside
    a run without its model, and a unit finished again finds its model and writes the directory again (the same
    files). Loaded through its Auto class first: MLflow 3.17 cannot log a checkpoint directory by path with
    transformers v5."""
    import mlflow
    import transformers
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri  # the caller's MLflow URI stays as it was
    from transformers.utils import logging as tf_logging

    from lightning_modules.models.build import load_model
    from lightning_modules.models.checkpoints import checkpoint_info
    from lightning_modules.models.export import write_export

    tf_logging.disable_progress_bar()
    # a local checkpoint has no Hub model card or license to look up: MLflow's two warnings per model say only that
    logging.getLogger("mlflow.transformers").setLevel(logging.ERROR)

    info = checkpoint_info(str(model_dir))
    if not info.has_tokenizer and tokenizer != "byte":
        raise ValueError(f"checkpoint {model_dir} has no tokenizer files ({tokenizer})")
    with tempfile.TemporaryDirectory() as tmp, _use_tracking_uri(uri):
        exp = Path(tmp) / EXPORT_DIR
        done = write_export(load_model(info.model_dir), exp, info.model_dir if info.has_tokenizer else None)
        if logged is None:
            auto = getattr(transformers, done["auto_class"])
            parts = {"model": auto.from_pretrained(str(exp), trust_remote_code=done["remote_code"]),
                     "tokenizer": transformers.AutoTokenizer.from_pretrained(str(exp))}
            verbosity = tf_logging.get_verbosity()
            tf_logging.set_verbosity_error()  # the pipeline MLflow builds names every class it knows when it meets ours
            try:
                with mlflow.start_run(run_id=run_id):
                    logged = mlflow.transformers.log_model(
                        parts, name=MODEL_NAME, task=TASKS[done["auto_class"]],
                        pip_requirements=[f"{p}=={version(p)}" for p in REQUIREMENTS]).model_uri  # no inference
            finally:
                tf_logging.set_verbosity(verbosity)
        mlflow.MlflowClient(uri).log_artifacts(run_id, str(exp), EXPORT_DIR)
    return logged


def registered_name(sweep: str, cell: str, family: str, ratio: float) -> str:
    return f"{sweep}-{cell}-{family}-r{ratio:g}-pruned"


def register_primary(rep, tracking_uri: str, say=print) -> list[tuple[str, str]]:
    """Register the primary method's pruned models of the report's sweep (one registered model per scale, family
    and ratio, a version per seed), tagged with the verdict and the losses; a version already registered for a
    run is not registered twice. Returns (name, version) of each."""
    import mlflow
    from mlflow import MlflowClient
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    from lightning_modules.declarations.arms import label as arm_label
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
