"""Text → tokens: the byte and subword tokenisers, the identity of the token streams a run sees (what every unit
key and the plan's vocabulary rest on). Encoding a corpus into streams is prepared.py's. No torch here either."""

from __future__ import annotations

import hashlib
import json
import math
import os
import uuid
from pathlib import Path

import numpy as np

from lightning_modules.data.corpus import Corpus
from lightning_modules.declarations.config import (
    BYTE_VOCAB_SIZE,
    EOS_ID,
    MASK_ID,
    PAD_ID,
    DataConfig,
    HeadroomInputError,
)


class ByteTokenizer:
    """UTF-8 bytes are the tokens (ids 0..255), then pad, mask, eos."""

    name = "byte"
    vocab_size = BYTE_VOCAB_SIZE
    pad_id, mask_id, eos_id = PAD_ID, MASK_ID, EOS_ID
    n_special = 4

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", "replace")

    @staticmethod
    def for_transformers():
        """The same tokenizer as a transformers one (what a model logged to MLflow carries): byte-level BPE
        without merges, each byte's id its value, then <pad>, <mask>, <eos> at their ids."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        char = bytes_to_unicode()  # byte -> the printable character byte-level BPE writes for it
        vocab = {char[b]: b for b in range(256)} | {"<pad>": PAD_ID, "<mask>": MASK_ID, "<eos>": EOS_ID}
        tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tok.decoder = decoders.ByteLevel()
        tok.add_special_tokens(["<pad>", "<mask>", "<eos>"])
        return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", mask_token="<mask>",
                                       eos_token="<eos>")


class HFTokenizer:
    """A `tokenizers`/`transformers` tokenizer: BPE trained on the train split, or a checkpoint's own."""

    def __init__(self, tok, name: str):
        self.tok, self.name = tok, name
        self.vocab_size = len(tok)
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.eos_id = tok.eos_token_id if tok.eos_token_id is not None else tok.sep_token_id
        self.mask_id = tok.mask_token_id
        if self.eos_id is None:
            self.eos_id = self.pad_id
        self.n_special = len(getattr(tok, "all_special_ids", ()))

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tok(text, add_special_tokens=False)["input_ids"], dtype=np.int32)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, the batch encoded by `tokenizers` on all cores (the same ids as `encode`)."""
        return self.tok(texts, add_special_tokens=False)["input_ids"]

    def decode(self, ids) -> str:
        return self.tok.decode(list(ids))

    def fingerprint(self) -> str:
        """The tokenizer's content (vocabulary, merges, normalisation), not its name: a cache key."""
        backend = getattr(self.tok, "backend_tokenizer", None)
        text = backend.to_str() if backend is not None else json.dumps(self.tok.get_vocab(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_dir() -> Path:
    return Path(os.environ.get("HEADROOM_CACHE", Path.home() / ".cache" / "headroom"))


def train_bpe(docs: list[str], vocab_size: int, corpus_hash: str) -> HFTokenizer:
    """A byte-level BPE tokenizer trained on `docs` with `tokenizers`, cached by corpus hash and size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    path = cache_dir() / "bpe" / f"{corpus_hash}-{vocab_size}.json"
    if not path.exists():
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=["<pad>", "<mask>", "<eos>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
        )
        tok.train_from_iterator(docs, trainer=trainer)
        path.parent.mkdir(parents=True, exist_ok=True)
        # a name no other writer uses (the cache is shared by pods whose process ids repeat), then renamed:
        # concurrent readers never see a half-written file
        tmp = path.with_name(f".{path.stem}.{uuid.uuid4().hex}.json")
        try:
            tok.save(str(tmp))
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    fast = PreTrainedTokenizerFast(
        tokenizer_file=str(path), pad_token="<pad>", mask_token="<mask>", eos_token="<eos>"
    )
    return HFTokenizer(fast, f"bpe-{vocab_size}")


def pretrained_tokenizer(directory: str) -> HFTokenizer:
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(os.path.expanduser(directory))
    except Exception as e:
        raise HeadroomInputError(f"tokenizer {directory}: {str(e).splitlines()[0]}") from None
    return HFTokenizer(tok, f"pretrained:{directory}")


def make_tokenizer(cfg: DataConfig, corpus: Corpus | None):
    if cfg.tokenizer == "byte":
        return ByteTokenizer()
    if cfg.tokenizer == "bpe":
        assert corpus is not None
        return train_bpe(corpus.splits["train"], cfg.bpe_vocab_size, corpus.corpus_hash)
    return pretrained_tokenizer(cfg.tokenizer.split(":", 1)[1])


MQAR_PAIRS = {"train": 8, "val": 8, "calibration": 8, "id": 8, "shift": 16}  # shift: twice the pairs to recall
MQAR_STREAMS = {"val": 1, "calibration": 2, "id": 3, "shift": 4}  # train uses the run's seed (+ 1000)


def mqar_hash() -> str:
    params = {"pairs": MQAR_PAIRS, "streams": MQAR_STREAMS}
    return "mqar-" + hashlib.sha256(json.dumps(params).encode()).hexdigest()[:11]


def data_hash(corpus: Corpus, tokenizer) -> str:
    """The identity of the token streams a run sees: the corpus hash, plus the tokenizer's unless it is bytes."""
    if tokenizer.name == "byte":
        return corpus.corpus_hash
    return corpus.corpus_hash + "-" + hashlib.sha256(tokenizer.name.encode()).hexdigest()[:6]


def planned_vocab_size(cfg: DataConfig) -> tuple[int, str]:
    """The vocabulary size a plan can know without reading the corpus: (size, how it is known). Bytes and a
    pretrained tokenizer are exact; a BPE tokenizer not yet trained is planned at its declared size (training
    reaches it on any corpus of a few megabytes; the sweep itself plans with the trained tokenizer)."""
    if cfg.tokenizer == "byte" or cfg.source == "mqar":
        return BYTE_VOCAB_SIZE, "bytes"
    if cfg.tokenizer.startswith("pretrained:"):
        return pretrained_tokenizer(cfg.tokenizer.split(":", 1)[1]).vocab_size, "the pretrained tokenizer"
    return cfg.bpe_vocab_size, "declared bpe_vocab_size (the tokenizer is trained when the sweep starts)"


def unigram_entropy(counts) -> float:
    """Entropy in nats of the empirical unigram distribution given token counts."""
    total = float(sum(counts))
    return -sum((c / total) * math.log(c / total) for c in counts if c > 0)


def unigram_entropy_of(stream: np.ndarray, vocab_size: int) -> float:
    """Entropy (nats/token) of the empirical unigram distribution of a token stream: the loss floor of a
    model that ignores context."""
    return unigram_entropy(np.bincount(stream, minlength=vocab_size).tolist())
