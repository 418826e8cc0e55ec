"""Data sources, splits, tokenisers and the seeded, resumable sample order — on local files the tests write."""

import hashlib

import numpy as np
import pytest
import torch

from lightning_modules.data.corpus import STDLIB_SHIFT_PACKAGES, check_source, load_corpus, stdlib_files
from lightning_modules.data.datamodule import MQAR, EvalWindows, HeadroomData, TrainWindows, mlm_mask
from lightning_modules.data.tokens import make_tokenizer, unigram_entropy_of
from lightning_modules.declarations.config import DataConfig, HeadroomInputError, TrainConfig, train_config_for


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _write_corpus(root, n: int, prefix: str = "doc", words=("alpha", "beta", "gamma", "delta")):
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        body = " ".join(words[(i * j) % len(words)] for j in range(200))
        (root / f"{prefix}{i:03d}.txt").write_text(f"{prefix} number {i}\n{body}\n")
    return root


# ------------------------------------------------------------------------------------------- stdlib


def test_stdlib_excludes_tests_and_idle():
    rels = [r for r, _ in stdlib_files()]
    assert len(rels) > 300
    for r in rels:
        parts = r.split("/")
        assert not {"test", "tests", "idlelib", "site-packages"} & set(parts[:-1]), r


def test_stdlib_splits_are_deterministic_and_shift_is_held_out():
    a, b = load_corpus(DataConfig()), load_corpus(DataConfig())
    assert a.corpus_hash == b.corpus_hash and len(a.corpus_hash) == 16
    assert a.eval_sets == ["id", "shift"]
    assert all(a.splits[s] for s in ("train", "val", "calibration", "id", "shift"))
    # the shifted set is exactly the held-out packages, and none of it is in any other split
    shift_files = {_digest(p.read_text(encoding="utf-8", errors="replace")) for r, p in stdlib_files()
                   if r.split("/")[0] in STDLIB_SHIFT_PACKAGES}
    shift_files.discard(_digest(""))
    assert {_digest(d) for d in a.splits["shift"]} <= shift_files
    others = {_digest(d) for s in ("train", "val", "calibration", "id") for d in a.splits[s]}
    assert not shift_files & others
    # the training split is most of the text
    assert a.n_chars("train") > 0.7 * sum(a.n_chars(s) for s in ("train", "val", "calibration", "id"))
    # a different split rule is a different corpus
    assert load_corpus(DataConfig(val_fraction=0.05)).corpus_hash != a.corpus_hash


# ---------------------------------------------------------------------------------------- path:GLOB


def test_path_source_splits_every_file_once_and_hash_tracks_content(tmp_path):
    _write_corpus(tmp_path / "c", 80)
    _write_corpus(tmp_path / "s", 5, prefix="shifted", words=("zeta", "eta"))
    cfg = DataConfig(source=f"path:{tmp_path}/c/*.txt", shift=f"path:{tmp_path}/s/*.txt")
    corpus = load_corpus(cfg)
    pooled = [d for s in ("train", "val", "calibration", "id") for d in corpus.splits[s]]
    assert sorted(pooled) == sorted(p.read_text() for p in (tmp_path / "c").glob("*.txt"))
    assert all(corpus.splits[s] for s in ("train", "val", "calibration", "id"))
    assert len(corpus.splits["shift"]) == 5 and corpus.eval_sets == ["id", "shift"]
    h = corpus.corpus_hash
    (tmp_path / "c" / "doc000.txt").write_text("changed\n" * 50)
    assert load_corpus(cfg).corpus_hash != h
    # without a shift glob there is no shifted set, and the corpus says so
    plain = load_corpus(DataConfig(source=f"path:{tmp_path}/c/*.txt"))
    assert plain.eval_sets == ["id"] and plain.shift_note is None


def test_few_files_are_cut_into_blocks(tmp_path):
    for i in range(3):
        (tmp_path / f"big{i}.txt").write_text("".join(f"line {j} of file {i}\n" for j in range(3000)))
    corpus = load_corpus(DataConfig(source=f"path:{tmp_path}/*.txt"))
    assert all(corpus.splits[s] for s in ("train", "val", "calibration", "id"))


