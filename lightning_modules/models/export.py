"""`headroom export`: a model directory anyone can load with torch and transformers alone, and its ONNX graph.

A model transformers can build from its own config (a dense or uniformly pruned decoder whose heads divide the
hidden size) is written as a plain checkpoint. Any other — a `global` prune's per-layer head counts, a pruned GPT-2
or BERT, headroom's rotary encoder — carries `modeling_headroom.py` (lightning_modules/models/hf_remote.py), an `auto_map`
in its config.json and its class's name in `architectures` (as OpenELM's and Nemotron-NAS's directories do), and
loads with `trust_remote_code=True`. The tokenizer goes with it: the checkpoint's own, or headroom's byte tokenizer as
a transformers one. With `onnx=True` the directory also holds `onnx/model.onnx` (+ `model.onnx.data`), exported by
transformers' own ONNX exporter (torch.export, dynamic batch and length), checked in onnxruntime against PyTorch on
a batch of another shape. Written to a temporary directory and renamed into place: nothing half-written.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from lightning_modules.declarations.config import BYTE_VOCAB_SIZE

REMOTE_FILE = "modeling_headroom.py"
ONNX_FILE = "onnx/model.onnx"
ONNX_PACKAGES = ("onnx", "onnxscript", "onnxruntime")
CHECK_SHAPES = ((3, 12), (1, 1))  # the onnxruntime checks: other batch sizes and lengths than the export's sample
ONNX_RTOL, ONNX_ATOL = 1e-4, 1e-5  # the graph's logits against PyTorch's: |difference| <= atol + rtol * max |logit|
# the Auto class a plain (no remote code) directory of each architecture loads through
PLAIN_AUTO = {"LlamaModel": "AutoModel", "GPT2Model": "AutoModel", "BertModel": "AutoModel"}


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


def missing_onnx_packages() -> list[str]:
    return [p for p in ONNX_PACKAGES if importlib.util.find_spec(p) is None]


def export(checkpoint: str, out: Path, onnx: bool = False) -> dict:
    """Write `checkpoint` (a headroom run directory or a model directory) to `out` as a self-contained Hugging Face
    directory (see `write_export`)."""
    from lightning_modules.models.build import load_model
    from lightning_modules.models.checkpoints import checkpoint_info

    info = checkpoint_info(checkpoint)
    return write_export(load_model(info.model_dir), out, info.model_dir if info.has_tokenizer else None, onnx)


def write_export(model, out: Path, tokenizer_dir: str | None = None, onnx: bool = False) -> dict:
    """Write the loaded `model` to `out`, with the tokenizer of `tokenizer_dir` (or headroom's byte tokenizer for a
    byte vocabulary); returns what was written ({"remote_code", "architecture", "auto_class", "tokenizer",
    "files", and with onnx "onnx": {"file", "check_shape", "max_abs_diff", "max_abs_logit"}})."""
    from lightning_modules.data.tokens import ByteTokenizer
    from lightning_modules.models import hf_remote

    arch = type(model).__name__
    remote = needs_remote_code(model.config)
    if remote and arch not in hf_remote.CLASSES:
        raise ValueError(f"{arch}: no modeling file for this architecture")
    cls, auto = hf_remote.CLASSES.get(arch) or (None, PLAIN_AUTO.get(arch, "AutoModel"))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    done = {"remote_code": remote, "architecture": arch, "auto_class": auto}
    try:
        model.save_pretrained(str(tmp))
        if remote:
            shutil.copyfile(hf_remote.__file__, tmp / REMOTE_FILE)
            cfg = json.loads((tmp / "config.json").read_text())
            cfg.update(architectures=[cls], auto_map={auto: f"{REMOTE_FILE[:-3]}.{cls}"})
            (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        if tokenizer_dir is not None:
            from transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(str(tmp))
            done["tokenizer"] = "the checkpoint's"
        elif model.config.vocab_size == BYTE_VOCAB_SIZE:
            ByteTokenizer.for_transformers().save_pretrained(str(tmp))
            done["tokenizer"] = "headroom's bytes"
        else:
            done["tokenizer"] = None
        if onnx:
            done["onnx"] = write_onnx(model, tmp / ONNX_FILE)
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp's 0700 would hide the directory from other users
        if out.exists():
            out.rmdir()  # empty (checked by the caller)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    done["files"] = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    return done


def _ids(model, shape: tuple[int, int], seed: int):
    import torch

    cfg = model.config
    t = min(shape[1], getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None) or shape[1])
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, min(cfg.vocab_size, 256), (shape[0], t), generator=g)


def write_onnx(model, path: Path) -> dict:
    """The model's logits as an ONNX graph at `path` (its weights in `path`.data), through transformers' exporter
    with dynamic batch and sequence length; then run in onnxruntime on batches of other shapes (CHECK_SHAPES) and
    compared with PyTorch's logits: a difference past ONNX_ATOL + ONNX_RTOL x the largest |logit| raises ValueError
    (the caller writes nothing). Returns the file and the comparison."""
    import numpy as np
    import onnxruntime as ort
    import torch
    from transformers.exporters.exporter_onnx import OnnxConfig, OnnxExporter

    path.parent.mkdir(parents=True, exist_ok=True)
    device = next(model.parameters()).device
    use_cache = getattr(model.config, "use_cache", None)
    model.config.use_cache = False  # logits only: no key/value cache outputs
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # registry notes about torchvision ops it lacks
    try:
        with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):  # the exporter's progress lines
            dyn = {"input_ids": {0: torch.export.Dim.DYNAMIC, 1: torch.export.Dim.DYNAMIC}}  # batch, length
            program = OnnxExporter().export(model, {"input_ids": _ids(model, (2, 8), 0).to(device)},
                                            config=OnnxConfig(dynamic_shapes=dyn)).program
        OnnxExporter.save_program(program, path)
    finally:
        model.config.use_cache = use_cache
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = torch.get_num_threads()
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    checks = []
    for k, shape in enumerate(CHECK_SHAPES):
        ids = _ids(model, shape, k + 1)
        got = session.run(["logits"], {"input_ids": ids.numpy()})[0]
        with torch.no_grad():
            want = model(input_ids=ids.to(device), use_cache=False).logits.float().cpu().numpy()
        diff, top = float(np.abs(got - want).max()), float(np.abs(want).max())
        if not diff <= ONNX_ATOL + ONNX_RTOL * top:
            raise ValueError(f"the ONNX graph's logits differ from PyTorch's by {diff:.2e} on a {shape[0]}x{shape[1]} "
                             f"batch (largest |logit| {top:.3g})")
        checks.append((list(ids.shape), diff, top))
    return {"file": path.name, "check_shape": checks[0][0], "max_abs_diff": max(c[1] for c in checks),
            "max_abs_logit": max(c[2] for c in checks), "shapes_checked": [c[0] for c in checks]}
