"""Memory planned per trial and trials packed per GPU: what `--plan` shows per unit and per scale, and the check
that refuses a sweep whose fractional `gpu` trials can share a GPU their memory does not fit.

A unit's peak comes from lightning_modules.declarations.memory (a documented formula, checked against real training steps by
benchmarks/plan_memory.py on the CPU and benchmarks/gpu_memory.py on a GPU). Ray puts trials on one GPU as long as
their `gpu` fractions sum to at most 1, whichever scales they belong to (a stage is one Tune run over every scale).
So for each stage the check takes the worst such set of its trials — the most memory any choice of them whose
fractions fit one GPU can need, each trial at its scale's largest peak in that stage, plus CUDA_CONTEXT_GB for each
trial's own CUDA context — and requires it to fit `resources.gpu_memory_gb` (decimal GB, default 80).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from lightning_modules.declarations.config import HeadroomInputError, ModelConfig
from lightning_modules.declarations.memory import prune_memory, train_memory
from lightning_modules.declarations.methods import get_method

from .schema import Sweep
from .unit import Unit

GB = 10**9
CUDA_CONTEXT_GB = 0.5  # what each process's CUDA context takes on its GPU, outside torch's allocations


def trial_precision(sweep: Sweep, u: Unit) -> str:
    """The precision a unit's trial trains at: its own, or for "auto" what a trial on its device picks (bf16-mixed on
    a GPU, 32-true on a CPU; lightning_modules.training.lm.resolve_precision)."""
    p = u.train.precision
    if p != "auto":
        return p
    return "bf16-mixed" if sweep.resources_for(u.scale).gpu else "32-true"


def unit_memory(sweep: Sweep, u: Unit, model: ModelConfig, dense: ModelConfig | None = None) -> int:
    """Peak bytes of one worker of `u`'s trial training `model`. `dense`: a prune unit's dense model (scored, then
    held while the pruned one is fine-tuned), or a distilled control's teacher."""
    t, prec = u.train, trial_precision(sweep, u)
    if u.stage == "prune":
        scoring = get_method(u.method).memory(dense, t.batch_size, t.seq_len, bool(sweep.resources_for(u.scale).gpu))
        return prune_memory(dense, model, t.batch_size, t.seq_len, prec, scoring, distill=u.recovery == "distill")
    workers = sweep.resources_for(u.scale).workers
    return train_memory(model, t.batch_size, t.seq_len, prec, workers=workers, teacher=dense).peak


def per_gpu(gpu: float) -> int:
    """How many trials asking `gpu` each Ray puts on one GPU."""
    return math.floor(1 / gpu + 1e-9)


def _largest(rows: Sequence) -> dict[tuple[str, str], dict]:
    """Per (stage, scale) of the trials that ask a GPU: their gpu fraction and largest planned peak."""
    out: dict[tuple[str, str], dict] = {}
    for r in rows:
        gpu = r.resources["gpu"]
        if not gpu:
            continue
        s = out.setdefault((r.stage, r.scale), {"gpu": gpu, "peak_bytes": 0, "unit": r.name, "stage": r.stage,
                                                "scale": r.scale})
        if r.memory_bytes > s["peak_bytes"]:
            s.update(peak_bytes=r.memory_bytes, unit=r.name)
    return out


def _worst_set(kinds: list[dict]) -> tuple[float, list[int]]:
    """The most memory (GB, CUDA contexts included) that trials of these kinds can need on one GPU: the best
    choice of counts n_i with Σ n_i·gpu_i ≤ 1 (an unbounded knapsack, searched exhaustively: a handful of kinds)."""
    best: tuple[float, list[int]] = (0.0, [0] * len(kinds))

    def go(i: int, room: float, counts: list[int], need: float) -> None:
        nonlocal best
        if i == len(kinds):
            if need > best[0]:
                best = (need, list(counts))
            return
        k = kinds[i]
        for n in range(math.floor(room / k["gpu"] + 1e-9), -1, -1):
            go(i + 1, room - n * k["gpu"], [*counts, n], need + n * (k["peak_bytes"] / GB + CUDA_CONTEXT_GB))

    go(0, 1.0, [], 0.0)
    return best


def check_packing(sweep: Sweep, rows: Sequence) -> None:
    """Raise HeadroomInputError (one line) when trials of one stage can share a GPU that cannot hold them, naming
    the largest such set and what would fit."""
    cap = sweep.resources.gpu_memory_gb
    by_stage: dict[str, list[dict]] = {}
    for s in _largest(rows).values():
        by_stage.setdefault(s["stage"], []).append(s)
    for stage, kinds in by_stage.items():
        need, counts = _worst_set(kinds)
        if need <= cap:
            continue
        worst = [(n, k) for n, k in zip(counts, kinds, strict=True) if n]
        what = " and ".join(f"{n} × {k['unit']} ({k['peak_bytes'] / GB:.1f} GB, gpu {k['gpu']:g})" for n, k in worst)
        k = max(worst, key=lambda nk: nk[1]["peak_bytes"] / nk[1]["gpu"])[1]
        fits = int(cap // (k["peak_bytes"] / GB + CUDA_CONTEXT_GB))
        if fits:
            advice = f"give scale {k['scale']} gpu: {1 / fits:.3g} or more ({fits} to a GPU)"
        elif stage == "prune":
            advice = "none fits one GPU: lower batch_size or seq_len (a prune trial scores and fine-tunes on one GPU)"
        else:
            advice = "none fits one GPU: lower batch_size or seq_len, or add data-parallel workers"
        raise HeadroomInputError(f"{stage}: {what} can share one GPU and need {need:.1f} GB with their CUDA contexts, "
                                 f"but resources.gpu_memory_gb is {cap:g}; {advice}")


def packing_note(sweep: Sweep, rows: Sequence) -> str:
    """One line for `--plan`'s text: per GPU scale, its largest trial's peak and the trials sharing a GPU."""
    scales: dict[str, dict] = {}
    for s in _largest(rows).values():
        if s["peak_bytes"] > scales.get(s["scale"], {}).get("peak_bytes", -1):
            scales[s["scale"]] = s
    if not scales:
        return ""
    cap = sweep.resources.gpu_memory_gb
    parts = []
    for scale, s in scales.items():
        n, each = per_gpu(s["gpu"]), s["peak_bytes"] / GB + CUDA_CONTEXT_GB
        parts.append(f"{scale}: {s['peak_bytes'] / GB:.2f} GB per trial (largest: {s['unit']}), {n} per GPU "
                     f"(gpu {s['gpu']:g}) use {n * each:.1f} GB; {int(cap // each)} would fit")
    return (f"GPU memory (planned peak per trial, lightning_modules/declarations/memory.py, + {CUDA_CONTEXT_GB:g} GB per trial "
            f"for its CUDA context; {cap:g} GB per GPU, resources.gpu_memory_gb) — " + "; ".join(parts) + ".")
