"""Where a sweep runs, resolved once in the driver: its MLflow store, its Ray storage, its reports folder and its
cluster address, every local path of the sweep made absolute (trials run in their own working directories, on any
node), and a pretrained checkpoint's identity."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from lightning_modules.models.checkpoints import checkpoint_info
from orchestration.design.schema import Sweep
from orchestration.design.spec import report_dir, resolve_tracking_uri


@dataclass(frozen=True)
class Where:
    tracking_uri: str
    storage: str  # an absolute path, or a URI Ray Tune supports (s3://, gs://, ...)
    reports: Path
    address: str | None

    @property
    def local_storage(self) -> Path | None:
        return None if "://" in self.storage else Path(self.storage)


def resolve_where(sweep: Sweep, tracking_uri: str | None, storage: str | None, address: str | None) -> Where:
    """Every path is resolved here, in the driver: trials run in their own working directories, on any node."""
    st = storage or sweep.storage or "ray_results"
    if "://" not in st:
        st = str(Path(st).expanduser().resolve())
    return Where(resolve_tracking_uri(tracking_uri or sweep.tracking_uri), st,
                 report_dir(sweep.name).resolve(), address or os.environ.get("RAY_ADDRESS") or None)


def _abs(path: str) -> str:
    return str(Path(path).expanduser().resolve())


def resolve_paths(sweep: Sweep) -> Sweep:
    """The sweep with every local path absolute (data globs, local datasets, tokenizer and checkpoint
    directories): trials run in their own working directories. A pretrained sweep with the default byte
    tokenizer takes the checkpoint's own tokenizer when it has one."""
    data = sweep.data
    kind, _, rest = data.source.partition(":")
    update = {}
    if kind == "path":
        update["source"] = "path:" + _abs(rest)
    elif kind == "hf" and rest.startswith((".", "/", "~")):
        update["source"] = "hf:" + _abs(rest)
    if data.shift and data.shift.startswith("path:"):
        update["shift"] = "path:" + _abs(data.shift[5:])
    if data.tokenizer.startswith("pretrained:"):
        update["tokenizer"] = "pretrained:" + _abs(data.tokenizer[11:])
    top = {}
    if sweep.pretrained is not None:
        info = checkpoint_info(sweep.pretrained.checkpoint)
        top["pretrained"] = sweep.pretrained.model_copy(update={"checkpoint": _abs(sweep.pretrained.checkpoint)})
        if data.tokenizer == "byte" and info.has_tokenizer:
            update["tokenizer"] = "pretrained:" + _abs(info.model_dir)
        if sweep.family is None:
            top["family"] = [info.family]
    return sweep.model_copy(update={**top, "data": data.model_copy(update=update)})


def checkpoint_id(model_dir: str) -> str:
    """A pretrained checkpoint's identity for unit keys: its config and the names and sizes of its files."""
    h = hashlib.sha256(Path(model_dir, "config.json").read_bytes())
    for f in sorted(Path(model_dir).iterdir()):
        if f.is_file():
            h.update(f"{f.name}:{f.stat().st_size}".encode())
    return "pretrained-" + h.hexdigest()[:16]


def stop_on_signals() -> None:
    """Ctrl-C and SIGTERM (`kill PID`, `ray job stop`, a pod stopped) end a sweep's driver as KeyboardInterrupt: its
    parent run is marked KILLED, its running children closed, and `--resume` continues. Installed after Ray starts
    (ray.init puts its own SIGTERM handler in the driver, which ends the process without that bookkeeping), and also
    for a driver a shell started in the background, which inherits SIGINT ignored."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers (a driver run from a thread keeps the process's own)

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
