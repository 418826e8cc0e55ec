"""Reading an MLflow store, without Ray: the client and the paged run search the sweep driver (tracking.py) and
the report (report/read.py) both use."""

from __future__ import annotations

import os

# Artifacts travel through the tracking server. MLflow 3.17's client otherwise asks a server that proxies S3 for
# presigned URLs and downloads from the object store itself — an address (http://minio:9000 on Kubernetes) that a
# laptop behind `kubectl port-forward svc/mlflow` cannot reach. headroom's artifacts are small; set the variable
# to true to download directly from an object store you can reach.
PROXY_DOWNLOAD_ENV = "MLFLOW_ENABLE_PROXY_MULTIPART_DOWNLOAD"


# While the tracking server restarts, MLflow's client retries with exponential backoff (by default factor 2 and 7
# retries: waits of 2, 4, 8, ... s); factor 1 with one more retry waits as long in all (about 4 minutes) but
# reconnects sooner after a short restart. The user's own settings win.
RETRY_ENV = {"MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "8"}


def mlflow_client(uri: str):
    """An MlflowClient for `uri` that downloads artifacts through the server (unless the user chose otherwise)."""
    from mlflow.tracking import MlflowClient

    os.environ.setdefault(PROXY_DOWNLOAD_ENV, "false")
    for k, v in RETRY_ENV.items():
        os.environ.setdefault(k, v)
    return MlflowClient(tracking_uri=uri)


def search_runs(client, experiment_id: str, filter_string: str, order_by: list[str] | None = None,
                limit: int | None = None) -> list:
    """Every active run of the experiment that matches, page by page (MLflow returns at most 1000 a call);
    `limit` stops after that many."""
    from mlflow.entities import ViewType

    out, token = [], None
    page_size = min(limit, 1000) if limit else 1000
    while True:
        page = client.search_runs([experiment_id], filter_string, ViewType.ACTIVE_ONLY, max_results=page_size,
                                  order_by=order_by, page_token=token)
        out += list(page)
        token = page.token
        if not token or (limit and len(out) >= limit):
            return out[:limit] if limit else out
