"""Prune timing (lightning_modules/pruning/early.py): a dense run keeps checkpoints at chosen steps; pruning one of them and
training on to T continues the dense run exactly, with only the heads changed.

References: with every head kept, the continued run must end at the dense run's own final weights (schedule, data
order and optimizer moments all carried over); with heads removed, the carried AdamW moments must be the dense
moments' rows and columns of the kept heads, indexed by hand."""

from __future__ import annotations

import pytest
import torch

from lightning_modules.declarations.config import DataConfig, model_config_for, train_config_for
from lightning_modules.declarations.prune_plan import PruneData, PruneJob, PrunePlan

T = 12


@pytest.fixture(scope="module", params=["decoder", "encoder"])
def dense_run(request, tmp_path_factory, cache_dir):
    from lightning_modules.data.datamodule import HeadroomData
    from lightning_modules.training.loop import Snapshots, train_lm

    family = request.param
    snaps = tmp_path_factory.mktemp(f"snapshots-{family}")
    train = train_config_for("xs", steps=T, batch_size=4, seq_len=32, warmup_steps=3, val_every=6, val_batches=1,
                             eval_batches=2, seed=3)
    data = HeadroomData(DataConfig(), train, family)
    result = train_lm(model_config_for("xs", family), train, DataConfig(), callbacks=[Snapshots([0, 6], snaps)],
                      progress=False, data=data)
    return family, train, snaps, result


def _job(plan):
    """The prune job these tests run: two eval batches, one calibration batch."""
    return PruneJob(plan=plan, data=PruneData(calibration_batches=1), eval_batches=2)


def _data(family, train):
    from lightning_modules.data.datamodule import HeadroomData

    return HeadroomData(DataConfig(), train, family).prepare()


def test_the_dense_run_keeps_complete_checkpoints_at_the_chosen_steps(dense_run):
    _, _, snaps, _ = dense_run
    assert sorted(p.name for p in snaps.iterdir()) == ["step0.ckpt", "step6.ckpt"]  # no partial files left
    for step in (0, 6):
        ck = torch.load(snaps / f"step{step}.ckpt", map_location="cpu", weights_only=False)
        assert ck["global_step"] == step and ck["optimizer_states"] and ck["lr_schedulers"]


@pytest.mark.parametrize("step", [0, 6])
def test_keeping_every_head_continues_the_dense_run_to_its_own_final_weights(dense_run, step):
    from lightning_modules.pruning.early import prune_and_continue

    family, train, snaps, result = dense_run
    plan = PrunePlan(method="magnitude", ratio=0.0)  # removes nothing
    pruned, _, m = prune_and_continue(snaps / f"step{step}.ckpt", _data(family, train), _job(plan))
    assert m.prune_step == step and m.continued_steps == T - step
    dense = dict(result.lm.model.named_parameters())
    for name, p in pruned.named_parameters():
        assert torch.allclose(p, dense[name], atol=1e-5, rtol=1e-4), name
    assert m.loss["pre_ft"]["val"]["loss"] == pytest.approx(result.metrics["final"]["val"]["loss"], rel=1e-4)


