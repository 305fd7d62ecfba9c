"""Damped revival (Hwang §V-C): persistence, hysteresis and a hold against the collector.

Deterministic: times are the values the tests pass in, never a clock."""
from __future__ import annotations

import random

import pytest

from replistream.gc import RevivalDamper, RevivalPolicy, apply_revival, candidate_groups, collect_garbage, plan_revival
from test_gc_revival import fan_in


def test_a_transient_delay_does_not_revive():
    snap = fan_in(dormant={"entry#1->f#0:0"})
    d = RevivalDamper(threshold_s=10, persist=2)
    assert d.plan(0.0, snap, {"f#0": 50.0}) == []     # one spike
    assert d.plan(10.0, snap, {"f#0": 1.0}) == []     # gone (below clear_s = 5): the count restarts
    assert d.plan(20.0, snap, {"f#0": 50.0}) == []    # a new spike counts 1 again
    assert d.streak("f#0") == 1


def test_a_persistent_delay_revives():
    snap = fan_in(dormant={"entry#1->f#0:0"})
    d = RevivalDamper(threshold_s=10, persist=3)
    assert d.plan(0.0, snap, {"f#0": 12.0}) == [] and d.plan(10.0, snap, {"f#0": 12.0}) == []
    (e,) = d.plan(20.0, snap, {"f#0": 12.0})
    assert e.action == "revive-stream" and e.revive_streams == ("entry#1->f#0:0",)
    assert e.delay_s == 12.0
    assert d.streak("f#0") == 0  # escalation needs the delay to persist again
    after = apply_revival(snap, e)
    assert d.plan(30.0, after, {"f#0": 12.0}) == [] and d.plan(40.0, after, {"f#0": 12.0}) == []
    (e2,) = d.plan(50.0, after, {"f#0": 12.0})  # persisted again: the next step of §V-C is planned
    assert e2 == plan_revival(after, {"f#0": 12.0}, 10)[0]


def test_hysteresis_a_delay_between_clear_and_threshold_keeps_the_count():
    snap = fan_in(dormant={"entry#1->f#0:0"})
    d = RevivalDamper(threshold_s=10, clear_s=4, persist=2)
    assert d.plan(0.0, snap, {"f#0": 11.0}) == []
    assert d.plan(10.0, snap, {"f#0": 6.0}) == []      # between 4 and 10: neither counts nor clears
    assert len(d.plan(20.0, snap, {"f#0": 11.0})) == 1  # second period above: fires
    d2 = RevivalDamper(threshold_s=10, clear_s=4, persist=2)
    d2.plan(0.0, snap, {"f#0": 11.0})
    d2.plan(10.0, snap, {"f#0": 3.0})                   # below 4: cleared
    assert d2.plan(20.0, snap, {"f#0": 11.0}) == []


def test_a_replica_not_observed_loses_its_count():
    d = RevivalDamper(threshold_s=1.0, persist=2)
    d.observe({"x": 2.0})
    d.observe({"y": 0.0})
    assert d.streak("x") == 0


def test_a_revived_stream_is_not_discarded_within_its_hold():
    snap = fan_in(dormant={"entry#1->f#0:0"}, theta=0.0)
    d = RevivalDamper(threshold_s=10, persist=1, hold_s=600.0)
    (e,) = d.plan(100.0, snap, {"f#0": 12.0})
    after = apply_revival(snap, e)
    assert after.stream("entry#1->f#0:0").live
    undamped = collect_garbage(after)
    assert not undamped.snapshot.stream("entry#1->f#0:0").live  # the collector's next victim without a hold
    held = collect_garbage(after, keep=d.held(400.0))
    assert held.snapshot.stream("entry#1->f#0:0").live
    assert held.steps > 0  # it collected something else
    assert all("entry#1->f#0:0" not in x.streams for x in held.decisions)
    later = collect_garbage(after, keep=d.held(700.0))  # the hold expired at 700
    assert not later.snapshot.stream("entry#1->f#0:0").live


def test_a_held_replica_blocks_every_group_that_would_discard_it():
    snap = fan_in()
    groups, blocked = candidate_groups(snap, keep={"f#1"})
    assert all("f#1" not in g.replicas for g in groups)
    assert any(w.startswith("held") for w in blocked.values())


def test_undamped_settings_plan_as_plan_revival():
    rng = random.Random(7)
    snap = fan_in(dormant={"entry#1->f#0:0", "entry#0->f#1:0"})
    d = RevivalDamper(threshold_s=10, clear_s=10, persist=1, hold_s=0)
    for t in range(20):
        delays = {lab: rng.choice([0.0, 5.0, 12.0, 30.0]) for lab in ("f#0", "f#1", "app")}
        assert d.plan(float(t), snap, delays) == plan_revival(snap, delays, 10)
        assert d.held(float(t)) == frozenset()


def test_policy_without_a_damper_is_unchanged_and_with_one_is_damped():
    snap = fan_in(dormant={"entry#1->f#0:0"})
    plain = RevivalPolicy(threshold_s=10, proactive=False)
    assert plain.decide(snap, {"f#0": 12.0}) == plan_revival(snap, {"f#0": 12.0}, 10)
    damped = RevivalPolicy(threshold_s=10, proactive=False, damper=RevivalDamper(threshold_s=10, persist=2))
    assert damped.decide(snap, {"f#0": 12.0}, now=0.0) == []
    assert len(damped.decide(snap, {"f#0": 12.0}, now=10.0)) == 1


@pytest.mark.parametrize("kw", [dict(persist=0), dict(clear_s=11.0), dict(clear_s=-1.0), dict(hold_s=-1.0),
                                dict(persist=1.5)])
def test_bad_parameters_are_refused(kw):
    with pytest.raises(ValueError):
        RevivalDamper(threshold_s=10, **kw)


def test_holds_extend_and_expire():
    from replistream.gc import RevivalEvent

    d = RevivalDamper(hold_s=10.0)
    e = RevivalEvent("revive-stream", "delay", "f#0", "", revive_streams=("s",))
    d.fired(0.0, [e])
    d.fired(5.0, [e])
    assert d.held(14.9) == {"s"} and d.held(15.0) == frozenset()
