"""What each trial of a sweep holds on the cluster: a unit's resources (what `--plan` shows and the tracker
records), the Ray bundle its trial asks Tune for, how a data-parallel trial's Ray Train run is set up, and how many
trials of a stage with data-parallel ones may run at once."""

from __future__ import annotations

from .schema import Sweep
from .unit import Unit

# what the trial function of a data-parallel trial holds while its Ray Train workers train: memory for the
# process (torch imported), no CPU — it waits, and a share of a CPU would keep W one-CPU workers off a W-CPU node
DRIVER_BUNDLE = {"memory": 2**30}


def trial_resources(sweep: Sweep, unit: Unit) -> dict:
    """What a unit's trial holds: its scale's resources (a prune unit scores and prunes on one worker)."""
    r = sweep.resources_for(unit.scale).as_dict()
    return {**r, "workers": 1} if unit.stage == "prune" else r


def ddp_trials(sweep: Sweep, storage: str, prefix: str) -> dict:
    """scale -> how its train trials run data-parallel (absent: in the trial's own process)."""
    out = {}
    for scale in sweep.scales or {}:
        r = sweep.resources_for(scale)
        if r.workers > 1:
            out[scale] = {**r.as_dict(), "storage": storage, "retries": sweep.retries, "prefix": prefix}
    return out


def trial_bundle(sweep: Sweep, scale: str | None, trains: bool) -> dict:
    """A trial's resources: its scale's, or for a data-parallel trial what the function that drives the Ray
    Train run needs (the workers ask Ray for their own)."""
    r = sweep.resources_for(scale)
    if trains and r.workers > 1:
        return dict(DRIVER_BUNDLE)
    return {"CPU": r.cpu, **({"GPU": r.gpu} if r.gpu else {})}


def concurrency(sweep: Sweep, scales: set[str], trains: bool) -> int | None:
    """How many trials of a stage with data-parallel ones may run at once: as many of its largest trial as the
    cluster holds now (None: no data-parallel trial, Tune's own accounting suffices)."""
    import ray

    need = [r for r in map(sweep.resources_for, scales) if r.workers > 1] if trains else []
    if not need:
        return None
    have = ray.cluster_resources()
    fits = []
    for r in need:
        fits.append(int(have.get("CPU", 0) // (r.cpu * r.workers)))
        if r.gpu:
            fits.append(int(have.get("GPU", 0) // (r.gpu * r.workers)))
    return max(1, min(fits))
