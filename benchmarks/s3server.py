"""An S3-compatible server on loopback for the tests and the fault campaign: moto's server with IAM enforced (a
key must belong to a user, and the user's policy decides what it may touch, as MinIO's users and policies do),
whose state — buckets, objects, users, keys, policies — is saved when the server is stopped (SIGTERM) and loaded
when it starts, so that a restart keeps what was stored, as MinIO keeps it on its volume.

    python benchmarks/s3server.py --port 9000 --state /path/state.pickle

On a first start (no state file) the first three requests need no signature: they create the root user, its key
and its allow-all policy (benchmarks/stack.py does that); every later request is checked."""

from __future__ import annotations

import argparse
import os
import pickle
import signal
import sys
import threading
from pathlib import Path

BACKENDS = ("s3", "iam", "sts")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--state", type=Path, required=True, help="where the state is saved on stop and loaded on start")
    a = ap.parse_args(argv)
    restored = a.state.exists()
    # read by moto at import: requests answered before authentication is enforced
    os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "0" if restored else "3"
    from moto.backends import get_backend
    from moto.server import ThreadedMotoServer

    if restored:
        with a.state.open("rb") as f:
            saved = pickle.load(f)
        for name in BACKENDS:
            live = get_backend(name)
            live.clear()
            live.update(saved[name])
    server = ThreadedMotoServer(ip_address=a.host, port=a.port, verbose=False)
    server.start()
    print(f"s3server: listening on {a.host}:{a.port} ({'restored' if restored else 'empty'})", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    server.stop()
    tmp = a.state.with_suffix(".tmp")
    with tmp.open("wb") as f:
        pickle.dump({name: get_backend(name) for name in BACKENDS}, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, a.state)  # a whole state or the previous one, never half of one
    print("s3server: state saved", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
