"""The head-scoring methods, declared once: what a sweep file may name under `prune.methods`, what `headroom prune
--method` accepts, what scores the heads (`scoring.score_heads`), what `--plan` counts as its cost.

A method is one `Method` declaration plus its scorer: `register_method(Method(...))` adds one (a test may register
its own). Everything that lists methods iterates `METHODS`. Torch-free: the scorer is named by "module:function" and
imported only when a model is scored, so the sweep spec and the plan validate names without torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from lightning_modules.declarations.memory import (
    attention_memory,
    backward_memory,
    forward_memory,
    rows_memory,
    weight_gradient_memory,
    weights_memory,
)


def _fixed(passes: float) -> Callable[..., float]:
    return lambda n_heads, batch_tokens, calibration_tokens, options: passes


@dataclass(frozen=True)
class Method:
    """A head-scoring method.

    `scorer`: the function `(model, batches, loss_fn, mask=None, **options) -> [layers, heads]`, or its
    "module:function" path. `passes(n_heads, batch_tokens, calibration_tokens, options)`: forward-pass equivalents
    per calibration token of one scoring round (a backward through the weights ≈ 2 forwards; one to the gates
    only ≈ 1), what `--plan` multiplies by the calibration tokens and the dense model's forward FLOPs per token.
    `needs_calibration`: whether it reads data.
    `options`: the scorer's keyword defaults that its cost depends on (passed to `passes`). `memory`: how it holds
    memory, `(cfg, batch_size, seq_len, gpu) -> peak bytes` (lightning_modules/declarations/memory.py has the usual ones), which
    `--plan` packs GPUs by."""

    name: str
    scorer: str | Callable
    passes: Callable[[int, int, int, Mapping], float]
    needs_calibration: bool = True
    options: Mapping = field(default_factory=dict)
    description: str = ""
    memory: Callable[[object, int, int, bool], int] = backward_memory
    standardize: bool = False  # scope global: its scores z-scored per layer before one threshold ranks them (FLAP)
    compensates: bool = False  # its recipe folds the removed heads' mean output into the bias (FLAP; compensate.py)

    def __post_init__(self):
        if not callable(self.memory):
            raise ValueError(f"method {self.name}: memory must be a function (cfg, batch_size, seq_len, gpu) -> bytes")

    def score_fn(self) -> Callable:
        if callable(self.scorer):
            return self.scorer
        module, _, attr = self.scorer.partition(":")
        return getattr(importlib.import_module(module), attr)


_METHODS: dict[str, Method] = {}
METHODS: Mapping[str, Method] = MappingProxyType(_METHODS)  # name → Method, in declaration order


def register_method(m: Method) -> Method:
    if m.name in _METHODS:
        raise ValueError(f"method {m.name!r} is already registered")
    _METHODS[m.name] = m
    return m


def unregister_method(name: str) -> None:
    _METHODS.pop(name, None)


def method_names() -> tuple[str, ...]:
    return tuple(_METHODS)


def get_method(name: str) -> Method:
    """The declaration of `name`; ValueError naming the choices when there is none."""
    if name not in _METHODS:
        raise ValueError(f"unknown method {name!r}; choose one of {', '.join(_METHODS)}")
    return _METHODS[name]


def compensates(name: str, setting: bool | None) -> bool:
    """Whether a prune by method `name` compensates the bias: the prune's `bias_compensation` setting, or (None)
    the method's recipe."""
    return get_method(name).compensates if setting is None else setting


def scoring_flops(name: str, n_heads: int, batch_tokens: int, calibration_tokens: int, fwd_flops_per_token: float,
                  rounds: int = 1, compensate: bool = False) -> float:
    """FLOPs method `name` spends scoring the heads of a model of `fwd_flops_per_token` forward FLOPs per token
    (`n_heads`: all its heads) on `calibration_tokens`, `rounds` times (an iterative prune scores once a round):
    its declared forward-pass equivalents per calibration token × the tokens × a forward pass, and with `compensate`
    one more forward pass over them (the bias compensation's means). What the pruned arm is charged for choosing
    its heads, and what Scratch-B's budget adds (lightning_modules/declarations/costs.py)."""
    m = get_method(name)
    passes = m.passes(n_heads, batch_tokens, calibration_tokens, m.options) * rounds + (1 if compensate else 0)
    return passes * calibration_tokens * fwd_flops_per_token