@pytest.mark.parametrize("setup,match", [
    (lambda d: None, "no files match"),
    (lambda d: [(d / f"e{i}.txt").write_text("") for i in range(3)], "empty"),
    (lambda d: [(d / "a.txt").write_text("text\n" * 9), (d / "b.txt").write_bytes(b"ELF\0\1" * 99)],
     r"b\.txt holds NUL bytes"),
    (lambda d: [(d / "a.txt").write_text("text\n" * 9), (d / "c.txt").write_bytes(bytes(range(128, 256)) * 9)],
     r"c\.txt is mostly not UTF-8 text \(1152 of its first 1152 bytes"),
])
def test_path_source_bad_input(tmp_path, setup, match):
    setup(tmp_path)
    cfg = DataConfig(source=f"path:{tmp_path}/*.txt")
    with pytest.raises(HeadroomInputError, match=match):
        check_source(cfg)
    with pytest.raises(HeadroomInputError, match=match):
        load_corpus(cfg)


def test_text_that_is_not_utf8_everywhere_is_still_text(tmp_path):
    """Latin-1 prose (a few bytes in a hundred that are not UTF-8) and UTF-8 with every script stay text."""
    (tmp_path / "latin1.txt").write_bytes(("caf\u00e9 na\u00efve r\u00e9sum\u00e9 " * 40).encode("latin-1"))
    (tmp_path / "utf8.txt").write_text("\u65e5\u672c\u8a9e \u0420\u0443\u0441 \U0001F600 " * 40)
    assert check_source(DataConfig(source=f"path:{tmp_path}/*.txt")) is None  # refused files raise


def test_unknown_source_string():
    with pytest.raises(ValueError, match="unknown data source"):
        DataConfig(source="ftp://x")


# ------------------------------------------------------------------------------------------ tokenisers


def test_bpe_trained_on_train_split_and_cached(tmp_path, cache_dir):
    _write_corpus(tmp_path / "c", 60)
    cfg = DataConfig(source=f"path:{tmp_path}/c/*.txt", tokenizer="bpe", bpe_vocab_size=300)
    corpus = load_corpus(cfg)
    tok = make_tokenizer(cfg, corpus)
    assert tok.vocab_size <= 300 and tok.mask_id is not None and tok.eos_id is not None
    text = "alpha beta gamma delta"
    assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode(text)) < len(text.encode())  # merges learned
    cached = list((cache_dir / "bpe").glob(f"{corpus.corpus_hash}-300.json"))
    assert len(cached) == 1
    mtime = cached[0].stat().st_mtime_ns
    make_tokenizer(cfg, corpus)
    assert cached[0].stat().st_mtime_ns == mtime  # reused, not retrained


def test_subword_streams_are_prepared_once(tmp_path, cache_dir):
    """The second data module on the same source reads the prepared streams the first wrote (their equality with
    a fresh encoding is tests/test_prepared.py's)."""
    from lightning_modules.data.datamodule import HeadroomData

    _write_corpus(tmp_path / "c", 60)
    cfg = DataConfig(source=f"path:{tmp_path}/c/*.txt", tokenizer="bpe", bpe_vocab_size=300)
    first = HeadroomData(cfg, TrainConfig(steps=1, seq_len=16, batch_size=2), "decoder").prepare()
    files = sorted((cache_dir / "prepared" / first.corpus_hash).glob("*.bin"))
    assert {f.stem for f in files} == set(first.streams)
    mtimes = [f.stat().st_mtime_ns for f in files]
    second = HeadroomData(cfg, TrainConfig(steps=1, seq_len=16, batch_size=2), "decoder").prepare()
    assert [f.stat().st_mtime_ns for f in files] == mtimes  # read, not rewritten
    assert second.prepared.path == first.prepared.path


def test_byte_tokenizer_round_trip_and_unigram_entropy():
    tok = make_tokenizer(DataConfig(), None)
    s = "déjà vu — ok"
    assert tok.decode(tok.encode(s)) == s
    # hand-computed: two symbols, equally frequent → ln 2
    assert unigram_entropy_of(np.array([0, 1, 0, 1]), 260) == pytest.approx(np.log(2))


# ------------------------------------------------------------------------------------- sample order


def test_train_order_is_seeded_and_resumable():
    stream = np.arange(10_000, dtype=np.int32) % 256
    a = TrainWindows(stream, 32, seed=0, n_samples=700)
    b = TrainWindows(stream, 32, seed=1, n_samples=700)
    starts_a = [a.start_of(j) for j in range(700)]
    assert starts_a != [b.start_of(j) for j in range(700)]
    # one epoch visits every window once, then the next epoch reshuffles
    epoch = starts_a[:a.n_windows]
    assert len(set(epoch)) == a.n_windows
    assert starts_a[a.n_windows:2 * a.n_windows] != epoch
    # resuming at sample k gives exactly the samples an uninterrupted run would see
    resumed = TrainWindows(stream, 32, seed=0, n_samples=700, start=250)
    assert len(resumed) == 700  # as long as a whole run's loader (see TrainWindows)
    for i in (0, 1, 57, 449):
        assert torch.equal(resumed[i]["input_ids"], a[250 + i]["input_ids"])


