"""Tokenizers for training on text: the UTF-8 bytes, or a byte-level BPE trained on the text.

- `ByteTokenizer`: every UTF-8 byte is a token; vocabulary 256, nothing to train or save.
- `BPETokenizer`: a byte-level BPE (GPT-2's pre-tokenisation, bytes as the base alphabet, so
  every text encodes without unknown tokens) trained on the training text with the Hugging Face
  `tokenizers` library, and saved as one `tokenizer.json` beside the checkpoints, so that
  generation and `--resume` decode with the same vocabulary. Its vocabulary holds GPT-2's
  end-of-text token `<|endoftext|>` (`EOT_TEXT`, id `eot_id`) as a special token, as the
  handout's tokenizer does: that text in the data (TinyStories' and OpenWebText's document
  separator) is one token, which `--pack` splits documents at, and samples leave out.

`make_tokenizer(kind, ...)` is the front door: it trains (or takes from the cache) and saves.
Token ids are stored as uint16 (`bench.train.data`), so a vocabulary holds at most 65,536
tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Protocol

__all__ = [
    "EOT_TEXT",
    "MAX_VOCAB_SIZE",
    "TOKENIZERS",
    "TOKENIZER_FILE",
    "TOKEN_SUFFIXES",
    "BPETokenizer",
    "ByteTokenizer",
    "Tokenizer",
    "load_tokenizer",
    "make_tokenizer",
    "save_tokenizer",
]

TOKENIZERS = ("bytes", "bpe")
TOKENIZER_FILE = "tokenizer.json"  # a BPE tokenizer's file, in the run's output folder
TOKEN_SUFFIXES = (".bin", ".npy")  # files of token ids (bench.train.data): nothing to tokenise
EOT_TEXT = "<|endoftext|>"  # GPT-2's end of a document, a special token of every BPE here
MAX_VOCAB_SIZE = 2**16  # ids are stored as uint16
# Text goes to the BPE encoder in pieces of about this many characters (whole lines), so that
# `encode_batch` spreads the work over the cores and memory stays bounded.
_CHUNK_CHARS = 1 << 20


class Tokenizer(Protocol):
    """What training needs of a tokenizer: its name, vocabulary size, encode and decode."""

    kind: str
    vocab_size: int
    eot_id: int | None  # the end-of-text token (`EOT_TEXT`); None: the vocabulary has none

    def encode(self, text: str) -> list[int]:
        """The token ids of `text`."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids` (invalid UTF-8 shown as U+FFFD)."""
        ...

    def fingerprint(self) -> str:
        """A hash that changes whenever the ids of some text would: the token cache's key."""
        ...


class ByteTokenizer:
    """The UTF-8 bytes of the text as token ids (vocabulary 256): no training, no file."""

    kind = "bytes"
    vocab_size = 256
    eot_id = None  # every id is a byte

    def encode(self, text: str) -> list[int]:
        """The UTF-8 bytes of `text`."""
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        """The text of the bytes `ids`; a sequence cut inside a character shows U+FFFD there."""
        return bytes(ids).decode("utf-8", errors="replace")

    def fingerprint(self) -> str:
        """Always the same: the byte mapping never changes."""
        return "bytes"


