"""Training and validation tokens from a text file or a token file, cached as uint16 memmaps, and
the batches drawn from them.

`load_corpus(data, ...)` is the front door. `data` is either

- a UTF-8 text file (any suffix but the two below): it is tokenised (`bench.train.tokenizer`)
  and the ids written to the token cache, a flat uint16 file named after the hash of the text
  and the tokenizer, so that a second run on the same text opens the cached file (memory-mapped)
  instead of tokenising again;
- a token file: `.bin`, a flat array of uint16 ids (the nanoGPT convention), or `.npy`, a 1-D
  NumPy array of integer ids; both are memory-mapped, never read whole.

Validation data comes from `val_data` (either kind) or, without it, from the held-out tail of
`data`: the last `VAL_FRACTION` (10%) of the text's characters, or of a token file's tokens.
The model never trains on the tail, and a BPE tokenizer is trained on the head alone.

Every problem is reported before any training, with what to do: a missing or empty file, text
that is not UTF-8, too few tokens for one sequence, ids the vocabulary does not cover.

`Batches` draws a run's batches: the same global batch on every rank, each rank its own rows.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import lmcore
from bench.train.tokenizer import (
    MAX_VOCAB_SIZE,
    TOKEN_SUFFIXES,
    TOKENIZER_FILE,
    Tokenizer,
    load_tokenizer,
    make_tokenizer,
    save_tokenizer,
)

__all__ = [
    "BPE_VOCAB_SIZE",
    "TOKEN_SUFFIXES",
    "VAL_FRACTION",
    "Batches",
    "Corpus",
    "check_sources",
    "default_cache_dir",
    "load_corpus",
    "read_token_file",
    "tokens_of_text",
]

VAL_FRACTION = 0.1  # the held-out tail of --data when no --val-data is given
BPE_VOCAB_SIZE = 10_000  # the handout's vocabulary, the default of --vocab-size
_TOKEN_DTYPE = np.uint16


@dataclass(frozen=True)
class Corpus:
    """The tokens a run trains and evaluates on, and how to read them back as text.

    Args:
        train: 1-D integer token ids to train on (a memmap).
        val: 1-D integer token ids to evaluate on (a memmap).
        vocab_size: the model's vocabulary; every id in `train` and `val` is below it.
        tokenizer: decodes samples; None for a token file whose BPE tokenizer is unknown.
        val_source: where `val` came from, in words (for the summary).
        eot_id: the end-of-text token that ends a document (`--eot-id`, or the tokenizer's);
            None when there is none.
    """

    train: np.ndarray
    val: np.ndarray
    vocab_size: int
    tokenizer: Tokenizer | None
    val_source: str
    eot_id: int | None = None


def default_cache_dir() -> Path:
    """Where tokenised text and trained tokenizers are kept between runs.

    `$XDG_CACHE_HOME/cs336sys-bench` (`~/.cache/cs336sys-bench` when the variable is unset).
    """
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "cs336sys-bench"


def _is_token_file(path: Path) -> bool:
    return path.suffix in TOKEN_SUFFIXES


def _check_exists(path: Path, flag: str) -> None:
    if not path.is_file():
        raise ValueError(f"{flag} {path}: no such file; give the path of a text or token file")
    if path.stat().st_size == 0:
        raise ValueError(f"{flag} {path} is empty; give a file with text (or tokens) in it")


def check_sources(data: str | Path, val_data: str | Path | None) -> None:
    """The checks of `--data` and `--val-data` that read nothing: each names a file, not empty
    (made before the run's folder is, so that a mistyped path leaves none behind).

    Raises:
        ValueError: a missing or empty file.
    """
    _check_exists(Path(data), "--data")
    if val_data is not None:
        _check_exists(Path(val_data), "--val-data")


def read_token_file(path: str | Path, *, flag: str = "--data") -> np.ndarray:
    """The token ids of a `.bin` (flat uint16) or `.npy` (1-D integer) file, memory-mapped.

    Raises:
        ValueError: the file is missing, empty, not 1-D, does not hold integers, or a `.bin`
            file has an odd number of bytes.
    """
    path = Path(path)
    _check_exists(path, flag)
    if path.suffix == ".bin":
        if path.stat().st_size % np.dtype(_TOKEN_DTYPE).itemsize:
            raise ValueError(
                f"{flag} {path}: a .bin token file holds uint16 ids (2 bytes each) but has an odd "
                "number of bytes; write it with np.asarray(ids, np.uint16).tofile(path)"
            )
        return np.memmap(path, dtype=_TOKEN_DTYPE, mode="r")
    tokens = np.load(path, mmap_mode="r")
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(
            f"{flag} {path}: a .npy token file must be a 1-D array of integer ids, got shape "
            f"{tokens.shape} and dtype {tokens.dtype}"
        )
    if tokens.size == 0:
        raise ValueError(f"{flag} {path} holds no tokens; give a file with tokens in it")
    return tokens


def _read_text(path: Path, flag: str) -> str:
    _check_exists(path, flag)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{flag} {path} is not UTF-8 text ({error.reason} at byte {error.start}); convert it, "
            f"or give a token file ({' or '.join(TOKEN_SUFFIXES)})"
        ) from None
    if not text:
        raise ValueError(f"{flag} {path} is empty; give a file with text in it")
    return text


def _write_atomically(path: Path, tokens: np.ndarray) -> None:
    # Ranks started together may tokenise the same text at once: each writes its own temporary
    # file and renames it into place, so a reader never sees half a file.
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "wb") as f:
        tokens.tofile(f)
    os.replace(tmp, path)


def tokens_of_text(text: str, tokenizer: Tokenizer, *, cache_dir: str | Path) -> np.ndarray:
    """The ids of `text` as a read-only uint16 memmap, from the cache or tokenised into it.

    The cache file's name is the hash of the text and of the tokenizer's fingerprint, so a
    changed text or tokenizer never reads stale ids.

    Raises:
        ValueError: the tokenizer's vocabulary does not fit in uint16.
    """
    if tokenizer.vocab_size > MAX_VOCAB_SIZE:
        raise ValueError(f"vocabulary {tokenizer.vocab_size} does not fit uint16 token ids")
    key = hashlib.sha256(tokenizer.fingerprint().encode() + b"\0" + text.encode()).hexdigest()
    path = Path(cache_dir) / f"{tokenizer.kind}-{key[:24]}.bin"
    if not path.is_file():
        _write_atomically(path, np.asarray(tokenizer.encode(text), dtype=_TOKEN_DTYPE))
    if path.stat().st_size == 0:  # np.memmap cannot map an empty file
        return np.zeros(0, dtype=_TOKEN_DTYPE)
    return np.memmap(path, dtype=_TOKEN_DTYPE, mode="r")


def _split_point(length: int) -> int:
    return length - int(length * VAL_FRACTION)


def _check_vocab(tokens: np.ndarray, vocab_size: int, path: Path, flag: str) -> None:
    largest = int(tokens.max())
    if int(tokens.min()) < 0:
        raise ValueError(f"{flag} {path} holds negative token ids; ids must be >= 0")
    if largest >= vocab_size:
        raise ValueError(
            f"{flag} {path} holds token id {largest}, outside the vocabulary of {vocab_size}; "
            f"pass --vocab-size {largest + 1} or more"
        )


def _check_length(tokens: np.ndarray, context_length: int, what: str) -> None:
    if len(tokens) < context_length + 1:
        raise ValueError(
            f"{what} has {len(tokens)} tokens, fewer than one sequence needs (context length "
            f"{context_length} + 1 for the targets); give more text or a shorter --context-length"
        )


def load_corpus(
    data: str | Path,
    *,
    val_data: str | Path | None,
    tokenizer: str,
    vocab_size: int | None,
    context_length: int,
    out_dir: str | Path,
    cache_dir: str | Path,
    resume: bool = False,
    eot_id: int | None = None,
) -> Corpus:
    """Training and validation tokens of a run (see the module docstring), checked for use; a
    BPE tokenizer trained on the text is saved in `out_dir` once they pass.

    Args:
        data: text or token file to train on.
        val_data: text or token file to evaluate on; None for the held-out tail of `data`.
        tokenizer: `"bytes"` or `"bpe"`: how text is tokenised (and samples decoded).
        vocab_size: the vocabulary: a BPE's size (10,000 when None), or for token files the
            model's vocabulary (256 for bytes, 10,000 for bpe when None). Must be 256 with
            bytes on text, or None.
        context_length: tokens per training sequence; both splits must hold one sequence.
        out_dir: the run's folder (a BPE tokenizer is saved there; for a token file, one
            there decodes the samples).
        cache_dir: the token and tokenizer cache.
        resume: the run continues from its checkpoint in `out_dir`, whose tokenizer it keeps
            (a new run replaces one found there: `make_tokenizer`).
        eot_id: the end-of-text id (`--eot-id`); None: the tokenizer's, if it has one.

    Raises:
        ValueError: any of the problems in the module docstring.
    """
    data = Path(data)
    if _is_token_file(data):
        train = read_token_file(data)
        tok = load_tokenizer(tokenizer, out_dir)
        vocab = vocab_size or (256 if tokenizer == "bytes" else BPE_VOCAB_SIZE)
        if tok is not None and vocab_size is None:
            vocab = tok.vocab_size
        if vocab > MAX_VOCAB_SIZE:
            raise ValueError(f"--vocab-size {vocab} is above {MAX_VOCAB_SIZE} (uint16 ids)")
        if tokenizer == "bpe" and tok is not None and tok.vocab_size > vocab:
            raise ValueError(
                f"{TOKENIZER_FILE} in --out {out_dir} has a vocabulary of {tok.vocab_size}, "
                f"larger than the model's {vocab} (--vocab-size): it is not these tokens' "
                "tokenizer; remove it, or pass the --vocab-size it was made with"
            )
        _check_vocab(train, vocab, data, "--data")
        if val_data is None:
            train, val = train[: _split_point(len(train))], train[_split_point(len(train)) :]
    else:
        if tokenizer == "bytes" and vocab_size not in (None, 256):
            raise ValueError(
                f"--tokenizer bytes has a vocabulary of 256, got --vocab-size {vocab_size}; "
                "drop --vocab-size or use --tokenizer bpe"
            )
        text = _read_text(data, "--data")
        if val_data is None:
            text, val_text = text[: _split_point(len(text))], text[_split_point(len(text)) :]
        tok = make_tokenizer(
            tokenizer,
            text=text,
            vocab_size=vocab_size or BPE_VOCAB_SIZE,
            out_dir=out_dir,
            cache_dir=cache_dir,
            resume=resume,
            save=False,
        )
        vocab = tok.vocab_size
        train = tokens_of_text(text, tok, cache_dir=cache_dir)
        if val_data is None:
            val = tokens_of_text(val_text, tok, cache_dir=cache_dir)
    if val_data is None:
        source = f"held-out tail of --data ({VAL_FRACTION:.0%})"
        _check_length(train, context_length, f"--data {data} (the first {1 - VAL_FRACTION:.0%})")
        _check_length(val, context_length, f"the held-out tail of --data {data}")
    else:
        val_path = Path(val_data)
        source = f"--val-data {val_path.name}"
        if _is_token_file(val_path):
            val = read_token_file(val_path, flag="--val-data")
            _check_vocab(val, vocab, val_path, "--val-data")
        else:
            if tok is None:
                raise ValueError(
                    "--val-data is text but --data is a token file with no tokenizer to encode "
                    "it; give --val-data as a token file too"
                )
            val = tokens_of_text(_read_text(val_path, "--val-data"), tok, cache_dir=cache_dir)
        _check_length(train, context_length, f"--data {data}")
        _check_length(val, context_length, f"--val-data {val_path}")
    eot_id = eot_id if eot_id is not None else getattr(tok, "eot_id", None)
    if eot_id is not None and not 0 <= eot_id < vocab:
        raise ValueError(f"--eot-id {eot_id} is outside the vocabulary of {vocab}")
    if not _is_token_file(data):
        save_tokenizer(tok, out_dir)  # the data passed: the run's tokenizer goes beside it
    return Corpus(
        train=train, val=val, vocab_size=vocab, tokenizer=tok, val_source=source, eot_id=eot_id
    )


class Batches:
    """The global batch of every micro-step, drawn from one seeded generator; this rank's rows.

    Every rank draws the same starts (`lmcore.get_batch` with the same generator state) and
    keeps rows `[rank·b, (rank+1)·b)`, so the ranks together train on exactly the batch one
    process would. The generator (`generator`) is the data position a checkpoint saves.

    Args:
        tokens: the token ids to draw sequences from.
        batch_size: sequences per optimizer step over all ranks and micro-batches.
        grad_accum: micro-batches per step.
        context_length: tokens per sequence.
        rank: this rank.
        world_size: the number of ranks.
        seed: the generator's seed (the same on every rank).
    """

    def __init__(
        self,
        tokens: np.ndarray,
        *,
        batch_size: int,
        grad_accum: int,
        context_length: int,
        rank: int,
        world_size: int,
        seed: int,
    ) -> None:
        self.tokens, self.context_length = tokens, context_length
        self.micro = batch_size // grad_accum  # sequences per micro-step, all ranks
        self.rows = slice(rank * self.micro // world_size, (rank + 1) * self.micro // world_size)
        self.generator = np.random.default_rng(seed)

    def next(self, device: torch.device) -> torch.Tensor:
        """This rank's tokens `(micro / world_size, context_length + 1)` of the next micro-step."""
        x, y = lmcore.get_batch(
            self.tokens, self.micro, self.context_length, "cpu", generator=self.generator
        )
        tokens = torch.cat((x, y[:, -1:]), dim=1)[self.rows]  # (rows, seq + 1)
        if device.type == "cuda":
            return tokens.pin_memory().to(device, non_blocking=True)
        return tokens
