"""The sweep's axes, and the other headroom.* tags of a child run, declared once: for each, where a sweep file sets
it, its value when it does not apply, its MLflow tag and how the value is written there and read back, whether it
enters a unit's key, and its column in the report's run table (`reports/<sweep>/runs.csv`).

`plan.Unit.tags()` writes the tags from these declarations, `report.read.Run` reads them back with them, and the
run table has a column per declaration. The built-in axes have their fields on the unit and the sweep schema and
their loops in plan.py. An axis registered later (`register_axis`: a study of its own, or a test) owns its whole
life in its one declaration: its sweep field (added to the schema), the values it expands every prune unit into and
their effect on the unit, how controls treat it (one control standing for every value, or one per value), its tag,
its part of the name and the key (a unit's `axes`, hashed by the default rule), its `--plan` column and its label in
the report, the console verdict and the driver's summary. Torch-free.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace

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
    (RUN_NAME orders the parts).

    The rest is a registered axis's life (the built-in ones have theirs in the unit, schema and plan):
    `field`: its sweep field's (annotation, default), added to the schema block `sweep_field` names
    ("prune.<name>": the prune block; "<name>": the top level); `values(sweep, scale)`: the values every prune
    unit at `scale` is expanded into (default: the sweep field's list); `apply(unit, value)`: the value's effect
    on a unit of the expansion (its prune or train settings; default: none beyond recording it in `unit.axes`);
    `controls`: "every" (a control stands for every value: one control, stamped `*`) or "each" (one control per
    value, carrying it); `label(value)`: its text in the report's, the console's and the summary's rows (default
    `name=value`)."""

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
    field: tuple | None = None  # a registered axis's sweep field: (annotation, default)
    values: Callable | None = None  # (sweep, scale) -> the values a prune unit is expanded into
    apply: Callable | None = None  # (unit, value) -> the unit with the value's effect
    controls: str = "every"  # every | each: one control for every value, or one per value
    label: Callable | None = None  # value -> its text in rows (default name=value)

    @property
    def tag_name(self) -> str:
        return f"headroom.{self.tag or self.name}"

    def value(self, unit) -> object:
        if self.get is not None:
            return self.get(unit)
        if self.name in _REGISTERED:  # a registered axis's value lives in the unit's `axes`
            return dict(unit.axes).get(self.name, self.default)
        return getattr(unit, self.name)

    def label_of(self, value) -> str:
        return self.label(value) if self.label is not None else f"{self.name}={self.to_tag(value)}"

    def expansion(self, sweep, scale: str) -> list:
        """The values a prune unit at `scale` is expanded into (a registered axis; [] for a built-in one)."""
        if self.values is not None:
            return list(self.values(sweep, scale))
        if self.field is None:
            return []
        block = sweep
        for part in self.sweep_field.split(".")[:-1]:
            block = getattr(block, part)
        return list(getattr(block, self.name))

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
         get=lambda u: u.finetune_steps if u.stage == "prune" else u.f_label,
         groups=True, in_name=lambda u: None if u.f_label is None else f"F{u.f_label}"),
    # the recovery objective (lm | distill) of a prune unit, or of the pruned arm a control's budget is matched to
    Axis("recovery", "prune.recovery", "lm", groups=True,
         get=lambda u: u.recovery if u.stage == "prune" or u.f_label is not None or u.recovery != "lm"
         else NONE, in_name=lambda u: "kd" if u.recovery != "lm" else None),
    # a from-scratch curve point's steps (arm scratch_curve: a fraction of T); "none" on other units
    Axis("curve_steps", "scratch_curve", None, to_tag=_int_or_none, from_tag=_int_or(None), key="derived",
         get=lambda u: u.train.steps if u.arm == "scratch_curve" else None,
         in_name=lambda u: None if u.arm != "scratch_curve" else f"S{u.train.steps}"),
    # the comparison group a pruned run or a control belongs to: the values of every grouped axis, "*" where the
    # run stands for every value (decided by the plan, orchestration/design/unit.py: comparison_group); "none" on others
    Axis("group", "", key="derived", get=lambda u: u.comparison_group()),
    # a pruned run's controls, as the plan paired them: {arm: the group text of its controls} (JSON; "none" on others)
    Axis("controls", "", None, key="derived", get=lambda u: u.control_groups(),
         to_tag=lambda v: NONE if v is None else json.dumps(v, sort_keys=True), from_tag=json.loads),
]
BY_NAME = {a.name: a for a in AXES}
# the order of a run name's parts (each axis's `in_name`): what the MLflow UI sorts by; register_axis puts a new
# axis's part before the seed
RUN_NAME = ["scale", "family", "budget", "arm", "method", "ratio", "scope", "schedule", "prune_at", "finetune_steps",
            "recovery", "curve_steps", "seed"]


_REGISTERED: list[str] = []  # the axes register_axis added, in order


def registered() -> list[Axis]:
    """The axes registered since the built-in ones (their values live in a unit's `axes`)."""
    return [BY_NAME[n] for n in _REGISTERED]


def grouped() -> tuple[str, ...]:
    """The axes a comparison group is made of (scale, family, ratio, method, scope, schedule, finetune_steps,
    recovery, and any registered since), in declaration order."""
    return tuple(a.name for a in AXES if a.groups)


def register_axis(a: Axis, before: str = "key") -> Axis:
    """Declare an axis (it goes before `before`: the grouped axes keep declaration order). With a `field`, its
    sweep field joins the schema block its `sweep_field` names."""
    if a.name in BY_NAME:
        raise ValueError(f"axis {a.name!r} is declared already")
    if a.controls not in ("every", "each"):
        raise ValueError(f"axis {a.name!r}: controls must be 'every' or 'each', not {a.controls!r}")
    if a.in_name is None:  # its part of the run name: name and value where it has one (units differ by it)
        a = replace(a, in_name=lambda u, a=a: None if a.value(u) == a.default else f"{a.name}{a.to_tag(a.value(u))}")
    AXES.insert(next(i for i, x in enumerate(AXES) if x.name == before), a)
    BY_NAME[a.name] = a
    _REGISTERED.append(a.name)
    if a.in_name is not None:
        RUN_NAME.insert(RUN_NAME.index("seed"), a.name)
    if a.field is not None:
        from . import schema

        schema.add_field(a.sweep_field, *a.field)
    return a


def unregister_axis(name: str) -> None:
    a = BY_NAME.pop(name)
    AXES.remove(a)
    _REGISTERED.remove(name)
    if name in RUN_NAME:
        RUN_NAME.remove(name)
    if a.field is not None:
        from . import schema

        schema.remove_field(a.sweep_field)


def run_name(unit) -> str:
    """A unit's run name: each axis's part, in RUN_NAME's order."""
    return "-".join(p for p in (BY_NAME[a].in_name(unit) for a in RUN_NAME) if p is not None)


def tags_of(unit) -> dict[str, str]:
    """A unit's headroom.* tags (DESIGN's MLflow contract), in declaration order."""
    return {a.tag_name: a.to_tag(a.value(unit)) for a in AXES}


def read_tags(tags: dict) -> dict[str, object]:
    """The typed value of every axis from a run's tags."""
    return {a.name: a.read(tags) for a in AXES}
