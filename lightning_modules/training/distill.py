"""Recovery by distillation: the objective that fine-tunes a pruned model (and trains the `scratch_kd` control)
towards a frozen dense teacher's next-token distribution instead of the data's next token alone.

Per predicted token, with student logits s, teacher logits t and temperature τ:

    loss = lm_weight · CE(s, next token) + (1 − lm_weight) · τ² · KL(softmax(t/τ) ‖ softmax(s/τ))

the forward KL of Hinton et al. 2015 (the τ² keeps the gradient's scale as τ changes). The defaults — τ = 1 and
no language-model term — are Minitron's (Muralidharan et al. 2024, "Compact Language Models via Pruning and
Knowledge Distillation", §4: logit-only distillation with forward KL at τ = 1 recovered pruned models best, and
adding the LM loss did not help). Evaluation is never distilled: every arm is scored by its own LM loss.

The teacher's forward pass is compute the pruned arm spends: it counts one third of a dense training step's FLOPs
per token (lightning_modules/declarations/costs.py `teacher_flops_per_token`), so Scratch-B's and scratch_kd's budgets include it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from lightning_modules.declarations.prune_plan import DistillSpec, RecoveryKind  # noqa: F401 - the objective's settings live with the plan


class LogitDistillation:
    """A loss function in headroom's form, `(model, batch) -> (summed loss [B], predicted tokens [B])`, over the
    tokens the LM loss predicts (labels ≠ -100, shifted for a causal model). The teacher (frozen here) runs without
    gradients, in eval mode, on the batch's device."""

    def __init__(self, teacher: torch.nn.Module, spec: DistillSpec | None = None):
        self.teacher = teacher.eval()
        for p in self.teacher.parameters():
            p.requires_grad_(False)
        self.spec = spec or DistillSpec()

    def __call__(self, model, batch) -> tuple[torch.Tensor, torch.Tensor]:
        from lightning_modules.models.build import is_causal

        dev = batch["input_ids"].device
        if next(self.teacher.parameters()).device != dev:
            self.teacher.to(dev)
        ids, att = batch["input_ids"], batch.get("attention_mask")
        with torch.no_grad():
            t_logits = self.teacher(input_ids=ids, attention_mask=att).logits
        s_logits = model(input_ids=ids, attention_mask=att).logits
        labels = batch["labels"]
        if is_causal(model):
            s_logits, t_logits, labels = s_logits[:, :-1], t_logits[:, :-1], labels[:, 1:]
        mask = labels != -100
        tau, w = self.spec.temperature, self.spec.lm_weight
        s32, t32 = s_logits.float(), t_logits.float()
        log_p_s = F.log_softmax(s32 / tau, dim=-1)
        log_p_t = F.log_softmax(t32 / tau, dim=-1)
        kl = (log_p_t.exp() * (log_p_t - log_p_s)).sum(-1)  # [B, T]
        per_token = (1 - w) * tau * tau * kl
        if w > 0:
            b, t, v = s32.shape
            ce = F.cross_entropy(s32.reshape(-1, v), labels.reshape(-1), ignore_index=-100, reduction="none")
            per_token = per_token + w * ce.view(b, t)
        per_token = torch.where(mask, per_token, 0.0)  # a NaN or inf at a padded position cannot spread
        return per_token.sum(1), mask.sum(1)


def recovery_loss(kind: str, teacher: torch.nn.Module | None, spec: DistillSpec | None):
    """The training objective of a recovery fine-tune: None (the model's own LM loss) or a LogitDistillation."""
    if kind == "lm":
        return None
    if teacher is None:
        raise ValueError("recovery by distillation needs the dense teacher")
    return LogitDistillation(teacher, spec)


def recovery_record(kind: str, spec: DistillSpec | None) -> dict:
    """What a prune's metrics record of its recovery objective."""
    out = {"kind": kind}
    if kind == "distill":
        out.update((spec or DistillSpec()).model_dump())
    return out
