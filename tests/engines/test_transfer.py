"""Staged state transfer in the in-process harness (issue #8; Megaphone §3.3, docs/migration.md).

Every strategy keeps replication transparency (output equals the reference, and every replica's
emissions are a sub-multiset of its operator's ideal output: ``audit=True``) while another replica
fails; a transfer whose peer dies restarts from another working replica; tampered steps are caught.
"""
from __future__ import annotations

import random

import numpy as np
import pytest

from replistream import Query
from replistream.replica import StagedReplica, splittable
from replistream.operators.keyed import KeyedCount
from replistream.testing import (AddReplica, KillReplica, ReplicaDivergence, Revive, assert_same_output, chunked,
                                 run_reference, run_replicated)
from replistream.replica.transfer import STRATEGIES, plan_transfer


def keyed_count_query() -> Query:
    q = Query("kc")
    s = q.source("s", {"k": "i8", "v": "i8"}, punctuate_every=4)
    s.apply(KeyedCount(by="k", keep=("v",), bits=4), name="op").sink("out")
    return q


def window_query() -> Query:
    q = Query("tw")
    s = q.source("s", {"k": "i8", "v": "i8"}, punctuate_every=4)
    s.window(size=8, slide=4, by="k", aggs={"n": "count", "s": ("v", "sum")}, name="op").sink("out")
    return q


def join_query() -> Query:
    q = Query("j")
    a = q.source("s", {"k": "i8", "v": "i8"}, punctuate_every=4)
    b = q.source("t", {"k": "i8", "w": "i8"}, punctuate_every=4)
    a.join(b, window=6, on="k", name="op").sink("out")
    return q


def count_window_query() -> Query:
    q = Query("cw")
    s = q.source("s", {"k": "i8", "v": "i8"}, punctuate_every=4)
    s.count_window(size=3, by="k", aggs={"s": ("v", "sum")}, name="op").sink("out")
    return q


QUERIES = {"keyed_count": keyed_count_query, "time_window": window_query, "join": join_query,
           "count_window": count_window_query}


def scenario(name: str, seed: int, strategy: str, kill_other: bool = True, n: int = 160):
    """Inputs with a staged Revive of replica 0 (k=3) and, right after it, the crash of replica 1."""
    r = random.Random(seed)
    recs = [{"ts": t, "k": r.randrange(12), "v": r.randrange(100)} for t in range(n)]
    cut = r.randrange(20, n - 40)
    events = [Revive("op", 0, strategy=strategy, bins_per_step=r.randrange(1, 4), bits=r.choice([2, 3]),
                     delay=r.randrange(10))]
    if kill_other:
        events.append(KillReplica("op", 1))
    data = {"s": chunked(recs[:cut], r.randrange(2, 6)) + events + chunked(recs[cut:], 5)}
    if name == "join":
        data["t"] = chunked([{"ts": t, "k": r.randrange(12), "w": r.randrange(100)} for t in range(n)], 5)
    return data


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", sorted(QUERIES))
def test_every_strategy_is_transparent_under_a_concurrent_failure(name, strategy):
    q = QUERIES[name]()
    multi = 0
    for seed in range(6):
        data = scenario(name, seed, strategy)
        ref = run_reference(q, data)
        rep = run_replicated(q, data, k=3, seed=seed, crash=seed % 2 == 1, audit=True)
        assert_same_output(ref.outputs["out"], rep.outputs["out"])
        (tr,) = rep.stats["harness"].transfers
        assert tr["strategy"] == strategy and tr["replaced"] == "op#0"
        assert "op#1" in rep.stats["harness"].crashed
        multi += tr["steps"] > 1
    assert (multi > 0) == (strategy != "all-at-once")


def test_staged_receivers_really_ran_partial_cores():
    """Guard: over fixed seeds, staged receivers applied tuples before holding every bin (early
    outputs), merged partial cores, and got steps from peers at different punctuations."""
    early = merges = 0
    for seed in range(8):
        data = scenario("keyed_count", seed, "fluid", kill_other=False)
        rep = run_replicated(keyed_count_query(), data, k=2, seed=seed, audit=True)
        (tr,) = rep.stats["harness"].transfers
        early += tr["early_tuples"] > 0
        merges += tr["merges"] > 0
    assert early > 0 and merges > 0


@pytest.mark.slow
def test_a_transfer_whose_peer_dies_restarts_from_another_peer():
    """The peer of a fluid transfer (replica 1) dies a few chunks later; the rest comes from replica 2."""
    restarted = 0
    for seed in range(10):
        r = random.Random(seed)
        recs = [{"ts": t, "k": r.randrange(16), "v": r.randrange(100)} for t in range(200)]
        data = {"s": chunked(recs[:40], 4) + [Revive("op", 0, peer=1, strategy="fluid", bits=3)] + chunked(recs[40:60], 4)
                + [KillReplica("op", 1)] + chunked(recs[60:], 4)}
        for name in ("keyed_count", "time_window"):
            q = QUERIES[name]()
            ref = run_reference(q, data)
            rep = run_replicated(q, data, k=3, seed=seed, audit=True)
            assert_same_output(ref.outputs["out"], rep.outputs["out"])
            (tr,) = rep.stats["harness"].transfers
            if tr["restarts"]:
                restarted += 1
                assert tr["peers"][0] == "op#1" and tr["peers"][-1] == "op#2"
    assert restarted >= 5


