"""Prepared data (lightning_modules/data/prepared.py): the driver encodes a source once; a trial maps the streams and
never reads the text. The references: each document encoded on its own the way the loader did before (one
`encode` per document, eos after each), and `clean_window_starts` run on the streams directly."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT

from lightning_modules.data.corpus import load_corpus
from lightning_modules.data.datamodule import HeadroomData
from lightning_modules.data.decontaminate import clean_window_starts
from lightning_modules.data.prepared import data_identity, open_prepared, prepare, prepared_root, source_key
from lightning_modules.data.tokens import make_tokenizer
from lightning_modules.declarations.config import DataConfig, HeadroomInputError, TrainConfig


def _corpus(root, n=60, words=("alpha", "beta", "gamma", "delta", "epsilon")):
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        body = " ".join(words[(i * j + j // 3) % len(words)] for j in range(150))
        (root / f"doc{i:03d}.txt").write_text(f"story {i}\n{body}\n")
    return root


def _one_by_one(tokenizer, docs):
    """Today's encoding, the reference: each document on its own, followed by eos."""
    eos = np.asarray([tokenizer.eos_id], dtype=np.int64)
    return np.concatenate([np.concatenate([np.asarray(tokenizer.encode(d), dtype=np.int64), eos]) for d in docs])


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("HEADROOM_CACHE", str(d))
    return d


