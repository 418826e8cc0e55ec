"""Create the MLflow user that sweeps log as, or reset its password to the Secret's value; run by the mlflow-users
Job with the admin's login (MLFLOW_TRACKING_USERNAME/PASSWORD). The user is not an admin: it creates the
experiments it logs to (which makes it their manager) and reads every other one (default permission READ). Exits
non-zero while the server is not up yet; the Job retries."""

import os

from mlflow.exceptions import RestException
from mlflow.server import get_app_client

uri = os.environ["MLFLOW_TRACKING_URI"]
name, secret = os.environ["SWEEP_USERNAME"], os.environ["SWEEP_PASSWORD"]
if name == os.environ["MLFLOW_TRACKING_USERNAME"]:
    raise SystemExit("the sweep user must not be the admin: give mlflow-sweep-credentials its own username")
auth = get_app_client("basic-auth", tracking_uri=uri)
try:
    auth.create_user(name, secret)
    print(f"created MLflow user {name}")
except RestException as e:
    if e.error_code != "RESOURCE_ALREADY_EXISTS":
        raise
    auth.update_user_password(name, secret)
    print(f"MLflow user {name} exists; password set from the Secret")
auth.update_user_admin(name, False)
