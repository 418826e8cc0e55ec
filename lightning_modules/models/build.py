"""Build headroom's two model families from transformers v5 classes, and save/load any supported checkpoint.

* `decoder` — `LlamaForCausalLM` (RoPE, RMSNorm, SwiGLU, no biases), tied embeddings.
* `encoder` — `BertForMaskedLM` (post-LayerNorm, GELU, learned absolute positions) with two headroom changes:
  - an explicit head_dim: BERT ties head size to d_model/H, so headroom builds it with a placeholder head count
    and reshapes the attention of each layer to H heads of head_dim (heads.reshape_layers), initialised as BERT
    initialises them;
  - rotary position embeddings on queries and keys (as RoFormer, Su et al. 2021), through transformers'
    AttentionInterface (`headroom_rope_sdpa` / `headroom_rope_eager`). Why: with learned absolute positions only,
    a small byte-level masked LM keeps near-uniform attention and stays at the bag-of-bytes plateau (measured
    on the stdlib corpus at scale xs: val 2.69 nats/byte after 1000 steps against a unigram entropy of 2.86);
    with rotary positions it reaches 2.31 in 300 steps. Plain BERT checkpoints keep their own attention.

Every model headroom makes or prunes records `config.headroom` (its ModelConfig, the heads of each layer, the
head_dim) and `load_model` rebuilds it from that. Plain Llama, GPT-2 and BERT checkpoint directories load too.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from lightning_modules.declarations.config import EOS_ID, PAD_ID, HeadroomInputError, ModelConfig
from lightning_modules.models.checkpoints import read_json_object, read_model_config
from lightning_modules.models.families import family_of, layer_shapes
from lightning_modules.models.heads import attention_modules, reshape_layers

# architectures headroom loads, by the name transformers writes into config.json
ARCHITECTURES = {
    "LlamaForCausalLM": "llama", "LlamaModel": "llama",
    "GPT2LMHeadModel": "gpt2", "GPT2Model": "gpt2",
    "BertForMaskedLM": "bert", "BertModel": "bert",
}
DEFAULT_ARCH = {"llama": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel", "bert": "BertForMaskedLM"}


def _quiet_transformers():
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    from lightning_modules.models.hf_remote import register_rotary  # imports transformers: here, once it is wanted

    register_rotary()
    return transformers


def plain_heads(cfg: ModelConfig) -> bool:
    """Whether transformers' own config can describe the architecture: uniform heads, and (its configs validate
    this even with an explicit head_dim) heads dividing d_model; BERT also needs head_dim = d_model / heads."""
    if not cfg.uniform or cfg.d_model % cfg.n_heads:
        return False
    return cfg.family == "decoder" or cfg.d_model // cfg.n_heads == cfg.head_dim


def is_rotary_encoder(model) -> bool:
    return bool((getattr(model.config, "headroom", None) or {}).get("rotary"))


def set_attention(model, kind: str = "sdpa") -> None:
    """Switch the attention implementation (`sdpa`, or `eager`, which can return attention weights), keeping
    headroom's rotary encoder rotary."""
    from lightning_modules.models.hf_remote import (
        ROTARY,  # the rotary attention lives in the file a saved encoder carries
    )

    name = f"{ROTARY}_{kind}" if is_rotary_encoder(model) else kind
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            cfg._attn_implementation = name


def hf_config(cfg: ModelConfig, pad_id: int = PAD_ID, eos_id: int = EOS_ID):
    """The transformers config of a headroom ModelConfig. It records the ModelConfig and the true heads of every
    layer under `headroom`; where transformers cannot express them (`plain_heads` is false) its head fields hold
    a valid placeholder (1 head) and `build_model`/`load_model` reshape the layers from the record."""
    tf = _quiet_transformers()
    n = cfg.n_heads if plain_heads(cfg) else 1
    common = dict(vocab_size=cfg.vocab_size, hidden_size=cfg.d_model, num_hidden_layers=cfg.n_layers,
                  num_attention_heads=n, intermediate_size=cfg.d_ff,
                  max_position_embeddings=cfg.max_seq_len, pad_token_id=pad_id, tie_word_embeddings=True)
    if cfg.family == "decoder":
        config = tf.LlamaConfig(**common, num_key_value_heads=n, head_dim=cfg.head_dim,
                                rms_norm_eps=1e-5, attention_dropout=0.0, bos_token_id=eos_id,
                                eos_token_id=eos_id, rope_theta=10000.0)
        config.architectures = ["LlamaForCausalLM"]
    else:
        config = tf.BertConfig(**common, type_vocab_size=1, hidden_dropout_prob=0.0,
                               attention_probs_dropout_prob=0.0)
        config.architectures = ["BertForMaskedLM"]
    config.headroom = {
        "model_config": cfg.model_dump(mode="json"),
        "layers": [{"heads": h, "kv_heads": h} for h in cfg.layer_heads],
        "head_dim": cfg.head_dim,
        "rotary": cfg.family == "encoder",
    }
    return config


