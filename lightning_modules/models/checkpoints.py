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


def read_json_object(path: str, what: str, name: str) -> dict:
    """A JSON file that must hold one object: unreadable, not UTF-8, not JSON or not an object is one line."""
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or a number past int's digit limit
        raise HeadroomInputError(f"checkpoint {what}: {name} is not valid JSON") from None
    except OSError as e:
        raise HeadroomInputError(f"checkpoint {what}: {name} cannot be read ({e.strerror or e})") from None
    if not isinstance(obj, dict):
        raise HeadroomInputError(f"checkpoint {what}: {name} holds a JSON {type(obj).__name__}, not an object")
    return obj


def read_model_config(model_dir: str, what: str | None = None) -> dict:
    """The config.json of a Hugging Face model directory, checked to be a supported model type whose head and
    layer counts, positions and architectures are of the shape headroom reads (no torch)."""
    what = what or model_dir
    if not os.path.isdir(model_dir):
        raise HeadroomInputError(f"checkpoint {what}: no such directory")
    cpath = os.path.join(model_dir, "config.json")
    if not os.path.isfile(cpath):
        raise HeadroomInputError(f"checkpoint {what}: no config.json (not a Hugging Face model directory)")
    cfg = read_json_object(cpath, what, "config.json")
    mt = cfg.get("model_type")
    if not isinstance(mt, str) or mt not in SUPPORTED_MODEL_TYPES:
        raise HeadroomInputError(f"checkpoint {what}: model type {mt!r} is not supported "
                                 f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    _layer_heads(cfg, what)
    max_pos = _max_positions(cfg)
    if max_pos is not None and not _count(max_pos):
        raise HeadroomInputError(f"checkpoint {what}: config.json's maximum positions {max_pos!r} is not a "
                                 "positive integer")
    archs = cfg.get("architectures")
    if archs is not None and (not isinstance(archs, list) or not all(isinstance(a, str) for a in archs)):
        raise HeadroomInputError(f"checkpoint {what}: config.json's architectures is not a list of class names")
    return cfg


def _max_positions(cfg: dict):
    return cfg.get("max_position_embeddings", cfg.get("n_positions"))


def _count(value) -> bool:
    """A positive whole number as JSON writes one (not a bool, not a float)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _layer_heads(cfg: dict, what: str) -> list[int]:
    """Every layer's head count: headroom's own per-layer block when the config carries one, else the uniform
    count transformers reads; either of another shape is one line."""
    meta = cfg.get("headroom")
    if meta is not None and not isinstance(meta, dict):
        raise HeadroomInputError(f"checkpoint {what}: config.json's headroom block is not an object")
    layers = (meta or {}).get("layers")
    if layers:
        if not isinstance(layers, list) or not all(
                isinstance(l, dict) and _count(l.get("heads")) and _count(l.get("kv_heads", l.get("heads")))
                for l in layers):
            raise HeadroomInputError(f"checkpoint {what}: config.json's headroom.layers is not a list of "
                                     "{\"heads\": <positive integer>, \"kv_heads\": <positive integer>} objects")
        if not _count(meta.get("head_dim")):
            raise HeadroomInputError(f"checkpoint {what}: config.json's headroom.head_dim is not a positive integer")
        return [l["heads"] for l in layers]
    n = cfg.get("num_attention_heads", cfg.get("n_head"))
    count = cfg.get("num_hidden_layers", cfg.get("n_layer"))
    if not _count(n) or not _count(count):
        raise HeadroomInputError(f"checkpoint {what}: config.json lacks head or layer counts")
    return [n] * count


METRICS_FILE = "metrics.json"  # a run directory's numbers, beside its model/ (train.write_run, the trials)


def _run_record(mpath: str, what: str) -> dict:
    """A `headroom train` run's metrics.json: an object whose data and training configs, where present, are
    objects too (what `prune` and `score` read from it)."""
    run = read_json_object(mpath, what, METRICS_FILE)
    for key in ("data_config", "train_config"):
        if run.get(key) is not None and not isinstance(run[key], dict):
            raise HeadroomInputError(f"checkpoint {what}: {METRICS_FILE}'s {key} is not an object")
    return run


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
            run = _run_record(mpath, path)
    cfg = read_model_config(model_dir, what=path)
    mt = cfg["model_type"]
    heads = _layer_heads(cfg, path)
    max_pos = _max_positions(cfg)
    has_tok = any(os.path.isfile(os.path.join(model_dir, f)) for f in ("tokenizer.json", "vocab.txt", "vocab.json"))
    archs = cfg.get("architectures") or []
    family = "encoder" if mt == "bert" and any("MaskedLM" in a for a in archs) else "decoder"
    return CheckpointInfo(model_dir, mt, heads, max_pos, run, has_tok, family)
