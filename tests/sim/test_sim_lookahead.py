"""Revival decided inside the batched engine (#30, point 4): look-ahead epochs.

A coordinator ``(period_s, fn, ahead)`` lets the batched engine run up to ``ahead(sim, t)``
without stopping and replay the calls in between from what it recorded. The invariant: every
replayed call observes (``Simulator.input_delays``) what the call of a run stopped at every
period observes, and a replayed call that acts stops the run (``LookaheadMiss``).
"""
from __future__ import annotations

import math

import numpy as np
import pytest


def _setting(duration_s=600.0):
    from replistream.network import GeoLatencyModel, default_servers
    from replistream.placement import fig1_sources
    from replistream.workloads import fig1_inputs, fig1_query

    servers = default_servers(6)
    net = GeoLatencyModel(servers, seed=2)
    q = fig1_query(3, window_s=10)
    names = [s.name for s in servers]
    plan = {"entry": names[:2], "loads": names[1:2], "pings": names[2:3], "correlate": names[3:5],
            "hot": names[4:6], "alerts": [names[0]]}
    return q, plan, net, fig1_inputs(3, duration_s=duration_s, period_s=10, seed=1, chunk=6), \
        fig1_sources(q, servers)


def _observe(ahead_s, scenario=None, act_at=None):
    """Run with a coordinator that records every call's input_delays (and, at ``act_at``, applies
    the same snapshot again); ``ahead_s``: look-ahead horizon after each call (None: stop at every call)."""
    from replistream.sim import Simulator

    q, plan, net, inputs, sources = _setting()
    seen = []

    def fn(sim, t):
        seen.append((t, sim.input_delays(t)))
        if act_at is not None and t == act_at:
            sim.apply_snapshot(snap)

    coord = (10.0, fn) if ahead_s is None else (10.0, fn, lambda sim, t: t + ahead_s)
    sim = Simulator(q, plan, net, sources=sources, scenario=scenario, coordinator=coord, batch_s=600.0,
                    retain=True)
    from replistream.gc import snapshot_from_plan

    snap = snapshot_from_plan(q, plan)
    res = sim.run(inputs, until=540.0)
    return seen, res, sim


def _same(a, b):
    assert [t for t, _ in a] == [t for t, _ in b]
    for (t, x), (_, y) in zip(a, b):
        assert sorted(x) == sorted(y), t
        for k in x:
            assert math.isclose(x[k], y[k], rel_tol=0, abs_tol=1e-9), (t, k, x[k], y[k])


def test_replayed_calls_observe_what_calls_of_a_stopped_run_observe():
    """The same observation at every call, on a run with a delayed link and a cut (large delays and
    silences), whether the engine stops every 10 s or runs 100 or 300 s ahead; same outputs."""
    from replistream.scenario import Scenario

    q, plan, *_ = _setting()
    sc = Scenario.from_dict({"events": [
        *({"at": 100, "action": "delay_link", "a": plan["loads"][0], "b": c, "extra_ms": 900, "duration": 100}
          for c in plan["correlate"]),
        *({"at": 250, "action": "cut_link", "a": e, "b": plan["pings"][0], "duration": 170} for e in plan["entry"])]})
    stop, r0, _ = _observe(None, sc)
    assert any(v > 0.5 for _, d in stop for v in d.values())  # the scenario is seen
    for ahead in (100.0, 300.0):
        got, r1, sim = _observe(ahead, sc)
        _same(stop, got)
        assert sim._batch.lookahead_epochs > 0
        for app in q.sinks:
            np.testing.assert_array_equal(np.sort(r0.outputs[app]["id"]), np.sort(r1.outputs[app]["id"]))
            np.testing.assert_allclose(np.sort(r0.latencies(app)[1]), np.sort(r1.latencies(app)[1]), atol=1e-9)


def test_a_replayed_call_that_acts_stops_the_run():
    from replistream.sim.batch import LookaheadMiss

    with pytest.raises(LookaheadMiss, match="acted at t=50"):
        _observe(100.0, act_at=50.0)
    # the last call of a look-ahead sees its time's exact state and may act
    seen, _, sim = _observe(100.0, act_at=100.0)
    assert sim.mutations == 1 and seen[-1][0] == 540.0


def test_a_lookahead_needs_the_batched_engine():
    from replistream.sim import Simulator

    q, plan, net, _, sources = _setting()
    with pytest.raises(ValueError, match="batched execution"):
        Simulator(q, plan, net, sources=sources, coordinator=(10.0, lambda s, t: None, lambda s, t: None))


def test_link_bounds_hold_at_every_second_of_the_window():
    """The bound is at least the model's latency at every time of the window (inf in an outage)."""
    from replistream.network import GeoLatencyModel, default_servers
    from replistream.sim.lookahead import link_bounds_ms

    m = GeoLatencyModel(default_servers(12), seed=5)
    names = m.names
    pairs = [(a, b) for a in names for b in names if a != b]
    for t0 in (0.0, 7_300.0, 86_000.0):
        b = link_bounds_ms(m, pairs, t0, t0 + 300)
        ts = np.arange(t0, t0 + 300, 0.25)
        for (a, c), x in zip(pairs, b):
            lat = m.latencies_ms(a, c, ts)
            assert (lat <= x + 1e-9).all() or not np.isfinite(x), (a, c, t0)
            if not np.isfinite(lat).all():
                assert x == math.inf


def test_delay_bounds_are_upper_bounds_of_what_replicas_observe():
    """On a run without a scenario, no call observes more than the bound computed before it."""
    from replistream.sim import Simulator
    from replistream.sim.lookahead import delay_bounds

    q, plan, net, inputs, sources = _setting()
    worst = []

    def fn(sim, t):
        b = delay_bounds(sim, t - 60.0, t + 10.0)
        d = sim.input_delays(t)
        worst.extend((d[k], b[k]) for k in d if k in b)

    Simulator(q, plan, net, sources=sources, coordinator=(10.0, fn), batch_s=600.0).run(inputs, until=540.0)
    assert worst and all(d <= b for d, b in worst)
