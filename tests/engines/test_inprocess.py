"""The in-process engine's own contract: placement and KillServer, sentinels it cannot run,
and runs that repeat exactly (the replication properties are in test_replication_properties.py,
hand-over in test_handover_properties.py, every engine against the ideal run in test_conformance.py)."""
from __future__ import annotations

import dataclasses

import pytest

from replistream import Query, QueryError
from replistream.engines.inprocess import InProcessEngine, default_placement
from replistream.sources import Call, KillReplica, KillServer, Pause, Sentinel
from replistream.testing import assert_same_output, chunked, run_reference, run_replicated


def window_query() -> Query:
    q = Query("w")
    s = q.source("s", {"k": "i8", "v": "i8"}, punctuate_every=4)
    s.window(size=8, slide=4, by="k", aggs={"n": "count", "t": ("v", "sum")}, name="w").filter(
        lambda b: b["n"] > 0, name="f").sink("out")
    return q.build()


RECS = [{"ts": t, "k": t % 5, "v": t * 7 % 11} for t in range(120)]


def feed(*events: Sentinel, at: int = 60) -> dict:
    return {"s": chunked(RECS[:at], 6) + list(events) + chunked(RECS[at:], 6)}


def check(q, data, rep):
    ref = run_reference(q, data)
    assert rep.complete
    assert_same_output(ref.outputs["out"], rep.outputs["out"])


def test_kill_server_kills_every_replica_the_placement_puts_there():
    q = window_query()
    placement = {"entry": ["a", "b"], "w": ["b", "c"], "f": ["c", "a"], "out": ["a"]}
    data = feed(KillServer("c"))
    rep = run_replicated(q, data, k=2, seed=2, placement=placement)
    check(q, data, rep)
    assert sorted(rep.stats["harness"].crashed) == ["f#0", "w#1"]
    assert rep.stats["harness"].spared == []


def test_kill_server_without_placement_uses_replica_i_on_s_i_and_spares_the_application():
    q = window_query()
    assert default_placement(q, 3)["w"] == ["s0", "s1", "s2"] and default_placement(q, 3)["out"] == ["s0"]
    data = feed(KillServer("s0"))
    rep = run_replicated(q, data, k=3, seed=5)
    check(q, data, rep)
    assert sorted(rep.stats["harness"].crashed) == ["f#0", "s#0", "w#0"]
    assert rep.stats["harness"].spared == ["out#0"]  # an application has one replica


def test_kill_server_spares_the_last_working_replica():
    q = window_query()
    data = feed(KillReplica("w", 1), KillServer("s0"))
    rep = run_replicated(q, data, k=2, seed=1)
    check(q, data, rep)
    h = rep.stats["harness"]
    assert sorted(h.crashed) == ["f#0", "s#0", "w#1"] and h.spared == ["w#0", "out#0"]


def test_a_server_killed_twice_is_killed_once():
    q = window_query()
    data = {"s": chunked(RECS[:30], 6) + [KillServer("s1")] + chunked(RECS[30:90], 6) + [KillServer("s1")]
            + chunked(RECS[90:], 6)}
    rep = run_replicated(q, data, k=2, seed=3)
    check(q, data, rep)
    assert sorted(rep.stats["harness"].crashed) == ["f#1", "s#1", "w#1"]


def test_unknown_server_is_refused_before_the_run():
    with pytest.raises(QueryError, match="KillServer: no server 'nowhere'"):
        run_replicated(window_query(), feed(KillServer("nowhere")), k=2)


def test_call_needs_a_deployment():
    with pytest.raises(QueryError, match="Call: the in-process engine has no deployment"):
        run_replicated(window_query(), feed(Call(lambda d: d.kill_replica("w", 0))), k=2)


def test_a_sentinel_the_engine_does_not_know_is_refused():
    @dataclasses.dataclass(frozen=True)
    class Shout(Sentinel):
        word: str

    with pytest.raises(QueryError, match="Shout: the in-process engine cannot run this sentinel"):
        run_replicated(window_query(), feed(Shout("hey")), k=2)


def test_pause_changes_nothing():
    q = window_query()
    plain = run_replicated(q, feed(), k=2, seed=9, crash=True)
    paused = run_replicated(q, feed(Pause(5.0)), k=2, seed=9, crash=True)
    assert plain.outputs["out"].tobytes() == paused.outputs["out"].tobytes()
    assert dataclasses.asdict(plain.stats["harness"]) == dataclasses.asdict(paused.stats["harness"])


def test_placement_must_give_k_servers():
    with pytest.raises(ValueError, match="exactly k=3 distinct servers"):
        InProcessEngine(window_query(), k=3, placement={"entry": ["a", "b"], "w": ["a", "b"], "f": ["a", "b"],
                                                         "out": ["a"]})


def test_an_engine_runs_again_from_its_seed():
    q = window_query()
    eng = InProcessEngine(q, k=3, seed=4, crash=True, audit=True)
    a, b = eng.run(feed(KillServer("s2"))), eng.run(feed(KillServer("s2")))
    assert a.outputs["out"].tobytes() == b.outputs["out"].tobytes()
    assert dataclasses.asdict(a.stats["harness"]) == dataclasses.asdict(b.stats["harness"])
    check(q, feed(), a)
