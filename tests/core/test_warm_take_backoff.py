"""A pool that does not answer a take in time is left alone for a while (engines/ray/warm.py): a
deployment asks it several times (its actors at once, its standby coordinator, a file reader), and
each ask would otherwise wait the whole timeout again before the script starts its own processes."""
from __future__ import annotations

import pytest
import ray

from replistream.engines.ray import warm


class Keeper:
    def __init__(self):
        self.take = self.take_many = self

    def remote(self, *args):
        return object()


@pytest.fixture
def joined(monkeypatch):
    monkeypatch.setattr(warm, "_joined", True)
    monkeypatch.setattr(warm, "_skip_until", 0.0)
    monkeypatch.setattr(warm, "_owner", lambda: "job:test")
    monkeypatch.setattr(warm, "_keeper", lambda create=False: Keeper())
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    asked = []

    def slow(ref, timeout=None):
        asked.append(timeout)
        raise ray.exceptions.GetTimeoutError("no answer")

    monkeypatch.setattr(ray, "get", slow)
    return asked


def test_after_one_timeout_the_pool_is_not_asked_again(joined):
    assert warm.take("ReplicaActor", timeout=0.01) is None
    assert warm.take_many({"EntryActor": 1}) == []
    assert warm.take("CoordinatorActor") is None
    assert joined == [0.01]  # asked once


def test_it_is_asked_again_once_the_pause_is_over(joined, monkeypatch):
    assert warm.take("ReplicaActor", timeout=0.01) is None
    monkeypatch.setattr(warm, "_skip_until", 0.0)
    assert warm.take("ReplicaActor", timeout=0.02) is None
    assert joined == [0.01, 0.02]