def _needs_reshape(model, layers: list[dict], head_dim: int) -> bool:
    return [(n, kv, hd) for n, kv, hd in layer_shapes(model)] != [
        (int(s["heads"]), int(s.get("kv_heads", s["heads"])), head_dim) for s in layers
    ]


def build_model(cfg: ModelConfig, seed: int, pad_id: int = PAD_ID, eos_id: int = EOS_ID):
    """A randomly initialised model of `cfg`, the same for the same seed."""
    tf = _quiet_transformers()
    config = hf_config(cfg, pad_id, eos_id)
    cls = tf.LlamaForCausalLM if cfg.family == "decoder" else tf.BertForMaskedLM
    torch.manual_seed(seed)
    model = cls(config)
    set_attention(model, "sdpa")
    meta = config.headroom
    if _needs_reshape(model, meta["layers"], cfg.head_dim):
        reshape_layers(model, meta["layers"], cfg.head_dim)
        for attn in attention_modules(model):
            for m in attn.modules():
                if isinstance(m, nn.Linear):
                    model._init_weights(m)
    return model


def model_config_of(model) -> ModelConfig | None:
    meta = getattr(model.config, "headroom", None) or {}
    mc = meta.get("model_config")
    return ModelConfig(**mc) if mc else None


def is_causal(model) -> bool:
    return family_of(model).name in ("llama", "gpt2")


def has_lm_head(model) -> bool:
    return type(model).__name__ in ("LlamaForCausalLM", "GPT2LMHeadModel", "BertForMaskedLM")


# -------------------------------------------------------------------------------------------- save/load


def save_model(model, directory: str | os.PathLike, tokenizer=None) -> None:
    """`save_pretrained` plus, for pretrained tokenizers, the tokenizer files."""
    _quiet_transformers()
    model.save_pretrained(str(directory))
    tok = getattr(tokenizer, "tok", None)
    if tok is not None and hasattr(tok, "save_pretrained"):
        tok.save_pretrained(str(directory))


def _state_dict_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.exists():
        weight_map = read_json_object(str(index), str(directory), index.name).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map or not all(
                isinstance(f, str) for f in weight_map.values()):
            raise HeadroomInputError(f"checkpoint {directory}: {index.name} has no weight_map of tensor names to "
                                     "shard files")
        files = [directory / f for f in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise HeadroomInputError(f"checkpoint {directory}: {index.name} names shard {missing[0]}, which is "
                                     "not there")
        return files
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (directory / name).exists():
            return [directory / name]
    return []


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else e.__class__.__name__


def _build(cls, config, meta: dict, directory: Path):
    """The model a headroom checkpoint's config.json describes (its per-layer heads), randomly initialised —
    built first on the meta device and counted: its parameters must fit in the weights files the checkpoint
    carries, so a config edited to another shape, or one whose numbers would allocate more than the machine
    holds, is refused in one line instead of being built."""
    files = _state_dict_files(directory)
    if not files:
        raise HeadroomInputError(f"checkpoint {directory}: no model weights (model.safetensors) found")

    def make():
        model = cls(config)
        if _needs_reshape(model, meta["layers"], int(meta["head_dim"])):
            reshape_layers(model, meta["layers"], int(meta["head_dim"]))
        return model

    try:
        with torch.device("meta"):
            n = sum(p.numel() for p in make().parameters())
    except Exception as e:
        raise HeadroomInputError(f"checkpoint {directory}: config.json describes no model headroom can build "
                                 f"({_first_line(e)})") from None
    have = sum(f.stat().st_size for f in files)
    if n > have:  # at least one byte a parameter in any dtype a checkpoint is written in
        raise HeadroomInputError(f"checkpoint {directory}: config.json describes {n:,} parameters, more than its "
                                 f"weights files ({have:,} bytes) can hold (truncated weights or an edited config)")
    return make()


def _load_state(model, directory: Path) -> None:
    from safetensors.torch import load_file

    files = _state_dict_files(directory)
    if not files:
        raise HeadroomInputError(f"checkpoint {directory}: no model weights (model.safetensors) found")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(str(f)) if f.suffix == ".safetensors" else torch.load(f, weights_only=True))
        except Exception as e:  # a truncated or corrupt file: safetensors', pickle's or zip's own error
            raise HeadroomInputError(f"checkpoint {directory}: {f.name} is damaged (truncated or corrupt: "
                                     f"{_first_line(e)})") from None
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as e:
        raise HeadroomInputError(f"checkpoint {directory}: weights do not fit its recorded architecture") from e
    # tied weights (LM head = embeddings) are saved once; anything else missing is an incomplete checkpoint
    shared = {p.data_ptr() for k, p in model.state_dict().items() if k in state}
    really_missing = [k for k in missing if model.state_dict()[k].data_ptr() not in shared]
    persistent_buffers = {k for k, _ in model.named_buffers()}
    really_missing = [k for k in really_missing if k not in persistent_buffers]
    if really_missing or unexpected:
        what = really_missing[:3] or unexpected[:3]
        raise HeadroomInputError(f"checkpoint {directory}: weights do not match its architecture ({what})")


