"""Tokenizers for real corpora: UTF-8 bytes (no file), or Hugging Face `tokenizers` from a local tokenizer.json.

Nothing is fetched from a hub: `load_tokenizer(path)` reads one local file, and `train_bpe` builds a byte-level BPE
from local text. `tokenizers` is imported inside the functions that need it, so `tidal plan` runs without it.

A tokenizer here has `name`, `vocab` (ids are < vocab), `sha256` (of the tokenizer file, "bytes" for UTF-8 bytes; it
is part of a corpus cache's fingerprint) and `encode_batch(texts) -> list[np.ndarray]` (int64 ids, no special tokens
added: documents are trained as separate sequences, so no end-of-document token is needed to keep them apart).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from tidal.core.errors import TidalError

BYTE_VOCAB = 256


class ByteTokenizer:
    """UTF-8 bytes as token ids (vocab 256), the default when no tokenizer file is given."""

    name = "bytes"
    vocab = BYTE_VOCAB
    sha256 = "bytes"

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8).astype(np.int64) for t in texts]

    def __repr__(self) -> str:
        return "ByteTokenizer()"


class HFTokenizer:
    """A Hugging Face `tokenizers.Tokenizer` loaded from a local tokenizer.json."""

    def __init__(self, path: str | Path) -> None:
        p = Path(path)
        try:
            raw = p.read_bytes()
        except OSError as e:
            raise TidalError(f"tokenizer file {p} cannot be read: {e.strerror}") from None
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise TidalError("a tokenizer file needs the 'tokenizers' package: pip install 'tidal[data]'") from None
        try:
            self._tok = Tokenizer.from_str(raw.decode("utf-8"))
        except Exception as e:  # UnicodeDecodeError, or the plain Exception tokenizers raises on a bad file
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise TidalError(f"tokenizer file {p} does not load: {msg[:200]}") from None
        self.name = str(p)
        self.sha256 = hashlib.sha256(raw).hexdigest()
        self.vocab = int(self._tok.get_vocab_size(with_added_tokens=True))
        if self.vocab < 2:
            raise TidalError(f"tokenizer file {p} has a vocabulary of {self.vocab} < 2 tokens")

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        # encode_batch_fast (tokenizers >= 0.20) skips character offsets: same ids, ~25% faster
        encode = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
        encs = encode(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int64) for e in encs]

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids])

    def __repr__(self) -> str:
        return f"HFTokenizer({self.name!r}, vocab={self.vocab})"


def load_tokenizer(path: str | Path | None) -> ByteTokenizer | HFTokenizer:
    """UTF-8 bytes when `path` is None, else the tokenizer.json at `path` (TidalError if it does not load)."""
    return ByteTokenizer() if path is None else HFTokenizer(path)


def train_bpe(texts: Iterable[str], vocab: int, out: str | Path, *, min_frequency: int = 2,
              special_tokens: Sequence[str] = ("<|endoftext|>",)) -> HFTokenizer:
    """Train a byte-level BPE (GPT-2 style: every byte is in the initial alphabet, so nothing is ever unknown) of
    `vocab` tokens on `texts` and write it to `out` as tokenizer.json. Returns the loaded tokenizer."""
    n_min = BYTE_VOCAB + len(special_tokens)
    if vocab < n_min:
        raise TidalError(f"a byte-level BPE needs vocab >= {n_min} (256 bytes + special tokens), got {vocab}")
    if min_frequency < 0:
        raise TidalError(f"min_frequency must be >= 0, got {min_frequency}")
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise TidalError("tidal tokenizer train needs the 'tokenizers' package: pip install 'tidal[data]'") from None
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, min_frequency=min_frequency, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=list(special_tokens))
    tok.train_from_iterator(texts, trainer=trainer)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out))
    return HFTokenizer(out)
