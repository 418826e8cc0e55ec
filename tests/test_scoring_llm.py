"""The scores of structured LLM pruning (activation, flap, wanda_sp, taylor) against hand computations on tiny
models of every family headroom prunes — headroom's decoder (Llama), a GPT-2 and a BERT built from their
transformers configs — and a planted dead head. The references read the output projection's input with a hook of
their own, reach every weight by its attribute path (not through families.py) and apply each paper's formula
with plain loops."""

from __future__ import annotations

import pytest
import torch

METHODS = ("activation", "flap", "wanda_sp", "taylor")


def _llama():
    from lightning_modules.declarations.config import model_config_for
    from lightning_modules.models.build import build_model

    m = build_model(model_config_for("xs", n_heads=4), seed=0)
    d = lambda l: m.model.layers[l].self_attn  # noqa: E731
    return m, [{"out": d(l).o_proj, "w": d(l).o_proj.weight, "hd": d(l).head_dim,
                "q": (d(l).q_proj.weight, 0), "k": (d(l).k_proj.weight, 0), "v": (d(l).v_proj.weight, 0),
                "o_cols": d(l).o_proj.weight} for l in range(len(m.model.layers))]


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    m = _with_biases(GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=260, n_positions=64)))
    out = []
    for blk in m.transformer.h:
        a = blk.attn
        c = a.c_attn.weight.t()  # [3·C, D]: q | k | v rows
        out.append({"out": a.c_proj, "w": a.c_proj.weight.t(), "hd": 8, "q": (a.c_attn.weight, "gpt2", 0),
                    "k": (a.c_attn.weight, "gpt2", 1), "v": (a.c_attn.weight, "gpt2", 2), "rows": c})
    return m, out


def _bert():
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                     vocab_size=260, max_position_embeddings=64)
    m = _with_biases(BertForMaskedLM(cfg))
    return m, [{"out": lay.attention.output.dense, "w": lay.attention.output.dense.weight, "hd": 8,
                "q": (lay.attention.self.query.weight, 0), "k": (lay.attention.self.key.weight, 0),
                "v": (lay.attention.self.value.weight, 0)} for lay in m.bert.encoder.layer]


def _with_biases(m):
    """Biases drawn away from their zero initialisation, so that the biases' share of a score is seen."""
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return m.eval()


FAMILIES = {"llama": _llama, "gpt2": _gpt2, "bert": _bert}


def _batches(n=3, b=2, t=16):
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        x = torch.randint(0, 260, (b, t), generator=g)
        out.append({"input_ids": x, "labels": x.clone()})
    return out


def _captured(model, layers, batches):
    """Every layer's output-projection input per batch, [B, T, C], by a hook of the test's own."""
    from lightning_modules.models.build import token_losses

    got = [[] for _ in layers]
    hooks = [lay["out"].register_forward_pre_hook(lambda mod, args, l=l: got[l].append(args[0].detach().double()))
             for l, lay in enumerate(layers)]
    with torch.no_grad():
        for b in batches:
            token_losses(model, b)
    for h in hooks:
        h.remove()
    return got


