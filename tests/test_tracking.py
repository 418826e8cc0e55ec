"""The MLflow side alone, on a real SQLite store: one parent per spec hash, one child per key across drivers,
and stepped metrics logged once however often a restored trial replays them."""

from __future__ import annotations

import pytest
from test_spec import GOOD

from orchestration.design.plan import train_units
from orchestration.design.spec import parse_sweep


@pytest.fixture()
def store(tmp_path):
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def _tracker(uri, sweep):
    from orchestration.running.tracking import Tracker

    t = Tracker(uri, sweep.name, sweep.spec_hash())
    t.open_parent("t.yaml", GOOD, sweep.model_dump(mode="json"))
    return t


def test_one_run_per_key_across_drivers_and_steps_logged_once(store):
    sweep = parse_sweep(GOOD)
    unit = train_units(sweep, "corpus")[0]
    first = _tracker(store, sweep)
    run = first.child(unit)
    assert first.log_stepped(run, [("train/loss", s, 10.0 - s) for s in range(1, 11)]) == 10
    # the same driver replays steps 5..15 (a trial restored from the checkpoint of step 4)
    assert first.log_stepped(run, [("train/loss", s, 100.0) for s in range(5, 16)]) == 5
    # a new driver (a resumed sweep) finds the same parent and the same run, and knows what it holds
    second = _tracker(store, sweep)
    assert second.parent_id == first.parent_id
    assert second.child(unit) == run
    assert second.log_stepped(run, [("train/loss", s, 7.0) for s in range(12, 21)]) == 5
    hist = sorted((m.step, m.value) for m in second.client.get_metric_history(run, "train/loss"))
    assert [s for s, _ in hist] == list(range(1, 21))
    assert hist[0] == (1, 9.0) and hist[10] == (11, 100.0) and hist[15] == (16, 7.0)  # first write wins
    assert second.unfinished_units() and not second.finished_keys()
    second.finish(unit.key, run)
    assert second.finished_keys() == {unit.key} and not second.unfinished_units()


def test_a_changed_spec_gets_a_new_parent_and_fresh_children(store):
    a = parse_sweep(GOOD)
    b = parse_sweep(GOOD.replace("seeds: [0, 1]", "seeds: [0, 1, 2]"))
    ta, tb = _tracker(store, a), _tracker(store, b)
    assert ta.parent_id != tb.parent_id
    u = train_units(a, "corpus")[0]
    assert u in train_units(b, "corpus")  # the same unit of work ...
    assert ta.child(u) != tb.child(u)  # ... is a child of each parent: a report reads one parent's runs
    runs = ta.client.search_runs([ta.experiment_id], "tags.`headroom.role` = 'parent'")
    assert {r.data.tags["headroom.spec_hash"] for r in runs} == {a.spec_hash(), b.spec_hash()}
    child = ta.client.get_run(ta.child(u))
    assert child.data.tags["mlflow.parentRunId"] == ta.parent_id
    assert {k: v for k, v in child.data.tags.items() if k.startswith("headroom.")} == u.tags()
    assert child.data.params["lr"] == str(u.train.lr)
