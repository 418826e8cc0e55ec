"""The MLflow UI as the place to compare runs, on the smoke sweep's store (run with `--register`): the experiment's
kind and description, the parent run's headline note, each child's description and dense-run link, the pruned
models loadable with `mlflow.transformers.load_model` and registered with the verdict."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from test_sweep import client, runs_of, split

pytestmark = pytest.mark.slow


def test_the_byte_tokenizer_as_a_transformers_tokenizer_gives_the_same_ids():
    from lightning_modules.data.tokens import ByteTokenizer

    byte, tf = ByteTokenizer(), ByteTokenizer.for_transformers()
    text = "def f(x):\n    return 'héllo wörld' + \t\"€\" # ✓ \x00\x7f 🤖"
    ids = tf(text, add_special_tokens=False)["input_ids"]
    assert ids == byte.encode(text).tolist()  # every byte its own id, whitespace and multi-byte characters too
    assert tf.decode(ids) == text
    assert (tf.pad_token_id, tf.mask_token_id, tf.eos_token_id) == (byte.pad_id, byte.mask_id, byte.eos_id)


def test_the_experiment_opens_on_its_runs_and_says_what_the_sweep_tests(smoke):
    c = client(smoke["cwd"])
    exp = c.get_experiment_by_name("smoke")
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    note = exp.tags["mlflow.note.content"]
    parent = split(runs_of(c, "smoke"))[0][0]
    assert "smoke" in note and parent.info.run_name in note and "scratch_e, scratch_b" in note
    assert "gradient, random" in note and "ratios 0.5" in note


def test_the_parent_runs_note_is_the_headline(smoke):
    c = client(smoke["cwd"])
    parent = split(runs_of(c, "smoke"))[0][0]
    note = parent.data.tags["mlflow.note.content"]
    v = json.loads((smoke["cwd"] / "reports" / "smoke" / "verdict.json").read_text())
    for h in v["headline"]:  # every scale's verdict words, as the report has them
        assert f"### {h['scale']} {h['family']}" in note and f"**{h['headline']}**" in note
    for x in (x for x in v["comparisons"] if x["primary"]):  # every primary difference with its interval
        assert f"{x['diff_mean']:+.4f}" in note
    for d in v["diagnostics"]:
        assert f"- {d['check']}: " in note
    assert "report/report.html" in note
    arts = {a.path for a in c.list_artifacts(parent.info.run_id, "report")}
    assert "report/report.html" in arts  # where the note points


def test_children_say_what_they_are_and_link_their_dense_run(smoke):
    c = client(smoke["cwd"])
    _, children = split(runs_of(c, "smoke"))
    dense = {(t["headroom.scale"], t["headroom.family"], t["headroom.seed"], t["headroom.steps"]): r.info.run_id
             for r in children if (t := r.data.tags)["headroom.arm"] == "dense"}
    first = {"dense": "Dense", "pruned": "Pruned", "scratch_e": "Scratch-E", "scratch_b": "Scratch-B",
             "dense_half": "Half-budget dense run"}
    for r in children:
        t = r.data.tags
        if t["headroom.stage"] == "lr_search":
            assert t["mlflow.note.content"].startswith("Learning-rate candidate")
            continue
        assert t["mlflow.note.content"].startswith(first[t["headroom.arm"]]), t["mlflow.note.content"]
        want = dense.get((t["headroom.scale"], t["headroom.family"], t["headroom.seed"], t["headroom.steps"]))
        if t["headroom.arm"] == "dense":
            assert "headroom.dense_run_id" not in t
        else:  # the dense run of the same scale, family, seed and budget
            assert t["headroom.dense_run_id"] == want, r.info.run_name
    pruned = [r for r in children if r.data.tags["headroom.arm"] == "pruned"]
    assert all(f"{int(float(r.data.tags['headroom.ratio']) * 100)}% of its heads" in
               r.data.tags["mlflow.note.content"] for r in pruned)


def test_a_pruned_model_loads_with_mlflow_transformers_and_computes_what_headroom_does(smoke, monkeypatch):
    import mlflow
    import torch

    from lightning_modules.data.tokens import ByteTokenizer
    from lightning_modules.models.build import load_model

    c = client(smoke["cwd"])
    _, children = split(runs_of(c, "smoke"))
    by_id = {r.info.run_id: r for r in children}
    pruned = [r for r in children if r.data.tags["headroom.arm"] == "pruned"]
    assert len(pruned) == 8 and all(r.data.tags["headroom.model"].startswith("models:/") for r in pruned)
    for r in pruned:  # exactly one logged model per prune run
        found = c.search_logged_models([r.info.experiment_id], filter_string=f"source_run_id = '{r.info.run_id}'")
        assert len(found) == 1 and found[0].name == "pruned_model"
    r = next(r for r in pruned if r.data.tags["headroom.method"] == "gradient")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{smoke['cwd'] / 'mlflow.db'}")  # this test only
    parts = mlflow.transformers.load_model(r.data.tags["headroom.model"], return_type="components")
    model, tok = parts["model"], parts["tokenizer"]
    # the reference: headroom's own loader on the trial's checkpoint (the one the report's losses came from)
    ckpt = r.data.tags["headroom.checkpoint"].removeprefix("file://")
    ref = load_model(f"{ckpt}/model")
    text = "import os\nfor name in os.listdir('.'):\n    print(name)\n"
    ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    assert ids[0].tolist() == ByteTokenizer().encode(text).tolist()
    dense_heads = int(by_id[r.data.tags["headroom.dense_run_id"]].data.tags["headroom.heads"])
    assert model.config.num_attention_heads == ref.config.num_attention_heads == dense_heads // 2  # pruned, r0.5
    with torch.no_grad():
        got, want = model.eval()(ids).logits, ref(ids).logits
    assert np.abs((got - want).numpy()).max() < 1e-5
    # the pipeline MLflow builds generates text with it
    pipe = mlflow.transformers.load_model(f"runs:/{r.info.run_id}/pruned_model")
    assert isinstance(pipe("def ", max_new_tokens=4, do_sample=False)[0]["generated_text"], str)


def test_register_puts_the_primary_pruned_models_in_the_registry_with_the_verdict(smoke):
    c = client(smoke["cwd"])
    v = json.loads((smoke["cwd"] / "reports" / "smoke" / "verdict.json").read_text())
    headline = {h["scale"]: h["headline"] for h in v["headline"]}
    _, children = split(runs_of(c, "smoke"))
    by_id = {r.info.run_id: r for r in children}
    names = sorted(m.name for m in c.search_registered_models())
    assert names == ["smoke-xs-T20-decoder-r0.5-pruned", "smoke-xs-T40-decoder-r0.5-pruned"]
    assert re.search(r"registered 4 pruned model version\(s\) of method gradient", smoke["stdout"])
    for name in names:
        versions = c.search_model_versions(f"name = '{name}'")
        assert len(versions) == 2  # one per seed
        for mv in versions:
            run = by_id[mv.tags["headroom.run_id"]]
            t = run.data.tags
            assert (t["headroom.method"], t["headroom.scope"], t["headroom.arm"]) == ("gradient", "per_layer", "pruned")
            assert mv.tags["headroom.verdict"] == headline[f"xs-T{t['headroom.steps']}"]
            dense = by_id[t["headroom.dense_run_id"]]
            assert mv.tags["headroom.dense_loss"] == f"{dense.data.metrics['final/id/loss']:.4f}"
            assert mv.tags["headroom.pruned_loss"] == f"{run.data.metrics['final/id/loss']:.4f}"
            assert mv.tags["headroom.seed"] == t["headroom.seed"]


def test_progress_estimates_the_time_left_per_stage(smoke):
    out = smoke["stdout"]
    lines = [line for line in out.splitlines() if re.match(r"\[headroom\]\s+\d+/\d+ ", line)]
    assert lines
    for line in lines:
        done, total = map(int, re.search(r"(\d+)/(\d+)", line).groups())
        assert ("left" in line) == (done < total), line
    assert re.search(r"wall time \d+ s: lr_search \d+ s, train \d+ s, prune \d+ s", out)
