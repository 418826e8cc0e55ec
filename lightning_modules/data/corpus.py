"""Text sources, deduplicated documents and deterministic splits (tokens.py turns them into token streams). No
torch here: the CLI resolves and checks data first.

Splits (every source): `train`, `val` (model selection, early choices such as "best method"), `calibration` (the
data that scores heads — never the data that evaluates them), and the eval sets `id` (in distribution) and, where
the source has one, `shift` (a shifted distribution, to tell a real effect from a benchmark artifact).

Documents go to splits by a hash of their name, not by the seed: every seed, arm and scale sees the same splits,
so runs are comparable, and the corpus hash (content + split rule) says so.
"""

from __future__ import annotations

import glob
import os
import sys
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lightning_modules.data.arrowdocs import ArrowDocs
from lightning_modules.data.splits import (  # noqa: F401 - the split rule's names, where callers have always found them
    MIN_UNITS,
    _split_by_codes,
    _split_units,
    _unit_fraction,
    dedupe,
    drop_train_duplicates,
    normalised_hash,
    split_codes,
)
from lightning_modules.data.splits import _hash as corpus_hash_of
from lightning_modules.declarations.config import DataConfig, HeadroomInputError

EVAL_SETS = ("id", "shift")

# stdlib: directories some installs strip (tests, IDLE) are excluded everywhere so every install agrees;
# whole packages held out of training form the shifted eval set (email handling and XML: other vocabulary,
# other idioms than the rest of the library).
STDLIB_EXCLUDE_DIRS = {"test", "tests", "idlelib", "site-packages", "dist-packages", "__pycache__"}
STDLIB_SHIFT_PACKAGES = ("email", "xml")


@dataclass
class Corpus:
    source: str
    splits: dict[str, Sequence[str]]  # split name -> documents (a list, or ArrowDocs read from a dataset's table)
    corpus_hash: str
    shift_note: str | None = None  # what the shifted set is; None when there is none
    meta: dict = field(default_factory=dict)

    @property
    def eval_sets(self) -> list[str]:
        return [s for s in EVAL_SETS if self.splits.get(s)]

    def n_chars(self, split: str) -> int:
        docs = self.splits.get(split, ())
        return docs.n_chars() if isinstance(docs, ArrowDocs) else sum(len(d) for d in docs)


# ------------------------------------------------------------------------------------------------ stdlib


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files() -> list[tuple[str, Path]]:
    """(relative path, path) of the standard library's .py files, without tests and IDLE, sorted."""
    root = stdlib_root()
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in STDLIB_EXCLUDE_DIRS)
        for f in sorted(filenames):
            if f.endswith(".py"):
                p = Path(dirpath) / f
                out.append((p.relative_to(root).as_posix(), p))
    return out


def _read(p: Path) -> str:
    return p.read_text(encoding="utf-8", errors="replace")


def load_stdlib(cfg: DataConfig) -> Corpus:
    files = stdlib_files()
    if not files:
        raise HeadroomInputError(f"data stdlib: no .py files under {stdlib_root()}")
    shift_docs, units = [], []
    for rel, p in files:
        text = _read(p)
        if not text.strip():
            continue
        if rel.split("/", 1)[0] in STDLIB_SHIFT_PACKAGES:
            shift_docs.append((rel, text))
        else:
            units.append((rel, text))
    units, dups = dedupe(units)
    shift, shift_dups = dedupe(shift_docs)
    splits = _split_units(units, cfg, "stdlib")
    splits["shift"] = [t for _, t in shift]
    left = drop_train_duplicates(splits)
    note = f"standard-library packages held out of training: {', '.join(STDLIB_SHIFT_PACKAGES)}"
    return Corpus(
        "stdlib", splits, corpus_hash_of(cfg, splits), note,
        meta={"python": sys.version.split()[0], "root": str(stdlib_root()), "files": len(files),
              "duplicates_removed": dups + shift_dups + left},
    )


# -------------------------------------------------------------------------------------------- path:GLOB


def glob_files(pattern: str) -> list[Path]:
    pattern = os.path.expanduser(pattern)
    return sorted(Path(p) for p in glob.glob(pattern, recursive=True) if os.path.isfile(p))


# A file is text when its first TEXT_SAMPLE bytes hold no NUL byte and at most NOT_TEXT_FRACTION of them fail to
# decode as UTF-8 (Latin-1 prose has a few per cent of such bytes; executables, archives and images hold NULs).
TEXT_SAMPLE = 1 << 16
NOT_TEXT_FRACTION = 0.3


