"""The plan's memory estimate (lightning_modules.declarations.memory) against the peak RSS of real training and scoring on the
CPU.

For each `--configs` entry (family:scale:batch:seq_len:precision:vocab, then optionally `:kd=SCALE` for a student
distilled from a teacher of that scale, or `:score=METHOD` for a prune trial's scoring) one fresh process, in turn,
builds the model and its optimizer as a trial does (models.build_model, lm.make_optimizer; CPU autocast for a mixed
precision) and takes one training step (which allocates AdamW's moments, as every later step of a trial holds them).
It then resets the kernel's peak-RSS mark (/proc/self/clear_refs), takes a second step (forward, loss, backward,
clipping, AdamW step) and reads the peak (VmHWM). The tensors held before that step (fp32 weights and moments) are
added back, so the figure is the peak of the model's tensors, as `torch.cuda.max_memory_allocated` counts on a GPU.
Then the same for one evaluation batch (fp32, no autograd). A scoring configuration scores the heads once to warm
up, then once measured (ablation at a GPU's 256 rows per pass). glibc is told to map every large block on its own
(MALLOC_MMAP_THRESHOLD_), so that freed tensors leave RSS at once. Goal: every measured peak within [0.7, 1.1] of
the estimate (an undercount would pack too many trials onto a GPU; an overcount only wastes some).

    python benchmarks/plan_memory.py [--configs decoder:s:32:256:32-true:8192,...] [--tiny] [--out F]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from lightning_modules.declarations.methods import GPU_ABLATION_ROWS as ROWS  # ablation's rows a pass on a GPU

ROOT = Path(__file__).resolve().parents[1]
BAND = (0.7, 1.1)  # measured ÷ estimated: never more than 10% over the plan, at most 30% under it
FULL = ("decoder:s:32:256:32-true:8192,decoder:s:32:256:bf16-mixed:8192,decoder:m:16:256:32-true:260,"
        "decoder:m:16:256:bf16-mixed:260,encoder:s:32:256:32-true:8192,encoder:m:16:256:bf16-mixed:260,"
        "decoder:s:32:256:bf16-mixed:8192:kd=m,decoder:xs:32:256:32-true:2048:kd=s,"
        "decoder:s:16:256:32-true:8192:score=gradient,decoder:s:8:128:32-true:8192:score=ablation,"
        "decoder:m:16:256:32-true:260:score=entropy,encoder:s:16:256:32-true:2048:score=confidence")
TINY = ("decoder:s:16:128:32-true:2048,encoder:s:16:128:bf16-mixed:260,decoder:xs:16:128:bf16-mixed:1024:kd=s,"
        "decoder:xs:8:64:32-true:2048:score=ablation,decoder:xs:8:128:32-true:260:score=entropy")

CHILD = r"""
import gc, json, sys, torch
from lightning_modules.declarations.config import TrainConfig, model_config_for
from lightning_modules.training.lm import make_optimizer
from lightning_modules.models.build import build_model, token_losses

def kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

def window(step):
    open("/proc/self/clear_refs", "w").write("5")  # the peak mark starts again from the current RSS
    before = kb("VmRSS")
    step()
    return kb("VmHWM") - before

