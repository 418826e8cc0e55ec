"""Numbers past what the code downstream can hold are refused in one line with exit 2, before anything is created:
every numeric field of the sweep schema (walked from the schema itself, not listed here) and every numeric flag of
the command line (walked from the parser) — integers past a signed 64-bit integer, seeds past MAX_SEED, floats
that are infinite or NaN — and the tokens of a run past 2^53. A sweep whose estimated compute is absurd for its
resources gets a note in its plan, not a refusal."""

from __future__ import annotations

import argparse
import math
import typing
from types import UnionType

import pytest
import yaml
from pydantic import BaseModel
from test_spec import GOOD

from lightning_modules.declarations.bounds import MAX_INT, MAX_SEED
from lightning_modules.declarations.config import HeadroomInputError
from orchestration.design.schema import Sweep
from orchestration.design.spec import parse_sweep

# every optional section present, so that each of its fields is reached
FULL = yaml.safe_load(GOOD)
FULL["scales"]["xs"].update(resources={"cpu": 1}, overrides={**FULL["scales"]["xs"]["overrides"], "val_every": 5})
FULL.update(lr={"search": {"trials": 2, "low": 1e-3, "high": 1e-2, "steps": 10}}, probes={"every": 5},
            trust={"margin": 0.05}, resources={"cpu": 1})
PRETRAINED = {"pretrained": {"checkpoint": "/nonexistent"}}  # its fields are checked before the checkpoint is


def _unwrap(ann):
    """(kind, model) of an annotation: "int", "float", "model" (a nested config), "mapping" (scales) or None."""
    while True:
        origin = typing.get_origin(ann)
        if origin is typing.Annotated:
            ann = typing.get_args(ann)[0]
        elif origin in (typing.Union, UnionType):
            inner = [a for a in typing.get_args(ann) if a is not type(None)]
            ints = [a for a in inner if typing.get_origin(a) is list or a in (int, float)]
            ann = ints[0] if ints else inner[0]  # int | list[int]: the number
        elif origin in (list, tuple):
            ann = typing.get_args(ann)[0]
        elif origin is dict:
            return "mapping", typing.get_args(ann)[1]
        else:
            break
    if ann is bool:
        return None, None
    if ann in (int, float):
        return ann.__name__, None
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return "model", ann
    return None, None


def numeric_fields(model: type[BaseModel] = Sweep, path: tuple = ()) -> list[tuple[tuple, str]]:
    out = []
    for name, f in model.model_fields.items():
        kind, sub = _unwrap(f.annotation)
        if kind in ("int", "float"):
            out.append(((*path, name), kind))
        elif kind == "model":
            out += numeric_fields(sub, (*path, name))
        elif kind == "mapping":  # scales: each scale's spec
            out += numeric_fields(sub, (*path, name, "xs"))
    return out


FIELDS = numeric_fields()
SEEDS = {("seeds",), ("lr", "search", "seed")}


def _sweep_with(path: tuple, value) -> str:
    d = yaml.safe_load(yaml.safe_dump({**FULL, **(PRETRAINED if path[0] == "pretrained" else {})}))
    node = d
    for key in path[:-1]:
        node = node.setdefault(key, {})
    old = node.get(path[-1])
    node[path[-1]] = [value] if isinstance(old, list) or path[-1] in ("seeds", "ratios", "at") else value
    return yaml.safe_dump(d)


def test_the_walk_reaches_every_kind_of_number():
    """The schema walk is not empty-handed: it finds the fields a hand list would name, in every section."""
    names = {".".join(p) for p, _ in FIELDS}
    assert {"seeds", "retries", "prune.finetune_steps", "prune.tolerance", "prune.calibration_batches",
            "scales.xs.steps", "scales.xs.overrides.batch_size", "scales.xs.overrides.min_lr_ratio", "lr.value",
            "lr.search.trials", "lr.search.seed", "resources.cpu", "trust.margin", "probes.every",
            "pretrained.seq_len", "prune.distill.temperature"} <= names
    assert len(FIELDS) > 40