def not_text(path: Path) -> str | None:
    """Why the file is not text (None when it is): a NUL byte, or mostly bytes that are not UTF-8."""
    with open(path, "rb") as f:
        block = f.read(TEXT_SAMPLE)
    if b"\0" in block:
        return "holds NUL bytes"
    bad = block.decode("utf-8", errors="replace").count("\ufffd")
    if block and bad > NOT_TEXT_FRACTION * len(block):
        return f"is mostly not UTF-8 text ({bad} of its first {len(block)} bytes do not decode)"
    return None


def check_path_source(pattern: str, what: str = "data") -> list[Path]:
    files = glob_files(pattern)
    if not files:
        raise HeadroomInputError(f"{what}: no files match {pattern!r}")
    if all(f.stat().st_size == 0 for f in files):
        raise HeadroomInputError(f"{what}: corpus is empty (all {len(files)} files matching {pattern!r} are empty)")
    for f in files:
        why = not_text(f)
        if why:
            raise HeadroomInputError(f"{what}: {f} {why}; a path: source must match text files only")
    return files


def load_path(cfg: DataConfig) -> Corpus:
    pattern = cfg.source.split(":", 1)[1]
    files = check_path_source(pattern)
    base = os.path.commonpath([str(f.parent) for f in files])
    units = [(os.path.relpath(f, base), _read(f)) for f in files]
    units = [(k, t) for k, t in units if t.strip()]
    if not units:
        raise HeadroomInputError(f"data: corpus is empty (files matching {pattern!r} hold only whitespace)")
    units, dups = dedupe(units)
    splits = _split_units(units, cfg, cfg.source)
    note = None
    if cfg.shift:
        splits["shift"], note, shift_dups = _shift_docs(cfg)
        dups += shift_dups + drop_train_duplicates(splits)
    return Corpus(cfg.source, splits, corpus_hash_of(cfg, splits), note, meta={"files": len(files), "duplicates_removed": dups})


def _shift_docs(cfg: DataConfig) -> tuple[list[str], str, int]:
    """(documents of the shifted set, what it is, duplicates dropped within it)."""
    assert cfg.shift is not None
    kind, rest = cfg.shift.split(":", 1)
    if kind == "path":
        docs = [t for t in (_read(f) for f in check_path_source(rest, "shift")) if t.strip()]
    else:
        docs = [d for split in _hf_rows(rest, cfg.text_column).values() for d in split]
    if not docs:
        raise HeadroomInputError(f"shift: {cfg.shift} holds no text")
    unique, dups = dedupe([(str(i), d) for i, d in enumerate(docs)])
    return [d for _, d in unique], f"shifted eval set from {cfg.shift}", dups


# ------------------------------------------------------------------------------------------ hf:NAME[:CFG]


def _parse_hf(spec: str) -> tuple[str, str | None]:
    # NAME may be a local directory (which can contain ':' only on odd systems); CONFIG follows the last ':'
    if os.path.exists(spec):
        return spec, None
    name, _, config = spec.rpartition(":")
    if name and not os.path.isabs(config):
        return name, config or None
    return spec, None


def _hf_rows(spec: str, text_column: str) -> dict[str, list[str]]:
    """Rows of a Hugging Face dataset by split, through `datasets.load_dataset` (hub name, or a local
    directory of text/json/parquet files — the same code path)."""
    name, config = _parse_hf(spec)
    if name.startswith((".", "/", "~")) and not os.path.exists(os.path.expanduser(name)):
        raise HeadroomInputError(f"data hf:{spec}: no such directory {name!r}")
    try:
        import datasets

        datasets.disable_progress_bars()
        dd = datasets.load_dataset(os.path.expanduser(name), config)
    except HeadroomInputError:
        raise
    except Exception as e:  # the datasets library raises many types; one line is what the user needs
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise HeadroomInputError(f"data hf:{spec}: {msg}") from None
    out = {}
    for split, ds in dd.items():
        if text_column not in ds.column_names:
            raise HeadroomInputError(
                f"data hf:{spec}: split {split!r} has no column {text_column!r} (columns: {ds.column_names})"
            )
        out[split] = ArrowDocs.scan(ds, text_column)
    return out


