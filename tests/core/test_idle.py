"""IdleMerge and heartbeats (replistream.idle), without Ray: a clock that ticks on every look
makes the idle decisions deterministic."""
from __future__ import annotations

import itertools
import queue

import numpy as np
import pytest

import replistream as rs
from replistream.idle import Heartbeat, IdleMerge, idle_timeouts, with_heartbeats
from replistream.schema import Punctuation
from replistream.sources import TimeMerge
from replistream.testing import run_reference


def ticking(step=1.0):
    ticks = itertools.count(0.0, step)
    return lambda: next(ticks)


def blocked(q):
    """An iterator that gives what is put on ``q`` until None."""
    return iter(q.get, None)


@pytest.mark.parametrize("seed", range(5))
def test_without_quiet_sources_it_merges_as_time_merge(seed):
    rng = np.random.default_rng(seed)
    srcs = {s: [[{"ts": int(t)}] for t in np.sort(rng.integers(0, 100, rng.integers(0, 8)))] for s in "abc"}
    want = [(t, s) for t, s, _ in TimeMerge({s: iter(c) for s, c in srcs.items()})]
    m = IdleMerge({s: iter(c) for s, c in srcs.items()}, idle_timeout=1e9)
    assert [(t, s) for t, s, _ in m] == want and m.heartbeats == []


def test_a_quiet_source_gets_growing_heartbeats_then_sends_again():
    q = queue.Queue()
    q.put([{"ts": 5}])
    fast = [[{"ts": 10}], [{"ts": 20}], [{"ts": 30}]]
    m = IdleMerge({"fast": iter(fast), "slow": blocked(q)}, idle_timeout=3.0, disorder={"slow": 2},
                  every=0.0, clock=ticking())
    got = []
    while len(got) < 7:
        got.append(next(m))
    kinds = [(s, type(c).__name__, t) for t, s, c in got]
    assert kinds[0] == ("slow", "list", 5)
    data = [k for k in kinds if k[1] == "list"]
    assert [k[2] for k in data] == [5, 10, 20, 30]  # the fast side is not held back
    beats = [h.p for h in m.heartbeats]
    assert beats == sorted(set(beats)) and beats[-1] == 30 - 2  # fed so far, minus the slow side's disorder
    assert all(h.source == "slow" and h.after == 1 for h in m.heartbeats)
    q.put([{"ts": 40}])
    q.put(None)
    rest = list(m)
    assert ("slow", 40) in [(s, t) for t, s, c in rest if isinstance(c, list)]
    assert [(t, s) for t, s, c in rest if c is None] == [(float("inf"), "fast"), (float("inf"), "slow")]


def test_an_error_in_a_source_is_raised_by_the_merge():
    def broken():
        yield [{"ts": 1}]
        raise OSError("disk gone")

    m = IdleMerge({"a": broken()}, idle_timeout=1.0, clock=ticking())
    with pytest.raises(OSError, match="disk gone"):
        list(m)


def test_idle_timeouts_are_checked():
    assert idle_timeouts(1, ["a"]) == {"a": 1.0}
    for bad in (0, -1, float("nan"), True, "1"):
        with pytest.raises(ValueError, match="idle_timeout of source 'a'"):
            idle_timeouts(bad, ["a"])
    with pytest.raises(ValueError, match="unknown source"):
        idle_timeouts({"z": 1}, ["a"])


def test_with_heartbeats_puts_them_back_where_they_were_sent():
    inputs = {"a": [{"ts": i} for i in range(5)], "b": [[{"ts": 1}], [{"ts": 9}]]}
    hb = [Heartbeat("b", 1, 6, 0.1), Heartbeat("b", 1, 8, 0.2)]
    out = with_heartbeats(inputs, hb, chunk_size=2)
    assert out["b"] == [[{"ts": 1}], Punctuation(6), Punctuation(8), [{"ts": 9}]]
    assert len(out["a"]) == 3
    with pytest.raises(ValueError, match="after item 7"):
        with_heartbeats(inputs, [Heartbeat("b", 7, 6, 0.1)])


def test_a_tuple_at_or_below_a_heartbeat_is_late_in_the_reference():
    q = rs.Query("late")
    s = q.source("s", {"x": "i8"})
    s.sink("out")
    q.build()
    inputs = {"s": [[{"ts": 1, "x": 1}], [{"ts": 5, "x": 2}, {"ts": 7, "x": 3}]]}
    res = run_reference(q, with_heartbeats(inputs, [Heartbeat("s", 1, 5, 0.1)], chunk_size=10))
    assert sorted(res.outputs["out"]["x"].tolist()) == [1, 3]
    assert sum(d.count for d in res.dead_letters if "late" in d.reason) == 1
