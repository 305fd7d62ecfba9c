"""Idle sources (issue #18): a source that goes quiet no longer holds back a join behind it.
The feeder puts heartbeat punctuations on it after ``idle_timeout``; tuples it sends later at
or below one are late and dead-lettered; the run equals the reference over the input with the
logged heartbeats put back (replistream.idle.with_heartbeats)."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import replistream as rs
from replistream.engines.ray import deploy
from replistream.idle import with_heartbeats
from replistream.sources import KillReplica
from replistream.testing import assert_same_output, run_reference

pytestmark = pytest.mark.usefixtures("ray_session")

MS = 1_000


def join_query():
    q = rs.Query("idle")
    fast = q.source("fast", {"key": "i8", "a": "i8"}, punctuate_every=50 * MS)
    slow = q.source("slow", {"key": "i8", "b": "i8"}, punctuate_every=50 * MS)
    fast.join(slow, window=100 * MS, on="key", name="j").sink("joined")
    return q.build()


def chunks(rng, lo, hi, n, field, size=200):
    ts = np.sort(rng.integers(lo, hi, n))
    rows = [{"ts": int(t), "key": int(rng.integers(0, 10)), field: int(i)} for i, t in enumerate(ts)]
    return [rows[i:i + size] for i in range(0, n, size)]


def wait_for(cond, dep, deadline_s=60.0):
    deadline = time.time() + deadline_s
    while time.time() < deadline:
        dep.poll()
        if cond():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
@pytest.mark.parametrize("kill", [False, True])
def test_a_quiet_source_no_longer_holds_back_a_join(kill):
    rng = np.random.default_rng(18)
    fast = chunks(rng, 0, 3_000 * MS, 3_000, "a")  # 3 s of event time, fed at once
    if kill:
        fast.insert(5, KillReplica("j", 0))
    before = chunks(rng, 0, 400 * MS, 300, "b")  # the slow side's first 0.4 s ...
    after = [[{"ts": 300 * MS, "key": 1, "b": -1}, {"ts": 350 * MS, "key": 2, "b": -2}],  # ... late, then
             [{"ts": 5_000 * MS, "key": 3, "b": -3}]]  # beyond everything fed
    go = threading.Event()

    def slow_source():
        yield from before
        go.wait(120)  # quiet until the join's results are all out
        yield from after

    q = join_query()
    inputs = {"fast": fast, "slow": before + after}
    full = run_reference(q, inputs)  # without heartbeats the late tuples would be joined: not the reference
    dep = deploy(q, servers=3, k=2)
    try:
        dep.feed({"fast": fast, "slow": slow_source()}, idle_timeout=0.3)
        # every match of the fast side with the slow side's first 0.4 s comes out while it is quiet
        expected = run_reference(q, {"fast": fast, "slow": before})
        n = len(expected.outputs["joined"])
        assert n > 0
        assert wait_for(lambda: dep.delivered.count("joined") >= n, dep), \
            f"only {dep.delivered.count('joined')} of {n} join results while the slow source was quiet"
        assert dep.heartbeats() and all(h.source == "slow" for h in dep.heartbeats())
        go.set()
        assert dep.wait(120)
        res = dep.collect()
    finally:
        go.set()
        dep.shutdown()
    hb = dep.heartbeats()
    ref = run_reference(q, with_heartbeats(inputs, hb, chunk_size=10_000))
    assert res.complete
    assert_same_output(ref.outputs["joined"], res.outputs["joined"])
    late = lambda r: sum(d.count for d in r.dead_letters if "late" in d.reason)  # noqa: E731
    assert late(res) == late(ref) == 2  # the slow side's two late tuples, set aside with their reason
    assert len(ref.outputs["joined"]) == n < len(full.outputs["joined"])


def test_idle_timeout_is_checked_before_anything_runs():
    q = join_query()
    with deploy(q, servers=2, k=1) as dep:
        with pytest.raises(ValueError, match="idle_timeout of source 'slow'"):
            dep.feed({"fast": [], "slow": []}, idle_timeout={"slow": -1})
        with pytest.raises(ValueError, match="unknown source"):
            dep.feed({"fast": [], "slow": []}, idle_timeout={"nope": 1})
        assert not dep.started
