"""Paths a user names on the command line, checked before any work and written without leftovers: an output
path that cannot be written is refused in one line (HeadroomInputError) before the work, and the directories a
command creates on the way to its output are removed again when the command fails."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from lightning_modules.declarations.config import HeadroomInputError

_SYSTEM_TREES = (Path("/proc"), Path("/sys"), Path("/dev"))  # kernel views: nothing of a run is written there


def user_path(path: str, flag: str) -> Path:
    """`path` as the user means it (`~` expanded), or one line saying why it is no path: empty, holding a NUL
    byte, naming a user that does not exist, or longer than the system allows."""
    text = str(path)
    if not text.strip():
        raise HeadroomInputError(f"{flag}: an empty path")
    if "\0" in text:
        raise HeadroomInputError(f"{flag} {text!r}: a path cannot hold a NUL byte")
    try:
        p = Path(text).expanduser()
    except RuntimeError:  # `~nosuchuser/...`
        raise HeadroomInputError(f"{flag} {text}: {text.split('/', 1)[0]} names no user of this machine") from None
    if len(os.fsencode(str(p))) >= os.pathconf("/", "PC_PATH_MAX") or any(
            len(os.fsencode(part)) > os.pathconf("/", "PC_NAME_MAX") for part in p.parts):
        raise HeadroomInputError(f"{flag} {text[:60]}...: longer than this system's paths can be")
    return p


def _probe(p: Path, flag: str, shown: str) -> tuple[bool, bool]:
    """(exists, is a directory) of `p`, or one line when the system will not say (no permission to look)."""
    try:
        st = p.stat()
    except FileNotFoundError:
        return False, False
    except OSError as e:
        if e.errno in (errno.ENOTDIR, errno.ELOOP):
            return False, False
        raise HeadroomInputError(f"{flag} {shown}: cannot look at {p} ({e.strerror or e.__class__.__name__})") from None
    return True, stat.S_ISDIR(st.st_mode)


def check_writable(path: str, flag: str = "--out", kind: str = "directory") -> Path:
    """An output path checked before any work: a path at all (`user_path`), not inside /proc, /sys or /dev, no
    file where a directory is expected on its way, and its nearest existing directory writable — so a command that
    cannot write its result refuses in one line (HeadroomInputError) instead of failing after the work. `kind`:
    what is written at `path` (a "directory" or a "file"). Returns the path, expanded."""
    p = user_path(path, flag)
    full = Path(os.path.abspath(p))
    try:
        real = full.resolve()
    except (OSError, RuntimeError) as e:
        raise HeadroomInputError(f"{flag} {path}: cannot resolve it ({e.__class__.__name__})") from None
    tree = next((t for t in _SYSTEM_TREES if t == real or t in real.parents), None)
    if tree is not None:
        raise HeadroomInputError(f"{flag} {path}: inside {tree}, where no {kind} of a run is written")
    exists, is_dir = _probe(full, flag, path)
    if exists and (kind == "directory") != is_dir:
        raise HeadroomInputError(f"{flag} {path}: exists and is not a {kind}")
    base = full if exists and kind == "directory" else full.parent
    while not _probe(base, flag, path)[0]:
        base = base.parent
    if not _probe(base, flag, path)[1]:
        raise HeadroomInputError(f"{flag} {path}: {base} is a file, where a directory is expected")
    if not os.access(base, os.W_OK | os.X_OK):
        raise HeadroomInputError(f"{flag} {path}: {base} is not writable")
    return p


@contextlib.contextmanager
def made_parents(directory: Path):
    """Create `directory` and its missing parents; if the block raises, remove every directory this created
    (those it holds then are the failed command's own leftovers, already cleaned by it, or nothing)."""
    full = Path(os.path.abspath(directory))
    created = []
    d = full
    while not d.exists():
        created.append(d)
        d = d.parent
    full.mkdir(parents=True, exist_ok=True)
    try:
        yield full
    except BaseException:
        for d in created:  # innermost first; a directory someone else filled meanwhile stays
            with contextlib.suppress(OSError):
                d.rmdir()
        raise