def _hf_dir(root, n=300):
    """The documents of _corpus as a dataset directory (train.jsonl, a `text` column), read through hf:."""
    import json

    root.mkdir(parents=True)
    docs = [p.read_text() for p in sorted(_corpus(root / "txt", n=n).glob("*.txt"))]
    (root / "ds").mkdir()
    (root / "ds" / "train.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return root / "ds"


@pytest.mark.parametrize("which", ["stdlib-bytes", "path-bpe", "hf-bpe"])
def test_prepared_streams_are_todays_tokens(tmp_path, own_cache, which):
    cfg = (DataConfig() if which == "stdlib-bytes" else
           DataConfig(source=f"path:{_corpus(tmp_path / 'c')}/*.txt", tokenizer="bpe", bpe_vocab_size=300)
           if which == "path-bpe" else DataConfig(source=f"hf:{_hf_dir(tmp_path / 'h')}", tokenizer="bpe",
                                                  bpe_vocab_size=300))
    p = prepare(cfg)
    corpus = load_corpus(cfg)
    tok = make_tokenizer(cfg, corpus)
    assert p.data_hash == data_identity(cfg).data_hash and p.vocab_size == tok.vocab_size
    assert p.manifest["corpus_hash"] == corpus.corpus_hash
    splits = {s: d for s, d in corpus.splits.items() if d}
    assert set(p.streams) == set(splits)
    for split, docs in splits.items():
        assert isinstance(p.streams[split], np.memmap) and p.streams[split].dtype == np.uint16
        assert np.array_equal(np.asarray(p.streams[split], dtype=np.int64), _one_by_one(tok, docs)), split
        assert p.manifest["tokens"][split] == len(p.streams[split])
        assert p.manifest["documents"][split] == len(docs)
    assert p.manifest["duplicates_removed"] == corpus.meta["duplicates_removed"]
    if which != "stdlib-bytes":  # the tokenizer travels with the data: same ids, same special tokens
        assert p.tokenizer.fingerprint() == tok.fingerprint()
        assert (p.tokenizer.pad_id, p.tokenizer.mask_id, p.tokenizer.eos_id) == (tok.pad_id, tok.mask_id, tok.eos_id)
        text = "alpha beta gamma epsilon"
        assert list(p.tokenizer.encode(text)) == list(tok.encode(text))


def test_a_trial_maps_the_streams_and_never_reads_the_text(tmp_path, own_cache):
    src = _corpus(tmp_path / "c")
    cfg = DataConfig(source=f"path:{src}/*.txt", tokenizer="bpe", bpe_vocab_size=300)
    tcfg = TrainConfig(steps=2, seq_len=16, batch_size=2)
    ident = data_identity(cfg)  # the driver
    reference = {s: np.array(v) for s, v in open_prepared(ident.data_hash).streams.items()}
    # headroom train (no unit): finds the prepared data through the source's listing; an audit hook records every
    # file the process opens, and none of the corpus's is among them
    probe = (
        "import sys, json; opened = []\n"
        "sys.addaudithook(lambda ev, a: opened.append(str(a[0])) if ev == 'open' and isinstance(a[0], str) else None)\n"
        "from lightning_modules.declarations.config import DataConfig, TrainConfig\n"
        "from lightning_modules.data.datamodule import HeadroomData\n"
        f"d = HeadroomData(DataConfig(source={cfg.source!r}, tokenizer='bpe', bpe_vocab_size=300), "
        "TrainConfig(steps=2, seq_len=16, batch_size=2)).prepare()\n"
        "batch = next(iter(d.train_dataloader()))\n"
        "print(json.dumps({'hash': d.corpus_hash, 'opened': opened}))\n"
    )
    r = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["hash"] == ident.data_hash
    assert not [f for f in out["opened"] if f.startswith(str(src) + os.sep)], "the corpus text was read"
    assert any(f.endswith("train.bin") for f in out["opened"])  # what it read instead
    # a sweep's trial (its unit carries the data hash) needs no corpus at all: delete it
    for f in src.iterdir():
        f.unlink()
    d = HeadroomData(cfg, tcfg, data_hash=ident.data_hash).prepare()
    for split, stream in reference.items():
        assert np.array_equal(d.streams[split], stream)
    assert len(next(iter(d.train_dataloader()))["input_ids"]) == 2


def test_clean_starts_are_computed_once_and_equal_the_direct_scan(tmp_path, own_cache):
    cfg = DataConfig(source=f"path:{_corpus(tmp_path / 'c')}/*.txt")
    p = prepare(cfg)
    for split in ("val", "id"):
        got = p.clean_starts(split, 32)
        assert np.array_equal(got, clean_window_starts(np.array(p.streams[split]), np.array(p.streams["train"]), 32))
        path = p.clean_path(split, 32)
        mtime = path.stat().st_mtime_ns
        assert np.array_equal(open_prepared(p.data_hash).clean_starts(split, 32), got)
        assert path.stat().st_mtime_ns == mtime  # read, not computed again


def test_a_stored_training_order_is_the_drawn_one_and_is_drawn_once(tmp_path, own_cache):
    """The first trial of a seed stores its epoch's order; a later trial maps it, and both walk exactly the
    windows the draw made before orders were stored (written out here: a phase, then a permutation, from
    default_rng([seed, epoch])), over two epochs and a part of a third. A damaged stored order is drawn again."""
    cfg = DataConfig(source=f"path:{_corpus(tmp_path / 'c')}/*.txt")
    tcfg = TrainConfig(steps=40, seq_len=16, batch_size=8, seed=3)
    ident = data_identity(cfg)
    first = HeadroomData(cfg, tcfg, data_hash=ident.data_hash).prepare().train_dataset()
    n = first.n_windows

    def drawn(j):
        epoch, k = divmod(j, n)
        rng = np.random.default_rng([3, epoch])
        phase = int(rng.integers(16))
        return phase + int(rng.permutation(n)[k]) * 16

    want = [drawn(j) for j in range(2 * n + 5)]
    assert [first.start_of(j) for j in range(2 * n + 5)] == want
    stored = sorted(p.name for p in (open_prepared(ident.data_hash).path / "order").iterdir())
    assert stored == [f"s3-e0-n{n}-L16.npy", f"s3-e1-n{n}-L16.npy", f"s3-e2-n{n}-L16.npy"]
    mtimes = {f: (open_prepared(ident.data_hash).path / "order" / f).stat().st_mtime_ns for f in stored}
    later = HeadroomData(cfg, tcfg, data_hash=ident.data_hash).prepare().train_dataset()
    assert [later.start_of(j) for j in range(2 * n + 5)] == want
    assert {f: (open_prepared(ident.data_hash).path / "order" / f).stat().st_mtime_ns for f in stored} == mtimes
    other = HeadroomData(cfg, tcfg.model_copy(update={"seed": 4}), data_hash=ident.data_hash).prepare()
    assert [other.train_dataset().start_of(j) for j in range(n)] != want[:n]  # another seed, another order
    damaged = open_prepared(ident.data_hash).path / "order" / stored[1]
    damaged.write_bytes(damaged.read_bytes()[:100])  # a torn file
    again = HeadroomData(cfg, tcfg, data_hash=ident.data_hash).prepare().train_dataset()
    assert [again.start_of(j) for j in range(2 * n + 5)] == want
    assert np.load(damaged).shape == (n + 1,)  # replaced by a whole one
    assert not [p for p in damaged.parent.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_a_changed_source_is_prepared_again_and_a_stale_unit_refused(tmp_path, own_cache):
    src = _corpus(tmp_path / "c")
    cfg = DataConfig(source=f"path:{src}/*.txt")
    first = prepare(cfg)
    key = source_key(cfg)
    (src / "doc000.txt").write_text("a different story\n" * 40)
    assert source_key(cfg) != key
    second = prepare(cfg)
    assert second.data_hash != first.data_hash
    assert (prepared_root() / first.data_hash / "manifest.json").exists()  # the old one stays for its runs
    # a trial planned on data that has changed and is not prepared on its node says so
    tcfg = TrainConfig(steps=1, seq_len=16, batch_size=2)
    with pytest.raises(HeadroomInputError, match="the data changed"):
        HeadroomData(cfg, tcfg, data_hash="0123456789abcdef").prepare()


def test_a_half_written_directory_is_never_read(tmp_path, own_cache):
    """Written under a temporary name and renamed: a crash leaves a hidden directory that nothing opens, and a
    directory without its manifest (copied in part) is replaced."""
    cfg = DataConfig(source=f"path:{_corpus(tmp_path / 'c')}/*.txt")
    h = data_identity(cfg).data_hash
    final = prepared_root() / h
    (final / "manifest.json").unlink()
    assert open_prepared(h) is None
    for f in prepared_root().glob("index/*.json"):
        f.unlink()
    p = prepare(cfg)
    assert p.data_hash == h and (final / "manifest.json").exists()
    assert not list(prepared_root().glob(".*tmp*"))


def test_a_failed_preparation_leaves_nothing_and_a_concurrent_one_is_kept(tmp_path, own_cache, monkeypatch):
    """A preparation that fails while encoding leaves neither a prepared directory nor its temporary one behind;
    when another process committed the same data while this one encoded, theirs stays and this one's is dropped."""
    import lightning_modules.data.prepared as prepared

    cfg = DataConfig(source=f"path:{_corpus(tmp_path / 'c')}/*.txt")
    real = prepared._write_into

    def fails(tmp, *a):
        real(tmp, *a)
        raise OSError("disk full")

    monkeypatch.setattr(prepared, "_write_into", fails)
    with pytest.raises(OSError, match="disk full"):
        prepare(cfg)
    assert [p.name for p in prepared_root().iterdir() if p.name != "index"] == []

    def races(tmp, cfg_, corpus, tokenizer, data_id, *a):  # another writer commits first, then this one renames
        real(tmp, cfg_, corpus, tokenizer, data_id, *a)
        other = prepared_root() / f".{data_id}.tmp-other"
        other.mkdir()
        real(other, cfg_, corpus, tokenizer, data_id, *a)
        (other / "theirs").write_text("")
        other.rename(prepared_root() / data_id)

    monkeypatch.setattr(prepared, "_write_into", races)
    p = prepare(cfg)
    assert (prepared_root() / p.data_hash / "theirs").exists() and p.streams["train"].size > 0
    assert not list(prepared_root().glob(".*tmp*"))


def test_a_killed_writers_temporary_directory_is_removed_once_stale(tmp_path, own_cache):
    """A writer killed mid-way leaves its temporary directory; the next preparation of the same data removes it
    once it is a day old, and leaves a recent one (a writer still at work) alone."""
    import time

    cfg = DataConfig(source=f"path:{_corpus(tmp_path / 'c')}/*.txt")
    h = data_identity(cfg).data_hash
    shutil.rmtree(prepared_root() / h)
    for f in prepared_root().glob("index/*.json"):
        f.unlink()
    old, fresh = prepared_root() / f".{h}.tmpkilled", prepared_root() / f".{h}.tmpworking"
    for d in (old, fresh):
        d.mkdir()
        (d / "train.bin").write_bytes(b"\0" * 64)
    os.utime(old, (time.time() - 2 * 86400,) * 2)
    prepare(cfg)
    assert not old.exists() and fresh.exists() and (prepared_root() / h / "manifest.json").exists()
