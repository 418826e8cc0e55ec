"""Parameters and FLOPs of headroom's models, from their configs alone (no torch), and the Scratch-B budget they
decide. Tested against the built models' own parameters and modules (tests/test_config.py, test_pruning.py)."""

from __future__ import annotations

from dataclasses import dataclass

from lightning_modules.declarations.config import ModelConfig


@dataclass(frozen=True)
class Counts:
    attention: int
    mlp: int
    other: int  # embeddings, norms, LM head
    embedding: int = 0  # the part of `other` in embedding tables (token, position, token type)

    @property
    def total(self) -> int:
        return self.attention + self.mlp + self.other

    @property
    def non_embedding(self) -> int:
        """Kaplan et al. 2020's N: what the budget axis divides tokens by (embeddings are half of a small model's
        parameters with a large vocabulary, a few percent of a large one's)."""
        return self.total - self.embedding


def param_counts(cfg: ModelConfig, kv_heads_per_layer: list[int] | None = None) -> Counts:
    """Exact parameter counts of the models `lightning_modules.models.build.build_model` makes (tested against them).

    decoder (Llama): no biases, RMSNorm, SwiGLU MLP, tied embeddings.
    encoder (BERT): biases, LayerNorm, GELU MLP, learned positions, one token type, tied MLM decoder.
    """
    d, ff, v = cfg.d_model, cfg.d_ff, cfg.vocab_size
    kv = kv_heads_per_layer or cfg.layer_heads
    attn = 0
    for h, hk in zip(cfg.layer_heads, kv):
        inner, inner_kv = h * cfg.head_dim, hk * cfg.head_dim
        if cfg.family == "decoder":
            attn += d * inner + 2 * d * inner_kv + inner * d
        else:
            attn += 3 * (d * inner + inner) + inner * d + d
    if cfg.family == "decoder":
        mlp = cfg.n_layers * 3 * d * ff
        other = v * d + cfg.n_layers * 2 * d + d
        table = v * d  # tied with the LM head
    else:
        mlp = cfg.n_layers * (d * ff + ff + ff * d + d)
        table = v * d + cfg.max_seq_len * d + d  # token, position and one token-type table
        embeddings = table + 2 * d  # and their LayerNorm
        norms = cfg.n_layers * 2 * 2 * d
        head = d * d + d + 2 * d + v  # transform dense, LayerNorm, decoder bias (weight tied)
        other = embeddings + norms + head
    return Counts(attention=attn, mlp=mlp, other=other, embedding=table)


def flops_per_token(cfg: ModelConfig, seq_len: int, kv_heads_per_layer: list[int] | None = None) -> Counts:
    """Forward matmul FLOPs per token (2 per multiply-add), split into attention, MLP and the LM head.

    Attention = q/k/v/o projections + scores (QKᵀ and AV over the full context, as Kaplan et al. count it).
    Training costs 3× this (see `train_flops_per_token`). Norms, softmax and embeddings lookups are ignored.
    """
    d, ff, v = cfg.d_model, cfg.d_ff, cfg.vocab_size
    kv = kv_heads_per_layer or cfg.layer_heads
    attn = 0
    for h, hk in zip(cfg.layer_heads, kv):
        inner, inner_kv = h * cfg.head_dim, hk * cfg.head_dim
        attn += 2 * (d * inner + 2 * d * inner_kv + inner * d)  # projections
        attn += 2 * 2 * seq_len * inner  # QKᵀ and AV
    n_mats = 3 if cfg.family == "decoder" else 2
    mlp = cfg.n_layers * 2 * n_mats * d * ff
    other = 2 * d * v + (2 * d * d if cfg.family == "encoder" else 0)
    return Counts(attention=attn, mlp=mlp, other=other)


def train_flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """Forward + backward ≈ 3 × forward."""
    return 3 * flops_per_token(cfg, seq_len).total


def teacher_flops_per_token(dense: ModelConfig, seq_len: int) -> int:
    """A distillation teacher's cost per training token: one forward pass of the dense model, a third of its
    training step's FLOPs (`train_flops_per_token` / 3)."""
    return flops_per_token(dense, seq_len).total


def arm_flops_per_token(fwd_dense: float, fwd_pruned: float, dense_steps: int, recovery_steps: int,
                        distill: bool = False, scoring_passes: float = 0.0, continued_steps: int = 0) -> float:
    """The pruned arm's compute per token of one training step, from the forward FLOPs per token of the dense
    (`fwd_dense`) and pruned (`fwd_pruned`) models: T steps at dense size, the scoring of its heads
    (`scoring_passes`: forward passes of the dense model per training-step token, methods.scoring_passes), then the
    recovery steps at pruned size, each with the teacher's forward pass when the recovery distils, and after a prune
    during training the `continued_steps` at pruned size that finish the dense schedule (language-model loss):
    3·T·C_dense + S·C_dense + R·(3·C_pruned + [distill] C_dense) + 3·K·C_pruned. Evaluation is not counted. The
    one formula: the controls' budgets (with the config's counts) and `--plan`'s rows (with the built modules'
    counts) both use it."""
    per_recovery = 3 * fwd_pruned + (fwd_dense if distill else 0)
    return dense_steps * 3 * fwd_dense + scoring_passes * fwd_dense + recovery_steps * per_recovery \
        + continued_steps * 3 * fwd_pruned


def pruned_arm_flops_per_token(dense: ModelConfig, pruned: ModelConfig, dense_steps: int, recovery_steps: int,
                               seq_len: int, distill: bool = False, scoring_passes: float = 0.0) -> float:
    """`arm_flops_per_token` with the config's forward FLOPs of each model (`flops_per_token`)."""
    return arm_flops_per_token(flops_per_token(dense, seq_len).total, flops_per_token(pruned, seq_len).total,
                               dense_steps, recovery_steps, distill, scoring_passes)


def scratch_b_steps(
    dense: ModelConfig, pruned: ModelConfig, dense_steps: int, finetune_steps: int, seq_len: int,
    distill: bool = False, scoring_passes: float = 0.0,
) -> int:
    """Steps that give the pruned architecture, trained from scratch, the compute of the whole pruned arm: dense T
    steps at dense size + the scoring of its heads + the recovery steps at pruned size (Liu et al. 2019
    "Scratch-B"; every candidate fine-tune counts: F per rate tried when the rate is chosen on val), the teacher's
    forward passes included when the recovery distils. Tokens per step are equal, so the budget converts to steps
    via FLOPs per token."""
    budget = pruned_arm_flops_per_token(dense, pruned, dense_steps, finetune_steps, seq_len, distill,
                                        scoring_passes)
    return int(round(budget / train_flops_per_token(pruned, seq_len)))


def scratch_kd_steps(dense: ModelConfig, pruned: ModelConfig, dense_steps: int, finetune_steps: int,
                     seq_len: int, scoring_passes: float = 0.0) -> int:
    """Steps of the `scratch_kd` control — the pruned architecture from scratch, distilled from the dense teacher
    at every step — that spend the distilled pruned arm's compute (scoring included), each step's teacher pass
    counted: (T·C_dense + S + R·(C_pruned + C_dense/3)) / (C_pruned + C_dense/3)."""
    budget = pruned_arm_flops_per_token(dense, pruned, dense_steps, finetune_steps, seq_len, distill=True,
                                        scoring_passes=scoring_passes)
    return int(round(budget / (train_flops_per_token(pruned, seq_len) + teacher_flops_per_token(dense, seq_len))))