def measure(spec):
    family, scale, batch, seq, precision, vocab, *extra = spec.split(":")
    batch, seq, vocab = int(batch), int(seq), int(vocab)
    extra = dict(e.split("=") for e in extra)
    mc = model_config_for(scale, family=family, vocab_size=vocab)
    model = build_model(mc, seed=0).train()
    loss_fn = token_losses
    if "kd" in extra:  # distilled from a teacher of that dense scale, as a scratch_kd control or distilled recovery
        from lightning_modules.training.distill import LogitDistillation
        loss_fn = LogitDistillation(build_model(model_config_for(extra["kd"], family=family, vocab_size=vocab), seed=1))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (batch, seq), generator=g)
    data = {"input_ids": ids, "labels": ids.clone()}
    weights = sum(p.numel() * p.element_size() for m in {model, getattr(loss_fn, "teacher", model)}
                  for p in set(m.parameters()))
    if "score" in extra:  # a prune trial's scoring, the dense model's weights held (ablation at a GPU's rows)
        from lightning_modules.pruning.scoring import score_heads
        opts = {"max_rows": ROWS} if extra["score"] == "ablation" else {}
        score_heads(model, [data], extra["score"], **opts)  # warm-up: the gate and kernels set up once
        return {"scoring": window(lambda: score_heads(model, [data], extra["score"], **opts)) + weights}
    opt, _ = make_optimizer(model, TrainConfig(steps=1, precision=precision, batch_size=batch, seq_len=seq),
                            fused=False)

    def train_step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision != "32-true"):
            s, n = loss_fn(model, data)
            loss = s.sum() / n.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def eval_step():
        with torch.no_grad():
            token_losses(model, data)

    train_step()  # the first step allocates AdamW's moments after the backward pass; later steps hold them
    moments = sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values() if t.dim())
    return {"train": window(train_step) + weights + moments, "evaluation": window(eval_step) + weights + moments}

for spec in sys.argv[1:]:
    print(json.dumps(measure(spec)), flush=True)
    gc.collect()  # the last configuration's tensors go (their blocks unmapped) before the next is measured
""".replace("ROWS", str(ROWS))


def estimate(spec: str) -> dict:
    """The plan's figures for a configuration: {"train", "evaluation", ...} or, for a scoring one, {"scoring"}."""
    from lightning_modules.declarations.config import model_config_for
    from lightning_modules.declarations.memory import train_memory
    from lightning_modules.declarations.methods import get_method

    family, scale, batch, seq, precision, vocab, *extra = spec.split(":")
    extra = dict(e.split("=") for e in extra)
    mc = model_config_for(scale, family=family, vocab_size=int(vocab))
    if "score" in extra:
        return {"scoring": get_method(extra["score"]).memory(mc, int(batch), int(seq), True)}
    teacher = model_config_for(extra["kd"], family=family, vocab_size=int(vocab)) if "kd" in extra else None
    est = train_memory(mc, int(batch), int(seq), precision, teacher=teacher)
    return {"params": est.params, "static": est.static, "activations": est.activations,
            "transient": est.transient, "train": est.train, "evaluation": est.evaluation}


def measure(specs: list[str]) -> list[dict]:
    """Every configuration, one after another in one fresh process (each measured from the RSS it starts at)."""
    # large tensors mapped and unmapped one by one (glibc would otherwise raise its mmap threshold and keep freed
    # blocks on its heap), so that RSS follows the live tensors
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    r = subprocess.run([sys.executable, "-c", CHILD, *specs], cwd=ROOT, capture_output=True, text=True, timeout=1800,
                       env=env)
    if r.returncode:
        raise SystemExit(f"plan_memory: failed: {r.stderr.strip().splitlines()[-1]}")
    rows = []
    for spec, line in zip(specs, r.stdout.strip().splitlines()[-len(specs):], strict=True):
        got, est = json.loads(line), estimate(spec)
        rows.append({"config": spec, "estimate": est, "measured": got, "ratios": {k: got[k] / est[k] for k in got}})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default=FULL)
    ap.add_argument("--tiny", action="store_true", help=f"five small configurations ({TINY})")
    ap.add_argument("--out", default="benchmarks/results/plan_memory.json")
    args = ap.parse_args(argv)
    rows = measure((TINY if args.tiny else args.configs).split(","))
    for row in rows:
        print(json.dumps(row), flush=True)
    ratios = [x for r in rows for x in r["ratios"].values()]
    out = {"benchmark": "plan_memory", "size": "tiny" if args.tiny else "full", "device": "cpu",
           "goal": f"measured peak ÷ estimate within [{BAND[0]}, {BAND[1]}]", "band": list(BAND), "rows": rows,
           "min_ratio": min(ratios), "max_ratio": max(ratios),
           "meets_goal": all(BAND[0] <= x <= BAND[1] for x in ratios)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"plan_memory: measured ÷ estimate {out['min_ratio']:.3f} .. {out['max_ratio']:.3f}; "
          f"goal {'met' if out['meets_goal'] else 'not met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
