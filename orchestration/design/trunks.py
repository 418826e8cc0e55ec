"""Trunks and cooldown branches: how a sweep trains many budgets of one architecture for little more than the
longest.

Under a warmup-stable-decay schedule (`schedule: wsd`, lightning_modules/training/lm.py) the learning rate of a run of B steps
is the peak from the end of warmup until `cooldown_start(B)`, whatever B is; only the last `cooldown_fraction` of the
steps decay. The data order is a function of the seed and the sample index alone (lightning_modules/data/datamodule.py). So a
run of B steps is, step for step, the longest run of the same architecture, seed and rate (its *trunk*) up to
cooldown_start(B), then B's own cooldown: the plan gives every shorter run of a trunk group that start
(`branch_step`, its trunk's `trunk_key`), and the trunk a checkpoint at every such step (`branch_points`). A branch
trains only its cooldown; its result is the run of its own budget (tests/test_trunks.py compares the two), so
neither field enters a unit's key.

A group is every wsd train unit that differs only in its step count and its arm: the dense run and its half-budget
run; Scratch-E, Scratch-B at every recovery budget and the from-scratch curve of one pruned shape. Units that learn
from a teacher (their loss is not the LM loss) or run probes (whose callbacks touch the model) train alone. Torch-free.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from lightning_modules.declarations.config import cooldown_start

from .unit import Unit


def _signature(u: Unit) -> str | None:
    """What a trunk group shares: everything but the steps and the arm (None: the unit trains alone)."""
    if u.stage != "train" or u.train.schedule != "wsd" or u.distill is not None or u.probes is not None:
        return None
    return "|".join([u.scale, u.family, str(u.seed), u.model.model_dump_json(),
                     u.train.model_copy(update={"steps": 1}).model_dump_json(), u.data.model_dump_json(),
                     u.corpus_hash])


def share_trunks(units: list[Unit]) -> list[Unit]:
    """`units` with every wsd group's trunk (its longest run; the first of equal ones) keeping a checkpoint at each
    other member's cooldown start, and each other member starting from there. A member whose cooldown starts at
    step 0, or shorter than its warmup, trains from scratch. Order and keys are unchanged."""
    groups: dict[str, list[int]] = defaultdict(list)
    for i, u in enumerate(units):
        sig = _signature(u)
        if sig is not None:
            groups[sig].append(i)
    out = list(units)
    for members in groups.values():
        trunk_i = max(members, key=lambda i: (units[i].train.steps, -i))
        trunk = units[trunk_i]
        points = set()
        for i in members:
            if i == trunk_i:
                continue
            step = cooldown_start(units[i].train)  # the rule the schedule itself follows
            # a budget shorter than the warmup warms up over its own steps, not the trunk's: it trains alone
            if step > 0 and units[i].train.steps - 1 >= units[i].train.warmup_steps:
                points.add(step)
                out[i] = replace(units[i], trunk_key=trunk.key, branch_step=step)
        out[trunk_i] = replace(trunk, branch_points=tuple(sorted(points)))
    return out


def trunk_steps(u: Unit) -> tuple[int, ...]:
    """The steps a train unit keeps a full checkpoint of: its snapshots for pruning at p·T and its branch points."""
    return tuple(sorted(set(u.snapshots) | set(u.branch_points)))