def scoring_passes(name: str, n_heads: int, batch_tokens: int, calibration_tokens: int, rounds: int = 1,
                   compensate: bool = False) -> float:
    """`scoring_flops` in forward passes of the scored model per token of one training step (`batch_tokens`): the
    scoring term of the pruned arm's compute (costs.arm_flops_per_token), whatever counts its forward FLOPs."""
    return scoring_flops(name, n_heads, batch_tokens, calibration_tokens, 1.0, rounds, compensate) / batch_tokens


# the primary comparison's method (the report's headline; report/analysis.PRIMARY reads it here): the scoring a
# Scratch-B of per-layer controls, which
# stands for every method, is charged for (the sweep's first method when it prunes without this one)
PRIMARY_METHOD = "gradient"


def charged_method(methods) -> str:
    return PRIMARY_METHOD if PRIMARY_METHOD in methods else list(methods)[0]


_S = "lightning_modules.pruning.scoring:"
L0_OPTIONS = {"steps": 150}  # score_l0's default gate-training steps, which its cost counts
GPU_ABLATION_ROWS = 256  # score_ablation's rows per forward pass on a GPU (masks × batch), which its memory counts

# gradient and l0 take the gradient of the loss with respect to the head gates only, the weights frozen: the backward
# computes no weight gradients, so a forward and its backward cost about 2 forward passes, not a training step's 3
# (tests/test_fair_compute.py counts them with torch's FLOP counter: 1.92)
register_method(Method("gradient", _S + "score_gradient", _fixed(2),
                       description="Michel et al. 2019: E_x|∂L/∂ξ_h| per example, L2-normalised per layer"))
register_method(Method("ablation", _S + "score_ablation",
                       lambda n_heads, bt, calib, o: n_heads + 1,  # one reference pass and one per head masked
                       description="leave-one-out: E_x|L_x(ξ_h = 0) − L_x|", memory=rows_memory(GPU_ABLATION_ROWS)))
register_method(Method("magnitude", _S + "score_magnitude", _fixed(0), needs_calibration=False,
                       description="the Frobenius norm of the head's OV circuit (no data)", memory=weights_memory))
register_method(Method("entropy", _S + "score_entropy", _fixed(1),
                       description="attention entropy (low: focused)", memory=attention_memory))
register_method(Method("confidence", _S + "score_confidence", _fixed(1),
                       description="Voita et al. 2019: the mean maximum attention weight", memory=attention_memory))
register_method(Method("random", _S + "score_random", _fixed(0), needs_calibration=False,
                       description="seeded uniform scores: the baseline every method must beat", memory=weights_memory))
# the scores of structured LLM pruning (lightning_modules/pruning/scoring_llm.py: formulas and sources): three read one
# forward pass; taylor's backward also computes the attention weights' gradients (torch's FLOP counter: TAYLOR_PASSES)
_LLM = "lightning_modules.pruning.scoring_llm:"
TAYLOR_PASSES = 2.2
register_method(Method("activation", _LLM + "score_activation", _fixed(1), memory=forward_memory,
                       description="Minitron: the L2 norm over a head's channels of its output's mean magnitude"))
register_method(Method("flap", _LLM + "score_flap", _fixed(1), memory=forward_memory, standardize=True,
                       compensates=True,
                       description="FLAP: the fluctuation of a head's output channels, weighted by their weights"))
register_method(Method("wanda_sp", _LLM + "score_wanda_sp", _fixed(1), memory=forward_memory,
                       description="structured Wanda: |W| times the input norm, summed over a head's channels"))
register_method(Method("taylor", _LLM + "score_taylor", _fixed(TAYLOR_PASSES), memory=weight_gradient_memory,
                       description="LLM-Pruner: Σ|w·∂L/∂w| over the head's query, key, value and output weights"))
register_method(Method("l0", _S + "score_l0",
                       # gate training: a forward and a gate-only backward (2 passes) per step on one batch each
                       lambda n_heads, bt, calib, o: 2 * o["steps"] * bt / max(calib, 1),
                       options=L0_OPTIONS,
                       description="Voita et al. 2019: hard-concrete gates trained for an expected-L0 penalty"))
