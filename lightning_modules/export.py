"""`headroom export`: a model directory anyone can load with torch and transformers alone.

A model transformers can build from its own config (a dense or uniformly pruned decoder whose heads divide the
hidden size) is written as a plain checkpoint. Any other — a `global` prune's per-layer head counts, a pruned GPT-2
or BERT, headroom's rotary encoder — carries `modeling_headroom.py` (lightning_modules/hf_remote.py) and an
`auto_map` in its config.json, and loads with `trust_remote_code=True`. The tokenizer goes with it: the checkpoint's
own, or headroom's byte tokenizer as a transformers one. Written to a temporary directory and renamed into place:
nothing half-written.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from .config import BYTE_VOCAB_SIZE

REMOTE_FILE = "modeling_headroom.py"


def _plain_shape(config) -> tuple[int, int, int] | None:
    """(heads, key/value heads, head size) every layer has when transformers builds `config` itself."""
    mt = config.model_type
    if mt == "llama":
        n = config.num_attention_heads
        return n, config.num_key_value_heads or n, getattr(config, "head_dim", None) or config.hidden_size // n
    if mt == "gpt2":
        return config.n_head, config.n_head, config.n_embd // config.n_head
    if mt == "bert":
        return config.num_attention_heads, config.num_attention_heads, config.hidden_size // config.num_attention_heads
    return None


def needs_remote_code(config) -> bool:
    """Whether plain transformers would build a different model from `config`: headroom's rotary encoder, or
    recorded layers whose heads, key/value heads or head size are not the config's own."""
    meta = getattr(config, "headroom", None) or {}
    if meta.get("rotary"):
        return True
    layers, hd = meta.get("layers") or [], int(meta.get("head_dim") or 0)
    plain = _plain_shape(config)
    return any((int(s["heads"]), int(s.get("kv_heads", s["heads"])), hd) != plain for s in layers)


def export(checkpoint: str, out: Path) -> dict:
    """Write `checkpoint` (a headroom run directory or a model directory) to `out` as a self-contained Hugging Face
    directory; returns what was written ({"remote_code", "architecture", "tokenizer", "files"})."""
    from . import hf_remote
    from .checkpoints import checkpoint_info
    from .models import load_model
    from .tokens import ByteTokenizer

    info = checkpoint_info(checkpoint)
    model = load_model(info.model_dir)
    arch = type(model).__name__
    remote = needs_remote_code(model.config)
    if remote:
        if arch not in hf_remote.CLASSES:
            raise ValueError(f"{arch}: no modeling file for this architecture")
        cls, auto = hf_remote.CLASSES[arch]
        model.config.auto_map = {auto: f"{REMOTE_FILE[:-3]}.{cls}"}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(str(tmp))
        if remote:
            shutil.copyfile(hf_remote.__file__, tmp / REMOTE_FILE)
        if info.has_tokenizer:
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(info.model_dir).save_pretrained(str(tmp))
            tokenizer = "the checkpoint's"
        elif model.config.vocab_size == BYTE_VOCAB_SIZE:
            ByteTokenizer.for_transformers().save_pretrained(str(tmp))
            tokenizer = "headroom's bytes"
        else:
            tokenizer = None
        if out.exists():
            out.rmdir()  # empty (checked by the caller)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"remote_code": remote, "architecture": arch, "tokenizer": tokenizer,
            "files": sorted(p.name for p in out.iterdir())}
