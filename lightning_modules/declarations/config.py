"""Typed, validated configs, the scale presets, head arithmetic, and the one home of every default.

This module imports pydantic only — never torch — so the CLI can validate its input and fail with one line
before any framework is loaded. Parameters, FLOPs and Scratch-B steps are in costs.py; what a checkpoint
directory holds is in checkpoints.py.

Vocabulary (docs/design.md): a *scale* is a named preset fixing d_model, layers, d_ff, head_dim and the dense
head count H; `heads_kept(H, ratio)` is the head count a prune ratio leaves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lightning_modules.declarations.bounds import Seed, check_tokens, fits_int64

Family = Literal["decoder", "encoder"]
FAMILIES: tuple[str, ...] = ("decoder", "encoder")

# Byte-level tokenisation: ids 0..255 are bytes, then the specials.
PAD_ID, MASK_ID, EOS_ID = 256, 257, 258
BYTE_VOCAB_SIZE = 260  # 256 bytes + pad, mask, eos, one spare (keeps the size a multiple of 4)


class HeadroomInputError(ValueError):
    """Bad user input. The CLI prints `str(err)` as one line on stderr and exits 2."""


class Strict(BaseModel):
    """Every validated config: unknown keys are errors, values never change after validation, no float is infinite
    or NaN, and no integer is past a signed 64-bit integer (in lists and mappings too)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _bounded(cls, v):
        fits_int64(v)
        return v




