"""Data at scale: the driver's one-time preparation and one trial's data setup, on two synthetic corpora a stated
ratio apart, written to JSON. Goal: a trial's setup time and peak RSS grow by at most 1.2× across the ratio.

    python benchmarks/data_scale.py [--small-mb 50] [--ratio 4] [--repeats 5] [--bpe-vocab 8192] [--tiny]

The corpora are TinyStories-shaped (`train.jsonl` and `validation.jsonl` with a `text` column, short stories from a
small grammar, seeded), read through `hf:<dir>` with a BPE tokenizer, as sweeps/scales.yaml reads TinyStories. The
driver's side is measured once per corpus (it runs once per data source): `prepared.prepare` and the clean window
starts at the trial's sequence length, in a fresh process and a fresh cache, wall seconds and peak RSS. A trial's
side is a fresh process that opens the prepared data by its hash (as every sweep trial does), builds the train,
validation and eval loaders and draws one batch of each: the seconds from the data module's creation to that batch,
and the process's peak RSS (importing torch included: the same on both sides). Trial setups are measured
interleaved (benchmarks/measure.py): an untimed warm-up round, then `--repeats` rounds of one setup on each corpus,
the order rotating; the answers are the medians of the per-round large ÷ small ratios of time and of peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from measure import at_most, combine, interleave, summarize  # noqa: E402

GOAL = 1.2  # large ÷ small, for a trial's setup time and peak RSS
SEQ_LEN = 256

NAMES = ["Lily", "Tom", "Mia", "Ben", "Sue", "Max", "Anna", "Sam", "Zoe", "Leo", "Ella", "Jack"]
ANIMALS = ["cat", "dog", "bird", "fish", "bunny", "frog", "duck", "bear", "mouse", "fox"]
THINGS = ["ball", "kite", "box", "tree", "boat", "cake", "hat", "book", "car", "flower", "rock", "cup"]
ADJ = ["big", "small", "red", "happy", "sad", "shiny", "soft", "old", "funny", "little", "blue", "brave"]
VERBS = ["saw", "found", "liked", "wanted", "lost", "made", "took", "gave", "shared", "hid", "painted", "fixed"]
PLACES = ["park", "garden", "house", "forest", "beach", "school", "shop", "river", "hill", "farm"]
FEEL = ["happy", "sad", "scared", "proud", "tired", "excited", "sorry", "surprised"]


def story(rng: random.Random) -> str:
    """One short story from the grammar (a few sentences about one child, one animal and one thing)."""
    name, animal, thing, place = rng.choice(NAMES), rng.choice(ANIMALS), rng.choice(THINGS), rng.choice(PLACES)
    out = [f"Once upon a time, there was a {rng.choice(ADJ)} {animal} named {name}."]
    for _ in range(rng.randint(3, 9)):
        kind = rng.randrange(4)
        if kind == 0:
            out.append(f"{name} {rng.choice(VERBS)} a {rng.choice(ADJ)} {rng.choice(THINGS)} in the {place}.")
        elif kind == 1:
            out.append(f"The {animal} felt {rng.choice(FEEL)} because the {thing} was {rng.choice(ADJ)}.")
        elif kind == 2:
            out.append(f'"Can I play with your {thing}?" asked {rng.choice(NAMES)}.')
        else:
            out.append(f"They went to the {rng.choice(PLACES)} and {rng.choice(VERBS)} a {rng.choice(THINGS)}.")
    out.append(f"In the end, {name} and the {animal} were {rng.choice(FEEL)}.")
    return " ".join(out)


def write_corpus(root: Path, mb: float, seed: int) -> dict:
    """train.jsonl (99%) and validation.jsonl (1%) of about `mb` megabytes of stories."""
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    target = int(mb * 1e6)
    sizes = {"train": 0, "validation": 0}
    counts = {"train": 0, "validation": 0}
    with open(root / "train.jsonl", "w") as tr, open(root / "validation.jsonl", "w") as va:
        while sizes["train"] + sizes["validation"] < target:
            split = "validation" if rng.random() < 0.01 else "train"
            text = story(rng)
            (va if split == "validation" else tr).write(json.dumps({"text": text}) + "\n")
            sizes[split] += len(text)
            counts[split] += 1
    return {"characters": sum(sizes.values()), "stories": sum(counts.values())}


_DRIVER = """
import json, resource, sys, threading, time
peak_anon = [0]  # anonymous memory (kB): what the process holds itself, not the file pages it maps (reclaimable)
def watch():
    while True:
        with open("/proc/self/status") as f:
            kb = next((int(l.split()[1]) for l in f if l.startswith("RssAnon:")), 0)
        peak_anon[0] = max(peak_anon[0], kb)
        time.sleep(0.02)
