"""The arms of the experiment, declared once: what a training run is (DESIGN: dense, pruned, the controls trained
from scratch), its display name, how a control's architecture and training steps derive from the dense model and
the prune, whether a `global` prune gets its own copy of it, and the sentence that describes its run.

A new control is one `register_arm(Arm(...))` plus, where its shape or budget is new, the two small functions it
names: the plan (`orchestration.design.plan`), `--plan`, the sweep spec's `controls`, the report's tables, verdicts and
plots all iterate `ARMS`. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from lightning_modules.declarations.config import (
    SCALES,
    HeadroomInputError,
    ModelConfig,
    model_config_for,
    wide_head_dim,
)
from lightning_modules.declarations.costs import arm_flops_per_token, scratch_b_steps, scratch_kd_steps


@dataclass(frozen=True)
class Shape:
    """What a control's architecture derives from: the dense model of (scale, family) with `dense_heads` heads, and
    the heads the prune keeps — `kept` per layer for a `global` prune (a list), or uniform (an int). `what` names
    the unit in an error."""

    scale: str
    family: str
    dense: ModelConfig
    dense_heads: int
    kept: int | list[int]
    vocab_size: int
    what: str


@dataclass(frozen=True)
class Budget:
    """The pruned arm as the plan counts it, which a control's training steps derive from: the dense model and the
    steps the arm trains it (T, or p·T when it prunes during training), the pruned model (the control's own), the
    steps the arm trains at its pruned size (every candidate fine-tune of its recovery; the rest of T after a prune
    during training apart), its recovery objective and its head scoring (orchestration/design/plan.pruned_arm). The
    controls are planned for a prune of the trained model (no continued steps)."""

    dense: ModelConfig
    model: ModelConfig
    dense_steps: int
    recovery_steps: int
    seq_len: int
    recovery: str = "lm"  # the pruned arm's recovery objective: "distill" adds the teacher's forward passes
    scoring_passes: float = 0.0  # the pruned arm's head scoring, in dense forward passes per training-step token
    continued_steps: int = 0  # a prune during training: the steps from p·T to T at pruned size, before recovery

    def arm_flops_per_token(self, fwd_dense: float, fwd_pruned: float) -> float:
        """The pruned arm's compute per training-step token, given each model's forward FLOPs per token."""
        return arm_flops_per_token(fwd_dense, fwd_pruned, self.dense_steps, self.recovery_steps,
                                   self.recovery == "distill", self.scoring_passes, self.continued_steps)


@dataclass(frozen=True)
class Arm:
    """One arm. `description` is a format string of the run's one-sentence note (fields: what, heads, steps,
    head_dim). A control (`control=True`) also gives `architecture(Shape) -> ModelConfig` and `steps(Budget) ->
    int`; `for_global`: a `global` prune gets its own unit copying the pruned per-layer counts (else the arm is a
    uniform shape, planned with the per-layer controls and compared with every scope); `search_as`: the arm whose
    learning-rate search its architecture shares (one shape, one search). `per_recovery`: its budget follows the
    pruned arm's recovery (F and its objective), so the sweep plans one unit per recovery budget and objective in
    `recoveries`, and the report pairs it with the pruned runs of that budget and objective only (else it stands
    for every one); `teacher`: it trains by distillation from the dense run of its cell and seed, once that
    run has finished."""

    name: str
    label: str
    description: str
    control: bool = False
    architecture: Callable[[Shape], ModelConfig] | None = None
    steps: Callable[[Budget], int] | None = None
    for_global: bool = False
    search_as: str | None = None
    per_recovery: bool = False
    recoveries: tuple[str, ...] = ("lm", "distill")
    teacher: bool = False


_ARMS: dict[str, Arm] = {}
ARMS: Mapping[str, Arm] = MappingProxyType(_ARMS)  # name → Arm, in declaration order


def register_arm(a: Arm) -> Arm:
    if a.name in _ARMS:
        raise ValueError(f"arm {a.name!r} is already registered")
    if a.control and (a.architecture is None or a.steps is None):
        raise ValueError(f"control {a.name!r} needs an architecture and a steps rule")
    _ARMS[a.name] = a
    return a


def unregister_arm(name: str) -> None:
    _ARMS.pop(name, None)


def control_names() -> tuple[str, ...]:
    """The controls trained from scratch, in declaration order (the report's column order)."""
    return tuple(a.name for a in _ARMS.values() if a.control)


def label(name: str) -> str:
    """The display name of an arm ("Scratch-E"); an undeclared name stands for itself."""
    return _ARMS[name].label if name in _ARMS else name


def check_control(name: str) -> str:
    """A declared control's name; ValueError naming the choices otherwise (the sweep spec's `controls`)."""
    if name not in _ARMS or not _ARMS[name].control:
        raise ValueError(f"unknown control {name!r}; choose one of {', '.join(control_names())}")
    return name


# ---------------------------------------------------------------------------------------------- shapes


def pruned_shape(s: Shape) -> ModelConfig:
    """The pruned architecture: the kept heads at the dense head_dim (uniform, or the prune's per-layer counts)."""
    if isinstance(s.kept, int):
        return model_config_for(s.scale, s.family, n_heads=s.kept, vocab_size=s.vocab_size)
    return s.dense.with_heads(s.kept)


def wide_shape(s: Shape) -> ModelConfig:
    """The kept heads made as wide as the dense model's attention (`dense_heads` × the preset's head_dim; see
    config.wide_head_dim); a shape it cannot have raises naming the unit."""
    sc = SCALES[s.scale]
    try:
        return model_config_for(s.scale, s.family, n_heads=s.kept, vocab_size=s.vocab_size,
                                head_dim=wide_head_dim(sc.d_model, s.kept, width=s.dense_heads * sc.head_dim))
    except HeadroomInputError as e:
        raise HeadroomInputError(f"unit {s.what}: {e}") from None


def dense_steps(b: Budget) -> int:
    return b.dense_steps


def matched_compute(b: Budget) -> int:
    """Scratch-B: the pruned arm's compute (dense T steps, the scoring of its heads, the recovery steps at pruned
    size, with the teacher's forward passes when the recovery distils)."""
    return scratch_b_steps(b.dense, b.model, b.dense_steps, b.recovery_steps, b.seq_len, b.recovery == "distill",
                           b.scoring_passes)


def matched_distilled_compute(b: Budget) -> int:
    """scratch_kd: the distilled pruned arm's training FLOPs, each of its own steps paying a teacher pass."""
    return scratch_kd_steps(b.dense, b.model, b.dense_steps, b.recovery_steps, b.seq_len, b.scoring_passes)


# ---------------------------------------------------------------------------------------------- the arms

register_arm(Arm("dense", "dense", "Dense: {what}, {heads}, trained from scratch for {steps}."))
register_arm(Arm("dense_half", "half-budget dense",
                 "Half-budget dense run: {what}, {heads}, trained from scratch for {steps}, half the dense run's "
                 "budget on its own schedule (the report's converged check)."))
register_arm(Arm("pruned", "pruned", "Pruned: a dense model with a fraction of its heads removed."))
register_arm(Arm("scratch_e", "Scratch-E",
                 "Scratch-E control: the pruned architecture ({heads}) trained from scratch for the dense run's "
                 "steps, {steps} ({what}).",
                 control=True, architecture=pruned_shape, steps=dense_steps, for_global=True))
register_arm(Arm("scratch_b", "Scratch-B",
                 "Scratch-B control: the pruned architecture ({heads}) trained from scratch until its training "
                 "FLOPs match dense training plus fine-tuning, {steps} ({what}).",
                 control=True, architecture=pruned_shape, steps=matched_compute, for_global=True,
                 search_as="scratch_e", per_recovery=True))
register_arm(Arm("scratch_curve", "from-scratch curve",
                 "From-scratch curve: the pruned architecture ({heads}) trained from scratch for {steps}, a fraction "
                 "of the dense run's budget ({what}): the learning curve a pruned start's savings are read from."))
register_arm(Arm("wide", "wide",
                 "wide control: {heads} of {head_dim} dims, as wide as the dense model's attention allows (the "
                 "usual fewer-heads model), trained from scratch for {steps} ({what}).",
                 control=True, architecture=wide_shape, steps=dense_steps))
register_arm(Arm("scratch_kd", "Scratch-KD",
                 "Scratch-KD control: the pruned architecture ({heads}) trained from scratch by distillation from "
                 "the dense model of its seed (the pruned arm's teacher), {steps}, the distilled pruned arm's "
                 "training FLOPs with every teacher pass counted ({what}). The dense training inside that budget "
                 "also made its teacher, which it uses without paying for it: the match favours this control.",
                 control=True, architecture=pruned_shape, steps=matched_distilled_compute, search_as="scratch_e",
                 per_recovery=True, recoveries=("distill",), teacher=True))
