"""The LightningDataModule: token streams of every split, cut into windows, in an order fixed by the seed.

Training sample j (counting across steps) is a pure function of (seed, j): epoch e = j // n_windows walks a
permutation of the train stream's windows drawn from (seed, e), each epoch with its own random phase. So a run
resumed at step k continues with exactly the batches an uninterrupted run would have seen (the consumed count is
saved in the checkpoint), and two arms with the same seed see the same data in the same order.

Data-parallel training (DDP, `world` > 1 ranks) keeps the global batch: of the B samples of each step, rank r
takes the r-th contiguous B/world of them, so the ranks together see exactly the batches one process would.
Validation windows are dealt out among the ranks and their loss sums added (lm.py), so the validation loss is that
of one process too.

Evaluation windows are evenly spaced over the split and masked (encoder) with a fixed seed: every run, seed and arm
is scored on the same tokens.
"""

from __future__ import annotations

import copy

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_modules.data.corpus import EVAL_SETS
from lightning_modules.data.prepared import Prepared, epoch_order, open_prepared, prepare
from lightning_modules.data.tokens import MQAR_PAIRS, MQAR_STREAMS, ByteTokenizer, mqar_hash, unigram_entropy_of
from lightning_modules.declarations.config import EVAL_CAP_TOKENS, DataConfig, HeadroomInputError, TrainConfig

EVAL_MASK_SEED = 1_000_003  # one masking of each eval window for all runs
_CLEAN_STARTS: dict = {}  # (data hash, split, seq_len) -> clean window starts, per process


def mlm_mask(ids: np.ndarray, rng: np.random.Generator, prob: float, mask_id: int, n_regular: int):
    """BERT masking: choose `prob` of the positions (at least one) to predict; of those 80% become the mask
    token, 10% a random regular token, 10% stay. Returns (inputs, labels with -100 where nothing is predicted)."""
    ids = ids.astype(np.int64)
    chosen = rng.random(ids.shape[0]) < prob
    if not chosen.any():
        chosen[rng.integers(ids.shape[0])] = True
    labels = np.where(chosen, ids, -100)
    inputs = ids.copy()
    r = rng.random(ids.shape[0])
    inputs[chosen & (r < 0.8)] = mask_id
    rand = chosen & (r >= 0.8) & (r < 0.9)
    inputs[rand] = rng.integers(0, n_regular, rand.sum())
    return inputs, labels


class _Windows(Dataset):
    def __init__(self, stream: np.ndarray, seq_len: int, mlm: dict | None):
        self.stream, self.seq_len, self.mlm = stream, seq_len, mlm

    def _item(self, start: int, mask_rng_seed) -> dict:
        ids = self.stream[start:start + self.seq_len]
        if self.mlm is None:
            x = torch.from_numpy(ids.astype(np.int64))
            return {"input_ids": x, "labels": x.clone()}
        inputs, labels = mlm_mask(ids, np.random.default_rng(mask_rng_seed), **self.mlm)
        return {"input_ids": torch.from_numpy(inputs), "labels": torch.from_numpy(labels)}


class TrainWindows(_Windows):
    """Samples start, start+1, ... of the seeded training order (see module docstring), n_samples of them.

    A resumed run's loader is as long as a whole run's: Lightning restores the checkpoint's batch index and ends
    the epoch when that index reaches the loader's length, so a loader of only the remaining samples would end
    the epoch early and be iterated again from its start — the last steps of the run would repeat earlier data.
    The samples past the run's end are never reached (max_steps stops training first)."""

    def __init__(self, stream, seq_len, seed: int, n_samples: int, start: int = 0, mlm: dict | None = None,
                 orders=None):
        super().__init__(stream, seq_len, mlm)
        self.n_windows = (len(stream) - seq_len) // seq_len
        if self.n_windows < 1:
            raise HeadroomInputError(f"train split ({len(stream)} tokens) is shorter than two windows of {seq_len}")
        self.seed, self.n_samples, self.start = seed, n_samples, start
        self._epochs: dict[int, tuple[int, np.ndarray]] = {}
        self._orders = orders or epoch_order  # a prepared dataset's stored orders (Prepared.train_order), or drawn

    def __len__(self) -> int:
        return self.n_samples

    def start_of(self, j: int) -> int:
        epoch, k = divmod(j, self.n_windows)
        if epoch not in self._epochs:
            self._epochs = {epoch: self._orders(self.seed, epoch, self.n_windows, self.seq_len)}
        phase, perm = self._epochs[epoch]
        return phase + int(perm[k]) * self.seq_len

    def __getitem__(self, i: int) -> dict:
        j = self.start + i
        return self._item(self.start_of(j), [self.seed, j, 7])


