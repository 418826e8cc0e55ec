"""WSD vs cosine at the same rate: the converged sweep's xxxs dense seed 0 (cosine, lr 5.19e-3 from its search,
19200 steps: id loss 1.3107) trained again with the wsd schedule, everything else equal."""
import json
import sys
import time

import torch

torch.set_num_threads(1)
from lightning_modules.declarations.config import DataConfig, model_config_for, train_config_for
from lightning_modules.training.loop import train_lm

lr = float(sys.argv[1]); sched = sys.argv[2]; seed = int(sys.argv[3])
model = model_config_for("xxxs", "decoder", n_heads=8)
train = train_config_for("xxxs", steps=19200, lr=lr, seed=seed, batch_size=16, seq_len=128, warmup_steps=100,
                         val_every=500, val_batches=4, eval_batches=32, schedule=sched)
t0 = time.time()
res = train_lm(model, train, DataConfig(), progress=False)
out = {"lr": lr, "schedule": sched, "seed": seed, "steps": 19200, "seconds": time.time() - t0,
       "final": {k: v["loss"] for k, v in res.metrics["final"].items()}}
print(json.dumps(out))
open(f"result_{sched}_{lr:g}_s{seed}.json", "w").write(json.dumps(out) + "\n")
