"""Pruning a trained model: head scores (scoring, scoring_llm), which heads stay (choose), what a prune measures
(measure), FLAP's bias compensation (compensate), the recovery fine-tune (recover), the whole prune of one model
(run) and what it found (result), the ranking's split-half stability (stability), pruning during training (early),
and the mechanism probes a dense run takes of itself: importance over training and head redundancy (probes)."""
