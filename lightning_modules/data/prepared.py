"""Prepared data: a text source turned once into what every trial reads, memory-mapped.

A sweep's driver prepares its data before planning (`prepare`): the corpus is loaded, deduplicated and split
(corpus.py), the tokenizer made (tokens.py), every split encoded in batches over all cores and written as a flat
token stream, and a manifest written last. The directory is `HEADROOM_CACHE/prepared/<data hash>/` — the data
identity every unit key already carries — written under a temporary name and renamed into place, so a reader sees a
whole prepared dataset or none:

    manifest.json        corpus hash, data hash, tokenizer (name, fingerprint, vocabulary), dtype, tokens and
                         documents per split, duplicates removed, the shifted set's note, how long it took
    <split>.bin          the split's tokens, each document followed by eos, raw uint16 (vocabularies up to 65536)
                         or int32
    tokenizer/           a subword tokenizer as transformers saves it (none for bytes)
    clean/<split>-<L>.npy  the split's evaluation-window starts at sequence length L that do not occur in train
                         (computed by the driver for every L its plan uses; by a trial for any other)
    order/s<seed>-e<epoch>-n<windows>-L<L>.npy  a training epoch's order: the window phase, then the permutation
                         of the windows (`epoch_order`), drawn by the first trial of a seed and mapped by the rest

A trial (`HeadroomData` given its unit's data hash) opens that directory and never loads, deduplicates or encodes
text: its setup reads the manifest, the tokenizer and the clean starts, and maps the streams — constant in the size
of the corpus. `headroom train`, which has no unit, finds the same directory through a small index keyed by the
source's file listing (paths, sizes, modification times; `source_key`); a source it cannot list (a hub dataset
name) is loaded as before and then prepared for the next run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lightning_modules.data.corpus import _parse_hf, glob_files, load_corpus, stdlib_files
from lightning_modules.data.decontaminate import clean_window_starts
from lightning_modules.data.tokens import ByteTokenizer, HFTokenizer, cache_dir, data_hash, make_tokenizer, mqar_hash
from lightning_modules.declarations.config import BYTE_VOCAB_SIZE, DataConfig, HeadroomInputError

VERSION = 1
ENCODE_BATCH = 2048  # documents per batch handed to the tokenizer (which spreads a batch over all cores)


def prepared_root() -> Path:
    return cache_dir() / "prepared"


def stream_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.int32)


@dataclass
class Prepared:
    path: Path
    manifest: dict
    tokenizer: object
    streams: dict[str, np.ndarray]  # split -> token stream, memory-mapped read-only

    @property
    def data_hash(self) -> str:
        return self.manifest["data_hash"]

    @property
    def vocab_size(self) -> int:
        return int(self.manifest["tokenizer"]["vocab_size"])

    @property
    def shift_note(self) -> str | None:
        return self.manifest["shift_note"]

    def clean_path(self, split: str, seq_len: int) -> Path:
        return self.path / "clean" / f"{split}-{seq_len}.npy"

    def clean_starts(self, split: str, seq_len: int) -> np.ndarray:
        """The split's clean window starts at `seq_len`, computed and stored (atomically) when not yet there."""
        path = self.clean_path(split, seq_len)
        if path.exists():
            return np.load(path)
        starts = clean_window_starts(self.streams[split], self.streams["train"], seq_len)
        _save_atomically(path, lambda f: np.save(f, starts))
        return starts

    def train_order(self, seed: int, epoch: int, n_windows: int, seq_len: int) -> tuple[int, np.ndarray]:
        """`epoch_order`, stored (atomically) by the first trial that draws it and memory-mapped by every later
        one: a trial's setup then stays constant in the size of the corpus (drawing a permutation of 1.9M windows
        takes about 50 ms and 15 MB)."""
        path = self.path / "order" / f"s{seed}-e{epoch}-n{n_windows}-L{seq_len}.npy"
        try:
            stored = np.load(path, mmap_mode="r")
            if stored.dtype == np.int64 and stored.shape == (n_windows + 1,):
                return int(stored[0]), stored[1:]
        except (OSError, ValueError):  # not there yet (or not a whole .npy: drawn again and replaced)
            pass
        phase, perm = epoch_order(seed, epoch, n_windows, seq_len)
        try:
            _save_atomically(path, lambda f: np.save(f, np.concatenate([[phase], perm]).astype(np.int64)))
        except OSError:  # a read-only cache: this trial keeps its draw in memory
            pass
        return phase, perm


