"""What one prune of one model found, as a type: the heads kept, the losses at every stage on every split, the
recovery fine-tune, sizes, FLOPs and latency, the scores and the mask-only curve, the seconds each kind of work
took. It writes itself as metrics.json (`to_json`, the layout that file has always had) and flattens itself into a
run's metric names (`metrics`, through declarations/names.py), so no reader digs in a nested dict by string."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from lightning_modules.declarations import names as M
from lightning_modules.declarations.prune_plan import candidate_rates

# the stages a prune evaluates (`loss`'s keys) and the metric stage each is reported under
STAGES = (("final", M.FINAL), ("pre_ft", M.PRE_FT), ("dense", M.DENSE), ("pruned_no_ft", M.NO_FT))


@dataclass
class PruneResult:
    plan: dict  # the PrunePlan, as JSON
    heads_dense: list[int]
    kept: list[list[int]]  # the dense heads each layer kept, by index
    loss: dict  # stage (STAGES) -> split -> an evaluation: {"loss", "ppl", "tokens"}
    finetune: dict  # the recovery: {"lr": chosen or None, "source", "grid": {rate: val loss}}
    recovery: dict  # the recovery's objective (lm, or distill and its settings)
    params: dict  # {"dense", "pruned"}
    params_nonembedding: dict  # {"dense", "pruned"}
    flops_per_token: dict  # {"dense", "pruned"}: {"attention", "other", "total"}
    eval_device: str
    eval_precision: str
    scores: list  # [layer][head] the method's scores (None where a score is not a number)
    loss_kind: str  # "lm", or "distill-<kind>" where the losses are distillation distances
    timing: dict  # seconds by kind of work (measure.WorkTimer)
    windows: dict  # "pre_ft" | "final" -> split -> per-window losses and tokens
    latency_ms: dict = field(default_factory=dict)  # {"masked", "dense", "pruned"}: median forward ms
    latency_batch: list[int] | None = None
    prune_curve: list = field(default_factory=list)  # mask-only rows: {"ratio", "nominal", split: loss}
    random_baseline: dict = field(default_factory=dict)  # split -> {"loss", "draws"} (a random prune's draws)
    stability: dict | None = None  # the ranking's split-half agreement (informed methods)
    prune_step: int | None = None  # pruned during training: the dense step it started from
    continued_steps: int | None = None  # and the steps it trained on to T

    @property
    def heads_kept(self) -> list[int]:
        return [len(k) for k in self.kept]

    @property
    def recovery_steps(self) -> int:
        """The steps trained at the pruned size in recovery: F for every rate tried (the grid, and any tried past an
        edge of it: more than Scratch-B was charged, which counts the grid)."""
        steps = self.plan["finetune_steps"]
        rates = len(candidate_rates(self.plan.get("finetune_lr"), self.plan.get("finetune_lr_grid") or ()))
        return steps * max(len(self.finetune["grid"]), rates) if steps else 0

    def to_json(self) -> dict:
        """metrics.json's layout: every field, `heads_kept` beside `kept`; the early-pruning fields only when set."""
        out = asdict(self)
        out["heads_kept"] = self.heads_kept
        for k in ("prune_step", "continued_steps"):
            if out[k] is None:
                del out[k]
        return out

    def metrics(self, eval_sets: list[str], scoring_flops: float | None = None) -> dict:
        """The flat metrics the prune's MLflow run records (params and FLOPs of both models, losses per stage and
        split, the random baseline's draws, the recovery fine-tune and its steps, latency, the prune curve).
        `scoring_flops`: what the method spent scoring the heads (Scratch-B's budget counts it)."""
        flat = {"params": self.params["pruned"], "params_dense": self.params["dense"],
                "params_dense_nonembedding": self.params_nonembedding["dense"],
                "flops_per_token": self.flops_per_token["pruned"]["total"],
                "flops_per_token_dense": self.flops_per_token["dense"]["total"]}
        for stage, key in STAGES:
            for split, v in self.loss[stage].items():
                flat[M.loss(key, split)] = v["loss"]
                if key in (M.FINAL, M.PRE_FT):
                    flat[M.tokens(key, split)] = v["tokens"]
                if key == M.FINAL:
                    flat[M.ppl(key, split)] = v["ppl"]
        if self.prune_step is not None:
            flat["prune_step"] = self.prune_step
        for split, v in self.random_baseline.items():
            flat[M.loss(M.RANDOM, split)] = v["loss"]
            for k, x in enumerate(v["draws"]):
                flat[M.random_draw(split, k)] = x
        flat[M.cost("recovery_steps")] = self.recovery_steps  # what Scratch-B's budget is checked against
        if scoring_flops is not None:
            flat[M.cost("scoring_flops")] = scoring_flops
        if self.finetune["lr"] is not None:  # the recovery's rate (chosen on val from the grid, or the sweep's)
            flat[M.FINETUNE_LR] = self.finetune["lr"]
            for lr, v in self.finetune["grid"].items():
                flat[M.finetune_val_loss(lr)] = v
        for kind, v in (self.stability or {}).items():
            if kind in ("spearman", "spearman_layer_min") and v is not None:
                flat[M.stability(kind)] = v
            elif kind in ("overlap", "chance"):
                flat.update({M.stability(kind, float(r)): x for r, x in v.items()})
        for kind, ms in self.latency_ms.items():
            flat[f"latency_ms/{kind}"] = ms
        for row in self.prune_curve:  # one metric per (eval set, ratio): MLflow's chart view
            for split in eval_sets or ["val"]:
                flat[M.curve(split, row["ratio"])] = row[split]
        return flat
