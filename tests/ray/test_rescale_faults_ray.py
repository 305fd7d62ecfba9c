"""A rescale (``dep.rescale``, issue #41; replistream/engines/ray/rescale.py) under what it had not yet
met: a host lost in the middle of the move, garbage collection on, and changes of the running
query issued from another thread while it moves bins. Each output equals the reference run as a
multiset (or, for a lost host, the rescale fails loudly naming what was lost).

The fault is placed in the middle of the move by the feed itself, not by a sleep: the feeder
waits at a gate a few chunks after the rescale's time ``T0``, so the steps whose times are later
than anything fed cannot be done yet; the test waits (with a deadline) until a taking replica has
installed a step, then acts, then opens the gate."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import ray

from replistream import Query, deploy, seconds
from replistream.engines.ray import GCConfig
from replistream.errors import RunFailed
from replistream.sources import Call
from replistream.testing import assert_same_output, run_reference

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.slow]

SERVERS = ["boston", "london", "tokyo"]


def query(name="rescale_faults"):
    q = Query(name)
    s = q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=seconds(0.1))
    kept = s.filter(lambda b: b["v"] > -10.0, name="keep")  # every tuple (replace_function changes it)
    kept.window(size=seconds(1), by="k", aggs={"n": "count", "t": ("v", "sum")}, name="per_k").sink("out")
    return q.build()


def inputs(n=40_000, chunk=500, seed=3, span=120):
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(0, seconds(span), n))
    k, v = rng.integers(0, 500, n), rng.normal(size=n)
    return {"s": [{"ts": ts[a:a + chunk], "k": k[a:a + chunk], "v": v[a:a + chunk]} for a in range(0, n, chunk)]}


class Gate:
    """A point in the input where the feeder waits (a ``Call`` sentinel) until the test opens it."""

    def __init__(self):
        self.reached, self.opened = threading.Event(), threading.Event()

    def sentinel(self):
        def wait(_dep):
            self.reached.set()
            assert self.opened.wait(300), "the gate was never opened"
        return Call(wait)


def gated_at(data, at: dict):
    """``data`` with gates at chunk indices: ``{index: gate}``."""
    chunks = list(data["s"])
    for i in sorted(at, reverse=True):
        chunks.insert(i, at[i].sentinel())
    return {"s": chunks}


def start_rescale(dep, p, strategy, **kw):
    """Run ``dep.rescale("per_k", p, ...)`` in a thread; returns ``(thread, outcome)`` where
    ``outcome`` gets ``"rec"`` (the record) or ``"error"`` (what it raised). Returns once the switch
    is made (the partitions counted: the rescale is past its routing and holds its steps)."""
    out: dict = {}

    def run():
        try:
            out["rec"] = dep.rescale("per_k", p, strategy=strategy, **kw)
        except Exception as e:  # noqa: BLE001 - judged by the test
            out["error"] = e

    t = threading.Thread(target=run, name="test-rescale")
    t.start()
    tick = threading.Event()
    while dep.partitions("per_k") != p and t.is_alive():
        tick.wait(0.01)
    return t, out


def status(dep, group):
    """``{label: moves_status}`` of the running replicas of partition ``group`` (``"per_k.1"``)."""
    return {label: ray.get(h.moves_status.remote(), timeout=60) for label, h in dep.topology.running(group)}


def wait_mid_move(dep, taking="per_k.1", giving="per_k.0"):
    """Until a running replica of the taking partition installed a step (deadline 120 s); asserts
    that steps are left (the feed is held before the last step's time)."""
    deadline = threading.Event()
    for _ in range(2400):
        st = status(dep, taking)
        if any(s["installed"] >= 1 for s in st.values()):
            break
        deadline.wait(0.05)
    else:
        raise AssertionError(f"no step installed at {taking} within 120 s: {status(dep, taking)}")
    assert all(s["take"] for s in st.values()), f"the move ended before the fault: {st}"
    assert any(s["give"] for s in status(dep, giving).values()), status(dep, giving)
    return st


# -- 1. a host lost in the middle of a rescale -------------------------------------------------------
def test_a_server_lost_mid_move_takes_a_giving_and_a_taking_replica_and_the_rescale_stays_exact():
    """1 -> 2 fluid, k=2: in the middle of the move (a step installed, others not yet reachable) the
    server of a replica ``per_k.0#i`` of the giving partition is killed (one without the
    application, whose single replica cannot be lost): it holds the new partition's replica started
    beside it (``per_k.1#i``) too, and whatever else runs there. Every step is still
    given by the other replica of ``per_k.0`` and installed at the other replica of ``per_k.1``
    (the rescale failing, even naming what was lost, is a failure here: a replica of each survived);
    the run's output equals the reference run's."""
    q, data = query(), inputs(seed=21)
    ref = run_reference(q, data)
    first, second = Gate(), Gate()
    # chunks of 1.5 s of event time; the 64 steps 100 ms apart span 6.4 s from T0 (at chunk 40):
    # the feed waits again at chunk 42, about half way through them
    with deploy(q, servers=SERVERS, k=2, parallelism={"per_k": 1}, bits=7) as dep:
        dep.feed(gated_at(data, {40: first, 42: second}), pace=None)
        assert first.reached.wait(120)
        t, out = start_rescale(dep, 2, "fluid", gap_ms=100.0, timeout=120.0)
        first.opened.set()
        assert second.reached.wait(120)
        wait_mid_move(dep)
        # the server of a replica of per_k.0 that holds no application (an application has one
        # replica: losing it is a fault beyond the model)
        apps = {dep.topology.server(a) for a in q.sinks}
        (i, server), *_ = [(i, dep.topology.server(f"per_k.0#{i}")) for i in range(2)
                           if dep.topology.server(f"per_k.0#{i}") not in apps]
        assert dep.topology.server(f"per_k.1#{i}") == server  # (new partitions start beside partition 0's)
        victims = dep.kill_server(server)
        assert {f"per_k.0#{i}", f"per_k.1#{i}"} <= set(victims), victims
        second.opened.set()
        t.join(timeout=300)
        assert not t.is_alive(), "the rescale did not return"
        if "error" in out:
            pytest.fail(f"the rescale failed although a replica of each partition survived: {out['error']}")
        rec = out["rec"]
        assert (rec["steps"], rec["bins_moved"]) == (64, 64), rec
        assert dep.partitions("per_k") == 2
        # every step was given by the survivor and installed at the survivor
        assert status(dep, "per_k.1")[f"per_k.1#{1 - i}"]["installed"] == 64
        assert not dep.topology.is_running(f"per_k.0#{i}") and not dep.topology.is_running(f"per_k.1#{i}")
        dep.wait(timeout=300)
        res = dep.collect()
    assert res.complete, res.punctuation
    assert_same_output(ref.outputs["out"], res.outputs["out"])


def test_a_rescale_whose_every_taking_replica_is_lost_fails_naming_the_partition():
    """The loud way: 1 -> 2 fluid, both replicas of the new partition killed in the middle of the
    move (the giving partition intact): no replica holds the bins it installed, so the rescale raises
    RunFailed naming the lost partition, within its timeout (never waits on it for good)."""
    q, data = query(), inputs(n=20_000, seed=22)
    first, second = Gate(), Gate()
    with deploy(q, servers=SERVERS, k=2, parallelism={"per_k": 1}, bits=7) as dep:
        dep.feed(gated_at(data, {20: first, 22: second}), pace=None)
        assert first.reached.wait(120)
        t, out = start_rescale(dep, 2, "fluid", gap_ms=100.0, timeout=60.0)
        first.opened.set()
        assert second.reached.wait(120)
        wait_mid_move(dep)
        dep.kill_replica("per_k.1", 0)
        dep.kill_replica("per_k.1", 1)
        second.opened.set()
        t.join(timeout=300)
        assert not t.is_alive(), "the rescale did not return"
        assert "error" in out, f"the rescale reported success with every taking replica lost: {out.get('rec')}"
        assert isinstance(out["error"], RunFailed) and "per_k.1" in str(out["error"]), out["error"]
        with pytest.raises(RunFailed, match=r"per_k\.1"):
            dep.wait(timeout=120)


# -- 2. garbage collection on ------------------------------------------------------------------------
ACTIONS = ("gc", "revival", "rebalance", "transfer", "reconfiguration")  # control-loop kinds that change replicas


def ticks_pass(dep, n=3):
    """Until ``n`` more control-loop periods have run (deadline 60 s)."""
    mgr, tick = dep.manager, threading.Event()
    want = mgr.ticks + n
    for _ in range(1200):
        if mgr.ticks >= want:
            return
        tick.wait(0.05)
    raise AssertionError(f"the control loop ran {mgr.ticks} of {want} periods in 60 s")


def test_a_rescale_with_garbage_collection_on_is_exact():
    """GC (kmin=1, a low cost target: it discards whatever kmin lets it) held back until the middle
    of a 1 -> 2 fluid move (the feed held before its last step), then let go: while the rescale runs
    the control loop only measures (no discard or revival: they rewrite the topology the new
    partition is built from and would hand over a replica in the middle of its steps); once it
    returned, GC discards (partition replicas among them), and 2 -> 1 all at once runs on what GC
    left. The output equals the reference run's; every partition keeps a live replica."""
    q, data = query(), inputs(seed=23, span=60, n=20_000, chunk=250)
    ref = run_reference(q, data)
    first, second, third = Gate(), Gate(), Gate()
    # (rates over the whole run, rate_window_s: the cost stays above theta while the feed is held)
    cfg = GCConfig(utility_period_s=0.5, gc_period_s=0.5, theta_fraction=0.05, max_steps=None, kmin=1,
                   rate_window_s=600.0)
    with deploy(q, servers=4, k=2, network="geo", gc=cfg, parallelism={"per_k": 1}, bits=7) as dep:
        dep.manager.hold_gc_until = float("inf")  # no discard yet (theta is still taken at the first period)
        dep.feed(gated_at(data, {30: first, 32: second, 55: third}), pace=None)
        assert first.reached.wait(120)
        t, out = start_rescale(dep, 2, "fluid", gap_ms=100.0, timeout=120.0)
        first.opened.set()
        assert second.reached.wait(120)
        wait_mid_move(dep)
        seen = len(dep.gc_events())
        dep.manager.hold_gc_until = 0.0  # GC may discard from now on ...
        ticks_pass(dep)
        during = [e for e in dep.gc_events()[seen:] if e["kind"] in ACTIONS]
        assert t.is_alive() and not during, f"the control loop acted in the middle of a rescale: {during}"
        second.opened.set()  # ... once the rescale returned
        t.join(timeout=300)
        assert not t.is_alive() and "rec" in out, out
        assert out["rec"]["steps"] == 64, out["rec"]
        assert third.reached.wait(120)
        tick = threading.Event()
        for _ in range(1200):  # GC discarded a replica of a partition of per_k (deadline 60 s)
            if any(e["kind"] == "gc" and any(g.startswith("per_k.") for g in e.get("partitions", []))
                   for e in dep.gc_events()):
                break
            tick.wait(0.05)
        else:
            raise AssertionError(f"GC discarded no partition replica: {dep.gc_events()[-3:]}")
        t, back = start_rescale(dep, 1, "all-at-once", timeout=120.0)
        third.opened.set()
        t.join(timeout=300)
        assert not t.is_alive() and "rec" in back, back
        assert back["rec"]["retired_replicas"] and dep.partitions("per_k") == 1
        dep.wait(timeout=300)
        res = dep.collect()
        assert any(dep.alive.get(r.label) for r in dep.topology.replicas("per_k.0", state="live"))
    assert res.complete, res.punctuation
    assert_same_output(ref.outputs["out"], res.outputs["out"])


# -- 3. a change of the running query racing a rescale ------------------------------------------------
def call_with_deadline(fn, seconds_=30.0):
    """``fn()`` in a thread of its own; returns what it raised (None if nothing); fails if it did not
    return within ``seconds_`` (a change must be refused at once, never waited on)."""
    out: dict = {}

    def run():
        try:
            out["rec"] = fn()
        except Exception as e:  # noqa: BLE001 - judged by the test
            out["error"] = e

    t = threading.Thread(target=run, name="test-change")
    t.start()
    t.join(timeout=seconds_)
    assert not t.is_alive(), f"a change issued during a rescale did not return within {seconds_} s"
    return out


def test_changes_issued_while_a_rescale_moves_bins_are_refused_and_work_after_it():
    """While a fluid 1 -> 2 rescale moves bins (the feed held before its last step: it cannot have
    ended), replace_function, add_operator and set_replication issued from another thread are each
    refused at once, in one line naming the rescale, and nothing of them is applied; once the rescale
    returned, replace_function and add_operator work; the output of every application equals the
    reference run of the query as changed."""
    q, data = query(), inputs(seed=24)
    first, second, third = Gate(), Gate(), Gate()
    with deploy(q, servers=SERVERS, k=2, parallelism={"per_k": 1}, bits=7) as dep:
        dep.feed(gated_at(data, {30: first, 32: second, 50: third}), pace=None)
        assert first.reached.wait(120)
        t, out = start_rescale(dep, 2, "fluid", gap_ms=100.0, timeout=120.0)
        first.opened.set()
        assert second.reached.wait(120)
        wait_mid_move(dep)
        before = (list(dep.changes), sorted(dep.query.operators), sorted(dep.handles), dict(dep.channel_opts["partitions"]))
        for name, fn in (("replace_function", lambda: dep.replace_function("keep", lambda b: b["v"] > 0.0)),
                         ("add_operator", lambda: dep.add_operator("per_k", lambda s: s.sink("raw"))),
                         ("set_replication", lambda: dep.set_replication("per_k", 3))):
            got = call_with_deadline(fn)
            assert "error" in got, f"{name}() ran during a rescale: {got.get('rec')}"
            assert isinstance(got["error"], RuntimeError), got["error"]
            assert f"{name}() cannot run while a rescale moves bins" in str(got["error"]), got["error"]
            assert "\n" not in str(got["error"])
        after = (list(dep.changes), sorted(dep.query.operators), sorted(dep.handles), dict(dep.channel_opts["partitions"]))
        assert after == before, "a refused change was applied in part"
        assert t.is_alive() and "rec" not in out, "the rescale ended with the feed held before its steps"
        second.opened.set()
        t.join(timeout=300)
        assert not t.is_alive() and "rec" in out, out
        assert out["rec"]["steps"] == 64
        # after the rescale: changes run (the feed held at a third gate, a third of the input to come)
        assert third.reached.wait(120)
        rf = dep.replace_function("keep", lambda b: b["v"] > 0.0)
        add = dep.add_operator("per_k", lambda s: s.filter(lambda b: b["n"] > 1, name="busy").sink("busy_out"))
        assert rf["change"] == "replace_function" and add["added"] == ["busy", "busy_out"], (rf, add)
        third.opened.set()
        dep.wait(timeout=300)
        res = dep.collect()
        assert res.complete, res.punctuation
        ref = run_reference(dep.query, data)
        assert set(dep.query.sinks) == {"out", "busy_out"}
        for app in dep.query.sinks:
            assert_same_output(ref.outputs[app], res.outputs[app])
        assert len(ref.outputs["busy_out"]) > 0
