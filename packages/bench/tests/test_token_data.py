"""Tokenizers and training data of bench-train: bytes and BPE, the token cache, token files, the
held-out tail, and the clear errors on bad data."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from generated_text import generated_text

from bench.train import tokenizer as tokenizer_module
from bench.train.data import VAL_FRACTION, load_corpus, read_token_file, tokens_of_text
from bench.train.tokenizer import (
    TOKENIZER_FILE,
    BPETokenizer,
    ByteTokenizer,
    load_tokenizer,
    make_tokenizer,
)

TEXT = generated_text(300, seed=1)


def _corpus(tmp_path, data, **kwargs):
    options = {
        "val_data": None,
        "tokenizer": "bytes",
        "vocab_size": None,
        "context_length": 16,
        "out_dir": tmp_path / "out",
        "cache_dir": tmp_path / "cache",
    }
    return load_corpus(data, **{**options, **kwargs})


def _write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_byte_tokenizer_round_trips_utf8():
    tok = ByteTokenizer()
    text = "a warm café ☕\n"
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8")) and max(ids) < tok.vocab_size == 256
    assert tok.decode(ids) == text


def test_bpe_tokenizer_round_trips_and_compresses(tmp_path):
    tok = BPETokenizer.train(TEXT, 300)
    ids = tok.encode(TEXT)
    assert tok.decode(ids) == TEXT
    assert 256 < tok.vocab_size <= 300 and max(ids) < tok.vocab_size
    assert len(ids) < 0.6 * len(TEXT.encode())  # merges of a small grammar's words compress
    tok.save(tmp_path / "t.json")
    again = BPETokenizer.load(tmp_path / "t.json")
    assert again.encode(TEXT) == ids and again.fingerprint() == tok.fingerprint()


@pytest.mark.parametrize("vocab_size", [256, 2**16 + 1])
def test_bpe_rejects_impossible_vocabulary(vocab_size):
    with pytest.raises(ValueError, match="vocab-size"):
        BPETokenizer.train(TEXT, vocab_size)


def test_tokens_are_cached_and_memory_mapped(tmp_path, monkeypatch):
    tok = ByteTokenizer()
    first = tokens_of_text(TEXT, tok, cache_dir=tmp_path)
    assert isinstance(first, np.memmap) and first.dtype == np.uint16
    np.testing.assert_array_equal(first, np.frombuffer(TEXT.encode(), dtype=np.uint8))

    def no_encoding(text):
        raise AssertionError("tokenised again")

    monkeypatch.setattr(tok, "encode", no_encoding)
    np.testing.assert_array_equal(tokens_of_text(TEXT, tok, cache_dir=tmp_path), first)


def test_bpe_is_trained_on_the_head_saved_and_reused(tmp_path, monkeypatch):
    data = _write(tmp_path, "train.txt", TEXT)
    corpus = _corpus(tmp_path, data, tokenizer="bpe", vocab_size=300)
    saved = tmp_path / "out" / TOKENIZER_FILE
    assert saved.is_file() and corpus.vocab_size == BPETokenizer.load(saved).vocab_size
    head = TEXT[: len(TEXT) - int(len(TEXT) * VAL_FRACTION)]
    assert corpus.tokenizer.decode(corpus.train.tolist()) == head
    assert corpus.tokenizer.decode(corpus.val.tolist()) == TEXT[len(head) :]

    def no_training(*args, **kwargs):
        raise AssertionError("trained again")

    # A second run with a fresh output folder takes the tokenizer and the tokens from the cache.
    monkeypatch.setattr(tokenizer_module.BPETokenizer, "train", no_training)
    again = _corpus(tmp_path, data, tokenizer="bpe", vocab_size=300, out_dir=tmp_path / "o2")
    np.testing.assert_array_equal(again.train, corpus.train)
    assert (tmp_path / "o2" / TOKENIZER_FILE).read_text() == saved.read_text()


def test_make_tokenizer_keeps_the_one_in_the_output_folder_only_on_resume(tmp_path):
    first = make_tokenizer("bpe", text=TEXT, vocab_size=280, out_dir=tmp_path, cache_dir=None)
    other = generated_text(50, seed=9)
    options = {"text": other, "vocab_size": 300, "out_dir": tmp_path, "cache_dir": None}
    kept = make_tokenizer("bpe", **options, resume=True)
    assert kept.fingerprint() == first.fingerprint()
    replaced = make_tokenizer("bpe", **options)  # a new run: another run's tokenizer is stale
    assert replaced.fingerprint() != first.fingerprint()
    saved = load_tokenizer("bpe", tmp_path)
    assert saved is not None and saved.fingerprint() == replaced.fingerprint()


def test_held_out_tail_of_text(tmp_path):
    corpus = _corpus(tmp_path, _write(tmp_path, "d.txt", TEXT))
    num_bytes = len(TEXT.encode())
    assert len(corpus.train) + len(corpus.val) == num_bytes
    assert corpus.vocab_size == 256 and "10%" in corpus.val_source


def test_separate_validation_text(tmp_path):
    val_text = generated_text(40, seed=2)
    corpus = _corpus(
        tmp_path, _write(tmp_path, "d.txt", TEXT), val_data=_write(tmp_path, "v.txt", val_text)
    )
    assert bytes(corpus.train.astype(np.uint8)) == TEXT.encode()
    assert bytes(corpus.val.astype(np.uint8)) == val_text.encode()


@pytest.mark.parametrize("suffix", [".bin", ".npy"])
def test_token_files(tmp_path, suffix):
    ids = np.random.default_rng(0).integers(0, 500, size=1000)
    path = tmp_path / f"t{suffix}"
    if suffix == ".bin":
        ids.astype(np.uint16).tofile(path)
    else:
        np.save(path, ids.astype(np.int32))
    np.testing.assert_array_equal(read_token_file(path), ids)
    corpus = _corpus(tmp_path, path, tokenizer="bpe", vocab_size=500)
    np.testing.assert_array_equal(corpus.train, ids[:900])
    np.testing.assert_array_equal(corpus.val, ids[900:])
    assert corpus.vocab_size == 500 and corpus.tokenizer is None


def test_token_file_beyond_the_vocabulary(tmp_path):
    path = tmp_path / "t.bin"
    np.arange(300, dtype=np.uint16).tofile(path)
    with pytest.raises(ValueError, match=r"token id 299.*vocabulary of 256.*--vocab-size 300"):
        _corpus(tmp_path, path)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda p: p / "missing.txt", "no such file"),
        (lambda p: _write(p, "empty.txt", ""), "is empty"),
        (lambda p: _write(p, "short.txt", "a few words\n"), "fewer than one sequence"),
        (lambda p: p / "bad.txt", "not UTF-8"),
        (lambda p: p / "odd.bin", "odd number of bytes"),
        (lambda p: p / "twod.npy", "1-D array of integer ids"),
    ],
)
def test_bad_data_is_reported(tmp_path, make, match):
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe not utf-8" * 20)
    (tmp_path / "odd.bin").write_bytes(b"\x01\x02\x03")
    np.save(tmp_path / "twod.npy", np.zeros((4, 4), dtype=np.int64))
    with pytest.raises(ValueError, match=match):
        _corpus(tmp_path, make(tmp_path))


def test_bytes_with_another_vocabulary_is_refused(tmp_path):
    with pytest.raises(ValueError, match="vocabulary of 256"):
        _corpus(tmp_path, _write(tmp_path, "d.txt", TEXT), vocab_size=1000)


def test_short_held_out_tail_is_reported(tmp_path):
    # 40 bytes: the 36-byte head holds a sequence of 16, the 4-byte tail does not.
    with pytest.raises(ValueError, match="held-out tail"):
        _corpus(tmp_path, _write(tmp_path, "d.txt", "x" * 40))


def test_bpe_without_the_tokenizers_library_says_what_to_do(monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # makes `import tokenizers` fail
    with pytest.raises(ValueError, match=r"pip install tokenizers.*--tokenizer bytes"):
        BPETokenizer.train(TEXT, 300)