class EvalWindows(_Windows):
    """Windows of a held-out split, the same for every run: the non-overlapping windows at `starts` (default: all
    of them), or n of those evenly spaced when n is smaller. Masking (encoder) is seeded by the window's start."""

    def __init__(self, stream, seq_len, n: int, mlm: dict | None = None, starts: np.ndarray | None = None):
        super().__init__(stream, seq_len, mlm)
        if starts is None:
            total = len(stream) // seq_len
            if total < 1:
                raise HeadroomInputError(f"split of {len(stream)} tokens is shorter than one window of {seq_len}")
            starts = np.arange(total, dtype=np.int64) * seq_len
        if len(starts) < 1:
            raise HeadroomInputError("split has no window that does not also occur in the training split")
        pick = np.unique(np.linspace(0, len(starts) - 1, min(n, len(starts))).round().astype(np.int64))
        self.starts = np.asarray(starts, dtype=np.int64)[pick]

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> dict:
        start = int(self.starts[i])
        return self._item(start, [EVAL_MASK_SEED, start])


class RankShard(Dataset):
    """Rank r's share of a training order batched B at a time: of the samples of step k (k·B .. k·B+B-1), the
    r-th contiguous block of B/world. Batched by B/world, rank r's k-th batch is its share of global batch k."""

    def __init__(self, dataset: Dataset, batch_size: int, rank: int, world: int):
        if batch_size % world:
            raise HeadroomInputError(f"batch_size {batch_size} is not divisible by {world} data-parallel workers")
        self.dataset, self.per_rank, self.rank, self.world = dataset, batch_size // world, rank, world

    def __len__(self) -> int:
        return len(self.dataset) // self.world

    def __getitem__(self, i: int) -> dict:
        step, k = divmod(i, self.per_rank)
        return self.dataset[step * self.per_rank * self.world + self.rank * self.per_rank + k]


# ----------------------------------------------------------------------------------------------- MQAR


class MQAR(Dataset):
    """Multi-query associative recall (Arora et al. 2023, "Zoology"): key-value pairs, then queries of those keys;
    only the answers (the value after each queried key) are predicted. Keys are tokens 0..63, values 64..127.
    For the encoder family the answers are replaced by the mask token."""

    KEYS, VALUES = range(64), range(64, 128)

    def __init__(self, seq_len: int, n_pairs: int, stream_seed: int, n_samples: int, start: int = 0,
                 mask_id: int | None = None, pad_id: int = 256):
        if seq_len < 2 * n_pairs + 2:
            raise HeadroomInputError(f"mqar: seq_len {seq_len} too short for {n_pairs} pairs and a query")
        self.seq_len, self.n_pairs, self.stream_seed = seq_len, n_pairs, stream_seed
        self.n_samples, self.start, self.mask_id, self.pad_id = n_samples, start, mask_id, pad_id

    def __len__(self) -> int:
        return self.n_samples  # from start (see TrainWindows)

    def __getitem__(self, i: int) -> dict:
        rng = np.random.default_rng([self.stream_seed, self.start + i, 11])
        keys = rng.choice(len(self.KEYS), self.n_pairs, replace=False)
        values = rng.integers(len(self.VALUES), size=self.n_pairs) + self.VALUES.start
        ids = np.full(self.seq_len, self.pad_id, dtype=np.int64)
        labels = np.full(self.seq_len, -100, dtype=np.int64)
        ids[0:2 * self.n_pairs:2], ids[1:2 * self.n_pairs:2] = keys, values
        n_queries = (self.seq_len - 2 * self.n_pairs) // 2
        q = rng.integers(self.n_pairs, size=n_queries)
        pos = 2 * self.n_pairs + 2 * np.arange(n_queries)
        ids[pos], ids[pos + 1], labels[pos + 1] = keys[q], values[q], values[q]
        if self.mask_id is not None:
            ids[pos + 1] = self.mask_id
        return {"input_ids": torch.from_numpy(ids), "labels": torch.from_numpy(labels)}