def load_model(directory: str | os.PathLike):
    """Load a Llama, GPT-2 or BERT checkpoint directory: headroom's own (dense, pruned, non-uniform) or any
    plain transformers one. Raises HeadroomInputError (one line) for anything else."""
    tf = _quiet_transformers()
    d = Path(os.path.expanduser(str(directory)))
    mt = read_model_config(str(d))["model_type"]
    try:
        config = tf.AutoConfig.from_pretrained(str(d))
    except Exception as e:  # config.json of the right type whose values transformers cannot read
        raise HeadroomInputError(f"checkpoint {d}: config.json does not load ({_first_line(e)})") from None
    arch = (config.architectures or [DEFAULT_ARCH[mt]])[0]
    arch = arch.removeprefix("Headroom")  # a `headroom export` directory names its modeling file's class
    if hasattr(config, "auto_map"):  # headroom builds the model itself: a re-saved copy must not point at a
        del config.auto_map  # modeling file it does not carry
    if ARCHITECTURES.get(arch) != mt:
        raise HeadroomInputError(f"checkpoint {d}: architecture {arch!r} is not supported")
    cls = getattr(tf, arch)
    meta = getattr(config, "headroom", None) or {}
    if meta.get("layers"):
        model = _build(cls, config, meta, d)  # random init, replaced by the saved weights below
        _load_state(model, d)
        set_attention(model, "sdpa")
    else:
        try:
            model = cls.from_pretrained(str(d))
        except Exception as e:
            raise HeadroomInputError(f"checkpoint {d}: {str(e).strip().splitlines()[0]}") from None
    model.eval()
    return model


# ------------------------------------------------------------------------------------------------ losses


def token_losses(model, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example summed cross-entropy and number of predicted tokens: ([B], [B]).

    Causal LMs predict token t+1 from tokens ≤ t; masked LMs predict the masked tokens. `labels` is -100 where
    nothing is predicted (padding, MQAR context, unmasked positions).
    """
    out = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"))
    logits, labels = out.logits, batch["labels"]
    if is_causal(model):
        logits, labels = logits[:, :-1], labels[:, 1:]
    b, t, v = logits.shape
    ce = F.cross_entropy(logits.reshape(-1, v).float(), labels.reshape(-1), ignore_index=-100, reduction="none")
    ce = ce.view(b, t)
    mask = labels != -100
    return ce.sum(1), mask.sum(1)


def mean_loss(model, batch: dict) -> torch.Tensor:
    """Mean cross-entropy over the predicted tokens of the batch (nats/token)."""
    s, n = token_losses(model, batch)
    return s.sum() / n.sum().clamp_min(1)


def count_parameters(model, embeddings: bool = True) -> int:
    """Distinct parameters (tied weights once). `embeddings=False`: the non-embedding count (Kaplan et al. 2020's
    N), leaving out every nn.Embedding (token, position, token-type tables; a tied LM head with them)."""
    seen, total = set(), 0
    if not embeddings:
        for m in model.modules():
            if isinstance(m, nn.Embedding):
                seen.add(m.weight.data_ptr())
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel()
    return total
