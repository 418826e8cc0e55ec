"""Which document goes where: deduplication by normalised content, the split of each document from the hash of
its name (never the seed), and the corpus hash over the splits. For lists of strings and for ArrowDocs (documents
held as rows of a dataset's table) alike, with one rule. corpus.py loads the sources. No torch."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import numpy as np

from lightning_modules.data.arrowdocs import ArrowDocs, normalised_digest, raw_digest
from lightning_modules.declarations.config import DataConfig, HeadroomInputError

# a source with fewer files than this is cut into blocks of lines, so that every split gets some text
MIN_UNITS = 50
BLOCK_CHARS = 2048


def _unit_fraction(key: str) -> float:
    return int(hashlib.sha256(key.encode()).hexdigest()[:12], 16) / 16**12


SPLIT_ORDER = ("train", "val", "calibration", "id")  # the codes of split_codes


def split_codes(frac: np.ndarray, key_of, cfg: DataConfig) -> np.ndarray:
    """The split of each document, from the hashes of the names alone: documents are ordered by (hash, name) and
    the first round(f·N) (at least one) go to val, the next to calibration, then id; the rest train. Ranking instead
    of thresholding keeps small corpora from leaving a split empty by chance. `frac[i]` is document i's
    _unit_fraction, `key_of(i)` its name (read only to break ties of the fraction). Returns each document's index
    in SPLIT_ORDER."""
    n = len(frac)
    sizes = [max(1, round(f * n)) for f in (cfg.val_fraction, cfg.calibration_fraction, cfg.eval_fraction)]
    order = np.argsort(frac, kind="stable")
    ranked = frac[order]
    ties = np.flatnonzero(ranked[1:] == ranked[:-1])  # i: ranked[i] == ranked[i + 1]
    for start in ties[np.r_[True, np.diff(ties) > 1]] if len(ties) else ():  # each run of equal fractions
        end = start + 1
        while end < n and ranked[end] == ranked[start]:
            end += 1
        order[start:end] = sorted(order[start:end].tolist(), key=key_of)
    out = np.zeros(n, dtype=np.int8)
    pos = 0
    for code, size in enumerate(sizes, start=1):
        out[order[pos:pos + size]] = code
        pos += size
    return out


def _blocks(text: str, size: int = BLOCK_CHARS) -> list[str]:
    """Cut text at line boundaries into blocks of about `size` characters."""
    out, cur, n = [], [], 0
    for line in text.splitlines(keepends=True):
        cur.append(line)
        n += len(line)
        if n >= size:
            out.append("".join(cur))
            cur, n = [], 0
    if cur:
        out.append("".join(cur))
    return out


def normalised_hash(text: str) -> str:
    """Hash of a document's content up to line endings, trailing spaces and blank lines at either end: two files
    that differ only there are the same document."""
    return normalised_digest(text).hex()


def dedupe(units: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], int]:
    """Drop documents whose normalised content repeats an earlier one (the first, in the given order, stays).
    Returns (units, number dropped). Done before splitting, so one text never sits in two splits."""
    seen, out = set(), []
    for key, text in units:
        h = normalised_hash(text)
        if h not in seen:
            seen.add(h)
            out.append((key, text))
    return out, len(units) - len(out)


def _norm_digests(docs) -> np.ndarray:
    return docs.norm if isinstance(docs, ArrowDocs) else np.asarray([normalised_digest(d) for d in docs], dtype="S32")


def _take(docs, positions):
    """The documents at `positions` of a list or of ArrowDocs, in order."""
    return docs.take(positions) if isinstance(docs, ArrowDocs) else [docs[i] for i in positions]


def drop_train_duplicates(splits: dict[str, Sequence[str]]) -> int:
    """Splits fixed by the source (a dataset's own validation and test, a shifted set) keep their documents; a
    training document with the same normalised content as a held-out one leaves train. Returns how many left."""
    held = [_norm_digests(docs) for name, docs in splits.items() if name != "train" and len(docs)]
    train = splits["train"]
    if held:
        splits["train"] = _take(train, np.flatnonzero(~np.isin(_norm_digests(train), np.concatenate(held))))
    return len(train) - len(splits["train"])


def _split_units(units: list[tuple[str, str]], cfg: DataConfig, what: str) -> dict[str, list[str]]:
    """units: (key, text), duplicates already dropped. Few large units are cut into blocks first so every split
    gets text."""
    if len(units) < MIN_UNITS:
        units = [(f"{k}#{i}", b) for k, t in units for i, b in enumerate(_blocks(t))]
    return _split_keyed([k for k, _ in units], [t for _, t in units], cfg, what)


def _split_keyed(keys: list[str], docs: Sequence[str], cfg: DataConfig, what: str) -> dict[str, Sequence[str]]:
    """Documents `docs` (a list) to splits by the hashes of their `keys`, in order."""
    frac = np.fromiter((_unit_fraction(k) for k in keys), np.float64, len(keys))
    return _split_by_codes(split_codes(frac, keys.__getitem__, cfg), docs, what)


def _split_by_codes(codes: np.ndarray, docs: Sequence[str], what: str) -> dict[str, Sequence[str]]:
    splits = {s: _take(docs, np.flatnonzero(codes == c)) for c, s in enumerate(SPLIT_ORDER)}
    empty = [s for s, d in splits.items() if not len(d)]
    units = codes
    if empty or len(units) < 4:
        raise HeadroomInputError(
            f"data {what}: corpus too small to fill the train, val, calibration and id splits ({len(units)} documents)"
        )
    return splits


def _hash(cfg: DataConfig, parts: dict[str, list[str]], extra: str = "") -> str:
    h = hashlib.sha256()
    h.update(json.dumps([cfg.val_fraction, cfg.calibration_fraction, cfg.eval_fraction, extra]).encode())
    for split in sorted(parts):
        h.update(split.encode() + b"\0")
        docs = parts[split]
        if isinstance(docs, ArrowDocs):  # the same bytes as one update per document
            h.update(docs.raw.tobytes())
        else:
            for doc in docs:
                h.update(raw_digest(doc))
    return h.hexdigest()[:16]