@pytest.mark.parametrize("path,kind", FIELDS, ids=[".".join(p) for p, _ in FIELDS])
def test_every_numeric_sweep_field_refuses_what_the_code_cannot_hold(path, kind):
    name = ".".join(path)
    bad = ([MAX_INT + 1, -MAX_INT - 2] if kind == "int" else [math.inf, -math.inf, math.nan])
    if path in SEEDS:
        bad.append(MAX_SEED + 1)
    for v in bad:
        with pytest.raises(HeadroomInputError) as e:
            parse_sweep(_sweep_with(path, v))
        msg = str(e.value)
        assert "\n" not in msg and name.split(".")[-1] in msg, (name, v, msg)


def test_a_seed_at_its_limit_and_a_long_sweep_pass():
    assert parse_sweep(_sweep_with(("seeds",), MAX_SEED)).seeds == [MAX_SEED]
    parse_sweep(GOOD.replace("steps: 20", f"steps: {2**40}"))  # long, not past any limit


def test_tokens_past_2_53_are_refused_naming_the_field():
    for text, field in ((GOOD.replace("steps: 20", f"steps: {2**50}"), "steps"),
                        (GOOD.replace("methods: [gradient, random]}", f"methods: [gradient], finetune_steps: "
                                      f"{2**50}}}"), "prune.finetune_steps")):
        with pytest.raises(HeadroomInputError, match=rf"{field}: .*past 9007199254740992 tokens"):
            parse_sweep(text)


def _cli_flags():
    from orchestration.cli import build_parser

    argv = {"train": ["train", "--quiet", "--out", "OUT"], "score": ["score", "CK", "--method", "gradient", "--out",
                                                                    "OUT/s.json"],
            "prune": ["prune", "CK", "--method", "gradient", "--ratio", "0.5", "--out", "OUT"],
            "sweep": ["sweep", "sweeps/smoke.yaml", "--plan"]}
    for a in build_parser()._actions:
        if isinstance(a, argparse._SubParsersAction):
            for cmd, sp in a.choices.items():
                for x in sp._actions:
                    if x.option_strings and x.type not in (None, str):
                        yield cmd, argv.get(cmd), x.option_strings[0], x.type.__name__


FLAGS = list(_cli_flags())


def test_every_numeric_flag_is_bounded():
    """No numeric flag reads a bare int or float: each goes through a bounded type."""
    assert FLAGS and {t for *_, t in FLAGS} <= {"_int", "_count", "_positive_int", "_seed", "_float", "_head_dim"}


@pytest.mark.parametrize("cmd,argv,flag,kind", FLAGS, ids=[f"{c}{f}" for c, _, f, _ in FLAGS])
def test_every_numeric_flag_refuses_what_the_code_cannot_hold(cmd, argv, flag, kind, tmp_path, capsys, monkeypatch):
    from orchestration.cli import main

    assert argv is not None, f"no argv for {cmd}"
    monkeypatch.chdir(tmp_path)
    bad = ["inf", "nan", "-inf"] if kind == "_float" else [str(MAX_SEED + 1)] if kind == "_seed" else [
        str(MAX_INT + 1)]
    for v in bad:
        out = tmp_path / "out"
        rc = main([a.replace("OUT", str(out)).replace("CK", str(tmp_path)) for a in argv] + [flag, v])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1 and flag in err, (flag, v, err)
        assert not out.exists() and [p.name for p in tmp_path.iterdir()] == []


def test_a_training_run_past_2_53_tokens_is_refused_before_anything_is_written(tmp_path, capsys):
    from orchestration.cli import main

    rc = main(["train", "--steps", str(2**50), "--batch-size", "64", "--seq-len", "64", "--out",
               str(tmp_path / "run"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "tokens" in err, err
    assert not (tmp_path / "run").exists()


def test_an_absurd_plan_gets_a_note_and_a_sane_one_none():
    from orchestration.design.plan import build_plan
    from orchestration.design.preflight import compute_note, plan_rows

    long = plan_rows(build_plan(parse_sweep(GOOD.replace("steps: 20", f"steps: {2**40}")), "c"))
    note = compute_note(long)
    assert note.startswith("Note: the estimated") and "years" in note
    assert compute_note(plan_rows(build_plan(parse_sweep(GOOD), "c"))) == ""
