"""Training for real on the embedded corpus: models learn, checkpoints rebuild the model alone, a resumed run
continues exactly where it stopped."""

import json

import pytest
import torch
from pytorch_lightning.callbacks import Callback

from lightning_modules.data.datamodule import HeadroomData
from lightning_modules.declarations.config import DataConfig, model_config_for, train_config_for
from lightning_modules.models.build import load_model
from lightning_modules.training.lm import evaluate, load_lm
from lightning_modules.training.loop import train_lm

MARGIN = 0.3  # nats/byte below the unigram entropy of the same split


def test_decoder_beats_unigram_entropy(xs_decoder_metrics):
    m = xs_decoder_metrics
    dm = HeadroomData(DataConfig(), train_config_for("xs")).prepare()
    unigram = dm.unigram_entropy("val")
    val = m["final"]["val"]["loss"]
    print(f"\nxs decoder: val loss {val:.3f} nats/byte, unigram entropy {unigram:.3f}")
    assert val <= unigram - MARGIN
    assert set(m["final"]) == {"val", "id", "shift"}
    assert m["corpus_hash"] == dm.corpus_hash and m["params"] > 0 and m["tokens_per_s"] > 0


def test_encoder_beats_unigram_entropy(xs_encoder):
    unigram = xs_encoder.data.unigram_entropy("val")
    val = xs_encoder.metrics["final"]["val"]["loss"]
    print(f"\nxs encoder: masked-token val loss {val:.3f} nats/byte, unigram entropy {unigram:.3f}")
    assert val <= unigram - MARGIN


def test_checkpoint_alone_rebuilds_the_model(xs_decoder_run):
    lm = load_lm(str(xs_decoder_run / "last.ckpt"))
    assert lm.model_cfg.family == "decoder" and lm.model_cfg.n_heads == 8
    saved = load_model(xs_decoder_run / "model")
    ids = torch.randint(0, 256, (2, 40))
    with torch.no_grad():
        assert torch.equal(lm.model.eval()(input_ids=ids).logits, saved(input_ids=ids).logits)


def test_cli_run_is_a_plain_transformers_checkpoint(xs_decoder_run):
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(str(xs_decoder_run / "model")).eval()
    ours = load_model(xs_decoder_run / "model")
    ids = torch.randint(0, 256, (2, 40))
    with torch.no_grad():
        assert torch.equal(plain(input_ids=ids).logits, ours(input_ids=ids).logits)
    metrics = json.loads((xs_decoder_run / "metrics.json").read_text())
    assert metrics["model_config"]["n_heads"] == 8 and metrics["steps"] > 0


def test_position_order_matters_to_the_decoder(xs_decoder_run):
    """RoPE and the causal mask: permuting the context changes what the last position predicts."""
    model = load_model(xs_decoder_run / "model")
    text = b"def main(argv):\n    return 0\n"
    ids = torch.tensor([list(text)])
    perm = torch.cat([torch.randperm(ids.shape[1] - 1, generator=torch.Generator().manual_seed(0)),
                      torch.tensor([ids.shape[1] - 1])])
    with torch.no_grad():
        a = model(input_ids=ids).logits[0, -1]
        b = model(input_ids=ids[:, perm]).logits[0, -1]
    assert (a - b).abs().max() > 1e-2


class _StopAt(Callback):
    def __init__(self, step):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step >= self.step:
            trainer.should_stop = True


@pytest.mark.parametrize("family", ["decoder", "encoder"])
def test_resume_continues_exactly(tmp_path, family):
    """Stop at step 4 of 12, resume from the checkpoint: the weights equal an uninterrupted 12-step run's. (Before
    the first half: Lightning counts a resumed epoch from the checkpoint's batch index, and a loader of only the
    remaining samples ended the epoch early and repeated data in the last steps; resuming at half-way hid it.)"""
    mcfg = model_config_for("xs", family)
    tcfg = train_config_for("xs", steps=12, val_every=6, warmup_steps=3, batch_size=4, seq_len=64,
                            eval_batches=1, val_batches=1)
    data = DataConfig()
    straight = train_lm(mcfg, tcfg, data, progress=False)
    train_lm(mcfg, tcfg, data, checkpoint_dir=tmp_path / "ck", checkpoint_every=4, progress=False,
             callbacks=[_StopAt(4)])
    assert torch.load(tmp_path / "ck" / "last.ckpt", weights_only=False)["global_step"] == 4
    resumed = train_lm(mcfg, tcfg, data, ckpt_path=str(tmp_path / "ck" / "last.ckpt"), progress=False)
    assert resumed.metrics["steps"] == 12
    # every step after the checkpoint saw the uninterrupted run's batch: the same loss, step by step
    ref = dict(straight.metrics["train_loss"])
    assert [s for s, _ in resumed.metrics["train_loss"]] == list(range(5, 13))
    for s, v in resumed.metrics["train_loss"]:
        assert v == pytest.approx(ref[s], rel=1e-5), s
    a, b = straight.lm.model.state_dict(), resumed.lm.model.state_dict()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=1e-5, msg=k)
    dm = straight.data
    assert evaluate(resumed.lm.model, dm.loader("val", 1))["loss"] == pytest.approx(
        evaluate(straight.lm.model, dm.loader("val", 1))["loss"], rel=1e-5)


