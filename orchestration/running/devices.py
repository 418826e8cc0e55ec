"""The GPU a trial is given, and what it does with it.

Ray tells each trial which GPUs it holds (its accelerator ids; Ray also sets CUDA_VISIBLE_DEVICES). A trial given a
GPU that torch cannot use — a CPU build of torch on a GPU node, a node without its driver — fails at once with one
line saying so: it never trains on the CPU while the sweep believes it holds a GPU.

A simulated cluster declares GPUs that do not exist (`headroom sweep FILE --simulate-gpus N`, or `ray start
--num-gpus N` with HEADROOM_SIMULATED_GPUS=1 in the environment of its nodes), so that the packing of fractional
`gpu` trials can be run and tested on a machine without one: its trials train on the CPU and record the GPU they
were given (the MLflow param `gpu_ids`), exactly as the real ones record theirs.
"""

from __future__ import annotations

import os

SIMULATE = "HEADROOM_SIMULATED_GPUS"  # "1": the cluster's GPUs are declared, not real; trials train on the CPU
GPU_PARAM = "gpu_ids"  # the MLflow param: the GPUs Ray gave a trial ("0", "0,1"); absent when it held none


class GPUUnusable(RuntimeError):
    """A trial holds a GPU that torch cannot use."""


def simulated() -> bool:
    return os.environ.get(SIMULATE) == "1"


def claim_gpu() -> dict[str, str]:
    """In a Ray trial or worker: {GPU_PARAM: its GPU ids} when Ray gave it any (empty dict otherwise). On a
    simulated cluster the CUDA devices are hidden so that training runs on the CPU; on a real one, torch must be
    able to use the GPU, else GPUUnusable with one line naming the GPU, the torch build and the way out."""
    import ray

    ids = [str(i) for i in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])]
    if not ids:
        return {}
    if simulated():
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        return {GPU_PARAM: ",".join(ids)}
    import torch

    if not torch.cuda.is_available():
        build = f"torch {torch.__version__}" + (" is a CPU build" if torch.version.cuda is None else
                                                  f" (CUDA {torch.version.cuda}) sees no usable device")
        raise GPUUnusable(f"this trial was given GPU {','.join(ids)} but {build}; install the torch build for the "
                          f"node's CUDA, or on a cluster whose GPUs are only declared set {SIMULATE}=1")
    return {GPU_PARAM: ",".join(ids)}
