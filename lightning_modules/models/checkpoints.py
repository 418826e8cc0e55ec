"""What a checkpoint path holds, read from JSON alone (no torch): the CLI and the sweep spec check a checkpoint
before any framework is loaded."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from lightning_modules.declarations.config import HeadroomInputError


@dataclass(frozen=True)
class CheckpointInfo:
    """What a checkpoint path holds, read from JSON alone (no torch): the model directory, the model type, the
    heads of every layer, and — for a `headroom train` run directory — the run's metrics (its data and training
    configs)."""

    model_dir: str
    model_type: str
    layer_heads: list[int]
    max_positions: int | None
    run: dict | None
    has_tokenizer: bool
    family: str  # encoder for a BERT masked LM, else decoder


SUPPORTED_MODEL_TYPES: tuple[str, ...] = ("llama", "gpt2", "bert")


def read_model_config(model_dir: str, what: str | None = None) -> dict:
    """The config.json of a Hugging Face model directory, checked to be a supported model type (no torch)."""
    what = what or model_dir
    if not os.path.isdir(model_dir):
        raise HeadroomInputError(f"checkpoint {what}: no such directory")
    cpath = os.path.join(model_dir, "config.json")
    if not os.path.isfile(cpath):
        raise HeadroomInputError(f"checkpoint {what}: no config.json (not a Hugging Face model directory)")
    try:
        with open(cpath) as f:
            cfg = json.load(f)
    except json.JSONDecodeError:
        raise HeadroomInputError(f"checkpoint {what}: config.json is not valid JSON") from None
    mt = cfg.get("model_type")
    if mt not in SUPPORTED_MODEL_TYPES:
        raise HeadroomInputError(f"checkpoint {what}: model type {mt!r} is not supported "
                                 f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    return cfg


METRICS_FILE = "metrics.json"  # a run directory's numbers, beside its model/ (train.write_run, the trials)


def checkpoint_info(path: str) -> CheckpointInfo:
    p = os.path.expanduser(path)
    if not os.path.isdir(p):
        raise HeadroomInputError(f"checkpoint {path}: no such directory")
    run = None
    model_dir = p
    if os.path.isfile(os.path.join(p, "model", "config.json")):
        model_dir = os.path.join(p, "model")
        mpath = os.path.join(p, METRICS_FILE)
        if os.path.isfile(mpath):
            try:
                run = json.load(open(mpath))
            except json.JSONDecodeError:
                raise HeadroomInputError(f"checkpoint {path}: metrics.json is not valid JSON") from None
    cfg = read_model_config(model_dir, what=path)
    mt = cfg["model_type"]
    meta = cfg.get("headroom") or {}
    if meta.get("layers"):
        heads = [int(l["heads"]) for l in meta["layers"]]
    else:
        n = cfg.get("num_attention_heads", cfg.get("n_head"))
        layers = cfg.get("num_hidden_layers", cfg.get("n_layer"))
        if not isinstance(n, int) or not isinstance(layers, int):
            raise HeadroomInputError(f"checkpoint {path}: config.json lacks head or layer counts")
        heads = [n] * layers
    max_pos = cfg.get("max_position_embeddings", cfg.get("n_positions"))
    has_tok = any(os.path.isfile(os.path.join(model_dir, f)) for f in ("tokenizer.json", "vocab.txt", "vocab.json"))
    archs = cfg.get("architectures") or []
    family = "encoder" if mt == "bert" and any("MaskedLM" in a for a in archs) else "decoder"
    return CheckpointInfo(model_dir, mt, heads, max_pos, run, has_tok, family)
