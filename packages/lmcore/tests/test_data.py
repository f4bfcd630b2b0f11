"""Random batches from a token array: shapes, dtype, shift by one, range and memmap input."""

import numpy as np
import pytest
import torch

from lmcore import get_batch


def test_shapes_dtype_and_device():
    tokens = np.random.default_rng(0).integers(0, 500, size=1000, dtype=np.uint16)
    inputs, targets = get_batch(tokens, 7, 13, "cpu")
    assert inputs.shape == targets.shape == (7, 13)
    assert inputs.dtype == targets.dtype == torch.int64
    assert inputs.device.type == "cpu"


def test_windows_are_contiguous_slices_and_targets_shift_by_one():
    tokens = np.arange(100, 400, dtype=np.int32)  # each token's value encodes its position
    inputs, targets = get_batch(tokens, 16, 9, "cpu", generator=np.random.default_rng(1))
    steps = torch.arange(9)
    assert torch.equal(inputs, inputs[:, :1] + steps)
    assert torch.equal(targets, inputs + 1)


def test_every_start_is_reachable_and_none_overruns():
    tokens = np.arange(12, dtype=np.int64)
    inputs, targets = get_batch(tokens, 2000, 5, "cpu", generator=np.random.default_rng(2))
    starts = set(inputs[:, 0].tolist())
    assert starts == set(range(12 - 5))  # starts 0 … 6: the last target is token 11
    assert targets.max().item() == 11


def test_same_generator_seed_gives_same_batch():
    tokens = np.random.default_rng(0).integers(0, 50, size=300)
    a = get_batch(tokens, 4, 8, "cpu", generator=np.random.default_rng(7))
    b = get_batch(tokens, 4, 8, "cpu", generator=np.random.default_rng(7))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_reads_memmap(tmp_path):
    path = tmp_path / "tokens.bin"
    values = np.random.default_rng(3).integers(0, 10_000, size=257, dtype=np.uint16)
    values.tofile(path)
    data = np.memmap(path, dtype=np.uint16, mode="r")
    inputs, targets = get_batch(data, 5, 32, "cpu")
    windows = torch.cat((inputs, targets[:, -1:]), dim=1).numpy()
    text = values.tolist()
    for window in windows.tolist():
        start = next(i for i in range(len(text)) if text[i : i + 33] == window)
        assert start + 33 <= len(text)


@pytest.mark.gpu
def test_cuda_batch_lands_on_the_device():
    tokens = np.arange(64, dtype=np.uint16)
    inputs, targets = get_batch(tokens, 3, 8, "cuda")
    assert inputs.is_cuda and targets.is_cuda
    assert torch.equal(targets.cpu(), inputs.cpu() + 1)


def test_too_short_array_is_rejected():
    with pytest.raises(ValueError, match="context_length \\+ 1"):
        get_batch(np.arange(8), 2, 8, "cpu")


def test_two_dimensional_array_is_rejected():
    with pytest.raises(ValueError, match="1-D"):
        get_batch(np.zeros((4, 50), dtype=np.int64), 2, 8, "cpu")


def test_float_array_is_rejected():
    with pytest.raises(TypeError, match="integer"):
        get_batch(np.linspace(0, 1, 50), 2, 8, "cpu")


@pytest.mark.parametrize(("batch_size", "context_length"), [(0, 4), (2, 0), (2, 2.5)])
def test_non_positive_sizes_are_rejected(batch_size, context_length):
    with pytest.raises(ValueError, match="positive integer"):
        get_batch(np.arange(50), batch_size, context_length, "cpu")
