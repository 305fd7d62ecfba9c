"""Partitions (issue #41): which operators split, how tuples are routed, and what ``parallelism=``
refuses (replistream/partition.py, replistream/plan.py).

* routing sends every tuple to exactly one partition, the one owning its bin; the same whatever
  the batch it comes in (so every upstream replica, however it batches, routes alike); a key's
  bin is its state's bin (the hash ``bin_keys`` gives, the one transfers move); punctuations reach
  every partition;
* the bin map is a pure function of (p, bits) and a rescale moves only the bins it names;
* ``check_parallelism`` answers each mistake with one line naming it and the fix.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replistream import Punctuation, Query, QueryError, seconds
from replistream.ids import hash_columns
from replistream.operators.base import bin_of
from replistream.operators.keyed import KeyedCount
from replistream.partition import (BinMap, Router, assign_bins, check_parallelism, parse_partition_label,
                                   partition_key)
from replistream.plan import PhysicalPlan
from replistream.schema import ID, Marker

PROPS = settings(max_examples=40, deadline=None, derandomize=True, database=None)


def keyed_query() -> Query:
    q = Query("keyed")
    s = q.source("s", {"k": "i8", "v": "f8"})
    f = s.filter(lambda b: b["v"] > 0, name="f")
    f.window(size=10, by="k", name="w").sink("out")
    f.count_window(size=3, by=("k",), name="cw").sink("out2")
    s.apply(KeyedCount(by="k", bits=4), name="kc").sink("out3")
    return q.build()


def batch(q: Query, n: int, seed: int, keys: int = 50) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return q.schema_of("s").from_columns({"ts": np.sort(rng.integers(0, 1000, n)), "k": rng.integers(0, keys, n),
                                          "v": rng.normal(size=n)}, ids=rng.integers(0, 2**63, n).astype(np.uint64))


@PROPS
@given(n=st.integers(0, 300), p=st.integers(1, 7), bits=st.integers(3, 12), seed=st.integers(0, 10**6),
       node=st.sampled_from(["f", "w", "cw", "kc"]))
def test_every_tuple_is_routed_exactly_once_to_its_bins_partition(n, p, bits, seed, node):
    q = keyed_query()
    if p > 1 << bits:
        return
    binmap = BinMap.even(p, bits)
    r = Router(q, node, binmap)
    b = batch(q, n, seed)
    parts = r.split(0, b)
    assert len(parts) == p
    got = np.concatenate(parts)
    assert sorted(got[ID].tolist()) == sorted(b[ID].tolist())  # each tuple once, none made up
    for i, part in enumerate(parts):
        assert (r.partition_of(0, part) == i).all()
        # the batch's own order within each share
        pos = {int(x): j for j, x in enumerate(b[ID])}
        assert [pos[int(x)] for x in part[ID]] == sorted(pos[int(x)] for x in part[ID])


@PROPS
@given(seed=st.integers(0, 10**6), cuts=st.lists(st.integers(1, 199), max_size=6))
def test_routing_does_not_depend_on_how_a_replica_batches(seed, cuts):
    """Two replicas cut the same stream into different batches: each tuple goes to the same partition."""
    q = keyed_query()
    r = Router(q, "w", BinMap.even(3, 8))
    b = batch(q, 200, seed)
    whole = dict(zip(b[ID].tolist(), r.partition_of(0, b).tolist()))
    pieces = np.split(b, sorted(set(cuts)))
    again = {}
    for piece in pieces:
        for i, part in enumerate(Router(q, "w", BinMap.even(3, 8)).split(0, piece)):  # another replica's router
            again.update((x, i) for x in part[ID].tolist())
    assert again == whole


def test_a_keys_bin_is_its_states_bin_and_keys_stay_together():
    q = keyed_query()
    b = batch(q, 500, 3)
    for node in ("w", "cw", "kc"):
        r = Router(q, node, BinMap.even(4, 6))
        logic = q.build_logic(node)
        assert (r.bins(0, b) == bin_of(logic.bin_keys(0, b), 6)).all()
        assert (r.key_hash(0, b) == hash_columns(b, ("k",))).all()
        part = r.partition_of(0, b)
        for k in np.unique(b["k"]):
            assert len(set(part[b["k"] == k].tolist())) == 1, f"{node}: key {k} split across partitions"
    # stateless: by tuple id, so two tuples of one key may go to different partitions
    r = Router(q, "f", BinMap.even(4, 6))
    assert r.by == "tuple" and len(set(r.partition_of(0, b).tolist())) == 4


def test_join_sides_meet_in_one_partition():
    q = Query()
    a = q.source("a", {"k": "i8", "x": "f8"})
    b = q.source("b", {"key": "i4"})
    a.join(b, window=5, left_key="k", right_key="key", name="j").sink("out")
    q.build()
    left = q.schema_of("a").from_columns({"ts": np.arange(100), "k": np.arange(100) % 17, "x": np.zeros(100)},
                                         ids=np.arange(100))
    right = q.schema_of("b").from_columns({"ts": np.arange(100), "key": np.arange(100) % 17}, ids=np.arange(100))
    r = Router(q, "j", BinMap.even(5, 8))
    assert (r.partition_of(0, left) == r.partition_of(1, right)).all()
    assert len(set(r.partition_of(0, left).tolist())) > 1


def test_punctuations_and_markers_reach_every_partition():
    q = keyed_query()
    r = Router(q, "w", BinMap.even(3, 4))
    b = batch(q, 60, 1)
    marker = Marker(5, 1, None)
    routed = r.route(0, [b[:30], Punctuation(4), marker, b[30:], Punctuation(9)])
    for items in routed:
        marks = [it for it in items if not isinstance(it, np.ndarray)]
        assert marks == [Punctuation(4), marker, Punctuation(9)]
    # tuples before a punctuation stay before it in every partition
    for items in routed:
        first = [i for i, it in enumerate(items) if isinstance(it, Punctuation)][0]
        assert all(it["ts"].max() <= b[:30]["ts"].max() for it in items[:first])
    assert sum(len(it) for items in routed for it in items if isinstance(it, np.ndarray)) == len(b)


def test_bin_map_is_pure_and_rescales_move_only_named_bins():
    assert (assign_bins(4096, 3) == assign_bins(4096, 3)).all()
    m1, m2, m4 = BinMap.even(1, 4), BinMap.even(2, 4), BinMap.even(4, 4)
    assert np.bincount(m4.owner).tolist() == [4, 4, 4, 4]
    moved = m2.moves(m4)
    assert len(moved) == 8 and all(c >= 2 for _, _, c in moved)  # half the bins, only into new partitions
    assert all(m2.owner[b] == a and m4.owner[b] == c for b, a, c in moved)
    assert len(m1.moves(m2)) == 8
    for p in range(1, 9):  # balanced, and growing moves bins only into the new partitions
        owner = assign_bins(64, p)
        assert np.bincount(owner).max() - np.bincount(owner).min() <= 1
        for p2 in range(p + 1, 10):
            changed = owner != assign_bins(64, p2)
            assert (assign_bins(64, p2)[changed] >= p).all()
    m = m2.with_owner([0, 1], 1)
    assert m.bins_of(1).tolist() == [0, 1, 8, 9, 10, 11, 12, 13, 14, 15] and m2.bins_of(1).tolist()[0] == 8
    with pytest.raises(ValueError, match="cannot share 4 bins"):
        assign_bins(4, 5)


def test_labels():
    assert parse_partition_label("agg.12") == ("agg", 12)
    assert parse_partition_label("agg") == ("agg", None)
    q = keyed_query()
    plan = PhysicalPlan(q, {"entry": ["a", "b"], "f": ["a", "b"], "w": ["a", "b"], "cw": ["b", "a"],
                            "kc": ["a", "b"], "w.1": ["c", "a"], "out": ["a"], "out2": ["a"], "out3": ["a"]},
                        k=2, parallelism={"w": 2, "kc": 3})
    assert [r.label for r in plan.replicas("w")] == ["w.0#0", "w.0#1", "w.1#0", "w.1#1"]
    assert [plan.server(r) for r in plan.replicas("w")] == ["a", "b", "c", "a"]
    assert [r.label for r in plan.replicas("kc.2")] == ["kc.2#0", "kc.2#1"]
    assert plan.channels("out3") == [6] and plan.channel_groups("out3") == [[0, 0, 1, 1, 2, 2]]
    assert plan.channel_groups("w") == [None]
    edges = [e for e in plan.streams() if e.src.node == "kc"]
    assert sorted({e.channel for e in edges}) == list(range(6))
    assert all(e.channel == plan.position(e.src) for e in plan.streams())
    assert {e.dst.label for e in plan.streams() if e.stream == "f" and e.dst.node == "w"} == \
        {"w.0#0", "w.0#1", "w.1#0", "w.1#1"}


@pytest.mark.parametrize("parallelism, error, match", [
    ({"nope": 2}, QueryError, r"^parallelism: query 'keyed' has no operator 'nope'"),
    ({"w": 0}, ValueError, r"^parallelism\['w'\] must be an integer >= 1 .* write 1 for an unpartitioned"),
    ({"w": 2.0}, ValueError, r"must be an integer >= 1"),
    ({"w": True}, ValueError, r"must be an integer >= 1"),
    ({"w": 5000}, ValueError, r"exceeds the 4096 bins"),
    ({"out": 2}, QueryError, r"'out' is an application, which is not partitioned"),
    ({"s": 2}, QueryError, r"'s' is a source"),
    ([("w", 2)], QueryError, r"must be a mapping"),
])
def test_parallelism_mistakes_are_one_line_naming_the_fix(parallelism, error, match):
    with pytest.raises(error, match=match) as info:
        check_parallelism(keyed_query(), parallelism)
    assert "\n" not in str(info.value)


def test_what_cannot_be_partitioned_says_why():
    q = Query("g")
    s = q.source("s", {"k": "i8"})
    s.window(10, name="total").sink("a")
    s.count_window(5, name="every5").sink("b")
    s.join(s.filter(lambda b: b["k"] > 0), window=3, name="cross").sink("c")

    class Opaque(KeyedCount):  # a user logic that names no key
        def __call__(self, name, in_schemas, strict=False):
            logic = super().__call__(name, in_schemas, strict)
            logic.bin_keys = lambda port, batch: None
            return logic

    s.apply(Opaque(by="k"), name="opaque").sink("d")
    q.build()
    for node, why in [("total", "window with no by= key"), ("every5", "count_window with no by= key"),
                      ("cross", "join with no key"), ("opaque", "names no key")]:
        with pytest.raises(QueryError, match=why) as info:
            check_parallelism(q, {node: 2})
        assert "leave it out of parallelism" in str(info.value) and "\n" not in str(info.value)
    assert partition_key(q, q.operator("filter")) == "tuple"
    q2 = Query("twice")
    q2.source("s", {"k": "i8"}).window(10, by="k").sink("a")
    assert check_parallelism(q2, {"window": 1}) == {}  # one partition: the operator as it is
    with pytest.raises(QueryError, match=r"names 'window_1' twice \(as 'window' too\)"):
        check_parallelism(q2, {"window_1": 2, "window": 3})
