# The headroom image: Ray head, workers and RayJob submitters all run it.
#   docker build -f k8s/images/headroom.Dockerfile -t ghcr.io/headroom-project/headroom:0.1.0 .
#   docker build -f k8s/images/headroom.Dockerfile --build-arg BASE=rayproject/ray:2.60.0-py311-cu128 \
#     -t ghcr.io/headroom-project/headroom:0.1.0-gpu .
# The Ray base image brings what KubeRay's probes and commands expect (bash, wget) and the `ray` user (uid 1000).
ARG BASE=rayproject/ray:2.60.0-py311-cpu
FROM ${BASE}

USER root
WORKDIR /opt/headroom
COPY pyproject.toml README.md ./
COPY lightning_modules ./lightning_modules
COPY orchestration ./orchestration
COPY sweeps ./sweeps
COPY benchmarks ./benchmarks
COPY k8s/images/install.sh k8s/images/requirements.lock ./k8s/images/
RUN PYTHON=python bash k8s/images/install.sh /opt/headroom && chown -R 1000:100 /opt/headroom

# numeric, so that a pod's runAsNonRoot can verify it
USER 1000:100
ENV HEADROOM_CACHE=/tmp/headroom-cache \
    HOME=/tmp/home \
    RAY_USAGE_STATS_ENABLED=0 \
    PYTHONDONTWRITEBYTECODE=1
