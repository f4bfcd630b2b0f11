"""Out-of-memory and unavailable measurements become row statuses; other errors propagate."""

import pytest
import torch

from bench.core.oom import OK, OOM, Unavailable, guarded, skipped


def _raise(exc):
    def fn():
        raise exc

    return fn


def test_guarded_passes_value_through():
    out = guarded(lambda: 41 + 1, device="cpu")
    assert (out.value, out.status, out.ok) == (42, OK, True)


def test_guarded_turns_injected_oom_into_status():
    out = guarded(_raise(torch.OutOfMemoryError("CUDA out of memory")), device="cpu")
    assert (out.value, out.status, out.ok) == (None, OOM, False)


def test_guarded_turns_unavailable_into_skipped_reason():
    out = guarded(_raise(Unavailable("fa2 is not installed")), device="cpu")
    assert out.status == skipped("fa2 is not installed") == "skipped: fa2 is not installed"


def test_guarded_lets_bugs_propagate():
    with pytest.raises(ZeroDivisionError):
        guarded(lambda: 1 / 0, device="cpu")


@pytest.mark.gpu
def test_guarded_frees_memory_after_real_oom():
    before = torch.cuda.memory_allocated()
    total = torch.cuda.get_device_properties(0).total_memory
    out = guarded(lambda: torch.empty(2 * total, dtype=torch.uint8, device="cuda"), device="cuda")
    assert out.status == OOM
    assert torch.cuda.memory_allocated() == before
