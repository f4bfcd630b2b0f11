"""`launch` reports the rank that failed first, and sets no time bound unless asked."""

from __future__ import annotations

import inspect
import time

import pytest
import torch
from failing_ranks import rank0_fails_and_lingers, sleeps

from bench.core import launch as launch_module
from bench.core.launch import RankFailed, launch


def test_the_first_failure_is_reported_not_the_peer_that_followed_it():
    with pytest.raises(RankFailed) as raised:
        launch(rank0_fails_and_lingers, world_size=2, backend="gloo")
    assert raised.value.rank == 0
    assert "the real cause, on rank 0" in str(raised.value)
    assert "ValueError" in str(raised.value)
    assert "Traceback" in str(raised.value)
    assert isinstance(raised.value, torch.multiprocessing.ProcessRaisedException)


def test_launch_sets_no_time_bound_by_default():
    default = inspect.signature(launch).parameters["timeout"].default
    assert default is None is launch_module.DEFAULT_TIMEOUT_S


def test_a_given_timeout_still_stops_the_ranks():
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="--timeout"):
        launch(sleeps, world_size=2, backend="gloo", timeout=1.0)
    assert time.monotonic() - started < 25
