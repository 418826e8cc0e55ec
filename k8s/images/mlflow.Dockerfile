# MLflow tracking server with the PostgreSQL and S3 drivers the stock image lacks, and MLflow's `auth` extra:
# `--app-name basic-auth` imports Flask-WTF, which plain `mlflow` does not install. PostgreSQL through psycopg 3:
# SQLAlchemy 2.1 (what MLflow 3.17 brings) maps postgresql:// to it, not to psycopg2 (tests/test_stack.py runs
# this server configuration).
#   docker build -f k8s/images/mlflow.Dockerfile -t ghcr.io/headroom-project/mlflow:3.17.2 k8s/images
FROM python:3.11-slim-bookworm

RUN pip install --no-cache-dir 'mlflow[auth]==3.17.2' 'psycopg[binary]==3.3.9' boto3==1.43.107 \
    && useradd --uid 1000 --user-group --no-create-home --home-dir /tmp mlflow

USER 1000:1000
ENV HOME=/tmp PYTHONDONTWRITEBYTECODE=1
WORKDIR /tmp
ENTRYPOINT ["mlflow"]
CMD ["server", "--host", "0.0.0.0", "--port", "5000"]