# ----------------------------------------------------------------------------------------- DataModule


class HeadroomData(pl.LightningDataModule):
    """All splits of one data source for one family. Call `prepare()` (idempotent) before building a model: it
    loads the corpus and tokenizer and fixes `vocab_size`."""

    def __init__(self, data: DataConfig, train: TrainConfig, family: str = "decoder", num_workers: int = 0,
                 data_hash: str | None = None):
        super().__init__()
        self.data, self.train_cfg, self.family, self.num_workers = data, train, family, num_workers
        self.data_hash = data_hash  # a unit's: its prepared data is opened directly
        self.prepared: Prepared | None = None
        self.tokenizer = None
        self.streams: dict[str, np.ndarray] = {}
        self.samples_consumed = 0
        self._prepared = False

    # ---- loading
    def prepare(self) -> HeadroomData:
        if self._prepared:
            return self
        if self.data.source == "mqar":
            self.tokenizer = ByteTokenizer()
            self.corpus_hash = mqar_hash()
            self.shift_note = "MQAR with twice as many key-value pairs to recall (16 instead of 8)"
        else:
            p = open_prepared(self.data_hash) if self.data_hash else None
            if p is None:  # not prepared here (a first `headroom train`, a node without the shared cache)
                p = prepare(self.data)
                if self.data_hash and p.data_hash != self.data_hash:
                    raise HeadroomInputError(f"data {self.data.source}: its data hash is {p.data_hash} now, the "
                                             f"sweep was planned on {self.data_hash} (the data changed)")
            self.prepared = p
            self.tokenizer, self.corpus_hash, self.streams, self.shift_note = p.tokenizer, p.data_hash, p.streams, \
                p.shift_note
            seq = self.train_cfg.seq_len
            for s in ("val", "calibration", "id"):
                if len(self.streams.get(s, ())) < seq:
                    raise HeadroomInputError(f"data {self.data.source}: the {s} split has fewer than {seq} tokens")
            for s in self.streams:
                if s != "train":
                    self.clean_starts(s)  # data preparation, once: every loader of the split uses it
        if self.family == "encoder" and self.tokenizer.mask_id is None:
            raise HeadroomInputError("tokenizer has no mask token; the encoder family needs one")
        self._prepared = True
        return self

    def with_train(self, train: TrainConfig, start: int = 0) -> HeadroomData:
        """The same prepared data with another training configuration (a recovery fine-tune's steps and rate),
        read from sample `start` of the seeded order (a recovery fine-tune: where the dense run's training stopped,
        the samples Scratch-B's steps past T read too); this module is left as it was."""
        view = copy.copy(self)
        view.train_cfg, view.samples_consumed = train, start
        return view

    @property
    def vocab_size(self) -> int:
        return self.prepare().tokenizer.vocab_size

    @property
    def eval_sets(self) -> list[str]:
        self.prepare()
        if self.data.source == "mqar":
            return list(EVAL_SETS)
        return [s for s in EVAL_SETS if len(self.streams.get(s, ())) >= self.train_cfg.seq_len]

    def unigram_entropy(self, split: str = "val") -> float:
        """nats/token of the split's empirical unigram distribution (over the tokens the loss predicts)."""
        self.prepare()
        return unigram_entropy_of(self.streams[split], self.vocab_size)

    # ---- datasets
    def _mlm(self) -> dict | None:
        if self.family != "encoder":
            return None
        tok = self.tokenizer
        n_regular = 256 if tok.name == "byte" else tok.vocab_size
        return {"prob": self.train_cfg.mlm_probability, "mask_id": tok.mask_id, "n_regular": n_regular}

    def train_dataset(self, start: int = 0) -> Dataset:
        self.prepare()
        t = self.train_cfg
        n = t.steps * t.batch_size
        if self.data.source == "mqar":
            return MQAR(t.seq_len, MQAR_PAIRS["train"], 1000 + t.seed, n, start, self._mask_id())
        orders = self.prepared.train_order if self.prepared is not None else None
        return TrainWindows(self.streams["train"], t.seq_len, t.seed, n, start, self._mlm(), orders)

    def _mask_id(self):
        return self.tokenizer.mask_id if self.family == "encoder" else None

    def clean_starts(self, split: str) -> np.ndarray:
        """The split's window starts that `clean_window_starts` keeps: read from the prepared data (the driver
        computes them for every sequence length its plan uses), memoised per process."""
        key = (self.corpus_hash, split, self.train_cfg.seq_len)
        if key not in _CLEAN_STARTS:
            _CLEAN_STARTS[key] = self.prepared.clean_starts(split, self.train_cfg.seq_len)
        return _CLEAN_STARTS[key]

    def split_dataset(self, split: str, n_windows: int) -> Dataset:
        self.prepare()
        if self.data.source == "mqar":
            return MQAR(self.train_cfg.seq_len, MQAR_PAIRS[split], MQAR_STREAMS[split], n_windows,
                        mask_id=self._mask_id())
        if split not in self.streams:
            raise HeadroomInputError(f"data {self.data.source}: no {split} split")
        return EvalWindows(self.streams[split], self.train_cfg.seq_len, n_windows, self._mlm(),
                           starts=self.clean_starts(split))

    def loader(self, split: str, n_batches: int | None, batch_size: int | None = None) -> DataLoader:
        """Fixed batches of a held-out split (val, calibration, id, shift): `n_batches` batches, or with None every
        clean window of the split up to EVAL_CAP_TOKENS (evenly spaced when the split is longer)."""
        bs = batch_size or self.train_cfg.batch_size
        return DataLoader(self.split_dataset(split, self._n_windows(n_batches, bs)), batch_size=bs, shuffle=False,
                          num_workers=self.num_workers)

    def _n_windows(self, n_batches: int | None, batch_size: int | None = None) -> int:
        if n_batches is not None:
            return n_batches * (batch_size or self.train_cfg.batch_size)
        return max(1, EVAL_CAP_TOKENS // self.train_cfg.seq_len)

    def eval_windows(self, split: str, n_batches: int | None) -> dict:
        """How an eval set is measured: clean windows used, windows of the split, and those dropped because they
        also occur in the training stream."""
        self.prepare()
        used = len(self.split_dataset(split, self._n_windows(n_batches)))
        if self.data.source == "mqar":
            return {"windows": used, "split_windows": None, "excluded": 0}
        total = len(self.streams[split]) // self.train_cfg.seq_len
        return {"windows": used, "split_windows": total, "excluded": total - len(self.clean_starts(split))}

    # ---- Lightning hooks
    def _rank(self) -> tuple[int, int]:
        t = self.trainer
        return (int(t.global_rank), int(t.world_size)) if t is not None else (0, 1)

    def train_dataloader(self) -> DataLoader:
        rank, world = self._rank()
        bs = self.train_cfg.batch_size
        ds = self.train_dataset(self.samples_consumed)
        if world > 1:
            ds = RankShard(ds, bs, rank, world)
        return DataLoader(ds, batch_size=bs // world, shuffle=False, drop_last=True, num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        rank, world = self._rank()
        if world == 1:
            return self.loader("val", self.train_cfg.val_batches)
        ds = self.split_dataset("val", self._n_windows(self.train_cfg.val_batches))
        mine = torch.utils.data.Subset(ds, range(rank, len(ds), world))  # the ranks' sums add up to the whole
        return DataLoader(mine, batch_size=self.train_cfg.batch_size, shuffle=False, num_workers=self.num_workers)

    def state_dict(self) -> dict:
        step = self.trainer.global_step if self.trainer is not None else 0
        return {"samples_consumed": step * self.train_cfg.batch_size}

    def load_state_dict(self, state: dict) -> None:
        self.samples_consumed = int(state.get("samples_consumed", 0))
