"""The models: built from a config, saved and loaded (build), the families headroom knows and how each holds its
heads (families), the head gate and physical head removal (heads), checkpoints a run keeps (checkpoints), and a
pruned model exported to load without headroom (export, with hf_remote: the modeling file it carries)."""
