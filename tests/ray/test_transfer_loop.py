"""The coordinator's staged-transfer loop (engines/ray/transfer.py) against fake replicas: what it
does when the sending peer is gone, decided from the receiver's own status.

A fake handle's methods answer through ``ray.put``, so the loop's ``ray.get`` calls run as they
do against actors; nothing else of a deployment is started.
"""
from __future__ import annotations

import types

import pytest
import ray

from replistream import Query
from replistream.engines.ray import transfer as T
from replistream.operators.keyed import KeyedCount


class _Method:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *a, **kw):
        return ray.put(self.fn(*a, **kw))


class FakeReceiver:
    """A pending receiver whose every step is installed and merged already (it completed while
    the coordinator was not looking)."""

    def __init__(self, steps: int):
        self.steps = steps
        self.begin_transfer = _Method(lambda bits: {"buffered_packets": 0})
        self.transfer_status = _Method(lambda wait_s=0.0, seen=None: {
            "installed": {i: 0.1 for i in range(self.steps)}, "complete": True, "inbox": 0})


class DeadHandle:
    """A replica that is gone: every call fails as a dead actor's would."""

    def __getattr__(self, name):
        def remote(*a, **kw):
            raise ConnectionError(f"{name}: the actor is dead")
        return types.SimpleNamespace(remote=remote)


class FakeManager:
    def __init__(self, query, running: set[str]):
        self.dep = types.SimpleNamespace(query=query, repairer=types.SimpleNamespace(mark_failed=lambda *a: None))
        self.handover = self.meter = self  # (the manager's parts: peers and cover_peer, notice_failures)
        self.transfers, self.connect_marks, self.records, self.running = [], {}, [], running
        self.topology = types.SimpleNamespace(
            replica=lambda label: types.SimpleNamespace(operator=label.rpartition("#")[0]),
            is_running=lambda label: label in self.running,
            handle=lambda label: DeadHandle())
        self.first_peer = True

    def peers(self, label, pending):
        if self.first_peer:  # the sender is live when the transfer starts, gone at the first look
            self.first_peer = False
            return ["c#0"]
        return [p for p in ("c#0",) if p in self.running]

    def cover_peer(self, label, peer):
        return []

    def now(self):
        return 0.0

    def record(self, entry):
        self.records.append(entry)

    def notice_failures(self):
        pass


def _query():
    q = Query("loop")
    q.source("s", {"k": "i8"}).apply(KeyedCount(by="k", bits=4), name="c").sink("out")
    return q.build()


def test_a_peer_gone_after_the_receiver_completed_leaves_the_transfer_complete(ray_session):
    """The sender died (or was declared failed) after its last step reached the receiver: the
    receiver holds every bin, so the transfer is complete, not failed for want of a live peer
    (a 1M-key Join's all-at-once move on Ray ended in RunFailed this way before)."""
    mgr = FakeManager(_query(), running={"c#1"})
    rec = FakeReceiver(steps=1)
    out = T.staged_install(mgr, "c#1", rec, set(), "all-at-once", bits=4)
    assert mgr.transfers[-1]["state"] == "complete"
    assert out["steps"] == 1 and out["restarts"] == 0
    assert [r["action"] for r in mgr.records] == ["complete"]


def test_a_peer_gone_before_the_receiver_has_its_steps_fails_the_transfer_loudly(ray_session):
    """The negative control: with steps still missing and no live peer, the transfer fails and
    says so."""
    mgr = FakeManager(_query(), running={"c#1"})
    rec = FakeReceiver(steps=1)
    rec.transfer_status = _Method(lambda wait_s=0.0, seen=None: {"installed": {}, "complete": False, "inbox": 0})
    with pytest.raises(RuntimeError, match="no live peer of 'c' left"):
        T.staged_install(mgr, "c#1", rec, set(), "fluid", bits=4)
    assert mgr.transfers[-1]["state"] == "failed"
