"""Memory planned per trial and trials packed per GPU: what `--plan` shows per unit and per scale, and the check
that refuses a sweep whose fractional `gpu` packs more trials onto a GPU than its memory holds.

A unit's peak comes from lightning_modules.memory (a documented formula, checked against real training steps by
benchmarks/plan_memory.py on the CPU and benchmarks/gpu_memory.py on a GPU). A trial asking `gpu: g` shares its GPU
with up to floor(1 / g) trials (Ray packs fractional GPUs that way); those trials' peaks must fit the GPU memory the
sweep declares (`resources.gpu_memory_gb`, decimal GB, default 80: an 80 GB GPU).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from lightning_modules.config import HeadroomInputError, ModelConfig
from lightning_modules.memory import prune_memory, train_memory

from .spec import Sweep
from .unit import Unit

GB = 10**9


def trial_precision(sweep: Sweep, u: Unit) -> str:
    """The precision a unit's trial trains at: its own, or for "auto" what a trial on its device picks (bf16-mixed on
    a GPU, 32-true on a CPU; lightning_modules.lm.resolve_precision)."""
    p = u.train.precision
    if p != "auto":
        return p
    return "bf16-mixed" if sweep.resources_for(u.scale).gpu else "32-true"


def unit_memory(sweep: Sweep, u: Unit, model: ModelConfig, dense: ModelConfig | None = None) -> int:
    """Peak bytes of one worker of `u`'s trial training `model`. `dense`: a prune unit's dense model (held while it
    scores and fine-tunes), or a distilled control's teacher."""
    t, prec = u.train, trial_precision(sweep, u)
    if u.stage == "prune":
        return prune_memory(dense, model, t.batch_size, t.seq_len, prec, distill=u.recovery == "distill")
    workers = sweep.resources_for(u.scale).workers
    return train_memory(model, t.batch_size, t.seq_len, prec, workers=workers, teacher=dense).peak


def per_gpu(gpu: float) -> int:
    """How many trials asking `gpu` each Ray puts on one GPU."""
    return math.floor(1 / gpu + 1e-9)


def scale_packing(sweep: Sweep, rows: Sequence) -> dict[str, dict]:
    """Per scale whose trials ask a GPU: its largest trial's peak, the trials sharing a GPU, and how many of that
    size the declared GPU memory holds."""
    out: dict[str, dict] = {}
    for r in rows:
        gpu = r.resources["gpu"]
        if not gpu:
            continue
        s = out.setdefault(r.scale, {"gpu": gpu, "trials_per_gpu": per_gpu(gpu), "peak_bytes": 0, "unit": r.name})
        if r.memory_bytes > s["peak_bytes"]:
            s.update(peak_bytes=r.memory_bytes, unit=r.name)
    capacity = sweep.resources.gpu_memory_gb * GB
    for s in out.values():
        s["fit"] = int(capacity // s["peak_bytes"]) if s["peak_bytes"] else 0
    return out


def check_packing(sweep: Sweep, rows: Sequence) -> None:
    """Raise HeadroomInputError (one line) when a scale's trials share a GPU that cannot hold them all, or one
    trial does not fit a GPU at all."""
    cap = sweep.resources.gpu_memory_gb
    for scale, s in scale_packing(sweep, rows).items():
        n, each = s["trials_per_gpu"], s["peak_bytes"] / GB
        if n * each <= cap:
            continue
        share = (f"{n} trials share a GPU (gpu: {s['gpu']:g}) and need {n * each:.1f} GB, {each:.1f} GB each"
                 if n > 1 else f"one trial (gpu: {s['gpu']:g}) needs {each:.1f} GB")
        fit = (f"at most {s['fit']} fit: set gpu to at least {1 / s['fit']:.3g}" if s["fit"] else
               "none fits: lower batch_size or seq_len, or train data-parallel (workers)")
        raise HeadroomInputError(f"scale {scale}: {share} (largest: unit {s['unit']}), but resources.gpu_memory_gb "
                                 f"is {cap:g}; {fit}")


def packing_note(sweep: Sweep, rows: Sequence) -> str:
    """One line per GPU scale for `--plan`'s text: peak per trial, trials per GPU, what that fills."""
    packs = scale_packing(sweep, rows)
    if not packs:
        return ""
    cap = sweep.resources.gpu_memory_gb
    parts = [f"{scale}: {s['peak_bytes'] / GB:.2f} GB per trial (largest: {s['unit']}), {s['trials_per_gpu']} per "
             f"GPU (gpu {s['gpu']:g}) use {s['trials_per_gpu'] * s['peak_bytes'] / GB:.1f} GB; {s['fit']} would fit"
             for scale, s in packs.items()]
    return (f"GPU memory (planned peak per trial, lightning_modules/memory.py; {cap:g} GB per GPU, "
            "resources.gpu_memory_gb) — " + "; ".join(parts) + ".")
