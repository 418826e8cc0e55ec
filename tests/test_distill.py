"""Recovery by distillation against a hand computation: one step's loss and gradients, the trainer's logged loss,
and run_prune's recovery fine-tune towards the dense teacher (tests/test_recovery.py plans it)."""

import copy
import math

import pytest
import torch
from conftest import ROOT  # noqa: F401 - puts the repository on sys.path

from lightning_modules.data.datamodule import HeadroomData
from lightning_modules.declarations.config import DataConfig, model_config_for, train_config_for
from lightning_modules.declarations.prune_plan import PruneData, PruneJob, PrunePlan
from lightning_modules.models.build import build_model, load_model, token_losses
from lightning_modules.models.heads import prune_heads
from lightning_modules.pruning.run import run_prune
from lightning_modules.training.distill import DistillSpec, LogitDistillation
from lightning_modules.training.lm import HeadroomLM, evaluate


def _hand_loss(student, teacher, batch, tau: float, w: float) -> torch.Tensor:
    """The distillation loss written out in float64, token by token, from the formula in distill.py:
    mean over predicted tokens of w·CE + (1 − w)·τ²·Σ_v p_t(v)·(log p_t(v) − log p_s(v)), p = softmax(logits/τ)."""
    s = student(input_ids=batch["input_ids"]).logits.double()
    with torch.no_grad():
        t = teacher(input_ids=batch["input_ids"]).logits.double()
    labels = batch["labels"]
    total, count = 0.0, 0
    B, T, V = s.shape
    for b in range(B):
        for i in range(T - 1):  # causal: position i predicts token i+1
            y = int(labels[b, i + 1])
            if y == -100:
                continue
            zs, zt = s[b, i] / tau, t[b, i] / tau
            log_ps = zs - torch.log(torch.exp(zs - zs.max()).sum()) - zs.max()
            log_pt = zt - torch.log(torch.exp(zt - zt.max()).sum()) - zt.max()
            kl = (torch.exp(log_pt) * (log_pt - log_ps)).sum()
            ce = -(s[b, i, y] - torch.logsumexp(s[b, i], 0))
            total = total + w * ce + (1 - w) * tau * tau * kl
            count += 1
    return total / count


@pytest.fixture(scope="module")
def pair():
    cfg = model_config_for("xs", "decoder", n_heads=8, vocab_size=300)
    teacher = build_model(cfg, seed=1)
    student = prune_heads(build_model(cfg, seed=2), [[0, 2, 5], [1, 3, 4, 6, 7]])  # a pruned shape
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (3, 17), generator=g)
    labels = ids.clone()
    labels[1, 9:] = -100  # padding predicts nothing
    return teacher, student, {"input_ids": ids, "labels": labels}


@pytest.mark.parametrize("tau,w", [(1.0, 0.0), (2.0, 0.3)])
def test_one_distillation_step_matches_the_hand_computed_loss_and_gradients(pair, tau, w):
    teacher, student, batch = pair
    spec = DistillSpec(temperature=tau, lm_weight=w)
    tcfg = train_config_for("xs", steps=1, batch_size=3, seq_len=16)
    lm = HeadroomLM.from_model(copy.deepcopy(student), tcfg, train_loss_fn=LogitDistillation(teacher, spec))
    loss = lm.training_step(batch, 0)
    loss.backward()
    got = {n: p.grad.clone() for n, p in lm.model.named_parameters()}

    ref_model = copy.deepcopy(student)
    ref = _hand_loss(ref_model, teacher, batch, tau, w)
    ref.backward()
    assert float(loss) == pytest.approx(float(ref), rel=1e-5)
    for n, p in ref_model.named_parameters():
        torch.testing.assert_close(got[n], p.grad.float(), rtol=1e-4, atol=1e-7, msg=n)
    assert all(p.grad is None for p in teacher.parameters())  # the teacher is frozen
    # validation stays the LM loss: what every arm is compared by
    lm.on_validation_epoch_start()
    lm.validation_step(batch, 0)
    s, n = token_losses(lm.model, batch)
    assert lm._val[0] / lm._val[1] == pytest.approx(float(s.sum() / n.sum()), rel=1e-6)


def test_a_student_equal_to_its_teacher_has_zero_kl(pair):
    teacher, _, batch = pair
    s, n = LogitDistillation(teacher)(copy.deepcopy(teacher), batch)
    assert float(s.abs().max()) < 1e-5 and n.tolist() == [16, 8, 16]


@pytest.fixture(scope="module")
def data():
    return HeadroomData(DataConfig(), train_config_for("xs", batch_size=8)).prepare()


def test_recovery_by_distillation_trains_on_the_teacher_and_reports_lm_losses(xs_decoder_run, data):
    """run_prune with recovery distill: the trainer's first logged loss is the hand-computed distillation loss of
    the pruned model on the first training batch; the metrics record the objective; every loss reported is the
    LM loss (the pruned model's final loss equals token_losses of the returned model)."""
    model = load_model(xs_decoder_run / "model")
    dense = copy.deepcopy(model)
    plan = PrunePlan(method="magnitude", ratio=0.5, finetune_steps=2, finetune_lr=1e-3)
    seen = []
    import lightning_modules.training.lm as lm_mod

    orig = lm_mod.HeadroomLM.training_step

    def spy(self, batch, i):
        out = orig(self, batch, i)
        if not seen:
            seen.append((copy.deepcopy(self.model), {k: v.clone() for k, v in batch.items()}, float(out)))
        return out

    lm_mod.HeadroomLM.training_step = spy
    try:
        pruned, _, m = run_prune(model, data, PruneJob(
            plan=plan, data=PruneData(calibration_batches=1, curve=False), eval_batches=2, latency_repeats=1,
            random_draws=0, recovery="distill", distill=DistillSpec(temperature=2.0)))
    finally:
        lm_mod.HeadroomLM.training_step = orig
    assert m.recovery == {"kind": "distill", "temperature": 2.0, "lm_weight": 0.0}
    student0, batch0, logged = seen[0]
    assert logged == pytest.approx(float(_hand_loss(student0, dense, batch0, 2.0, 0.0)), rel=1e-4)
    assert math.isfinite(m.loss["final"]["id"]["loss"])
    assert m.loss["final"]["id"]["loss"] == pytest.approx(evaluate(pruned, data.loader("id", 2))["loss"], rel=1e-6)