def test_mlm_masking():
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 256, 20_000)
    inputs, labels = mlm_mask(ids, np.random.default_rng(1), 0.15, mask_id=257, n_regular=256)
    chosen = labels != -100
    assert 0.14 < chosen.mean() < 0.16
    assert np.array_equal(labels[chosen], ids[chosen])
    assert np.array_equal(inputs[~chosen], ids[~chosen])
    frac_mask = (inputs[chosen] == 257).mean()
    frac_same = (inputs[chosen] == ids[chosen]).mean()
    assert 0.77 < frac_mask < 0.83 and 0.08 < frac_same < 0.13


def test_eval_windows_are_fixed_for_every_run():
    stream = np.arange(5_000, dtype=np.int32) % 256
    mlm = {"prob": 0.15, "mask_id": 257, "n_regular": 256}
    a, b = EvalWindows(stream, 64, 20, mlm), EvalWindows(stream, 64, 20, mlm)
    assert len(a) == 20
    for i in range(20):
        assert torch.equal(a[i]["input_ids"], b[i]["input_ids"]) and torch.equal(a[i]["labels"], b[i]["labels"])


def test_mqar_answers_are_the_recalled_values():
    ds = MQAR(seq_len=64, n_pairs=8, stream_seed=0, n_samples=5)
    for i in range(5):
        x, y = ds[i]["input_ids"].tolist(), ds[i]["labels"].tolist()
        table = dict(zip(x[0:16:2], x[1:16:2]))
        answers = [t for t in range(len(y)) if y[t] != -100]
        assert len(answers) == (64 - 16) // 2
        for t in answers:
            assert x[t - 1] in table and y[t] == table[x[t - 1]]
    enc = MQAR(seq_len=64, n_pairs=8, stream_seed=0, n_samples=1, mask_id=257)[0]
    assert (enc["input_ids"][enc["labels"] != -100] == 257).all()


def test_datamodule_splits_and_vocab(tmp_path):
    _write_corpus(tmp_path / "c", 60)
    tcfg = train_config_for("xs", seq_len=64, batch_size=4)
    dm = HeadroomData(DataConfig(source=f"path:{tmp_path}/c/*.txt"), tcfg, "encoder").prepare()
    assert dm.vocab_size == 260 and dm.eval_sets == ["id"]
    batch = next(iter(dm.loader("calibration", 1)))
    assert batch["input_ids"].shape == (4, 64)
    assert ((batch["labels"] != -100).sum(1) > 0).all()
    mq = HeadroomData(DataConfig(source="mqar"), tcfg, "decoder").prepare()
    assert mq.eval_sets == ["id", "shift"] and mq.corpus_hash.startswith("mqar-")
    shift = next(iter(mq.loader("shift", 1)))
    assert (shift["labels"] != -100).sum() > 0


def test_split_too_small_for_seq_len(tmp_path):
    for i in range(60):  # 60 short files: each held-out split gets a single short document
        (tmp_path / f"f{i}.txt").write_text(f"short file {i}\n")
    dm = HeadroomData(DataConfig(source=f"path:{tmp_path}/*.txt"), train_config_for("xs", seq_len=256), "decoder")
    with pytest.raises(HeadroomInputError, match="fewer than 256 tokens"):
        dm.prepare()


# ------------------------------------------------------------------------- duplicates and held-out windows


def test_duplicate_documents_are_removed_before_splitting(tmp_path):
    """Copies of a document (up to line endings and trailing spaces) are one document: after splitting, no text sits
    in two splits. A shifted set keeps its documents; a training copy of one leaves train."""
    _write_corpus(tmp_path / "c", 80)
    src = (tmp_path / "c" / "doc007.txt").read_text()
    for i in range(5):  # five copies, one with CRLF line endings and trailing blanks
        text = src.replace("\n", "\r\n") + "  \n\n" if i == 0 else src
        (tmp_path / "c" / f"copy{i}.txt").write_text(text)
    shifted = _write_corpus(tmp_path / "s", 3, prefix="shifted", words=("zeta", "eta"))
    (tmp_path / "c" / "leak.txt").write_text((shifted / "shifted001.txt").read_text())
    corpus = load_corpus(DataConfig(source=f"path:{tmp_path}/c/*.txt", shift=f"path:{tmp_path}/s/*.txt"))
    from lightning_modules.data.corpus import normalised_hash

    where = {}
    for split, docs in corpus.splits.items():
        for d in docs:
            where.setdefault(normalised_hash(d), []).append(split)
    assert all(len(v) == 1 for v in where.values()), {k: v for k, v in where.items() if len(v) > 1}
    assert where[normalised_hash(src)] != ["shift"] and len(where) == 80 + 3
    assert where[normalised_hash((shifted / "shifted001.txt").read_text())] == ["shift"]
    assert corpus.meta["duplicates_removed"] == 5 + 1