def load_hf(cfg: DataConfig) -> Corpus:
    """A dataset's documents, held as rows of its memory-mapped Arrow tables (arrowdocs.py), never as one list of
    strings; deduplicated by digest (the first of each content stays), split as the list-of-strings rule would."""
    spec = cfg.source.split(":", 1)[1]
    rows = _hf_rows(spec, cfg.text_column)
    if not any(len(d) for d in rows.values()):
        raise HeadroomInputError(f"data {cfg.source}: corpus is empty")
    n_rows = sum(len(d) for d in rows.values())
    rows = {split: docs.take(docs.first_occurrences()) for split, docs in rows.items()}
    dups = n_rows - sum(len(d) for d in rows.values())
    train_rows = rows.get("train", [])
    val_rows = rows.get("validation") or rows.get("valid") or rows.get("val")
    test_rows = rows.get("test")
    if train_rows and val_rows and test_rows:
        # the dataset's own splits: validation -> val, test -> id; calibration carved out of train by hash
        n_cal = max(1, round(cfg.calibration_fraction * len(train_rows)))
        if n_cal >= len(train_rows):
            raise HeadroomInputError(f"data {cfg.source}: train split too small to carve a calibration set")
        frac = np.fromiter((_unit_fraction(f"train/{i}") for i in range(len(train_rows))), np.float64,
                           len(train_rows))
        is_cal = np.zeros(len(train_rows), dtype=bool)
        is_cal[np.argsort(frac, kind="stable")[:n_cal]] = True  # sorted(range(n), key=fraction): stable
        splits = {"train": train_rows.take(np.flatnonzero(~is_cal)), "val": val_rows,
                  "calibration": train_rows.take(np.flatnonzero(is_cal)), "id": test_rows}
    else:
        names = [s for s in sorted(rows) if len(rows[s])]
        pooled = ArrowDocs.concat([rows[s] for s in names])
        starts = np.cumsum([0] + [len(rows[s]) for s in names])

        def key_of(j: int) -> str:  # the pooled document j's key: "<split>/<position in its deduplicated split>"
            s = int(np.searchsorted(starts, j, "right")) - 1
            return f"{names[s]}/{j - int(starts[s])}"

        first = pooled.first_occurrences()  # the units' keys, "<split>/<position>", are made when asked for
        dups = n_rows - len(first)
        units = pooled.take(first)
        if len(units) < MIN_UNITS:  # few documents: cut into blocks, as for any small source (held as text)
            splits = _split_units([(key_of(j), t) for j, t in zip(first.tolist(), units[:])], cfg, cfg.source)
        else:
            frac = np.fromiter((_unit_fraction(key_of(j)) for j in first.tolist()), np.float64, len(first))
            codes = split_codes(frac, lambda i: key_of(int(first[i])), cfg)
            splits = _split_by_codes(codes, units, cfg.source)
    note = None
    if cfg.shift:
        splits["shift"], note, shift_dups = _shift_docs(cfg)
        dups += shift_dups
    dups += drop_train_duplicates(splits)
    return Corpus(cfg.source, splits, corpus_hash_of(cfg, splits), note, meta={"duplicates_removed": dups})


# ------------------------------------------------------------------------------------------------- entry


def check_source(cfg: DataConfig) -> None:
    """Cheap checks that need no framework: paths exist and hold text. Called before torch is imported."""
    kind = cfg.source.split(":", 1)[0]
    if kind == "path":
        check_path_source(cfg.source.split(":", 1)[1])
    elif kind == "hf":
        name, _ = _parse_hf(cfg.source.split(":", 1)[1])
        if name.startswith((".", "/", "~")) and not os.path.exists(os.path.expanduser(name)):
            raise HeadroomInputError(f"data {cfg.source}: no such directory {name!r}")
    if cfg.shift and cfg.shift.startswith("path:"):
        check_path_source(cfg.shift.split(":", 1)[1], "shift")
    if cfg.tokenizer.startswith("pretrained:"):
        d = os.path.expanduser(cfg.tokenizer.split(":", 1)[1])
        if not os.path.isdir(d):
            raise HeadroomInputError(f"tokenizer: no such directory {d!r}")


def load_corpus(cfg: DataConfig) -> Corpus:
    kind = cfg.source.split(":", 1)[0]
    if kind == "stdlib":
        return load_stdlib(cfg)
    if kind == "path":
        return load_path(cfg)
    if kind == "hf":
        return load_hf(cfg)
    raise HeadroomInputError(f"data source {cfg.source!r} is not a text corpus")