def test_pruning_carries_the_moments_of_the_kept_heads(dense_run):
    from lightning_modules.models.heads import attention_modules
    from lightning_modules.pruning.early import pruned_checkpoint
    from lightning_modules.training.lm import load_lm, optimizer_params

    family, _, snaps, _ = dense_run
    raw = torch.load(snaps / "step6.ckpt", map_location="cpu", weights_only=False)
    model = load_lm(str(snaps / "step6.ckpt")).model
    keep = [[0, 2, 5, 7], [1, 3, 4, 6]]  # xs: 2 layers of 8 heads of 8 dims
    pruned, ck = pruned_checkpoint(raw, model, keep)
    decay, no_decay = optimizer_params(model)
    index = {n: i for i, (n, _) in enumerate(decay + no_decay)}
    state, new = raw["optimizer_states"][0]["state"], ck["optimizer_states"][0]["state"]
    hd = 8
    for layer, kept in enumerate(keep):
        attn = attention_modules(model)[layer]
        prefix = next(n for n, m in model.named_modules() if m is attn)
        rows = torch.cat([torch.arange(h * hd, (h + 1) * hd) for h in kept])
        q, o = ("q_proj", "o_proj") if family == "decoder" else ("self.query", "output.dense")
        for key in ("exp_avg", "exp_avg_sq"):
            iq, io = index[f"{prefix}.{q}.weight"], index[f"{prefix}.{o}.weight"]
            assert torch.equal(new[iq][key], state[iq][key][rows]), (layer, key)
            assert torch.equal(new[io][key], state[io][key][:, rows]), (layer, key)
        assert torch.equal(new[iq]["step"], state[iq]["step"])
    # the checkpoint's weights are the pruned model's; untouched parameters keep their moments exactly
    assert all(torch.equal(ck["state_dict"][f"model.{k}"], v) for k, v in pruned.state_dict().items())
    emb = index[next(n for n, _ in decay if "embed" in n)]
    assert torch.equal(new[emb]["exp_avg"], state[emb]["exp_avg"])


def test_a_missing_snapshot_is_one_clear_error(tmp_path, dense_run):
    from lightning_modules.declarations.config import HeadroomInputError
    from lightning_modules.pruning.early import prune_and_continue

    family, train, _, _ = dense_run
    with pytest.raises(HeadroomInputError, match="did not keep this step"):
        prune_and_continue(tmp_path / "step3.ckpt", _data(family, train),
                           PruneJob(plan=PrunePlan(method="random", ratio=0.5)))


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory, cache_dir):
    """The decoder's dense run of dense_run at bf16-mixed (Lightning's CPU autocast: what a GPU trains at)."""
    from lightning_modules.data.datamodule import HeadroomData
    from lightning_modules.training.loop import Snapshots, train_lm

    snaps = tmp_path_factory.mktemp("snapshots-bf16")
    train = train_config_for("xs", steps=T, batch_size=4, seq_len=32, warmup_steps=3, val_every=6, val_batches=1,
                             eval_batches=2, seed=3, precision="bf16-mixed")
    result = train_lm(model_config_for("xs", "decoder"), train, DataConfig(), callbacks=[Snapshots([6], snaps)],
                      progress=False, data=HeadroomData(DataConfig(), train, "decoder"))
    return train, snaps, result


def test_a_prune_during_bf16_training_continues_the_run_and_ablation_scores_it(bf16_run):
    """Prune timing at bf16-mixed: keeping every head at step 6 and training on under autocast ends at the bf16
    dense run's own weights (schedule, data, moments and precision carried over); removing half the heads by
    ablation there trains on to T with every loss finite and no better than the dense model's at T by more than
    the tolerance."""
    from lightning_modules.pruning.early import prune_and_continue

    train, snaps, result = bf16_run
    keep, _, m = prune_and_continue(snaps / "step6.ckpt", _data("decoder", train),
                                    _job(PrunePlan(method="ablation", ratio=0.0)))
    dense = dict(result.lm.model.named_parameters())
    for name, p in keep.named_parameters():
        assert torch.allclose(p, dense[name], atol=1e-5, rtol=1e-4), name
    assert m.loss["pre_ft"]["val"]["loss"] == pytest.approx(result.metrics["final"]["val"]["loss"], rel=1e-4)
    half, scores, m = prune_and_continue(snaps / "step6.ckpt", _data("decoder", train),
                                         _job(PrunePlan(method="ablation", ratio=0.5)))
    assert sum(m.heads_kept) == sum(m.heads_dense) // 2  # ratio 0.5 per layer
    losses = [v["loss"] for stage in ("pre_ft", "final") for v in m.loss[stage].values()]
    assert all(torch.isfinite(torch.tensor(x)) for x in losses) and m.continued_steps == T - 6
    assert m.loss["pre_ft"]["val"]["loss"] >= result.metrics["final"]["val"]["loss"] * (1 - 0.05)
