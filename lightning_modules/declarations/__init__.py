"""What the experiment is made of, declared without torch: the model and training configs and the scales
(config), the control arms (arms), the scoring methods (methods), the cost of every arm in FLOPs (costs), the
memory a trial needs (memory), the bounds of every number a user gives (bounds), the metric names training logs
(names) and the prune plan (prune_plan). orchestration's design of a sweep reads these and imports no torch."""
