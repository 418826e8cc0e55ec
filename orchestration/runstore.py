"""Reading an MLflow store, without Ray: the paged run search the sweep driver (tracking.py) and the report
(report/read.py) both use."""

from __future__ import annotations


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
