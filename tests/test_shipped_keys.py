"""Every shipped sweep keeps its spec hash and every unit its name and key (tests/golden/shipped_sweeps.json, written
from the plans of commit a9d03dc): so `--resume` of a sweep started before a change still finds its parent run and
continues its units, never a second copy. A sweep added since has no entry; a shipped one whose science changed on
purpose gets a new file name, not a new golden entry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestration.design.plan import build_plan
from orchestration.design.spec import load_sweep

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = json.loads((ROOT / "tests" / "golden" / "shipped_sweeps.json").read_text())


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_a_shipped_sweep_keeps_its_hash_and_every_unit_its_name_and_key(name):
    sweep, _ = load_sweep(ROOT / "sweeps" / name)
    plan = build_plan(sweep, "golden")
    units = plan.lr_search + plan.trained + plan.pruned + list(plan.taught)
    assert sweep.spec_hash() == GOLDEN[name]["spec_hash"]
    assert sorted([u.name, u.key] for u in units) == GOLDEN[name]["units"]