def test_fused_adamw_clips_under_bf16_mixed():
    """A GPU sweep trains with fused AdamW (make_optimizer's default on CUDA), bf16-mixed and gradient clipping.
    Lightning refuses to clip for an optimizer that unscales in its own step under any mixed precision, so every
    GPU trial failed at its first step (seen on an H200). Fused AdamW runs on the CPU too: the same training with
    the fused and the foreach kernel, clipping active, ends at the same weights."""
    from lightning_modules.training.lm import HeadroomLM, make_optimizer
    from lightning_modules.training.loop import build_trainer

    tc = train_config_for("xs", steps=6, batch_size=4, seq_len=32, val_every=6, precision="bf16-mixed",
                          grad_clip=0.05)  # small enough that every step clips
    norms = []

    def run(fused: bool):
        dm = HeadroomData(DataConfig(), tc).prepare()

        class LM(HeadroomLM):
            def configure_optimizers(self):
                opt, sched = make_optimizer(self.model, self.train_cfg, fused=fused)
                assert bool(opt.defaults.get("fused")) is fused
                return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

            def on_before_optimizer_step(self, optimizer):
                norms.append(float(torch.nn.utils.get_total_norm([p.grad for p in self.parameters()])))

        lm = LM(model_config_for("xs", vocab_size=dm.vocab_size).model_dump(mode="json"), tc.model_dump(mode="json"))
        build_trainer(tc, None, progress=False).fit(lm, datamodule=dm)
        return torch.cat([p.detach().flatten() for p in lm.model.parameters()])

    fused, foreach = run(True), run(False)
    assert min(norms) > 0.05  # the clip was active at every step
    from tolerance import assert_close_to_scale

    assert_close_to_scale(fused, foreach, rel=1e-4, msg="fused vs foreach AdamW")


def test_every_arm_evaluates_where_it_trained_at_the_declared_precision(xs_decoder_run, xs_decoder_metrics):
    """Lightning's teardown moves a model to the CPU after fit; train_lm evaluates it back on the trainer's root
    device, in fp32 whatever the training precision, and records both. A bf16-mixed run on the CPU: its final
    val loss is the fp32 evaluation of its weights. On the shared trained model (whose logits are large enough for
    bf16 rounding to show; a model of 4 steps predicts nearly uniformly, where it does not) a bf16 evaluation
    differs, and evaluate() gives the fp32 one even inside an autocast region."""
    from lightning_modules.models.build import token_losses
    from lightning_modules.training.lm import EVAL_PRECISION

    assert (xs_decoder_metrics["eval_device"], xs_decoder_metrics["eval_precision"]) == ("cpu", EVAL_PRECISION)
    tc = train_config_for("xs", steps=4, batch_size=4, seq_len=32, val_every=4, eval_batches=2,
                          precision="bf16-mixed")
    res = train_lm(model_config_for("xs"), tc, DataConfig(), progress=False)
    assert (res.metrics["eval_device"], res.metrics["eval_precision"]) == ("cpu", "32-true")
    model = res.lm.model
    assert next(model.parameters()).device.type == "cpu" and next(model.parameters()).dtype == torch.float32
    assert res.metrics["final"]["val"]["loss"] == evaluate(model, res.data.loader("val", 2))["loss"]

    trained = load_model(xs_decoder_run / "model").eval()
    data = HeadroomData(DataConfig(), train_config_for("xs")).prepare()
    fp32 = evaluate(trained, data.loader("val", 2))["loss"]
    with torch.autocast("cpu", dtype=torch.bfloat16):  # evaluate's guard holds inside an autocast region too
        assert evaluate(trained, data.loader("val", 2))["loss"] == fp32

    def by_hand(dtype):  # the loss summed window by window, in fp32 or under bf16 autocast
        total, count = 0.0, 0
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            for batch in data.loader("val", 2):
                s, n = token_losses(trained, batch)
                total, count = total + float(s.double().sum()), count + int(n.sum())
        return total / count

    assert fp32 == pytest.approx(by_hand("fp32"), rel=1e-9)
    bf16 = by_hand("bf16")
    assert abs(bf16 - fp32) > 1e-6 * fp32, "a bf16 evaluation should differ, or this test cannot see the precision"
