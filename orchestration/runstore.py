"""Reading an MLflow store, without Ray: the client and the paged run search the sweep driver (tracking.py) and
the report (report/read.py) both use."""

from __future__ import annotations

import os

# Artifacts travel through the tracking server. MLflow 3.17's client otherwise asks a server that proxies S3 for
# presigned URLs and downloads from the object store itself — an address (http://minio:9000 on Kubernetes) that a
# laptop behind `kubectl port-forward svc/mlflow` cannot reach. headroom's artifacts are small; set the variable
# to true to download directly from an object store you can reach.
PROXY_DOWNLOAD_ENV = "MLFLOW_ENABLE_PROXY_MULTIPART_DOWNLOAD"


def mlflow_client(uri: str):
    """An MlflowClient for `uri` that downloads artifacts through the server (unless the user chose otherwise)."""
    from mlflow.tracking import MlflowClient

    os.environ.setdefault(PROXY_DOWNLOAD_ENV, "false")
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
