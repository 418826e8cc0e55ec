"""hf: sources (Hugging Face datasets, read through `datasets.load_dataset` on local files the tests write): the
dataset's own splits or the hash rule, and documents held as rows of the Arrow tables, split exactly as lists of
strings would be."""

import pytest

from lightning_modules.data.corpus import check_source, load_corpus
from lightning_modules.declarations.config import DataConfig, HeadroomInputError

# -------------------------------------------------------------------------------------- hf:NAME[:CFG]


def test_hf_source_through_datasets_on_local_files(tmp_path):
    """The `datasets.load_dataset` code path that reads a hub dataset, on a local directory of text files."""
    d = tmp_path / "ds"
    d.mkdir()
    lines = {split: [f"{split} sentence {i} " + "word " * (i % 7 + 3) for i in range(n)]
             for split, n in (("train", 400), ("validation", 40), ("test", 40))}
    for split, ls in lines.items():
        (d / f"{split}.txt").write_text("\n".join(ls) + "\n")
    corpus = load_corpus(DataConfig(source=f"hf:{d}"))
    assert corpus.splits["val"] == lines["validation"]
    assert corpus.splits["id"] == lines["test"]
    assert set(corpus.splits["calibration"]) | set(corpus.splits["train"]) == set(lines["train"])
    assert not set(corpus.splits["calibration"]) & set(corpus.splits["train"])
    assert corpus.eval_sets == ["id"]
    # a dataset with one split is divided by the same hash rule as files
    d2 = tmp_path / "one"
    d2.mkdir()
    (d2 / "train.txt").write_text("\n".join(lines["train"]) + "\n")
    one = load_corpus(DataConfig(source=f"hf:{d2}"))
    assert all(one.splits[s] for s in ("train", "val", "calibration", "id"))


def _reference_hf_splits(d, cfg):
    """The split rule on plain lists of strings, written out as a loop over the rows (the loader holds rows of the
    Arrow tables and digests instead): what every hf: corpus was before the loader streamed."""
    import datasets

    from lightning_modules.data.corpus import MIN_UNITS, _unit_fraction, normalised_hash
    from lightning_modules.data.splits import _blocks

    def split_units(units, cfg):  # rank by (hash of the name, name); the first round(f·N) to val, calibration, id
        if len(units) < MIN_UNITS:
            units = [(f"{k}#{i}", b) for k, t in units for i, b in enumerate(_blocks(t))]
        n = len(units)
        order = sorted(range(n), key=lambda i: (_unit_fraction(units[i][0]), units[i][0]))
        where, pos = ["train"] * n, 0
        for split, f in (("val", cfg.val_fraction), ("calibration", cfg.calibration_fraction),
                         ("id", cfg.eval_fraction)):
            for i in order[pos:pos + max(1, round(f * n))]:
                where[i] = split
            pos += max(1, round(f * n))
        out = {s: [] for s in ("train", "val", "calibration", "id")}
        for (_, t), s in zip(units, where):
            out[s].append(t)
        return out

    def dedupe(units):
        seen, out = set(), []
        for k, t in units:
            if normalised_hash(t) not in seen:
                seen.add(normalised_hash(t))
                out.append((k, t))
        return out

    dd = datasets.load_dataset(str(d))
    rows = {s: [t for t in ds["text"] if t and t.strip()] for s, ds in dd.items()}
    n = sum(map(len, rows.values()))
    rows = {s: [t for _, t in dedupe(list(enumerate(ts)))] for s, ts in rows.items()}
    if all(rows.get(s) for s in ("train", "validation", "test")):
        tr = rows["train"]
        cal = set(sorted(range(len(tr)), key=lambda i: _unit_fraction(f"train/{i}"))[:max(1, round(
            cfg.calibration_fraction * len(tr)))])
        splits = {"train": [t for i, t in enumerate(tr) if i not in cal], "val": rows["validation"],
                  "calibration": [t for i, t in enumerate(tr) if i in cal], "id": rows["test"]}
        dups = n - sum(map(len, rows.values()))
    else:
        units = dedupe([(f"{s}/{i}", t) for s in sorted(rows) for i, t in enumerate(rows[s])])
        splits, dups = split_units(units, cfg), n - len(units)
    held = {normalised_hash(t) for s, ts in splits.items() if s != "train" for t in ts}
    kept = [t for t in splits["train"] if normalised_hash(t) not in held]
    return {**splits, "train": kept}, dups + len(splits["train"]) - len(kept)


