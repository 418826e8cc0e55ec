"""The sweep's axes, and the other headroom.* tags of a child run, declared once: for each, where a sweep file sets
it, its value when it does not apply, its MLflow tag and how the value is written there and read back, whether it
enters a unit's key, and its column in the report's run table (`reports/<sweep>/runs.csv`).

`plan.Unit.tags()` writes the tags from these declarations, `report.read.Run` reads them back with them, and the
run table has a column per declaration. A new axis is one `Axis` here plus its field on the unit (and, when the
sweep file sets it, its field in `spec.py`). Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

NONE = "none"


def _text(v) -> str:
    return str(v)


def _num_or_none(v) -> str:
    return NONE if v is None else f"{v:g}"


def _int_or_none(v) -> str:
    return NONE if v is None else str(v)


def _float(default):
    return lambda s: default if s == NONE else float(s)


def _int_or(default):
    return lambda s: default if s == NONE else int(s)


@dataclass(frozen=True)
class Axis:
    """One tag of a child run. `get(unit)` is the unit's value (default: its attribute `name`); `to_tag` writes it,
    `from_tag` reads the tag's text back (the value when the tag says "none" or is absent: `default`).
    `key`: "hashed" (the unit's field enters its key, by the rule of orchestration/design/unit.py: a field that keys did
    not hash from the start only when it differs from its default) or "derived" (never hashed: other fields
    decide it). `sweep_field`: where a sweep file sets it ("" when the plan derives it). `groups`: the
    report's comparisons pool runs that share it (a pruned arm's cell and its controls are grouped by every such
    axis, in declaration order; the seed pairs them). `in_name(unit)`: the part of the unit's run name it writes
    (RUN_NAME orders the parts)."""

    name: str
    sweep_field: str
    default: object = NONE
    tag: str = ""
    to_tag: Callable[[object], str] = _text
    from_tag: Callable[[str], object] = _text
    key: str = "hashed"
    get: Callable | None = None
    groups: bool = False
    in_name: Callable | None = None  # its part of a unit's run name (None: no part, or none for this unit)

    @property
    def tag_name(self) -> str:
        return f"headroom.{self.tag or self.name}"

    def value(self, unit) -> object:
        return self.get(unit) if self.get is not None else getattr(unit, self.name)

    def read(self, tags: dict) -> object:
        text = tags.get(self.tag_name, NONE)
        return self.from_tag(text) if text != NONE else self.default


AXES: list[Axis] = [  # declaration order; register_axis adds one (a test, or a study of its own)
    Axis("stage", ""),  # lr_search | train | prune | controls (a global prune's controls train in "train" units)
    Axis("arm", "controls", in_name=lambda u: u.arm),
    Axis("scale", "scales", groups=True, in_name=lambda u: u.scale),  # the report's scale is the cell: with its budget when a scale lists several
    Axis("family", "family", groups=True, in_name=lambda u: u.family),
    Axis("heads", "scales.<scale>.heads"),
    Axis("ratio", "prune.ratios", None, to_tag=_num_or_none, from_tag=_float(None), groups=True,
         in_name=lambda u: None if u.ratio is None else f"r{u.ratio:g}"),
    Axis("method", "prune.methods", groups=True, in_name=lambda u: None if u.method == NONE else u.method),
    Axis("scope", "prune.scope", groups=True, in_name=lambda u: "global" if u.scope == "global" else None),
    Axis("schedule", "prune.schedule", groups=True,
         in_name=lambda u: "iter" if u.schedule == "iterative" else None),
    Axis("seed", "seeds", 0, from_tag=int, in_name=lambda u: f"s{u.seed}"),
    Axis("key", "", key="derived"),
    # the dense budget T of a scale that lists several (None: one); its tag keeps its first name
    Axis("budget", "scales.<scale>.steps", None, tag="steps", to_tag=_int_or_none, from_tag=_int_or(None),
         key="derived", in_name=lambda u: None if u.budget is None else f"T{u.budget}"),
    # prune units: the fraction of T at which heads are removed (1: the trained model); "none" on other units
    Axis("prune_at", "prune.at", 1.0, to_tag=_num_or_none, from_tag=_float(1.0),
         get=lambda u: u.prune_at if u.stage == "prune" else None,
         in_name=lambda u: None if u.prune_at == 1.0 else f"at{u.prune_at:g}"),
    # the recovery budget F: a prune unit's own; a budget-matched control's when the sweep lists several F ("none":
    # it stands for every F)
    Axis("finetune_steps", "prune.finetune_steps", None, to_tag=_int_or_none, from_tag=_int_or(None),
         get=lambda u: u.prune.finetune_steps if u.stage == "prune" else u.finetune_steps,
         groups=True, in_name=lambda u: None if u.finetune_steps is None else f"F{u.finetune_steps}"),
    # the recovery objective (lm | distill) of a prune unit, or of the pruned arm a control's budget is matched to
    Axis("recovery", "prune.recovery", "lm", groups=True,
         get=lambda u: u.recovery if u.stage == "prune" or u.finetune_steps is not None or u.recovery != "lm"
         else NONE, in_name=lambda u: "kd" if u.recovery != "lm" else None),
    # a from-scratch curve point's steps (arm scratch_curve: a fraction of T); "none" on other units
    Axis("curve_steps", "scratch_curve", None, to_tag=_int_or_none, from_tag=_int_or(None), key="derived",
         get=lambda u: u.train.steps if u.arm == "scratch_curve" else None,
         in_name=lambda u: None if u.arm != "scratch_curve" else f"S{u.train.steps}"),
    # the comparison group a pruned run or a control belongs to: the values of every grouped axis, "*" where the
    # run stands for every value (decided by the plan, orchestration/design/unit.py: comparison_group); "none" on others
    Axis("group", "", key="derived", get=lambda u: u.comparison_group()),
]
BY_NAME = {a.name: a for a in AXES}
# the order of a run name's parts (each axis's `in_name`): what the MLflow UI sorts by; register_axis puts a new
# axis's part before the seed
RUN_NAME = ["scale", "family", "budget", "arm", "method", "ratio", "scope", "schedule", "prune_at", "finetune_steps",
            "recovery", "curve_steps", "seed"]


def grouped() -> tuple[str, ...]:
    """The axes a comparison group is made of (scale, family, ratio, method, scope, schedule, finetune_steps,
    recovery, and any registered since), in declaration order."""
    return tuple(a.name for a in AXES if a.groups)


def register_axis(a: Axis, before: str = "key") -> Axis:
    """Declare an axis (it goes before `before`: the grouped axes keep declaration order)."""
    if a.name in BY_NAME:
        raise ValueError(f"axis {a.name!r} is declared already")
    AXES.insert(next(i for i, x in enumerate(AXES) if x.name == before), a)
    BY_NAME[a.name] = a
    if a.in_name is not None:
        RUN_NAME.insert(RUN_NAME.index("seed"), a.name)
    return a


def unregister_axis(name: str) -> None:
    AXES.remove(BY_NAME.pop(name))
    if name in RUN_NAME:
        RUN_NAME.remove(name)


def run_name(unit) -> str:
    """A unit's run name: each axis's part, in RUN_NAME's order."""
    return "-".join(p for p in (BY_NAME[a].in_name(unit) for a in RUN_NAME) if p is not None)


def tags_of(unit) -> dict[str, str]:
    """A unit's headroom.* tags (DESIGN's MLflow contract), in declaration order."""
    return {a.tag_name: a.to_tag(a.value(unit)) for a in AXES}


def read_tags(tags: dict) -> dict[str, object]:
    """The typed value of every axis from a run's tags."""
    return {a.name: a.read(tags) for a in AXES}
