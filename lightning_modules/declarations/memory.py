"""Peak accelerator memory of one training trial, from its configs alone (no torch): what `--plan` shows per unit
and checks fractional GPUs against.

A trial's memory is
  - static: 16 bytes per parameter (fp32 weights, their gradients, AdamW's two moments); a mixed precision adds
    the half-precision copies autocast keeps of the weights (2 bytes per parameter), data-parallel training
    DDP's gradient buckets (4 bytes per parameter);
  - activations: what autograd saves for the backward pass, bytes per token of the batch (`activation_bytes`,
    below), times batch_size / workers × seq_len;
  - transient: as the backward pass starts, the loss's fp32 gradients (two vocabulary-sized tensors per token)
    are alive beside the saved tensors; at evaluation (fp32, no autograd) the logits, the decoder's shifted copy,
    the log-softmax and one layer's intermediate tensors.
The estimate is the larger of the training step's peak and the evaluation's.

The bytes per token are counted tensor by tensor from what the two families save (RMSNorm and LayerNorm keep
their fp32 input and normalised output, each linear layer its input in the compute precision, SDPA its query,
key, value, output and one fp32 log-sum-exp per head, the MLP its activations, the loss the fp32 log-probabilities;
no T×T matrix, since SDPA's fused kernels do not keep one), and re-measured by tests/test_memory.py with
`torch.autograd.graph.saved_tensors_hooks` on the built models. The whole estimate is checked against the peak
RSS of a real training step on the CPU (benchmarks/plan_memory.py) and, where a GPU is lent, against
`torch.cuda.max_memory_allocated` (benchmarks/gpu_memory.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from lightning_modules.declarations.config import ModelConfig
from lightning_modules.declarations.costs import param_counts

# bytes per token that autograd saves, per layer: d_model, attention width (heads × head_dim), heads, d_ff, and a
# constant; and once, for the final norm or MLM head and the loss: d_model, vocabulary, a constant
_PER_LAYER = {
    ("decoder", 4): (24, 16, 4, 16, 8),
    ("decoder", 2): (26, 8, 4, 8, 8),
    ("encoder", 4): (16, 16, 4, 8, 16),
    ("encoder", 2): (16, 8, 4, 4, 16),
}
_HEAD = {
    ("decoder", 4): (12, 4, 20),
    ("decoder", 2): (10, 4, 24),
    ("encoder", 4): (20, 4, 32),
    ("encoder", 2): (12, 4, 32),
}
# a distilled loss keeps, per token and vocabulary entry, fp32 copies of the student's and teacher's logits, both
# log-softmaxes, the teacher's probabilities and their difference, some freed as the backward pass starts: bytes
# (measured 15 at fp32 and 20 at bf16-mixed by benchmarks/plan_memory.py; the larger is used)
KD_BYTES = 20


def compute_bytes(precision: str) -> int:
    """Bytes per element of the activations at a Lightning precision ("auto" must be resolved first)."""
    if precision in ("bf16-mixed", "16-mixed"):
        return 2
    if precision == "32-true":
        return 4
    raise ValueError(f"precision {precision!r}: resolve 'auto' to the trial's device first")


def activation_bytes(cfg: ModelConfig, precision: str) -> int:
    """Bytes per token autograd keeps for backward through the whole model and its loss."""
    a = compute_bytes(precision)
    hd, hv, hc = _HEAD[(cfg.family, a)]
    return sum(_layer_bytes(cfg, a, h) for h in cfg.layer_heads) + hd * cfg.d_model + hv * cfg.vocab_size + hc


def _layer_bytes(cfg: ModelConfig, a: int, heads: int) -> int:
    """Bytes per token one layer of `heads` heads saves at `a` bytes per activation."""
    cd, ca, ch, cf, c = _PER_LAYER[(cfg.family, a)]
    return cd * cfg.d_model + ca * heads * cfg.head_dim + ch * heads + cf * cfg.d_ff + c


def _widest_layer(cfg: ModelConfig) -> int:
    """Bytes per token of the widest layer at fp32: what one layer's forward holds at once without autograd."""
    return _layer_bytes(cfg, 4, max(cfg.layer_heads))


@dataclass(frozen=True)
class MemoryEstimate:
    params: int
    static: int  # weights, gradients, optimizer moments (and autocast's weight copies, DDP's buckets)
    activations: int  # saved for backward, at the per-worker batch
    transient: int  # the logits alive beside them
    evaluation: int  # the evaluation's peak (static without gradients, fp32 logits)

    @property
    def train(self) -> int:
        return self.static + self.activations + self.transient

    @property
    def peak(self) -> int:
        return max(self.train, self.evaluation)


