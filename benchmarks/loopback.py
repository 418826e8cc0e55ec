"""Processes and ports on loopback: a free port, waiting for an HTTP server to answer, and stopping a process
group. What benchmarks/stack.py and the browser test start their servers with."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 60.0, proc: subprocess.Popen | None = None, log: Path | None = None,
              headers: dict | None = None) -> None:
    """Until `url` answers at all (an HTTP error is an answer); fails early if `proc` exits."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: the server exited with {proc.returncode}:\n"
                               + (log.read_text()[-4000:] if log else ""))
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=3):
                return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer in {timeout} s:\n" + (log.read_text()[-4000:] if log else ""))


def stop_group(proc: subprocess.Popen | None, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
    """Signal a process started in its own session, and everything it started; SIGKILL if it lingers."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout)
    except ProcessLookupError:
        pass
