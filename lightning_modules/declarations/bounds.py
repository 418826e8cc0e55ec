"""What the code downstream of a config can hold: the bounds every number a sweep file or a flag takes is held to
(docs/design.md "Bounds"). Pydantic only, like config.py."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

# What the code downstream can hold (docs/design.md "Bounds"): every integer of a config fits a signed 64-bit
# integer (numpy, torch and MLflow's step); a run's tokens (steps × batch × sequence) stay where float64 counts
# exactly (FLOPs and tokens are float metrics); a seed stays below 2^31, which numpy's legacy generator (Optuna's
# sampler, seeded with the search's seed plus its trial count) and torch's generators accept with room.
MAX_INT = 2**63 - 1
MAX_TOKENS = 2**53
MAX_SEED = 2**31 - 1


def fits_int64(v):
    if isinstance(v, bool):
        return
    if isinstance(v, int) and not -MAX_INT - 1 <= v <= MAX_INT:
        raise ValueError(f"{v} is past the largest integer headroom can hold, 2^63 - 1 = {MAX_INT}")
    if isinstance(v, (list, tuple)):
        for x in v:
            fits_int64(x)
    if isinstance(v, dict):
        for x in v.values():
            fits_int64(x)


def check_tokens(what: str, steps: int, batch_size: int, seq_len: int) -> None:
    """ValueError naming `what` when steps × batch_size × seq_len tokens are past MAX_TOKENS."""
    if steps * batch_size * seq_len > MAX_TOKENS:
        raise ValueError(f"{what}: {steps} steps of {batch_size} × {seq_len} tokens are past {MAX_TOKENS} tokens "
                         "per run (2^53, the largest count a float64 metric holds exactly)")


Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
