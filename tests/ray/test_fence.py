"""The fence checks identity before it kills (issue #40, point 4): a process is signalled only if
it is still the one a replica's probe named (pid and start time), so a pid reused by another
process meanwhile is left alone; a receiver Ray cannot reach for now (``ActorUnavailableError``)
is not counted dead: its link is dropped with a hold on the sender's log and reconnected later.
No Ray cluster: a child process and an ``Outbox`` alone."""
from __future__ import annotations

import signal
import subprocess
import sys

import numpy as np
import ray
import ray.exceptions as rx

from replistream.engines.ray.channels import Link, Outbox, gone_key
from replistream.engines.ray.common import process_start, signal_process
from replistream.schema import TS, Punctuation


def test_a_process_is_killed_only_if_it_is_the_one_named():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        start = process_start(child.pid)
        assert start is not None
        assert not signal_process(child.pid, start + 1, signal.SIGKILL)  # another process's start time
        assert not signal_process(child.pid, None, signal.SIGKILL)  # unknown: never a bare pid
        assert child.poll() is None
        assert signal_process(child.pid, start, signal.SIGKILL)
        assert child.wait(10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
    assert process_start(child.pid) is None or process_start(child.pid) != start


def test_an_unreachable_receiver_is_dropped_with_a_hold_not_counted_dead(monkeypatch):
    ob = Outbox("f#0", "a", None, 0.0)
    ob.add_link(Link("g#0", "b", None, 0, 0, acked=3))
    ob.add_link(Link("g#1", "c", None, 0, 0, acked=9))
    batch = np.zeros(5, dtype=[(TS, "i8"), ("x", "i8")])
    batch[TS] = np.arange(5, 10)
    ob.emit([batch, Punctuation(9)])
    call = object()
    (g0,) = [l for l in ob.links if l.label == "g#0"]
    g0.inflight.append((call, 0.0, 5))
    drops = []
    ob.on_drop = lambda owner, link, reason: drops.append(reason)

    def get(ref, *a, **k):
        raise rx.ActorUnavailableError("unreachable", None)

    monkeypatch.setattr(ray, "get", get)
    ob.collect({call})
    assert drops and drops[0].startswith("receiver unreachable")  # not "receiver died": no failure counted
    assert ob.holds == {gone_key("g#0", 0): 3}  # its reconnection replays from its position