def train_memory(cfg: ModelConfig, batch_size: int, seq_len: int, precision: str, workers: int = 1,
                 eval_batch_size: int | None = None, teacher: ModelConfig | None = None) -> MemoryEstimate:
    """Peak memory of one worker of a training trial of `cfg` (see the module's docstring); `teacher`: trained by
    distillation from that frozen model (its fp32 weights, and the fp32 distributions the loss keeps)."""
    p = param_counts(cfg).total
    a = compute_bytes(precision)
    static = 16 * p + (2 * p if a == 2 else 0) + (4 * p if workers > 1 else 0)
    tokens = max(1, batch_size // workers) * seq_len
    act = activation_bytes(cfg, precision) * tokens
    transient = 8 * cfg.vocab_size * tokens  # the loss's fp32 gradients at the start of the backward pass
    if teacher is not None:
        static += 4 * param_counts(teacher).total
        act += KD_BYTES * cfg.vocab_size * tokens
    evaluation = 12 * p + forward_bytes(cfg, (eval_batch_size or batch_size) * seq_len)  # weights, moments held
    return MemoryEstimate(params=p, static=static, activations=act, transient=transient, evaluation=evaluation)


def forward_bytes(cfg: ModelConfig, tokens: int) -> int:
    """An fp32 forward pass and its loss without autograd: the logits, the decoder's shifted copy and the
    log-softmax, and the widest layer's intermediate tensors, per token."""
    logits = (3 if cfg.family == "decoder" else 2) * 4 * cfg.vocab_size
    return (logits + _widest_layer(cfg)) * tokens


# How the scoring methods of lightning_modules/declarations/methods.py hold memory, all in fp32 (scoring runs without autocast).
# A method declares one of these (or its own function of the same signature) as `Method.memory`:
# (cfg, batch_size, seq_len, gpu) -> peak bytes of scoring cfg's heads on batches of batch_size × seq_len, on a GPU
# (gpu True) or a CPU; --plan packs GPUs by it.


def weights_memory(cfg: ModelConfig, batch_size: int, seq_len: int, gpu: bool = False) -> int:
    """The weights only (magnitude, random)."""
    return 4 * param_counts(cfg).total


def backward_memory(cfg: ModelConfig, batch_size: int, seq_len: int, gpu: bool = False) -> int:
    """A forward and backward pass at the calibration batch, parameters frozen (gradient, l0): an upper bound, since
    frozen weights spare the saved inputs of their products."""
    return weights_memory(cfg, 0, 0) + (activation_bytes(cfg, "32-true") + 8 * cfg.vocab_size) * batch_size * seq_len


def forward_memory(cfg: ModelConfig, batch_size: int, seq_len: int, gpu: bool = False) -> int:
    """One forward pass without autograd at the calibration batch, reading the output projections' inputs
    (activation, flap, wanda_sp: their per-channel sums are a few vectors of H·d)."""
    return weights_memory(cfg, 0, 0) + forward_bytes(cfg, batch_size * seq_len)


def weight_gradient_memory(cfg: ModelConfig, batch_size: int, seq_len: int, gpu: bool = False) -> int:
    """A forward and backward pass with the attention weights' gradients kept (taylor): the frozen-weight backward
    and an fp32 gradient of every attention parameter."""
    return backward_memory(cfg, batch_size, seq_len) + 4 * param_counts(cfg).attention


def rows_memory(gpu_rows: int):
    """Forward passes of one copy of the batch per masked head, up to `gpu_rows` rows at once on a GPU and one batch
    on a CPU (ablation)."""
    def peak(cfg: ModelConfig, batch_size: int, seq_len: int, gpu: bool = False) -> int:
        copies = min(sum(cfg.layer_heads) * batch_size, max(gpu_rows if gpu else 1, batch_size))
        return weights_memory(cfg, 0, 0) + forward_bytes(cfg, copies * seq_len)
    return peak


def attention_memory(cfg: ModelConfig, batch_size: int, seq_len: int, gpu: bool = False) -> int:
    """One forward pass returning every layer's attention map, B × heads × T × T each, beside the forward's
    temporaries and one layer's scores, then the entropy's three map-sized temporaries (entropy, confidence)."""
    one = 4 * batch_size * max(cfg.layer_heads) * seq_len**2
    maps = sum(4 * batch_size * h * seq_len**2 for h in cfg.layer_heads)
    return weights_memory(cfg, 0, 0) + maps + max(forward_bytes(cfg, batch_size * seq_len) + one, 3 * one)


def prune_memory(dense: ModelConfig, pruned: ModelConfig, batch_size: int, seq_len: int, precision: str,
                 scoring: int, distill: bool = False) -> int:
    """Peak of a prune trial: `scoring` (its method's declared memory), or the recovery fine-tune of the pruned
    model with the dense model still held (its fp32 weights; as the teacher when it distils)."""
    ft = train_memory(pruned, batch_size, seq_len, precision, teacher=dense if distill else None)
    return max(scoring, ft.peak + (0 if distill else 4 * param_counts(dense).total))
