"""The documents of a Hugging Face dataset without holding their text: a split is the row numbers of its documents
in the dataset's memory-mapped Arrow table (8 bytes a document) with two digests of each (its normalised content,
for deduplication, and its exact bytes, for the corpus hash) and its length; the text is read back in batches when
the tokenizer trains or the streams are encoded. TinyStories' 2.1M stories then cost the driver about 150 MB of
arrays instead of its 1.9 GB of text as Python strings.

corpus.py decides which documents go where, exactly as it does for a list of strings; this module only scans,
deduplicates by digest and reads back. No torch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence

import numpy as np

SCAN_BATCH = 4096  # rows read from the Arrow table at a time
READ_BATCH = 1024  # documents handed to the tokenizer at a time when iterating


def normalised_digest(text: str) -> bytes:
    """corpus.normalised_hash as 32 raw bytes: content up to line endings, trailing spaces and blank lines at
    either end."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    return hashlib.sha256("\n".join(lines).strip("\n").encode("utf-8", "replace")).digest()


def raw_digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "replace")).digest()


class ArrowDocs(Sequence):
    """Documents held as (table, row) pairs: `tables` are datasets.Dataset objects (one per split of the source),
    `src[i]`, `rows[i]` where document i is, with its normalised and raw digests and its length in characters.
    Indexing and slicing read the text from the memory-mapped tables."""

    def __init__(self, tables: tuple, column: str, src: np.ndarray, rows: np.ndarray, norm: np.ndarray,
                 raw: np.ndarray, chars: np.ndarray):
        self.tables, self.column = tables, column
        self.src, self.rows, self.norm, self.raw, self.chars = src, rows, norm, raw, chars

    @classmethod
    def scan(cls, ds, column: str) -> ArrowDocs:
        """Every row of the column that holds text (not None, not blank), in the table's order. Held per batch
        as arrays: no Python object per document outlives its batch."""
        parts: list[tuple] = []
        start = 0
        for batch in ds.with_format("arrow").iter(batch_size=SCAN_BATCH):
            texts = batch.column(column).to_pylist()
            keep = [i for i, t in enumerate(texts) if t and t.strip()]
            parts.append((np.asarray(keep, dtype=np.int64) + start,
                          np.frombuffer(b"".join(normalised_digest(texts[i]) for i in keep), dtype="S32"),
                          np.frombuffer(b"".join(raw_digest(texts[i]) for i in keep), dtype="S32"),
                          np.fromiter((len(texts[i]) for i in keep), np.int64, len(keep))))
            start += batch.num_rows
        rows, norm, raw, chars = (np.concatenate([p[k] for p in parts]) if parts else np.zeros(0, dt)
                                  for k, dt in enumerate((np.int64, "S32", "S32", np.int64)))
        return cls((ds,), column, np.zeros(len(rows), dtype=np.int16), rows, norm, raw, chars)

    @classmethod
    def concat(cls, parts: list[ArrowDocs]) -> ArrowDocs:
        """The documents of `parts` (at least one; the same column of each) one after the other."""
        tables, src = [], []
        for p in parts:
            src.append(p.src + len(tables))
            tables.extend(p.tables)
        cat = lambda name: np.concatenate([getattr(p, name) for p in parts])  # noqa: E731
        return cls(tuple(tables), parts[0].column, np.concatenate(src).astype(np.int16), cat("rows"), cat("norm"),
                   cat("raw"), cat("chars"))

    def take(self, positions) -> ArrowDocs:
        """The documents at these positions of this sequence, in the order given."""
        p = np.asarray(positions, dtype=np.int64)
        return ArrowDocs(self.tables, self.column, self.src[p], self.rows[p], self.norm[p], self.raw[p],
                         self.chars[p])

    def first_occurrences(self) -> np.ndarray:
        """Positions of the documents whose normalised content no earlier one has (the first of each stays)."""
        if not len(self):
            return np.zeros(0, dtype=np.int64)
        _, first = np.unique(self.norm, return_index=True)
        return np.sort(first)

    def n_chars(self) -> int:
        return int(self.chars.sum())

    def __len__(self) -> int:
        return len(self.rows)

    def _read(self, src: np.ndarray, rows: np.ndarray) -> list[str]:
        out: list = [None] * len(rows)
        for t in np.unique(src):
            at = np.flatnonzero(src == t)
            texts = self.tables[t].with_format("arrow")[rows[at].tolist()].column(self.column).to_pylist()
            for i, text in zip(at.tolist(), texts):
                out[i] = text
        return out

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self._read(self.src[i], self.rows[i])
        return self._read(self.src[[i]], self.rows[[i]])[0]

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(self) == len(other) and list(self) == list(other)

    __hash__ = None

    def __iter__(self) -> Iterator[str]:
        for lo in range(0, len(self), READ_BATCH):
            yield from self[lo:lo + READ_BATCH]

    def __repr__(self) -> str:
        return f"ArrowDocs({len(self)} documents of column {self.column!r})"