def test_window_hashes_equal_a_direct_polynomial():
    from lightning_modules.data.decontaminate import _HASH_BASE, window_hashes

    rng = np.random.default_rng(0)
    x = rng.integers(0, 300, 500).astype(np.int32)
    h = window_hashes(x, 7)
    B = int(_HASH_BASE)
    for i in range(0, len(h), 23):
        v = 0
        for k in range(7):
            v = (v * B + int(x[i + k]) + 1) % 2**64
        assert int(h[i]) == v


def test_hashes_at_starts_equal_the_direct_polynomial_and_every_offset_hash():
    """The held-out split's windows are hashed only at their starts (memory of the starts, not of the split): the
    same values as the direct polynomial and as window_hashes at those offsets, for both stream dtypes."""
    from lightning_modules.data.decontaminate import _HASH_BASE, hashes_at, window_hashes

    rng = np.random.default_rng(1)
    B = int(_HASH_BASE)
    for dtype in (np.uint16, np.int32):
        x = rng.integers(0, 60000, 3000).astype(dtype)
        starts = np.arange(0, len(x) - 16, 11, dtype=np.int64)
        got = hashes_at(x, starts, 16)
        assert np.array_equal(got, window_hashes(x, 16)[starts])
        for i in (0, 5, len(starts) - 1):
            v = 0
            for k in range(16):
                v = (v * B + int(x[starts[i] + k]) + 1) % 2**64
            assert int(got[i]) == v


def test_no_eval_window_occurs_in_the_train_stream():
    """On the embedded corpus, the windows a run is evaluated (or scored) on are absent from the training text at
    every offset, checked here by plain substring search: every window of `id` (the primary eval set), a sample of
    the other splits; and every window left out does occur in train (the filter drops nothing else). Without the
    filter, shared boilerplate (codec tables, licence headers) puts some held-out windows verbatim in train."""
    import random

    seq = 128
    dm = HeadroomData(DataConfig(), train_config_for("xs", seq_len=seq)).prepare()
    train = dm.streams["train"].astype(np.uint8).tobytes()
    rng = random.Random(0)
    excluded = 0
    for split in ("id", "val", "calibration", "shift"):
        stream = dm.streams[split].astype(np.uint8).tobytes()
        used = [int(s) for s in dm.split_dataset(split, 1 << 30).starts]
        assert len(used) > 100
        checked = used if split == "id" else rng.sample(used, 200)
        assert not any(stream[s:s + seq] in train for s in checked), split
        left_out = sorted(set(range(0, len(stream) - seq + 1, seq)) - set(used))
        assert all(stream[s:s + seq] in train for s in left_out), split
        excluded += len(left_out)
        info = dm.eval_windows(split, None)
        assert info["windows"] == len(used) == info["split_windows"] - info["excluded"]
    assert excluded > 0  # the filter had something to do


def test_whole_split_evaluation_by_default(tmp_path):
    """eval_batches None scores every clean window of a split (up to the stated cap), and says how many tokens."""
    from lightning_modules.declarations.config import model_config_for
    from lightning_modules.models.build import build_model
    from lightning_modules.training.lm import evaluate

    _write_corpus(tmp_path / "c", 60)
    tcfg = train_config_for("xs", seq_len=64, batch_size=4)
    dm = HeadroomData(DataConfig(source=f"path:{tmp_path}/c/*.txt"), tcfg, "decoder").prepare()
    windows = len(dm.clean_starts("id"))
    assert windows > 4  # more than one batch: the whole split, not a fixed number of batches
    got = evaluate(build_model(model_config_for("xs"), 0), dm.loader("id", None), per_window=True)
    assert got["tokens"] == windows * 63 and len(got["window_loss"]) == windows
    assert sum(got["window_loss"]) / got["tokens"] == pytest.approx(got["loss"])
