"""Processes and ports on loopback: a free port, waiting for an HTTP server to answer, stopping a process group, and
one Ray's processes and ports among others'. What benchmarks/stack.py and the browser test start their servers
with."""

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


def ray_processes(temp_dirs: list[str]) -> list:
    """One Ray's processes and no other's on the machine: every process whose command line names one of its nodes'
    temp dirs (GCS, raylets, dashboard, monitors), with everything they started (workers, agents, job drivers).
    `ray stop` has no such filter: it stops every Ray of the user, a sweep running beside the tests included."""
    import psutil

    roots = []
    for p in psutil.process_iter(["cmdline"]):
        if any(d in " ".join(p.info["cmdline"] or []) for d in temp_dirs):
            roots.append(p)
    own = {p.pid: p for p in roots}
    for p in roots:
        try:
            own.update((c.pid, c) for c in p.children(recursive=True))
        except psutil.NoSuchProcess:
            continue
    return list(own.values())


def stop_processes(procs: list, grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL for what is still alive after `grace` seconds."""
    import psutil

    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    kill_processes(psutil.wait_procs(procs, timeout=grace)[1])


def kill_processes(procs: list, timeout: float = 10.0) -> None:
    """SIGKILL each, then wait up to `timeout` seconds for them to go."""
    import psutil

    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=timeout)


def agent_ports() -> list[str]:
    """A node's dashboard agent listens on 52365 unless told otherwise: a second node on the machine (the worker, or
    another Ray, such as a sweep running beside the tests) then has no job agent, and `ray job submit` waits for
    one forever. Each node gets free ports of its own."""
    return ["--dashboard-agent-listen-port", str(free_port()), "--dashboard-agent-grpc-port", str(free_port()),
            "--runtime-env-agent-port", str(free_port()), "--metrics-export-port", str(free_port())]