@pytest.mark.parametrize("layout", [{"train": 400, "validation": 40, "test": 40}, {"train": 300, "validation": 30},
                                    {"train": 500}, {"train": 30}])
def test_hf_documents_streamed_from_arrow_split_as_lists_of_strings_would_be(tmp_path, layout):
    """The loader holds a dataset's documents as rows of its Arrow tables with their digests, never as one list of
    strings; its splits, duplicate count and corpus hash equal the list-of-strings rule on the same rows (with
    repeats within and across splits, None and blank rows, line-ending variants that deduplicate)."""
    import hashlib
    import json
    import random

    from lightning_modules.data.arrowdocs import ArrowDocs

    rng = random.Random(len(layout) * 1000 + sum(layout.values()))
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa".split()
    pool = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 40))) for _ in range(150)]
    d = tmp_path / "ds"
    d.mkdir()
    for split, n in layout.items():
        with open(d / f"{split}.jsonl", "w") as f:
            for _ in range(n):
                r = rng.random()
                t = (rng.choice(pool) + rng.choice(["", "\n", "  \n\n", "\r\n"]) if r < 0.35 else None if r < 0.38
                     else "   " if r < 0.41 else " ".join(rng.choice(words) for _ in range(rng.randint(3, 40))))
                f.write(json.dumps({"text": t}) + "\n")
    cfg = DataConfig(source=f"hf:{d}")
    corpus = load_corpus(cfg)
    splits, dups = _reference_hf_splits(d, cfg)
    assert {s: list(ts) for s, ts in corpus.splits.items()} == splits
    assert corpus.meta["duplicates_removed"] == dups and (dups > 0 or sum(layout.values()) < 50)
    if sum(layout.values()) >= 50:
        assert all(isinstance(ts, ArrowDocs) for ts in corpus.splits.values())  # held as rows, not strings
    h = hashlib.sha256(json.dumps([cfg.val_fraction, cfg.calibration_fraction, cfg.eval_fraction, ""]).encode())
    for s in sorted(splits):
        h.update(s.encode() + b"\0")
        for t in splits[s]:
            h.update(hashlib.sha256(t.encode()).digest())
    assert corpus.corpus_hash == h.hexdigest()[:16]
    assert {s: corpus.n_chars(s) for s in splits} == {s: sum(map(len, ts)) for s, ts in splits.items()}


def test_split_codes_break_ties_of_the_hash_by_the_name_as_a_sort_would():
    """split_codes ranks by fraction with numpy and sorts only runs of equal fractions by key: on fractions drawn
    from a few values (runs of every length) it assigns what sorting by (fraction, key) assigns."""
    import random

    import numpy as np

    from lightning_modules.data.splits import SPLIT_ORDER, split_codes

    rng = random.Random(3)
    cfg = DataConfig(val_fraction=0.2, calibration_fraction=0.1, eval_fraction=0.15)
    for n in (5, 40, 333):
        keys = [f"k{rng.randrange(10**6)}" for _ in range(n)]
        frac = np.array([rng.choice([0.1, 0.5, 0.7, 0.9]) for _ in range(n)])
        order = sorted(range(n), key=lambda i: (frac[i], keys[i]))
        want, pos = ["train"] * n, 0
        for split, f in (("val", 0.2), ("calibration", 0.1), ("id", 0.15)):
            for i in order[pos:pos + max(1, round(f * n))]:
                want[i] = split
            pos += max(1, round(f * n))
        assert [SPLIT_ORDER[c] for c in split_codes(frac, keys.__getitem__, cfg)] == want


def test_hf_missing_local_directory():
    with pytest.raises(HeadroomInputError, match="no such directory"):
        check_source(DataConfig(source="hf:/nonexistent/dataset"))