def _reference(method, model, layers, batches) -> torch.Tensor:
    from lightning_modules.models.build import token_losses

    xs = _captured(model, layers, batches)
    scores = []
    for l, lay in enumerate(layers):
        W, hd = lay["w"].detach().double(), lay["hd"]
        C = W.shape[1]
        H = C // hd
        tokens = torch.cat([x.reshape(-1, C) for x in xs[l]])  # [N, C]
        row = []
        for h in range(H):
            cs = range(h * hd, (h + 1) * hd)
            if method == "activation":
                s = [sum(float(x[i, :, c].abs().mean()) ** 2 for x in xs[l] for i in range(x.shape[0])) ** 0.5
                     for c in cs]
                row.append(sum(v * v for v in s) ** 0.5)
            elif method == "flap":
                row.append(sum(float(tokens[:, c].var()) * float(W[:, c].pow(2).sum()) for c in cs) / hd)
            elif method == "wanda_sp":
                n = tokens.shape[0]
                row.append(sum(float(W[:, c].abs().mean()) * float(tokens[:, c].pow(2).sum() / n) ** 0.5 for c in cs))
            else:
                row.append(None)
        scores.append(row)
    if method == "taylor":
        model.zero_grad()
        params = dict(model.named_parameters())
        for b in batches:
            s, k = token_losses(model, b)
            (s.sum() / k.sum()).backward()
        for l, lay in enumerate(layers):
            hd = lay["hd"]
            for h in range(len(scores[l])):
                r = slice(h * hd, (h + 1) * hd)
                total = 0.0
                for key in ("q", "k", "v"):
                    w = lay[key][0]
                    if len(lay[key]) == 3:  # GPT-2's Conv1D c_attn [D, 3·C]: the head's columns of q | k | v
                        C = w.shape[1] // 3
                        cols = slice(lay[key][2] * C + h * hd, lay[key][2] * C + (h + 1) * hd)
                        total += float((w[:, cols] * w.grad[:, cols]).abs().sum())
                        bias = [p for n_, p in params.items() if p is not w and n_.endswith("c_attn.bias")
                                and p.shape[0] == w.shape[1] and _same_block(n_, w, params)][0]
                        total += float((bias[cols] * bias.grad[cols]).abs().sum())
                    else:
                        total += float((w[r] * w.grad[r]).abs().sum())
                        bias = _bias_of(w, params)
                        if bias is not None:
                            total += float((bias[r] * bias.grad[r]).abs().sum())
                o = lay["out"].weight
                oc = o[r] if len(lay["q"]) == 3 else o[:, r]  # Conv1D c_proj [C, D]: the head's rows
                og = o.grad[r] if len(lay["q"]) == 3 else o.grad[:, r]
                total += float((oc * og).abs().sum())
                scores[l][h] = total
        model.zero_grad()
    return torch.tensor(scores, dtype=torch.float64)


def _bias_of(w, params):
    name = next(n for n, p in params.items() if p is w)
    return params.get(name[: -len("weight")] + "bias")


def _same_block(name, w, params):
    wname = next(n for n, p in params.items() if p is w)
    return name[: -len("bias")] == wname[: -len("weight")]


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("method", METHODS)
def test_scores_equal_the_hand_computed_formula(family, method):
    from lightning_modules.pruning.scoring import score_heads

    model, layers = FAMILIES[family]()
    batches = _batches()
    want = _reference(method, model, layers, batches)
    got = score_heads(model, batches, method).double()
    assert got.shape == want.shape
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-9), (family, method, got, want)
    assert all(p.grad is None for p in model.parameters())  # the scorer leaves no gradient behind


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("method", METHODS)
def test_a_dead_head_scores_lowest(family, method):
    """Head 2 of layer 0 with its value weights zeroed outputs nothing: every score of it is 0, the layer's lowest."""
    from lightning_modules.pruning.scoring import score_heads

    model, layers = FAMILIES[family]()
    lay, hd = layers[0], layers[0]["hd"]
    with torch.no_grad():
        w = lay["v"][0]
        if len(lay["v"]) == 3:
            C = w.shape[1] // 3
            w[:, 2 * C + 2 * hd: 2 * C + 3 * hd] = 0
            model.transformer.h[0].attn.c_attn.bias[2 * C + 2 * hd: 2 * C + 3 * hd] = 0
        else:
            w[2 * hd: 3 * hd] = 0
            b = _bias_of(w, dict(model.named_parameters()))
            if b is not None:
                b[2 * hd: 3 * hd] = 0
    s = score_heads(model, _batches(), method)
    assert s[0, 2].abs() < 1e-6 * s[0].abs().max() and int(s[0].argmin()) == 2, (family, method, s[0])