@pytest.mark.slow  # 2.4 s in the quick subset (#31)
def test_added_replicas_and_transfers_at_every_level_of_a_chain():
    """A Join feeding a keyed count; staged AddReplica at both levels with background crashes."""
    q = Query("chain")
    a = q.source("s", {"k": "i8", "v": "i8"}, punctuate_every=4)
    b = q.source("t", {"k": "i8", "w": "i8"}, punctuate_every=4)
    j = a.join(b, window=6, on="k", name="join")
    j.apply(KeyedCount(by="k_l", bits=3), name="op").sink("out")
    for seed in range(6):
        r = random.Random(seed)
        recs = [{"ts": t, "k": r.randrange(8), "v": t} for t in range(120)]
        data = {"s": chunked(recs[:50], 5) + [AddReplica("join", strategy="batched", bins_per_step=2, bits=3),
                                               AddReplica("op", strategy="fluid", bits=2)] + chunked(recs[50:], 5),
                "t": chunked([{"ts": t, "k": r.randrange(8), "w": t} for t in range(120)], 5)}
        ref = run_reference(q, data)
        rep = run_replicated(q, data, k=2, seed=seed, crash=True, audit=True)
        assert_same_output(ref.outputs["out"], rep.outputs["out"])
        assert len(rep.stats["harness"].transfers) == 2


def _drop_applied(ck):
    from replistream.operators.dupfilter import FilterState

    ck.filters = tuple(FilterState(f.max_punct, f.applied_ts[:0], f.applied_ids[:0]) for f in ck.filters)
    return ck


def _drop_state(ck):
    ck.logic = ck.logic.select([])
    return ck


@pytest.mark.parametrize("tamper", [_drop_applied, pytest.param(_drop_state, marks=pytest.mark.slow)],  # 2.2 s (#31)
                         ids=["applied-ids", "state"])
def test_tampered_steps_are_caught(tamper):
    """Negative control: steps without their applied ids or their state make some run fail (the audit
    or the comparison), and the same runs pass untampered."""
    caught = 0
    for seed in range(10):
        r = random.Random(seed)
        recs = [{"ts": t, "k": r.randrange(6), "v": r.randrange(9)} for t in range(120)]
        for good in (True, False):
            ev = Revive("op", 0, peer=1, strategy="batched", bins_per_step=2, bits=2,
                        tamper=None if good else tamper)
            data = {"s": chunked(recs[:60], 7) + [ev, KillReplica("op", 1)] + chunked(recs[60:], 5)}
            q = keyed_count_query()
            ref = run_reference(q, data)
            try:
                rep = run_replicated(q, data, k=2, seed=seed, audit=True)
                assert_same_output(ref.outputs["out"], rep.outputs["out"])
            except (AssertionError, ReplicaDivergence):
                assert not good, f"seed {seed}: the untampered run failed"
                caught += 1
    assert caught >= 3


def test_plans_and_splittability():
    assert [len(s) for s in plan_transfer("batched", 4, 5)] == [5, 5, 5, 1]
    steps = plan_transfer("fluid", 3)
    assert [s.tolist() for s in steps] == [[b] for b in range(8)]
    with pytest.raises(ValueError):
        plan_transfer("teleport", 3)
    assert splittable(keyed_count_query().build(), "op")
    assert splittable(join_query().build(), "op")
    q = Query("u")
    a, b = q.source("a", {"x": "i8"}), q.source("b", {"y": "i8"})
    a.join(b, window=5, name="cross").sink("o")
    assert splittable(q.build(), "cross")  # an unkeyed join: all its state in bin 0, still correct
    q = Query("sorted")
    s = q.source("s", {"x": "i8"})
    s.apply(lambda n, ins, strict: __import__("replistream").operators.MapLogic(n, ins, lambda b: b, None, strict)
            if False else _Ordered(n, ins, strict), order_sensitive=True, name="o").sink("out")
    assert not splittable(q.build(), "o")


class _Ordered(__import__("replistream").operators.OperatorLogic):
    """A stateless order-sensitive operator (a Sorter goes in front of it)."""

    stateless = True

    def __init__(self, name, ins, strict=False):
        super().__init__(name, ins, ins[0], strict)

    def _on_batch(self, port, batch):
        return [batch]


def test_staged_replica_holds_back_tuples_of_missing_bins_and_punctuations():
    q = keyed_count_query().build()
    from replistream import Punctuation
    from replistream.replica import ReplicaCore

    peer = ReplicaCore(q, "op", channels=[1], retain=True)
    schema = q.schema_of("s")
    b = schema.from_columns({"ts": [1, 2, 3, 4], "k": [1, 2, 3, 4], "v": [0, 0, 0, 0]}, ids=[1, 2, 3, 4])
    new = StagedReplica(q, "op", channels=[1], bits=2)
    assert new.process(0, 0, b) == [] and new.process(0, 0, Punctuation(5)) == []
    assert len(new.missing) == 4 and not new.early  # nothing applied without state
    bins = plan_transfer("fluid", 2)
    for step in bins[:3]:
        new.install_step(peer.checkpoint(2, step), step)
        assert not new.complete
    new.install_step(peer.checkpoint(2, bins[3]), bins[3])
    assert new.complete and new.core.logic.watermark == 5
    assert sorted(np.concatenate(new.early)["k"].tolist()) == [1, 2, 3, 4]
    log, _ = new.final_output()
    assert isinstance(log[-1], Punctuation) and log[-1].p == 5
