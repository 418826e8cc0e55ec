# The headroom image: Ray head, workers and RayJob submitters all run it. One base; the lock decides CPU or GPU:
#   docker build -f k8s/images/headroom.Dockerfile -t ghcr.io/headroom-project/headroom:0.1.0 .
#   docker build -f k8s/images/headroom.Dockerfile --build-arg LOCK=requirements-gpu.lock \
#     -t ghcr.io/headroom-project/headroom:0.1.0-gpu .
# The CPU lock takes torch from PyTorch's CPU index (no CUDA, no triton); the GPU lock takes PyPI's torch, built for
# CUDA 13.0, with the CUDA runtime as pinned wheels: the GPU image needs no CUDA base image, only a node driver
# for CUDA 13.0 (>= 580) and the container toolkit's compute capability (set below).
# The Ray base image brings what KubeRay's probes and commands expect (bash, wget) and the `ray` user (uid 1000).
ARG BASE=rayproject/ray:2.60.0-py311-cpu
FROM ${BASE}
ARG LOCK=requirements-cpu.lock

USER root
WORKDIR /opt/headroom
COPY pyproject.toml README.md ./
COPY lightning_modules ./lightning_modules
COPY orchestration ./orchestration
COPY sweeps ./sweeps
COPY benchmarks ./benchmarks
COPY k8s/images/install.sh k8s/images/requirements-cpu.lock k8s/images/requirements-gpu.lock ./k8s/images/
RUN LOCK=k8s/images/${LOCK} PYTHON=python bash k8s/images/install.sh /opt/headroom && chown -R 1000:100 /opt/headroom

# numeric, so that a pod's runAsNonRoot can verify it
USER 1000:100
ENV HEADROOM_CACHE=/tmp/headroom-cache \
    HOME=/tmp/home \
    RAY_USAGE_STATS_ENABLED=0 \
    PYTHONDONTWRITEBYTECODE=1 \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