class BPETokenizer:
    """A byte-level BPE of the Hugging Face `tokenizers` library (see the module docstring).

    Build one with `train` or `load`; `save` writes its `tokenizer.json`.
    """

    kind = "bpe"

    def __init__(self, tokenizer: object) -> None:
        self._tokenizer = tokenizer
        self.vocab_size: int = tokenizer.get_vocab_size()
        # None for a tokenizer.json written before the end-of-text token was a special token
        self.eot_id: int | None = tokenizer.token_to_id(EOT_TEXT)

    @classmethod
    def train(cls, text: str, vocab_size: int) -> BPETokenizer:
        """Learn merges on `text` until the vocabulary holds `vocab_size` tokens (or none is left),
        `EOT_TEXT` among them.

        Raises:
            ValueError: `vocab_size` is below 257 (the 256 bytes and one merge) or above 65,536.
        """
        if not 256 < vocab_size <= MAX_VOCAB_SIZE:
            raise ValueError(
                f"a byte-level BPE needs a vocabulary in (256, {MAX_VOCAB_SIZE}] (the 256 bytes "
                f"plus merges; ids are stored as uint16), got --vocab-size {vocab_size}"
            )
        _require_tokenizers()
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, pre_tokenizers, trainers

        tokenizer = HFTokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            special_tokens=[EOT_TEXT],
            show_progress=False,
        )
        tokenizer.train_from_iterator(_chunks(text), trainer=trainer, length=None)
        return cls(tokenizer)

    @classmethod
    def load(cls, path: str | Path) -> BPETokenizer:
        """The tokenizer saved at `path` (a `tokenizer.json`)."""
        _require_tokenizers()
        from tokenizers import Tokenizer as HFTokenizer

        return cls(HFTokenizer.from_file(str(path)))

    def save(self, path: str | Path) -> None:
        """Write the tokenizer to `path` (a `tokenizer.json`)."""
        self._tokenizer.save(str(path))

    def encode(self, text: str) -> list[int]:
        """The token ids of `text`, encoded in line-aligned pieces in parallel."""
        ids: list[int] = []
        for encoding in self._tokenizer.encode_batch(list(_chunks(text))):
            ids.extend(encoding.ids)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`."""
        return self._tokenizer.decode(list(ids))

    def fingerprint(self) -> str:
        """The hash of the tokenizer's JSON: same merges, same fingerprint."""
        return hashlib.sha256(self._tokenizer.to_str().encode()).hexdigest()[:16]


def _require_tokenizers() -> None:
    """Raise a `ValueError` that says what to do when the `tokenizers` library is missing."""
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        raise ValueError(
            "--tokenizer bpe needs the Hugging Face `tokenizers` library (pip install tokenizers); "
            "or use --tokenizer bytes"
        ) from None


def _chunks(text: str) -> Iterator[str]:
    """`text` in consecutive pieces of whole lines, about `_CHUNK_CHARS` characters each."""
    start = 0
    while start < len(text):
        end = text.find("\n", start + _CHUNK_CHARS)
        end = len(text) if end < 0 else end + 1
        yield text[start:end]
        start = end


def load_tokenizer(kind: str, directory: str | Path) -> Tokenizer | None:
    """The tokenizer of a run in `directory`: bytes, or its saved BPE (None if there is none)."""
    if kind == "bytes":
        return ByteTokenizer()
    path = Path(directory) / TOKENIZER_FILE
    return BPETokenizer.load(path) if path.is_file() else None


def make_tokenizer(
    kind: str,
    *,
    text: str,
    vocab_size: int,
    out_dir: str | Path,
    cache_dir: str | Path | None = None,
    resume: bool = False,
    save: bool = True,
) -> Tokenizer:
    """The tokenizer of a run, trained on `text` if needed, and saved in `out_dir` (or by
    `save_tokenizer` later, once the data has passed its checks: without `save`).

    A resumed run (`resume`) uses the BPE tokenizer saved in `out_dir` as it is (its checkpoint
    vouches for it: `bench.train.checkpoint`). A new run never does: a `tokenizer.json` that
    another run left in `out_dir` is replaced by this run's, which is taken from `cache_dir`
    when one was trained there on the same text with the same vocabulary size, or trained now
    (and put in the cache).

    Args:
        kind: `"bytes"` or `"bpe"`.
        text: the training text (the BPE merges are learnt on it).
        vocab_size: the BPE vocabulary size (ignored for bytes).
        out_dir: the run's folder, where a BPE tokenizer is saved.
        cache_dir: where trained tokenizers are kept between runs; None for no cache.
        resume: the run continues from a checkpoint in `out_dir`.
        save: write the tokenizer to `out_dir` now.

    Raises:
        ValueError: an unknown kind or a vocabulary size a BPE cannot have.
    """
    if kind == "bytes":
        return ByteTokenizer()
    if kind != "bpe":
        raise ValueError(f"unknown tokenizer {kind!r}; choose one of {', '.join(TOKENIZERS)}")
    saved = Path(out_dir) / TOKENIZER_FILE
    if resume and saved.is_file():
        return BPETokenizer.load(saved)
    cached = None
    if cache_dir is not None:
        what = json.dumps([vocab_size, EOT_TEXT]).encode()  # a change of either is a new BPE
        key = hashlib.sha256(what + text.encode()).hexdigest()[:16]
        cached = Path(cache_dir) / f"bpe-{vocab_size}-{key}.json"
    if cached is not None and cached.is_file():
        tokenizer = BPETokenizer.load(cached)
    else:
        tokenizer = BPETokenizer.train(text, vocab_size)
        if cached is not None:
            _save_atomically(tokenizer, cached)
    if save:
        save_tokenizer(tokenizer, out_dir)
    return tokenizer


def save_tokenizer(tokenizer: Tokenizer, out_dir: str | Path) -> None:
    """Write a BPE tokenizer to `out_dir` (its `TOKENIZER_FILE`); bytes need no file."""
    if isinstance(tokenizer, BPETokenizer):
        _save_atomically(tokenizer, Path(out_dir) / TOKENIZER_FILE)


def _save_atomically(tokenizer: BPETokenizer, path: Path) -> None:
    # Ranks started together (and runs sharing a cache) may save the same file at once: each
    # writes its own temporary file and renames it into place, so no reader sees half a file.
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    os.close(fd)
    tokenizer.save(tmp)
    os.replace(tmp, path)
