"""Decontamination: which windows of a held-out split also occur in the training stream (numpy only; the driver
runs it when it prepares data, prepared.py)."""

from __future__ import annotations

import numpy as np

_HASH_BASE = np.uint64(0x9E3779B97F4A7C15)  # odd, so invertible modulo 2^64
# tokens of the training stream hashed at a time: bounds the driver's memory on large corpora (window_hashes holds
# about nine uint64 arrays of the chunk's length: 1M tokens, about 80 MB; 16M took 1.2 GB, more than the corpus)
_HASH_CHUNK = 1 << 20


def window_hashes(stream: np.ndarray, width: int) -> np.ndarray:
    """Polynomial hashes (mod 2^64) of every window of `width` tokens of `stream`, at every offset:
    h(i) = Σ_k (s[i+k] + 1)·B^(width−1−k). Vectorised through prefix sums of s[j]·B^(−j): the window sum is a
    difference of two prefix sums, scaled back by B^(i+width−1)."""
    n = len(stream)
    if n < width:
        return np.zeros(0, dtype=np.uint64)
    s = stream.astype(np.uint64) + np.uint64(1)
    inv = np.uint64(pow(int(_HASH_BASE), -1, 1 << 64))
    with np.errstate(over="ignore"):
        inv_pow = np.full(n, inv, dtype=np.uint64)
        inv_pow[0] = 1
        inv_pow = np.cumprod(inv_pow, dtype=np.uint64)
        prefix = np.zeros(n + 1, dtype=np.uint64)
        np.cumsum(s * inv_pow, dtype=np.uint64, out=prefix[1:])
        pow_ = np.full(n, _HASH_BASE, dtype=np.uint64)
        pow_[0] = 1
        pow_ = np.cumprod(pow_, dtype=np.uint64)
        i = np.arange(n - width + 1)
        return (prefix[i + width] - prefix[i]) * pow_[i + width - 1]


def hashes_at(stream: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """`window_hashes(stream, width)[starts]` without hashing every offset: Horner's rule over the window's
    positions, vectorised across the starts (memory of the starts' length, not of the stream's)."""
    h = np.zeros(len(starts), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(width):
            h = h * _HASH_BASE + (np.asarray(stream[starts + k], dtype=np.uint64) + np.uint64(1))
    return h


def clean_window_starts(split: np.ndarray, train: np.ndarray, seq_len: int) -> np.ndarray:
    """Starts of the non-overlapping windows of a held-out split whose tokens do not occur anywhere in the training
    stream (at any offset). Removing duplicate documents leaves shared boilerplate (licence headers, generated
    tables, copied signatures); a window that a model could have memorised measures memory, not generalisation.
    Found by hashing every training window (`window_hashes`, in chunks) against the split's windows."""
    total = len(split) // seq_len
    starts = np.arange(total, dtype=np.int64) * seq_len
    if total == 0 or len(train) < seq_len:
        return starts
    held = hashes_at(split, starts, seq_len)
    order = np.argsort(held)
    sorted_held = held[order]
    seen = np.zeros(total, dtype=bool)
    for lo in range(0, len(train) - seq_len + 1, _HASH_CHUNK):
        h = window_hashes(train[lo:lo + _HASH_CHUNK + seq_len - 1], seq_len)
        pos = np.searchsorted(sorted_held, h).clip(max=total - 1)
        hit = sorted_held[pos] == h
        seen[order[pos[hit]]] = True
    return starts[~seen]