def _save_atomically(path: Path, write) -> None:
    """`write(f)` into a file under a name no other writer uses (the cache is shared by the pods of a cluster, whose
    process ids repeat), flushed, then renamed into place: a concurrent reader sees a whole file or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.{uuid.uuid4().hex}{path.suffix}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def epoch_order(seed: int, epoch: int, n_windows: int, seq_len: int) -> tuple[int, np.ndarray]:
    """The order a training epoch reads its windows in: a phase (the offset of every window start, so that the
    epochs of a long run see shifted windows) and a permutation of the windows, both drawn from (seed, epoch)."""
    rng = np.random.default_rng([seed, epoch])
    return int(rng.integers(seq_len)), rng.permutation(n_windows)


# ------------------------------------------------------------------------------------------------ reading


def _load_tokenizer(path: Path, manifest: dict):
    tok = manifest["tokenizer"]
    if tok["name"] == "byte":
        return ByteTokenizer()
    from transformers import AutoTokenizer

    out = HFTokenizer(AutoTokenizer.from_pretrained(str(path / "tokenizer")), tok["name"])
    if out.fingerprint() != tok["fingerprint"] or out.vocab_size != tok["vocab_size"]:
        raise HeadroomInputError(f"prepared data {path}: its tokenizer does not match its manifest; delete the "
                                 "directory to prepare the data again")
    return out


def open_prepared(data_id: str) -> Prepared | None:
    """The prepared dataset of a data hash, its streams memory-mapped; None when it has not been prepared."""
    path = prepared_root() / data_id
    try:
        manifest = json.loads((path / "manifest.json").read_text())
    except FileNotFoundError:
        return None
    if manifest.get("version") != VERSION:
        return None
    dtype = np.dtype(manifest["dtype"])
    streams = {split: np.memmap(path / f"{split}.bin", dtype=dtype, mode="r", shape=(n,))
               for split, n in manifest["tokens"].items()}
    return Prepared(path, manifest, _load_tokenizer(path, manifest), streams)


# ------------------------------------------------------------------------------- the source's file listing


def _listing(files) -> list:
    out = []
    for f in files:
        st = os.stat(f)
        out.append([str(f), st.st_size, st.st_mtime_ns])
    return out


def source_key(cfg: DataConfig) -> str | None:
    """A key of the source as it is on disk now, from its configuration and its files' paths, sizes and
    modification times (no file is read): the same key means the same text. None for a source that cannot be
    listed (a dataset on the hub). Rewriting a file in place within the same nanosecond tick and at the same size
    would go unnoticed; the data hash a sweep logs comes from the content itself."""
    kind = cfg.source.split(":", 1)[0]
    if kind == "stdlib":
        listing = [sys.version] + _listing(p for _, p in stdlib_files())
    elif kind == "path":
        listing = _listing(glob_files(cfg.source.split(":", 1)[1]))
    elif kind == "hf":
        name, _ = _parse_hf(cfg.source.split(":", 1)[1])
        root = Path(os.path.expanduser(name))
        roots = [root] if root.is_dir() else _hub_caches(name)
        if not roots:
            return None
        listing = [_listing(sorted(p for p in r.rglob("*") if p.is_file() and not p.name.endswith(".lock")))
                   for r in roots]  # datasets touches its lock files on every load
    else:
        return None
    if cfg.shift and cfg.shift.startswith("path:"):
        listing.append(_listing(glob_files(cfg.shift.split(":", 1)[1])))
    elif cfg.shift:
        return None
    if cfg.tokenizer.startswith("pretrained:"):
        d = Path(os.path.expanduser(cfg.tokenizer.split(":", 1)[1]))
        listing.append(_listing(sorted(p for p in d.rglob("*") if p.is_file())))
    body = json.dumps([VERSION, cfg.model_dump(mode="json"), listing])
    return hashlib.sha256(body.encode()).hexdigest()[:24]


def _hub_caches(name: str) -> list[Path]:
    """Where `datasets` keeps a hub dataset offline (the hub's download cache and the prepared Arrow cache);
    empty when it has not been downloaded, so the source is loaded rather than keyed."""
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    hub = Path(os.environ.get("HF_HUB_CACHE", home / "hub")) / ("datasets--" + name.replace("/", "--"))
    arrow = Path(os.environ.get("HF_DATASETS_CACHE", home / "datasets")) / name.replace("/", "___")
    return [p for p in (hub, arrow) if p.is_dir()]


def _index_path(key: str) -> Path:
    return prepared_root() / "index" / f"{key}.json"


def lookup(cfg: DataConfig) -> Prepared | None:
    """The prepared dataset of this source as it is on disk now, without reading its text; None if not prepared."""
    key = source_key(cfg)
    if key is None:
        return None
    try:
        data_id = json.loads(_index_path(key).read_text())["data_hash"]
    except FileNotFoundError:
        return None
    return open_prepared(data_id)


def _write_index(cfg: DataConfig, key: str | None, data_id: str) -> None:
    if key is None:
        return
    entry = json.dumps({"data_hash": data_id, "source": cfg.source}).encode()
    _save_atomically(_index_path(key), lambda f: f.write(entry))


# ------------------------------------------------------------------------------------------------ writing


def _encode_to(f, tokenizer, docs: list[str], dtype: np.dtype, progress) -> int:
    """Encode documents in batches (each followed by eos) and append them to file f; returns tokens written."""
    n = 0
    eos = tokenizer.eos_id
    for lo in range(0, len(docs), ENCODE_BATCH):
        batch = docs[lo:lo + ENCODE_BATCH]
        ids = tokenizer.encode_batch(batch)
        lengths = np.fromiter((len(x) + 1 for x in ids), dtype=np.int64, count=len(ids))
        out = np.empty(int(lengths.sum()), dtype=dtype)
        ends = np.cumsum(lengths)
        for x, end, length in zip(ids, ends, lengths):
            out[end - length:end - 1] = x
        out[ends - 1] = eos
        f.write(out.tobytes())
        n += len(out)
        progress(len(batch), sum(len(d) for d in batch))
    return n


class _Progress:
    """One line now and then: documents and characters encoded, their rate and the time left."""

    def __init__(self, total_docs: int, total_chars: int, say, every: float = 10.0):
        self.total_docs, self.total_chars, self.say, self.every = total_docs, total_chars, say, every
        self.docs = self.chars = 0
        self.t0 = self.last = time.monotonic()

    def __call__(self, docs: int, chars: int) -> None:
        self.docs += docs
        self.chars += chars
        now = time.monotonic()
        if self.say is None or (now - self.last < self.every and self.docs < self.total_docs):
            return
        self.last = now
        rate = self.chars / max(now - self.t0, 1e-9)
        eta = (self.total_chars - self.chars) / max(rate, 1e-9)
        self.say(f"data: encoded {self.docs}/{self.total_docs} documents, {rate / 1e6:.1f} MB/s, "
                 f"about {eta:.0f} s left")


STALE_S = 24 * 3600  # a temporary directory this old belongs to no live writer (TinyStories prepares in minutes)


def _write(cfg: DataConfig, say) -> str:
    """Load, encode and write the prepared dataset of a source; returns its data hash."""
    t0 = time.monotonic()
    corpus = load_corpus(cfg)
    tokenizer = make_tokenizer(cfg, corpus)
    data_id = data_hash(corpus, tokenizer)
    final = prepared_root() / data_id
    if (final / "manifest.json").exists():
        return data_id
    if final.exists():  # without a manifest: not written by prepare (a partial copy); replaced
        shutil.rmtree(final)
    for stale in prepared_root().glob(f".{data_id}.tmp*"):  # left by a writer killed mid-way (a day ago or more)
        if time.time() - stale.stat().st_mtime > STALE_S:
            shutil.rmtree(stale, ignore_errors=True)
    # written under a name no other writer uses (pods sharing the cache repeat process ids), renamed when whole
    tmp = prepared_root() / f".{data_id}.tmp{uuid.uuid4().hex}"
    tmp.mkdir(parents=True)
    try:
        _write_into(tmp, cfg, corpus, tokenizer, data_id, t0, say)
        os.rename(tmp, final)  # the commit: a reader sees a whole directory or none
    except OSError:
        if not (final / "manifest.json").exists():
            raise
        # another process prepared the same data meanwhile: keep theirs
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return data_id


def _write_into(tmp: Path, cfg: DataConfig, corpus, tokenizer, data_id: str, t0: float, say) -> None:
    """The streams, tokenizer and manifest of a prepared dataset, into the directory `tmp`."""
    dtype = stream_dtype(tokenizer.vocab_size)
    splits = {s: docs for s, docs in corpus.splits.items() if docs}
    progress = _Progress(sum(len(d) for d in splits.values()), sum(corpus.n_chars(s) for s in splits), say)
    tokens = {}
    for split, docs in splits.items():
        with open(tmp / f"{split}.bin", "wb") as f:
            tokens[split] = _encode_to(f, tokenizer, docs, dtype, progress)
    fingerprint = tokenizer.name
    if isinstance(tokenizer, HFTokenizer):
        tokenizer.tok.save_pretrained(str(tmp / "tokenizer"))
        fingerprint = tokenizer.fingerprint()
    manifest = {
        "version": VERSION, "source": cfg.source, "data": cfg.model_dump(mode="json"),
        "corpus_hash": corpus.corpus_hash, "data_hash": data_id,
        "tokenizer": {"name": tokenizer.name, "fingerprint": fingerprint, "vocab_size": tokenizer.vocab_size},
        "dtype": dtype.name, "tokens": tokens, "documents": {s: len(d) for s, d in splits.items()},
        "characters": {s: corpus.n_chars(s) for s in splits}, "shift_note": corpus.shift_note,
        "duplicates_removed": corpus.meta.get("duplicates_removed", 0), "seconds": round(time.monotonic() - t0, 2),
    }
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))


def prepare(cfg: DataConfig, say=None) -> Prepared:
    """The prepared dataset of a source: found through the index (nothing read), or loaded, encoded and written
    once. `say`: where progress lines go (the driver's log), None for silence."""
    if cfg.source == "mqar":
        raise ValueError("mqar is generated, not prepared")
    key = source_key(cfg)
    found = lookup(cfg)
    if found is not None:
        return found
    data_id = _write(cfg, say)
    _write_index(cfg, key, data_id)
    out = open_prepared(data_id)
    assert out is not None, data_id
    return out


@dataclass(frozen=True)
class DataIdentity:
    """What a sweep's driver needs of its data before planning: the identity of the token streams (it goes into
    every unit key) and the vocabulary size actually trained (it decides the models' sizes, so Scratch-B's
    compute)."""

    data_hash: str
    vocab_size: int


def data_identity(cfg: DataConfig, say=None) -> DataIdentity:
    """`data_hash` and the vocabulary, the data prepared for the trials on the way (once per source)."""
    if cfg.source == "mqar":
        return DataIdentity(mqar_hash(), BYTE_VOCAB_SIZE)
    p = prepare(cfg, say)
    return DataIdentity(p.data_hash, p.vocab_size)
