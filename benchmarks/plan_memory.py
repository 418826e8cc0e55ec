"""The plan's memory estimate (lightning_modules.memory) against the peak RSS of a real training step on the CPU.

For each `--configs` entry (family:scale:batch:seq_len:precision:vocab[:teacher's scale]) a fresh process builds
the model and its optimizer as a trial does (models.build_model, lm.make_optimizer; CPU autocast for a mixed
precision) and takes one training step (which allocates AdamW's moments, as every later step of a trial holds
them). It then resets the kernel's peak-RSS mark (/proc/self/clear_refs), takes a second step (forward, loss,
backward, clipping, AdamW step) and reads the peak (VmHWM). The tensors held before that step (fp32 weights and
moments) are added back, so the figure is the peak of the model's tensors, as `torch.cuda.max_memory_allocated`
counts on a GPU. Then the same for one evaluation batch (fp32, no autograd). glibc is told to map every large block
on its own (MALLOC_MMAP_THRESHOLD_), so that freed tensors leave RSS at once. Goal: every measured peak within
[0.7, 1.1] of the estimate (an undercount would pack too many trials onto a GPU; an overcount only wastes some).

    python benchmarks/plan_memory.py [--configs decoder:s:32:256:32-true:8192,...] [--tiny] [--out F]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BAND = (0.7, 1.1)  # measured ÷ estimated: never more than 10% over the plan, at most 30% under it
FULL = ("decoder:s:32:256:32-true:8192,decoder:s:32:256:bf16-mixed:8192,decoder:m:16:256:32-true:260,"
        "decoder:m:16:256:bf16-mixed:260,encoder:s:32:256:32-true:8192,encoder:m:16:256:bf16-mixed:260,"
        "decoder:s:32:256:bf16-mixed:8192:m,decoder:xs:32:256:32-true:2048:s")
TINY = "decoder:s:16:128:32-true:2048,encoder:s:16:128:bf16-mixed:260,decoder:xs:16:128:bf16-mixed:1024:s"

CHILD = r"""
import json, sys, torch
from lightning_modules.config import TrainConfig, model_config_for
from lightning_modules.lm import make_optimizer
from lightning_modules.models import build_model, token_losses

family, scale, batch, seq, precision, vocab, *kd = sys.argv[1].split(":")
batch, seq, vocab = int(batch), int(seq), int(vocab)
mc = model_config_for(scale, family=family, vocab_size=vocab)
model = build_model(mc, seed=0).train()
loss_fn = token_losses
if kd:  # distilled from a teacher of the dense scale `kd[0]`, as a scratch_kd control or a distilled recovery
    from lightning_modules.distill import LogitDistillation
    loss_fn = LogitDistillation(build_model(model_config_for(kd[0], family=family, vocab_size=vocab), seed=1))
opt, _ = make_optimizer(model, TrainConfig(steps=1, precision=precision, batch_size=batch, seq_len=seq), fused=False)
g = torch.Generator().manual_seed(0)
ids = torch.randint(0, 256, (batch, seq), generator=g)
data = {"input_ids": ids, "labels": ids.clone()}
weights = sum(p.numel() * p.element_size() for m in (model, getattr(loss_fn, "teacher", model))
              for p in set(m.parameters())) if kd else sum(p.numel() * p.element_size() for p in model.parameters())

def kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

def window(step):
    open("/proc/self/clear_refs", "w").write("5")  # the peak mark starts again from the current RSS
    before = kb("VmRSS")
    step()
    return kb("VmHWM") - before

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

train_step()  # the first step allocates AdamW's moments after the backward pass; a trial's later steps hold them
moments = sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values() if t.dim())
train = window(train_step) + weights + moments
evaluation = window(eval_step) + weights + moments
print(json.dumps({"train": train, "evaluation": evaluation}))
"""


def measure(spec: str) -> dict:
    from lightning_modules.config import model_config_for
    from lightning_modules.memory import train_memory

    family, scale, batch, seq, precision, vocab, *kd = spec.split(":")
    # large tensors mapped and unmapped one by one (glibc would otherwise raise its mmap threshold and keep freed
    # blocks on its heap), so that RSS follows the live tensors
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    r = subprocess.run([sys.executable, "-c", CHILD, spec], cwd=ROOT, capture_output=True, text=True, timeout=900,
                       env=env)
    if r.returncode:
        raise SystemExit(f"plan_memory: {spec} failed: {r.stderr.strip().splitlines()[-1]}")
    got = json.loads(r.stdout.strip().splitlines()[-1])
    teacher = model_config_for(kd[0], family=family, vocab_size=int(vocab)) if kd else None
    est = train_memory(model_config_for(scale, family=family, vocab_size=int(vocab)), int(batch), int(seq),
                       precision, teacher=teacher)
    row = {"config": spec, "params": est.params, "estimate": {
        "static": est.static, "activations": est.activations, "transient": est.transient, "train": est.train,
        "evaluation": est.evaluation}, "measured": got}
    row["ratio_train"] = got["train"] / est.train
    row["ratio_evaluation"] = got["evaluation"] / est.evaluation
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default=FULL)
    ap.add_argument("--tiny", action="store_true", help=f"two small configurations ({TINY})")
    ap.add_argument("--out", default="benchmarks/results/plan_memory.json")
    args = ap.parse_args(argv)
    rows = []
    for spec in (TINY if args.tiny else args.configs).split(","):
        rows.append(measure(spec))
        print(json.dumps(rows[-1]), flush=True)
    ratios = [r[k] for r in rows for k in ("ratio_train", "ratio_evaluation")]
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