threading.Thread(target=watch, daemon=True).start()
t0 = time.perf_counter()
from lightning_modules.declarations.config import DataConfig
from lightning_modules.data.prepared import prepare
p = prepare(DataConfig(source=sys.argv[1], tokenizer="bpe", bpe_vocab_size=int(sys.argv[2])))
for split in p.streams:
    if split != "train":
        p.clean_starts(split, int(sys.argv[3]))
time.sleep(0.05)
print(json.dumps({"seconds": time.perf_counter() - t0, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "peak_anon_mb": peak_anon[0] / 1024, "data_hash": p.data_hash, "tokens": p.manifest["tokens"]}))
"""

_TRIAL = """
import json, resource, sys, time
import torch  # before the clock: a trial has it loaded already
from lightning_modules.declarations.config import DataConfig, TrainConfig
from lightning_modules.data.datamodule import HeadroomData
t0 = time.perf_counter()
cfg = DataConfig(source=sys.argv[1], tokenizer="bpe", bpe_vocab_size=int(sys.argv[2]))
tc = TrainConfig(steps=1000, seq_len=int(sys.argv[3]), batch_size=16, val_batches=4, eval_batches=16)
d = HeadroomData(cfg, tc, "decoder", data_hash=sys.argv[4]).prepare()
next(iter(d.train_dataloader())); next(iter(d.val_dataloader())); next(iter(d.loader("id", tc.eval_batches)))
print(json.dumps({"seconds": time.perf_counter() - t0,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _python(code: str, *args, cache: Path) -> dict:
    env = {**os.environ, "HEADROOM_CACHE": str(cache), "PYTHONPATH": str(ROOT), "HF_DATASETS_CACHE": str(cache / "hf"),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    r = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, env=env,
                       cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"data_scale: a measured process failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


TINYSTORIES_GB = 1.9  # characters of TinyStories' train and validation text, in 1e9 (sweeps/scales.yaml's data)


def _fit(corpora: dict, driver: dict) -> dict:
    """The driver's seconds and peak RSS as a + b·GB through the two corpora, and both at TinyStories' size (an
    extrapolation: the synthetic grammar has a far smaller vocabulary than real stories)."""
    gb = {n: corpora[n]["characters"] / 1e9 for n in ("small", "large")}
    out = {}
    for key, unit in (("seconds", "s"), ("peak_rss_mb", "mb"), ("peak_anon_mb", "anon_mb")):
        slope = (driver["large"][key] - driver["small"][key]) / (gb["large"] - gb["small"])
        fixed = driver["small"][key] - slope * gb["small"]
        out[f"{unit}_per_gb"] = slope
        out[f"fixed_{unit}"] = fixed
        out[f"tinystories_{unit}"] = fixed + slope * TINYSTORIES_GB
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small-mb", type=float, default=50.0, help="size of the smaller corpus, megabytes of text")
    ap.add_argument("--ratio", type=float, default=4.0, help="the larger corpus is this many times the smaller")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved rounds of trial setups")
    ap.add_argument("--bpe-vocab", type=int, default=8192)
    ap.add_argument("--seq-len", type=int, default=SEQ_LEN)
    ap.add_argument("--tiny", action="store_true",
                    help="CI size: 0.2 MB and 0.8 MB, BPE 512, 2 rounds and no warm-up round (it checks the JSON)")
    ap.add_argument("--workdir", default=None, help="where the corpora and caches go (default: a temporary dir)")
    ap.add_argument("--out", default="benchmarks/results/data_scale.json")
    args = ap.parse_args(argv)
    if args.tiny:
        args.small_mb, args.ratio, args.repeats, args.bpe_vocab = 0.2, 4.0, 2, 512
    if args.ratio < 4:
        raise SystemExit("data_scale: --ratio must be at least 4")

    work = Path(args.workdir or tempfile.mkdtemp(prefix="headroom-data-scale-"))
    corpora, driver = {}, {}
    for name, seed in (("small", 0), ("large", 1)):
        # the larger corpus at least `ratio` times the smaller one as written
        mb = args.small_mb if name == "small" else args.ratio * corpora["small"]["characters"] / 1e6
        t = time.perf_counter()
        corpora[name] = {**write_corpus(work / name, mb, seed), "generate_s": round(time.perf_counter() - t, 2)}
        d = _python(_DRIVER, f"hf:{work / name}", args.bpe_vocab, args.seq_len, cache=work / f"cache-{name}")
        gb = corpora[name]["characters"] / 1e9
        driver[name] = {**d, "s_per_gb": d["seconds"] / gb, "peak_rss_mb_per_gb": d["peak_rss_mb"] / gb}

    def setup(name):
        got = {}

        def side():
            r = _python(_TRIAL, f"hf:{work / name}", args.bpe_vocab, args.seq_len, driver[name]["data_hash"],
                        cache=work / f"cache-{name}")
            got[name] = r
            return r
        return side

    sides = {n: setup(n) for n in ("small", "large")}
    rounds = interleave(sides, args.repeats, warmup_rounds=0 if args.tiny else 1)
    samples = [{"order": r["order"], **{f"{n}_{k}": r[n][k] for n in ("small", "large")
                                        for k in ("seconds", "peak_rss_mb")}} for r in rounds]
    time_ratio = summarize([s["large_seconds"] / s["small_seconds"] for s in samples], at_most(GOAL))
    rss_ratio = summarize([s["large_peak_rss_mb"] / s["small_peak_rss_mb"] for s in samples], at_most(GOAL))
    size_ratio = corpora["large"]["characters"] / corpora["small"]["characters"]
    result = {
        "benchmark": "data_scale", "goal": GOAL, "seq_len": args.seq_len, "bpe_vocab": args.bpe_vocab,
        "corpus_ratio": size_ratio, "corpora": corpora, "driver": driver,
        "driver_s_per_gb": driver["large"]["s_per_gb"], "driver_peak_rss_mb_per_gb": driver["large"]["peak_rss_mb_per_gb"],
        # driver cost as fixed + per-GB (the line through the two corpora) and extrapolated to TinyStories' text
        "driver_fit": _fit(corpora, driver),
        "samples": samples,
        "trial_setup_s": {n: summarize([s[f"{n}_seconds"] for s in samples])["median"] for n in ("small", "large")},
        "trial_peak_rss_mb": {n: summarize([s[f"{n}_peak_rss_mb"] for s in samples])["median"]
                              for n in ("small", "large")},
        "median_time_ratio": time_ratio["median"], "time_spread": time_ratio["spread"],
        "meets_goal_time": time_ratio["meets_goal"],
        "median_rss_ratio": rss_ratio["median"], "rss_spread": rss_ratio["spread"],
        "meets_goal_rss": rss_ratio["meets_goal"],
    }
    result["meets_goal"] = combine([result["meets_goal_time"], result["meets_goal_rss"]])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("corpus_ratio", "driver_s_per_gb", "driver_peak_rss_mb_per_gb", "driver_fit",
                                              "trial_setup_s", "trial_peak_rss_mb", "median_time_ratio",
                                              "median_rss_ratio", "meets_goal")}, indent=1))
    return result


if __name__ == "__main__":
    main()