def test_a_masked_head_reads_zero_and_the_declared_passes_match_torchs_flop_count():
    """With `mask` (the iterative schedule) a head already off scores 0 on the forward scores; and the passes each
    method declares (what Scratch-B is charged) are what torch's FLOP counter counts, in forward passes."""
    from torch.utils.flop_counter import FlopCounterMode

    from lightning_modules.declarations.methods import get_method
    from lightning_modules.models.build import token_losses
    from lightning_modules.pruning.scoring import score_heads

    model, layers = _llama()
    batches = _batches(n=1, b=4, t=64)
    mask = torch.ones(2, 4)
    mask[1, 3] = 0
    for m in ("activation", "flap", "wanda_sp"):
        s = score_heads(model, batches, m, mask=mask)
        assert s[1, 3] == 0 and (s[1, :3] > 0).all(), m

    def count(f):
        with FlopCounterMode(display=False) as fc:
            f()
        return fc.get_total_flops()

    with torch.no_grad():
        fwd = count(lambda: token_losses(model, batches[0]))
    for m in METHODS:
        measured = count(lambda: score_heads(model, batches, m)) / fwd
        declared = get_method(m).passes(8, 256, 256, {})
        assert measured == pytest.approx(declared, rel=0.06), (m, measured, declared)


def test_flap_ranks_globally_on_per_layer_z_scores_and_the_others_on_their_scores():
    """FLAP prunes globally on scores standardised within each layer: a layer whose raw scores are 100× larger
    keeps no more heads for it. By hand: layer 0 [1, 2, 3, 4]·100, layer 1 [1, 2, 3, 4] have equal z-scores
    (−1.342, −0.447, 0.447, 1.342), so removing half globally takes the two lowest of each layer; on the raw scores
    (any other method) it takes three heads of layer 1 (one must stay) and the lowest of layer 0."""
    from lightning_modules.pruning.choose import heads_to_keep
    from lightning_modules.pruning.scoring import ranked

    raw = torch.tensor([[100.0, 200.0, 300.0, 400.0], [1.0, 2.0, 3.0, 4.0]])
    z = ranked(raw, "flap", "global")
    by_hand = torch.tensor([-3, -1, 1, 3], dtype=torch.float64) / 5**0.5
    assert torch.allclose(z.double(), by_hand.repeat(2, 1), atol=1e-6)
    assert torch.equal(ranked(raw, "flap", "per_layer"), raw) and torch.equal(ranked(raw, "gradient", "global"), raw)
    assert [sorted(k) for k in heads_to_keep(z, [4, 4], 0.5, "global")] == [[2, 3], [2, 3]]
    assert [sorted(k) for k in heads_to_keep(raw, [4, 4], 0.5, "global")] == [[1, 2, 3], [3]]


def test_the_methods_sweep_plans_every_scorer_and_charges_its_scoring(capsys):
    """`--plan` of sweeps/methods.yaml: a prune row per method, ratio, scope and seed, and each method's estimate
    exceeds random's (which reads no data) by its declared passes × the calibration tokens × the dense model's
    forward FLOPs per token, by hand — twice for a method that reads data (the split-half stability scores each
    half once more), and flap's one more pass: its recipe's bias compensation reads the mean head outputs."""
    import json

    from conftest import ROOT

    from lightning_modules.declarations.methods import get_method
    from orchestration.cli import main

    assert main(["sweep", str(ROOT / "sweeps" / "methods.yaml"), "--plan", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    dense = next(r for r in rows if r["arm"] == "dense")
    prunes = [r for r in rows if r["stage"] == "prune"]
    methods = sorted({r["method"] for r in prunes})
    assert {"activation", "flap", "wanda_sp", "taylor", "gradient", "random"} <= set(methods)
    assert len(prunes) == len(methods) * 3 * 2 * 3  # ratios × scopes × seeds
    calib_tokens = 16 * 16 * 128  # calibration_batches × batch × seq_len
    for m in methods:
        for scope in ("per_layer", "global"):
            row = lambda meth: next(r for r in prunes if (r["method"], r["scope"], r["ratio"], r["seed"]) == (
                meth, scope, 0.5, 0))  # noqa: E731
            passes = get_method(m).passes(sum(dense["heads"]), 16 * 128, calib_tokens, get_method(m).options)
            # the split-half stability scores the halves once more (methods that read data); flap's recipe
            # compensates the bias (one more forward pass)
            passes = passes * (2 if get_method(m).needs_calibration else 1) + (1 if m == "flap" else 0)
            assert row(m)["est_flops"] - row("random")["est_flops"] == pytest.approx(
                passes * calib_tokens * dense["flops_per_token"], rel=1e-6, abs=2), (m, scope)
