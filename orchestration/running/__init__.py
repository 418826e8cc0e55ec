"""Running a sweep: the stages, Ray Tune trainables and callbacks, data-parallel workers, devices, MLflow tracking
and the model registry, where runs and checkpoints live, artifacts, metric names and the driver's summary."""