def jsonable(obj):
    """obj with every non-finite float as None (JSON has no NaN or infinity), through dicts, lists and tuples."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return obj


class ModelConfig(Strict):
    """Architecture of one model. `head_dim=None` means d_model // n_heads (which must then divide).

    `heads_per_layer` describes a non-uniform model (a Scratch-E control of a `global` prune copies the pruned
    model's per-layer counts); when given, `n_heads` is its maximum.
    """

    family: Family = "decoder"
    d_model: int = Field(gt=0)
    n_layers: int = Field(gt=0)
    n_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    d_ff: int = Field(gt=0)
    vocab_size: int = Field(default=BYTE_VOCAB_SIZE, gt=0)
    max_seq_len: int = Field(gt=0)
    heads_per_layer: tuple[int, ...] | None = None

    @model_validator(mode="before")
    @classmethod
    def _derive_head_dim(cls, data):
        if isinstance(data, dict) and data.get("head_dim") is None:
            d, h = data.get("d_model"), data.get("n_heads")
            if isinstance(d, int) and isinstance(h, int) and h > 0:
                if d % h:
                    raise ValueError(
                        f"n_heads={h} does not divide d_model={d}; give head_dim explicitly"
                    )
                data = {**data, "head_dim": d // h}
        return data

    @model_validator(mode="after")
    def _check_layers(self):
        if self.heads_per_layer is not None:
            if len(self.heads_per_layer) != self.n_layers:
                raise ValueError(
                    f"heads_per_layer has {len(self.heads_per_layer)} entries for {self.n_layers} layers"
                )
            if min(self.heads_per_layer) < 1:
                raise ValueError("heads_per_layer: every layer keeps at least one head")
            if max(self.heads_per_layer) != self.n_heads:
                raise ValueError("n_heads must equal max(heads_per_layer)")
        return self

    @property
    def layer_heads(self) -> list[int]:
        """Heads in each layer (uniform models repeat n_heads)."""
        return list(self.heads_per_layer) if self.heads_per_layer else [self.n_heads] * self.n_layers

    @property
    def uniform(self) -> bool:
        return len(set(self.layer_heads)) == 1

    def with_heads(self, heads: int | list[int] | tuple[int, ...], head_dim: int | None = None) -> ModelConfig:
        """Same architecture with other head counts (int: uniform; list: per layer) and optionally head_dim."""
        data = self.model_dump()
        if isinstance(heads, int):
            data.update(n_heads=heads, heads_per_layer=None)
        else:
            heads = tuple(int(h) for h in heads)
            if len(heads) != self.n_layers:
                raise ValueError(f"heads_per_layer has {len(heads)} entries for {self.n_layers} layers")
            data.update(n_heads=max(heads), heads_per_layer=None if len(set(heads)) == 1 else heads)
        if head_dim is not None:
            data["head_dim"] = head_dim
        return ModelConfig(**data)


# wsd: warmup-stable-decay (Hägele et al. 2024): the peak rate until the last `cooldown_fraction` of the steps, then
# a (1 - sqrt) decay to min_lr_ratio. Its rate up to a budget's cooldown does not depend on the budget, so one long
# run's checkpoint there starts every shorter budget's cooldown (orchestration/design/trunks.py)
Schedule = Literal["cosine", "linear", "constant", "wsd"]
Precision = Literal["auto", "32-true", "bf16-mixed", "16-mixed"]


class TrainConfig(Strict):
    steps: int = Field(gt=0)
    batch_size: int = Field(default=16, gt=0)
    seq_len: int = Field(default=128, gt=1)
    lr: float = Field(default=3e-3, gt=0)
    warmup_steps: int = Field(default=30, ge=0)
    schedule: Schedule = "cosine"
    min_lr_ratio: float = Field(default=0.1, ge=0, le=1)
    cooldown_fraction: float = Field(default=0.2, gt=0, le=1)  # wsd: the decaying share of the steps
    weight_decay: float = Field(default=0.1, ge=0)
    grad_clip: float = Field(default=1.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.95)
    precision: Precision = "auto"  # auto: bf16-mixed on a GPU, 32-true on a CPU
    seed: Seed = 0
    val_every: int = Field(default=100, gt=0)
    val_batches: int = Field(default=8, gt=0)
    # final evaluation: every clean window of each eval set up to EVAL_CAP_TOKENS (None), or this many batches
    eval_batches: int | None = Field(default=None, gt=0)
    mlm_probability: float = Field(default=0.15, gt=0, lt=1)

    @model_validator(mode="after")
    def _tokens(self):
        check_tokens("steps", self.steps, self.batch_size, self.seq_len)
        return self


def cooldown_start(cfg: TrainConfig, total_steps: int | None = None) -> int:
    """The step at which a `wsd` schedule of `total_steps` (default cfg.steps) leaves its peak rate: the last
    round(cooldown_fraction · total) steps decay (at least one), never before the warmup ends. Up to this step the
    schedule is the same for every budget, so a longer run's checkpoint here starts this budget's cooldown."""
    total = total_steps or cfg.steps
    warm = min(cfg.warmup_steps, max(total - 1, 0))
    return max(warm, total - max(1, round(cfg.cooldown_fraction * total)))


# The stated cap of a whole-split evaluation (eval_batches None): at most this many tokens per eval set, windows
# evenly spaced over the split when it is longer.
EVAL_CAP_TOKENS = 1 << 20

DATA_SOURCE_HELP = "stdlib, path:GLOB, hf:NAME[:CONFIG] or mqar"


class DataConfig(Strict):
    """Where the text comes from and how it is cut into splits (see lightning_modules/data/corpus.py).

    source: `stdlib` | `path:GLOB` | `hf:NAME[:CONFIG]` | `mqar`.
    shift: a second source for the shifted eval set (`path:` glob or `hf:` dataset); `stdlib` and `mqar` have
    their own shifted set built in.
    tokenizer: `byte` (default), `bpe` (trained on the train split, cached by corpus hash), or `pretrained:DIR`.
    """

    source: str = "stdlib"
    shift: str | None = None
    tokenizer: str = "byte"
    bpe_vocab_size: int = Field(default=1024, ge=260)
    val_fraction: float = Field(default=0.04, gt=0, lt=0.5)
    calibration_fraction: float = Field(default=0.03, gt=0, lt=0.5)
    eval_fraction: float = Field(default=0.04, gt=0, lt=0.5)
    text_column: str = "text"

    @field_validator("source")
    @classmethod
    def _source(cls, v: str) -> str:
        kind = v.split(":", 1)[0]
        if v in ("stdlib", "mqar"):
            return v
        if kind in ("path", "hf") and len(v) > len(kind) + 1:
            return v
        raise ValueError(f"unknown data source {v!r}; expected {DATA_SOURCE_HELP}")

    @field_validator("shift")
    @classmethod
    def _shift(cls, v: str | None) -> str | None:
        if v is None:
            return v
        kind = v.split(":", 1)[0]
        if kind in ("path", "hf") and len(v) > len(kind) + 1:
            return v
        raise ValueError(f"shift source {v!r} must be path:GLOB or hf:NAME[:CONFIG]")

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer(cls, v: str) -> str:
        if v in ("byte", "bpe") or (v.startswith("pretrained:") and len(v) > 11):
            return v
        raise ValueError(f"unknown tokenizer {v!r}; expected byte, bpe or pretrained:DIR")

    @model_validator(mode="after")
    def _fractions(self):
        if self.val_fraction + self.calibration_fraction + self.eval_fraction >= 0.5:
            raise ValueError("val + calibration + eval fractions must leave at least half for training")
        return self


# --------------------------------------------------------------------------------------------------- scales


@dataclass(frozen=True)
class Scale:
    """A named preset. d_model = n_heads * head_dim; H is a multiple of 4 (ratios 0.25/0.5/0.75 keep whole heads)."""

    name: str
    d_model: int
    n_layers: int
    n_heads: int
    head_dim: int
    d_ff: int
    max_seq_len: int
    # a training budget that fits the scale's hardware (xs/s/m: 2 CPU cores; l/xl: one GPU)
    steps: int
    batch_size: int
    seq_len: int
    lr: float


SCALES: dict[str, Scale] = {
    s.name: s
    for s in (
        # presets small enough to train until they stop gaining on two CPU cores (docs/measured/ladder.json):
        # the width grows, the 8 heads and 2 layers stay, head_dim = d_model / 8
        Scale("xxxs", d_model=32, n_layers=2, n_heads=8, head_dim=4, d_ff=128, max_seq_len=256,
              steps=2400, batch_size=16, seq_len=128, lr=3e-3),
        Scale("xxs", d_model=48, n_layers=2, n_heads=8, head_dim=6, d_ff=192, max_seq_len=256,
              steps=4800, batch_size=16, seq_len=128, lr=3e-3),
        Scale("xs", d_model=64, n_layers=2, n_heads=8, head_dim=8, d_ff=256, max_seq_len=256,
              steps=300, batch_size=16, seq_len=128, lr=3e-3),
        Scale("s", d_model=128, n_layers=4, n_heads=8, head_dim=16, d_ff=512, max_seq_len=256,
              steps=400, batch_size=16, seq_len=128, lr=2e-3),
        Scale("m", d_model=256, n_layers=6, n_heads=8, head_dim=32, d_ff=1024, max_seq_len=512,
              steps=600, batch_size=16, seq_len=256, lr=1e-3),
        Scale("l", d_model=512, n_layers=8, n_heads=16, head_dim=32, d_ff=2048, max_seq_len=1024,
              steps=20000, batch_size=64, seq_len=512, lr=6e-4),
        # about GPT-2 small: d_model 768, 12 layers; 16 heads of 48 dims
        Scale("xl", d_model=768, n_layers=12, n_heads=16, head_dim=48, d_ff=3072, max_seq_len=1024,
              steps=50000, batch_size=64, seq_len=1024, lr=6e-4),
    )
}


def get_scale(name: str) -> Scale:
    try:
        return SCALES[name]
    except KeyError:
        raise HeadroomInputError(f"unknown scale {name!r}; choose one of {', '.join(SCALES)}") from None


def model_config_for(
    scale: str,
    family: str = "decoder",
    n_heads: int | None = None,
    head_dim: int | None | Literal["auto"] = None,
    vocab_size: int = BYTE_VOCAB_SIZE,
    heads_per_layer: list[int] | None = None,
) -> ModelConfig:
    """The ModelConfig of a scale. `n_heads` keeps the preset's head_dim (the Scratch-E architecture);
    `head_dim="auto"` makes the heads as wide as d_model allows (`wide_head_dim`: the `wide` control); an int
    sets it."""
    sc = get_scale(scale)
    if family not in FAMILIES:
        raise HeadroomInputError(f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}")
    h = sc.n_heads if n_heads is None else n_heads
    hd: int | None
    if head_dim is None:
        hd = sc.head_dim
    elif head_dim == "auto":
        hd = wide_head_dim(sc.d_model, h)
    else:
        hd = head_dim
    try:
        cfg = ModelConfig(
            family=family, d_model=sc.d_model, n_layers=sc.n_layers, n_heads=h, head_dim=hd,
            d_ff=sc.d_ff, vocab_size=vocab_size, max_seq_len=sc.max_seq_len,
        )
        if heads_per_layer is not None:
            cfg = cfg.with_heads(heads_per_layer)
    except ValueError as e:
        raise HeadroomInputError(f"scale {scale}: {first_error(e)}") from None
    return cfg


PRESET_FIELDS = ("steps", "batch_size", "seq_len", "lr")  # the TrainConfig fields a scale preset sets


def train_config_for(scale: str, **overrides) -> TrainConfig:
    sc = get_scale(scale)
    base = {k: getattr(sc, k) for k in PRESET_FIELDS}
    base.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return TrainConfig(**base)
    except ValueError as e:
        raise HeadroomInputError(first_error(e)) from None


def check_compatible(model: ModelConfig, train: TrainConfig) -> None:
    if train.seq_len > model.max_seq_len:
        raise HeadroomInputError(
            f"seq_len {train.seq_len} exceeds the model's max_seq_len {model.max_seq_len}"
        )


def first_error(e: Exception) -> str:
    """One line from a pydantic ValidationError: 'field: message'."""
    errors = getattr(e, "errors", None)
    if callable(errors):
        err = errors()[0]
        loc = ".".join(str(x) for x in err.get("loc", ()))
        msg = err.get("msg", str(e)).removeprefix("Value error, ")
        return f"{loc}: {msg}" if loc else msg
    return str(e).splitlines()[0]


# ---------------------------------------------------------------------------------------- head arithmetic


def heads_removed(n_heads: int, ratio: float) -> int:
    """round(ratio·H), halves rounded up (Python's round() would send 0.5 to 0 and 2.5 to 2)."""
    return math.floor(ratio * n_heads + 0.5)


def kept_counts(layer_heads: list[int], ratio: float, scope: str) -> tuple[list[int] | None, int]:
    """How many heads a prune keeps — decided here once, for the pruner (pruning.heads_to_keep) and the plan's rows
    alike: (per layer, or None for a global prune, whose scores choose the layers; the total). per_layer: layer l
    keeps n_l − round(ratio·n_l), at least one. global: round(ratio·N) heads go, but never a layer's last."""
    if scope == "per_layer":
        kept = [max(1, n - heads_removed(n, ratio)) for n in layer_heads]
        return kept, sum(kept)
    total = sum(layer_heads)
    return None, total - min(heads_removed(total, ratio), total - len(layer_heads))


def heads_kept(n_heads: int, ratio: float) -> int:
    """Heads left after removing a fraction `ratio` of H: H − round(ratio·H). At least one must stay."""
    if not 0 <= ratio < 1:
        raise HeadroomInputError(f"ratio {ratio} must be in [0, 1)")
    kept = n_heads - heads_removed(n_heads, ratio)
    if kept < 1:
        raise HeadroomInputError(f"ratio {ratio} leaves no head of {n_heads}")
    return kept


def within_tolerance(loss: float, dense_loss: float, tolerance: float) -> bool:
    """Half (1) of the claim: a pruned loss counts as "little loss" when it is at most dense × (1 + tolerance)
    (the sweep's `prune.tolerance`, relative, declared before running)."""
    return loss <= dense_loss * (1 + tolerance)


def prunable_fraction(ratios, losses, dense_loss: float, tolerance: float) -> float:
    """The largest ratio of a prune curve up to which every point stays within tolerance of dense (Michel et al.:
    how much can go with no noticeable loss). Points are sorted by ratio; 0.0 when even the first one fails."""
    best = 0.0
    for r, loss in sorted(zip(ratios, losses)):
        if not within_tolerance(loss, dense_loss, tolerance):
            break
        best = r
    return best


def wide_head_dim(d_model: int, n_heads_kept: int, width: int | None = None) -> int:
    """The `wide` control: the kept heads made as wide as the dense model's attention, the usual "fewer, wider
    heads" configuration. `width` is the dense model's attention width (its heads × head_dim; default d_model, a
    preset's own). head_dim is the largest even number ≤ min(width, d_model) / heads_kept: rotary position
    embeddings rotate pairs of dimensions, so an odd head size cannot be built. So the wide model's attention is
    never wider than the dense model's: heads_kept·head_dim equals the dense width when the division comes out
    even, else a little less (at width 128 and 6 heads, 6 × 20 = 120). A sweep that sets fewer heads than the preset
    (s at 4 heads of 16: width 64) gets wide heads of at most that width (2 heads of 32 at ratio 0.5), not d_model."""
    cap = d_model if width is None else min(width, d_model)
    hd = 2 * (cap // (2 * n_heads_kept))
    if hd < 2:
        raise HeadroomInputError(f"wide: {n_heads_kept} heads leave less than 2 dimensions each of the dense "
                                 f"attention width {cap}")
    return hd
