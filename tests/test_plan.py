"""The plan of a sweep, checked on the shipped sweeps and small ones: unit keys, tags and budgets; Scratch-B's
compute against the pruned arm's with the vocabulary actually trained; the learning-rate search over every
architecture trained from scratch; `--plan` rows; unit keys pinned to what earlier versions wrote; the wide
control's width; and Scratch-B counting every candidate fine-tune."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT
from test_spec import GOOD


def test_plan_keys_tags_and_budgets():
    from lightning_modules.declarations.config import model_config_for
    from lightning_modules.declarations.costs import flops_per_token, scratch_b_steps
    from orchestration.design.plan import prune_units, train_units
    from orchestration.design.spec import parse_sweep
    from orchestration.design.unit import TAG_FIELDS, Unit

    sweep = parse_sweep(GOOD.replace("[scratch_e]", "[scratch_e, scratch_b, wide]") +
                        "lr: 0.004\n".replace("lr", "lr"))
    units = train_units(sweep, "corpus-a")
    # the half-budget dense run of the first seed (the converged check) follows the dense runs
    assert [u.arm for u in units] == ["dense", "dense", "dense_half"] + ["scratch_e", "scratch_b", "wide"] * 2
    assert units == train_units(sweep, "corpus-a")  # deterministic
    assert len({u.key for u in units}) == len(units)
    # the corpus is part of every key
    assert not {u.key for u in units} & {u.key for u in train_units(sweep, "corpus-b")}
    for u in units:
        tags = u.tags()
        assert set(tags) == {f"headroom.{f}" for f in TAG_FIELDS} and all(tags.values())
        assert u.train.lr == 0.004
    dense, half, se, sb, wide = units[0], units[2], units[3], units[4], units[5]
    assert (half.seed, half.train.steps, half.train.lr, half.model) == (0, 10, dense.train.lr, dense.model)
    assert dense.tags()["headroom.method"] == "none" and dense.tags()["headroom.ratio"] == "none"
    assert (se.heads, se.model.head_dim, se.train.steps) == ("4", 8, 20)  # xs: 8 heads of 8 → 4 heads
    assert (wide.heads, wide.model.head_dim) == ("4", 16)  # d_model 64 // 4
    # Scratch-B: the pruned arm's compute by hand, per token of a step: 20 dense steps (3 forward passes each),
    # gradient scoring (a forward and a gate-only backward, 2 forward passes, per calibration token:
    # calibration_batches batches of the training batch's size), no recovery steps
    d8, d4 = model_config_for("xs", n_heads=8), model_config_for("xs", n_heads=4)
    f8, f4 = flops_per_token(d8, 32).total, flops_per_token(d4, 32).total
    by_hand = round((20 * 3 * f8 + 2 * sweep.prune.calibration_batches * f8) / (3 * f4))
    assert sb.train.steps == by_hand > scratch_b_steps(d8, d4, 20, 0, 32) > 20  # scoring is charged
    pruned = prune_units(sweep, [u for u in units if u.arm == "dense"])
    assert len(pruned) == 2 * 2  # seeds × methods
    assert {p.dense_key for p in pruned} == {units[0].key, units[1].key}
    assert {(p.method, p.ratio, p.scope, p.schedule) for p in pruned} == {
        ("gradient", 0.5, "per_layer", "one_shot"), ("random", 0.5, "per_layer", "one_shot")}
    # a unit crosses the Ray boundary as JSON and comes back equal, with the same key; a prune unit's plan says
    # what the unit says (one copy of method, ratio, scope, schedule)
    for u in units + pruned:
        back = Unit.from_dict(json.loads(json.dumps(u.to_dict())))
        assert back == u and back.with_key().key == u.key
    for p in pruned:
        assert (p.plan.method, p.plan.ratio, p.plan.scope, p.plan.schedule, p.plan.seed) == (
            p.method, p.ratio, p.scope, p.schedule, p.seed)
        assert p.to_dict()["prune"] == p.prune.model_dump(mode="json")
    assert all(u.plan is None and u.prune is None for u in units)


def test_a_new_unit_field_round_trips_and_enters_the_key_only_when_set():
    """A field added to the unit, or to its prune settings, needs no list: it crosses the Ray boundary and comes
    back with its value, a unit at the field's default keeps the key it had before the field existed, and a unit
    that sets it gets another key. The fields are declared here, in the test alone."""
    from dataclasses import dataclass, fields, replace

    from orchestration.design.plan import build_plan
    from orchestration.design.spec import parse_sweep
    from orchestration.design.unit import PruneRun, Unit

    plan = build_plan(parse_sweep(GOOD), "corpus-a")
    trained, pruned = plan.trained[0], plan.pruned[0]

    class NewPrune(PruneRun):
        new_prune_setting: int = 0

    ns = {"__module__": __name__}
    Extra = dataclass(frozen=True)(type("Extra", (Unit,), {**ns, "__annotations__": {"new_field": int},
                                                           "new_field": 0}))
    ExtraPrune = dataclass(frozen=True)(type("ExtraPrune", (Unit,), {**ns, "__annotations__": {
        "prune": NewPrune | None}, "prune": None}))
    every = lambda u: {f.name: getattr(u, f.name) for f in fields(Unit)}
    for u in (trained, pruned):
        at_default = Extra(**every(u)).with_key()
        assert at_default.key == u.key
        set_ = replace(at_default, new_field=7).with_key()
        back = Extra.from_dict(json.loads(json.dumps(set_.to_dict())))
        assert back == set_ and back.new_field == 7 and set_.key != u.key
    p0 = ExtraPrune(**{**every(pruned), "prune": NewPrune(**pruned.prune.model_dump())}).with_key()
    assert p0.key == pruned.key
    p7 = replace(p0, prune=NewPrune(**{**pruned.prune.model_dump(), "new_prune_setting": 7})).with_key()
    back = ExtraPrune.from_dict(json.loads(json.dumps(p7.to_dict())))
    assert back == p7 and back.prune.new_prune_setting == 7 and p7.key not in (pruned.key, p0.key)


# -------------------------------------------------------------------------------- planning before compute


def _bpe_sweep(tmp_path, family: str, scope: str) -> str:
    corpus = tmp_path / "corpus"
    if not corpus.exists():
        import sysconfig

        corpus.mkdir()
        lib = Path(sysconfig.get_paths()["stdlib"])
        for f in sorted(lib.glob("*.py"))[:60]:
            (corpus / f"{f.stem}.txt").write_text(f.read_text(encoding="utf-8", errors="replace"))
    return textwrap.dedent(f"""\
        name: bpe
        family: {family}
        data: {{source: 'path:{corpus}/*.txt', tokenizer: bpe, bpe_vocab_size: 2000}}
        scales:
          s: {{steps: 200, overrides: {{batch_size: 4, seq_len: 64}}}}
        seeds: [0]
        prune: {{ratios: [0.25, 0.75], methods: [random], scope: [{scope}], finetune_steps: 30, finetune_lr: 1.0e-4}}
        controls: [scratch_e, scratch_b]
    """)


@pytest.mark.parametrize("family", ["decoder", "encoder"])
@pytest.mark.parametrize("scope", ["per_layer", "global"])
@pytest.mark.parametrize("tokenizer", ["byte", "bpe"])
def test_scratch_b_compute_equals_the_pruned_arm_with_the_trained_vocabulary(tmp_path, cache_dir, family, scope,
                                                                               tokenizer):
    """Scratch-B's steps × its FLOPs per token = T × dense FLOPs + F × pruned FLOPs, within one step, where the
    FLOPs are counted from the modules of models built with the vocabulary the tokenizer really has (the sweep
    driver's `data_identity`), not from the config formula that plans them."""
    from lightning_modules.data.prepared import data_identity
    from orchestration.design.plan import global_control_units, prune_units, train_units
    from orchestration.design.preflight import build_on_meta, spread_heads
    from orchestration.design.spec import parse_sweep

    text = _bpe_sweep(tmp_path, family, scope)
    if tokenizer == "byte":
        text = text.replace(", tokenizer: bpe, bpe_vocab_size: 2000", "")
    sweep = parse_sweep(text)
    ident = data_identity(sweep.data)
    assert ident.vocab_size == (2000 if tokenizer == "bpe" else 260)
    units = train_units(sweep, ident.data_hash, None, ident.vocab_size)
    dense = next(u for u in units if u.arm == "dense")
    T, F, seq = 200, 30, 64

    def flops(model_cfg):
        # the model as training builds it: the tokenizer's vocabulary, whatever the plan says
        return build_on_meta(model_cfg.model_copy(update={"vocab_size": ident.vocab_size}), seq)[1]

    c_dense = flops(dense.model)
    checked = 0
    for ratio in (0.25, 0.75):
        if scope == "per_layer":
            b = next(u for u in units if u.arm == "scratch_b" and u.ratio == ratio)
        else:
            p = next(u for u in prune_units(sweep, [dense]) if u.ratio == ratio)
            n = 32 - min(round(ratio * 32 + 1e-9), 28)
            kept = spread_heads(n, 4, 8)
            kept[0], kept[1] = kept[0] + 1, kept[1] - 1  # any split of the same total: the scores choose it
            b = next(u for u in global_control_units(sweep, p, dense, kept) if u.arm == "scratch_b")
            assert list(b.model.layer_heads) == kept
        c_small = flops(b.model)
        assert c_small < c_dense
        budget = T * c_dense + F * c_small
        assert abs(b.train.steps * c_small - budget) <= c_small, (ratio, b.train.steps, budget / c_small)
        checked += 1
    assert checked == 2


def test_lr_search_covers_every_architecture_trained_from_scratch():
    """With `lr.search`, dense, each Scratch-E/B shape and each wide shape is searched with the same trials and
    steps, and every arm trains at its own architecture's rate (global-scope controls: the uniform shape of their
    ratio)."""
    from orchestration.design.plan import (
        global_control_units,
        lr_search_bases,
        prune_units,
        scratch_architectures,
        train_units,
    )
    from orchestration.design.spec import parse_sweep
    from orchestration.design.unit import arch_key

    sweep = parse_sweep(GOOD.replace("[scratch_e]", "[scratch_e, scratch_b, wide]")
                        .replace("ratios: [0.5]", "ratios: [0.25, 0.5], scope: [per_layer, global]")
                        + "lr: {search: {trials: 3, low: 1.0e-4, high: 1.0e-2, steps: 10}}\n")
    bases = lr_search_bases(sweep, "c")
    archs = [arch_key(b.model) for b in bases]
    assert archs == ["8x8", "6x8", "6x10", "4x8", "4x16"]  # dense; 0.25: Scratch-E/B, wide; 0.5: the same
    assert len({(b.train.steps, b.seed) for b in bases}) == 1 and all(b.train.steps == 10 for b in bases)
    assert set(scratch_architectures(sweep, "xs", "decoder")) == set(archs)
    lrs = {("xs", "decoder", a): 1e-3 * (i + 1) for i, a in enumerate(archs)}
    units = train_units(sweep, "c", lrs)
    for u in units:
        assert u.train.lr == lrs[("xs", "decoder", arch_key(u.model))] and u.lr_source == "searched"
    assert {u.arm: u.train.lr for u in units if u.ratio == 0.25 or u.arm == "dense"} == {
        "dense": 1e-3, "scratch_e": 2e-3, "scratch_b": 2e-3, "wide": 3e-3}
    dense = next(u for u in units if u.arm == "dense")
    p = next(u for u in prune_units(sweep, [dense]) if u.scope == "global" and u.ratio == 0.5)
    glob = global_control_units(sweep, p, dense, [3, 5], lrs)
    assert {u.arm for u in glob} == {"scratch_e", "scratch_b"}
    assert all(u.train.lr == lrs[("xs", "decoder", "4x8")] and u.lr_source == "searched:4x8" for u in glob)
    # the recovery fine-tune's rate is chosen on val from multiples of the dense rate unless the sweep fixes it
    assert p.plan.finetune_lr is None or p.plan.finetune_steps == 0
    fixed = parse_sweep(GOOD.replace("methods: [gradient, random]}", "methods: [random], finetune_steps: 5}"))
    d = train_units(fixed, "c")[0]
    plan = prune_units(fixed, [d])[0].plan
    assert plan.finetune_lr is None and list(plan.finetune_lr_grid) == pytest.approx(
        [m * d.train.lr for m in (0.03, 0.1, 0.3)])
    # without a search every arm trains at the preset, and says so
    assert {u.lr_source for u in train_units(fixed, "c")} == {"preset"}


def _plan(tmp_path, text: str, *args):
    (tmp_path / "s.yaml").write_text(text)
    return subprocess.run([sys.executable, "-m", "orchestration.cli", "sweep", "s.yaml", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)


def test_every_shipped_sweep_plans_cleanly_and_wide_is_built_at_every_ratio(tmp_path):
    """`--plan --json` builds every unit's model on the meta device; the scales sweep's wide control at s, ratio
    0.25 (6 heads of d_model 128) has 20-dim heads, and the row's numbers are the built model's."""
    import contextlib
    import io

    from lightning_modules.declarations.config import heads_removed, model_config_for
    from lightning_modules.declarations.costs import param_counts
    from orchestration.cli import main

    for name in ("quickstart", "smoke", "scales"):
        out = io.StringIO()  # the CLI in this process: the same code, without an interpreter start per sweep
        with contextlib.redirect_stdout(out):
            assert main(["sweep", str(ROOT / "sweeps" / f"{name}.yaml"), "--plan", "--json"]) == 0, name
        rows = json.loads(out.getvalue())
        from orchestration.design.preflight import PLAN_FIELDS

        assert rows and all(set(PLAN_FIELDS) <= set(x) for x in rows), name
        if name == "scales":
            wide = [x for x in rows if x["arm"] == "wide" and x["scale"] == "s" and x["ratio"] == 0.25]
            assert len(wide) == 3 and all(x["heads"] == [6] * 4 and x["head_dim"] == 20 for x in wide)
            assert wide[0]["attention_width"] == 120 and wide[0]["vocab_size"] == 8192
            cfg = model_config_for("s", n_heads=6, head_dim=20, vocab_size=8192)
            assert wide[0]["params"] == param_counts(cfg).total
            stages = {x["stage"] for x in rows}
            assert stages == {"lr_search", "train", "prune", "controls"}
            # every unit the sweep would run is listed: 4 scales × 3 seeds × (1 + 3 ratios × 3 controls) trained
            # and a half-budget dense run per scale, 12 dense × 7 methods × 3 ratios × 2 scopes pruned, 2 controls
            # per global prune
            assert sum(x["stage"] == "train" for x in rows) == 4 * 3 * 10 + 4
            assert sum(x["stage"] == "prune" for x in rows) == 12 * 7 * 3 * 2
            assert sum(x["stage"] == "controls" for x in rows) == 12 * 7 * 3 * 2
            g = next(x for x in rows if x["stage"] == "prune" and x["scope"] == "global" and x["scale"] == "s"
                     and x["ratio"] == 0.75)
            assert g["heads"] is None and g["heads_total"] == 32 - heads_removed(32, 0.75)
            # per-scale resources: s and m trials share a GPU, xl trains on 4 workers; scoring and pruning on one
            by = {(x["scale"], x["stage"]): x["resources"] for x in rows}
            assert by[("s", "train")] == {"cpu": 2.0, "gpu": 0.25, "workers": 1}
            assert by[("l", "train")] == {"cpu": 4.0, "gpu": 1.0, "workers": 1}
            assert by[("xl", "train")] == by[("xl", "controls")] == {"cpu": 4.0, "gpu": 1.0, "workers": 4}
            assert by[("xl", "prune")] == {"cpu": 4.0, "gpu": 1.0, "workers": 1}
            from orchestration.design.preflight import PlanRow, format_table

            text = format_table([PlanRow(**x) for x in rows], "8192")
            # train stage at once: 30 trials each of s (0.25 GPU), m (0.5), l (1) and xl (4 workers × 1 GPU)
            assert "train 124 trial(s): 744 CPU, 178.25 GPU" in text and "4×(4 CPU 1 GPU)" in text
        if name == "smoke":  # two budgets, and (planned with prune.at added) pruning at half of training
            assert {x["budget"] for x in rows if x["stage"] == "train"} == {20, 40}
            timed = tmp_path / "timed.yaml"
            timed.write_text((ROOT / "sweeps" / "smoke.yaml").read_text().replace(
                "  tolerance: 0.05\n", "  tolerance: 0.05\n  at: [0.5, 1]\n"))
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                assert main(["sweep", str(timed), "--plan", "--json"]) == 0
            prunes = [x for x in json.loads(out.getvalue()) if x["stage"] == "prune"]
            assert {(x["budget"], x["prune_at"]) for x in prunes} == {(T, p) for T in (20, 40) for p in (0.5, 1.0)}
            # pruned halfway: trains the second half, then 10 fine-tune steps at each of the 3 candidate rates
            assert {(x["budget"], x["steps"]) for x in prunes if x["prune_at"] == 0.5} == {(20, 40), (40, 50)}


def test_budgets_and_prune_timings_plan_their_own_units_with_their_own_keys():
    """Each budget is its own dense run with its own controls and prunes; each prune timing its own prune unit
    from that dense run, whose kept checkpoints are part of its key. Sweeps without the new fields keep their keys."""
    from orchestration.design.plan import expected_names, prune_units, snapshot_step, train_units
    from orchestration.design.spec import parse_sweep

    plain = parse_sweep(GOOD)
    both = parse_sweep(GOOD.replace("steps: 20,", "steps: [10, 20],").replace(
        "methods: [gradient, random]}", "methods: [gradient, random], at: [0, 0.25, 1]}"))
    assert both.spec_hash() != plain.spec_hash() == parse_sweep(GOOD.replace("random]}", "random], at: [1]}")).spec_hash()
    trained = train_units(both, "c")
    dense = [u for u in trained if u.arm == "dense"]
    assert sorted((u.budget, u.train.steps, u.seed) for u in dense) == [(T, T, s) for T in (10, 20) for s in (0, 1)]
    assert all(u.snapshots == (0, snapshot_step(0.25, u.train.steps)) for u in dense)
    assert [snapshot_step(0.25, T) for T in (10, 20)] == [2, 5]  # floor: always before the end
    pruned = prune_units(both, dense)
    assert len(pruned) == 4 * 3 * 2  # dense runs × timings × methods
    assert {(p.prune_at, p.budget) for p in pruned} == {(a, T) for a in (0.0, 0.25, 1.0) for T in (10, 20)}
    keys = [u.key for u in trained + pruned]
    assert len(set(keys)) == len(keys)
    names = [u.name for u in trained + pruned]
    assert len(set(names)) == len(names) and names == expected_names(both)
    assert "xs-decoder-T10-pruned-gradient-r0.5-at0.25-s1" in names and "xs-decoder-T20-scratch_e-r0.5-s0" in names
    tags = pruned[0].tags()
    assert tags["headroom.steps"] == "10" and tags["headroom.prune_at"] == "0"
    assert dense[0].tags()["headroom.prune_at"] == "none"
    # the dense runs of a sweep that prunes only the trained models keep no checkpoints (and keep their keys)
    old = train_units(plain, "c")
    assert all(u.snapshots == () and u.budget is None for u in old)
    late = parse_sweep(GOOD.replace("steps: 20,", "steps: [20],"))
    assert [u.key for u in train_units(late, "c")] == [u.key for u in old]  # [20] is the same budget as 20
    with pytest.raises(Exception, match="prune.at"):
        parse_sweep("name: p\npretrained: {checkpoint: /nonexistent}\nprune: {ratios: [0.5], methods: [random], "
                    "at: [0.5, 1]}\n")


def test_a_unit_that_cannot_be_built_stops_the_plan_and_the_sweep_before_anything_starts(tmp_path):
    """40 heads of d_model 64 leave the wide control under 2 dimensions a head: one line names the unit, exit 2,
    with --plan and without it (no MLflow store, no Ray results)."""
    bad = GOOD.replace("steps: 20,", "steps: 20, heads: 40,").replace("ratios: [0.5]", "ratios: [0.1]").replace(
        "[scratch_e]", "[scratch_e, wide]")
    for args in (["--plan"], []):
        r = _plan(tmp_path, bad, *args)
        assert r.returncode == 2, r.stdout + r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and "xs-decoder-wide-r0.1-s0" in lines[0] and "less than 2" in lines[0], lines
        assert sorted(p.name for p in tmp_path.iterdir()) == ["s.yaml"]
    r = _plan(tmp_path, GOOD, "--json")
    assert r.returncode == 2 and "--json: only with --plan" in r.stderr


def test_unit_keys_are_those_earlier_versions_wrote():
    """A key is how `--resume` and a rerun find a unit's MLflow run: the keys below were written by the code before
    units carried typed configs and before budgets and prune timings existed; a sweep that uses neither must keep
    them."""
    from orchestration.design.plan import prune_units, train_units
    from orchestration.design.spec import load_sweep

    sweep, _ = load_sweep(ROOT / "sweeps" / "quickstart.yaml")
    trained = train_units(sweep, "hashX")
    pruned = prune_units(sweep, [u for u in trained if u.arm == "dense"])
    assert (trained[0].name, trained[0].key) == ("xs-decoder-dense-s0", "087182feec5e66eb")
    assert (pruned[0].name, pruned[0].key) == ("xs-decoder-pruned-gradient-r0.5-s0", "02c7b9a2e09aac8a")


def test_wide_is_never_wider_than_the_dense_attention(tmp_path):
    """s at 4 heads of 16 (attention width 64, as the quickstart's and budget sweep's s): the wide control keeps
    the kept heads as wide as the dense model's attention, not d_model (128) — at ratio 0.5 two heads of 32, at
    0.25 three heads of 20 (the largest even size ≤ 64/3) — and never has more attention parameters than dense."""
    import contextlib
    import io

    from orchestration.cli import main

    text = GOOD.replace("xs: {steps: 20,", "s: {steps: 20, heads: 4,").replace(
        "ratios: [0.5]", "ratios: [0.25, 0.5]").replace("[scratch_e]", "[scratch_e, wide]")
    (tmp_path / "s.yaml").write_text(text)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["sweep", str(tmp_path / "s.yaml"), "--plan", "--json"]) == 0
    rows = [x for x in json.loads(out.getvalue()) if x["stage"] == "train"]
    dense = [x for x in rows if x["arm"] == "dense"][0]
    assert dense["attention_width"] == 64
    wide = {x["ratio"]: x for x in rows if x["arm"] == "wide"}
    assert (wide[0.5]["heads"], wide[0.5]["head_dim"], wide[0.5]["attention_width"]) == ([2] * 4, 32, 64)
    assert (wide[0.25]["heads"], wide[0.25]["head_dim"], wide[0.25]["attention_width"]) == ([3] * 4, 20, 60)
    assert all(x["attention_width"] <= dense["attention_width"] for x in wide.values())


def test_scratch_b_counts_every_candidate_fine_tune():
    """The recovery rate chosen on val trains F steps at each of the grid's rates; the pruned arm spent all of
    them, so Scratch-B's budget holds T × dense + |grid| × F × pruned FLOPs (one F when the rate is fixed)."""
    from lightning_modules.declarations.config import model_config_for, train_config_for
    from lightning_modules.declarations.costs import train_flops_per_token
    from orchestration.design.plan import pruned_arm, train_units
    from orchestration.design.spec import parse_sweep

    for extra, candidates in (("", 3), (", finetune_lr: 1.0e-3", 1)):
        sweep = parse_sweep(GOOD.replace("methods: [gradient, random]",
                                         f"methods: [gradient], finetune_steps: 25{extra}").replace(
            "[scratch_e]", "[scratch_b]"))
        dense, t = model_config_for("xs"), train_config_for("xs").model_copy(update={"lr": 1e-3, "steps": 20})
        arm = pruned_arm(sweep, dense, dense, t, 25, "lm", "gradient")
        assert len(sweep.prune.finetune_lr_grid) == 3 and arm.recovery_steps == 25 * candidates
        b = next(u for u in train_units(sweep, "-") if u.arm == "scratch_b")
        c_dense = train_flops_per_token(model_config_for("xs"), 32)
        c_small = train_flops_per_token(b.model, 32)
        # gradient scoring: 2 forward passes (2/3 of a training step's FLOPs) per token of each calibration batch
        budget = 20 * c_dense + sweep.prune.calibration_batches * c_dense * 2 / 3 + 25 * candidates * c_small
        assert abs(b.train.steps * c_small - budget) <= c_small / 2, (extra, b.train.steps, budget / c_small)


def test_the_group_the_plan_stamps_is_the_group_the_report_pools():
    """Every pruned unit and control of the shipped sweeps: its headroom.group tag, read back as a report's run,
    is the group the report pools it in (runs.csv's column), value for value — a Scratch-B of a single F says
    recovery=lm (or distill) like its pruned groups, never the recovery tag's "none" — and dense runs are in no
    group."""
    from orchestration.design.plan import build_plan
    from orchestration.design.spec import load_sweep
    from orchestration.report import Run
    from orchestration.report.read import run_group

    seen = set()
    for name in ("quickstart", "budget", "timing", "recovery", "converged"):
        plan = build_plan(load_sweep(ROOT / "sweeps" / f"{name}.yaml")[0], "c")
        for u in plan.trained + plan.pruned + list(plan.taught):
            tags = u.tags()
            r = Run(u.key, u.name, "FINISHED", tags, {}, u.params())
            assert run_group(r) == tags["headroom.group"], (name, u.name)
            seen.add((u.arm, tags["headroom.group"] == "none"))
            if u.arm == "scratch_b":
                assert "recovery=none" not in tags["headroom.group"]
    assert {("dense", True), ("pruned", False), ("scratch_e", False), ("scratch_b", False)} <= seen


def test_a_run_name_is_each_axis_declared_part():
    """Run names come from the axes' declarations: an axis registered here with a part of its own puts it before
    the seed, and takes it away again when unregistered; learning-rate candidates keep their own form."""
    from orchestration.design.axes import Axis, register_axis, unregister_axis
    from orchestration.design.plan import build_plan, lr_candidate
    from orchestration.design.spec import load_sweep

    plan = build_plan(load_sweep(ROOT / "sweeps" / "smoke.yaml")[0], "c")
    pruned = plan.pruned[0]
    before = pruned.name
    assert before.endswith(f"-s{pruned.seed}") and before.startswith(f"{pruned.scale}-")
    register_axis(Axis("widget", "", in_name=lambda u: "wX"))
    try:
        assert pruned.name == before[: -len(f"-s{pruned.seed}")] + f"-wX-s{pruned.seed}"
    finally:
        unregister_axis("widget")
    assert pruned.name == before
    cand = lr_candidate(plan.lr_search[0], 1e-3)
    assert cand.name.startswith(f"{cand.scale}-{cand.family}-lr-") and cand.name.endswith("1.00e-03")
