"""Training: the LightningModule and evaluation (lm), the training loop, its trainer and callbacks (loop), and the
recovery objective by distillation (distill)."""
