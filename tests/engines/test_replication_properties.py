"""Replica consistency as properties (Hwang §III-IV): for random inputs, k in 1..4
and random punctuation spacing, the replicated in-process harness delivers
exactly the reference output, as a multiset of (id, ts, values), bit for bit,
with random interleavings, delays, re-sent copies and crashed replicas."""
from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replistream import Punctuation, Query, Summary
from replistream.sources import source_streams
from replistream.testing import assert_same_output, chunked, run_reference, run_replicated, with_punctuations

PROPS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make_records(rng: np.random.Generator, n: int, fields: dict, t_max: int = 600, disorder: int = 0):
    """n records with roughly increasing timestamps (shuffled within +-disorder)."""
    ts = np.sort(rng.integers(0, t_max, n))
    if disorder:
        ts = ts + rng.integers(-disorder, disorder + 1, n)
    recs = []
    for i in range(n):
        r = {"ts": int(ts[i])}
        for name, kind in fields.items():
            if kind == "key":
                r[name] = int(rng.integers(0, 5))
            elif kind == "int":
                r[name] = int(rng.integers(-1000, 1000))
            else:  # floats of wildly different magnitudes: sums depend on order unless exact
                r[name] = float(rng.normal() * 10.0 ** rng.integers(-8, 12))
        recs.append(r)
    return recs


def feed(records, rng: random.Random, explicit_every: int):
    return with_punctuations(records, explicit_every, rng, max_chunk=rng.randint(1, 12))


common = dict(
    seed=st.integers(0, 2**31 - 1),
    k=st.integers(1, 4),
    n=st.integers(0, 60),
    every=st.one_of(st.none(), st.integers(1, 400)),
    explicit=st.integers(1, 10),
    disorder=st.integers(0, 30),
    crash=st.booleans(),
)


def check(query, inputs, k, seed, crash, ordered_sinks=()):
    ref = run_reference(query, inputs)
    rep = run_replicated(query, inputs, k=k, seed=seed, crash=crash)
    assert ref.complete and rep.complete
    for sink in query.sinks:
        assert_same_output(ref.outputs[sink], rep.outputs[sink], ordered=sink in ordered_sinks)
    assert len(ref.dead_letters) == len([d for d in rep.dead_letters if d.where.startswith("source")])
    # dead letters come only from the (shared) entry logic: operators never see contract violations
    assert sum(d.count for d in rep.dead_letters if not d.where.startswith("source")) == 0
    return ref, rep


@pytest.mark.slow
@PROPS
@given(**common)
def test_union_filter_map(seed, k, n, every, explicit, disorder, crash):
    rng, prng = np.random.default_rng(seed), random.Random(seed)
    q = Query("ufm")
    a = q.source("a", {"key": "i8", "v": "f8"}, punctuate_every=every, max_disorder=disorder // 2)
    b = q.source("b", {"key": "i8", "v": "f8"}, punctuate_every=every, max_disorder=disorder // 2)
    (a.union(b).filter(lambda x: x["key"] != 2)
      .map(lambda x: {"key": x["key"], "w": x["v"] * 2.0}, {"key": "i8", "w": "f8"}).sink("out"))
    q.build()
    fields = {"key": "key", "v": "float"}
    inputs = {"a": feed(make_records(rng, n, fields, disorder=disorder), prng, explicit),
              "b": feed(make_records(rng, n, fields, disorder=disorder), prng, explicit)}
    check(q, inputs, k, seed, crash)


@PROPS
@given(**common, window=st.integers(1, 300), keyed=st.booleans())
def test_windowed_join(seed, k, n, every, explicit, disorder, crash, window, keyed):
    rng, prng = np.random.default_rng(seed), random.Random(seed)
    q = Query("join")
    left = q.source("left", {"key": "i8", "x": "i8"}, punctuate_every=every, max_disorder=disorder)
    right = q.source("right", {"key": "i8", "y": "f8"}, punctuate_every=every, max_disorder=disorder)
    if keyed:
        j = left.join(right, window=window, on="key")
    else:
        j = left.join(right, window=window, predicate=lambda l, r: (l["x"] + l["key"]) % 3 != r["key"] % 3)
    j.sink("pairs")
    q.build()
    inputs = {"left": feed(make_records(rng, n, {"key": "key", "x": "int"}, disorder=disorder), prng, explicit),
              "right": feed(make_records(rng, n, {"key": "key", "y": "float"}, disorder=disorder), prng, explicit)}
    ref, _ = check(q, inputs, k, seed, crash)
    # and the reference itself equals a nested-loop join over the accepted source tuples
    streams, _ = source_streams(q, inputs)
    L, R = (np.concatenate([b for b in streams[s] if not isinstance(b, Punctuation)] or [q.schema_of(s).empty()])
            for s in ("left", "right"))
    expected = sorted(
        (int(max(l["ts"], r["ts"])), int(l["x"]), float(r["y"]))
        for l in L for r in R
        if abs(int(l["ts"]) - int(r["ts"])) < window
        and (l["key"] == r["key"] if keyed else (l["x"] + l["key"]) % 3 != r["key"] % 3))
    got = sorted((int(t), int(x), float(y)) for t, x, y in ref.outputs["pairs"][["ts", "x", "y"]].tolist())
    assert got == expected


@pytest.mark.slow
@PROPS
@given(**common, size=st.integers(1, 400), slide=st.integers(1, 400), grouped=st.booleans())
def test_sliding_time_window_aggregate(seed, k, n, every, explicit, disorder, crash, size, slide, grouped):
    rng, prng = np.random.default_rng(seed), random.Random(seed)
    q = Query("twa")
    s = q.source("s", {"key": "i8", "x": "i8", "v": "f8"}, punctuate_every=every, max_disorder=disorder)
    s.window(size=size, slide=slide, by="key" if grouped else None,
             aggs={"n": "count", "sx": ("x", "sum"), "sv": ("v", "sum"), "mv": ("v", "mean"),
                   "lo": ("v", "min"), "hi": ("x", "max"),
                   "first": ("v", Summary(lambda v: v[0], "f8"))}).sink("agg")
    q.build()
    inputs = {"s": feed(make_records(rng, n, {"key": "key", "x": "int", "v": "float"}, disorder=disorder),
                        prng, explicit)}
    check(q, inputs, k, seed, crash)


@PROPS
@given(**common, size=st.integers(1, 8), slide=st.integers(1, 8), grouped=st.booleans())
def test_count_window_aggregate(seed, k, n, every, explicit, disorder, crash, size, slide, grouped):
    rng, prng = np.random.default_rng(seed), random.Random(seed)
    q = Query("cwa")
    s = q.source("s", {"key": "i8", "x": "i8", "v": "f8"}, punctuate_every=every, max_disorder=disorder)
    s.count_window(size=size, slide=slide, by="key" if grouped else None,
                   aggs={"n": "count", "sv": ("v", "sum"), "mx": ("x", "mean"),
                         "seq": ("x", Summary(lambda v: int(np.dot(v, np.arange(1, len(v) + 1))), "i8"))}
                   ).sink("agg", ordered=True)
    q.build()
    inputs = {"s": feed(make_records(rng, n, {"key": "key", "x": "int", "v": "float"}, disorder=disorder),
                        prng, explicit)}
    check(q, inputs, k, seed, crash, ordered_sinks=("agg",))


@pytest.mark.slow
@PROPS
@given(**common, n_servers=st.integers(1, 4), window=st.integers(1, 300))
def test_two_level_fig1_shape(seed, k, n, every, explicit, disorder, crash, n_servers, window):
    """Unions feeding a join feeding a filter (the paper's Fig. 1)."""
    rng, prng = np.random.default_rng(seed), random.Random(seed)
    q = Query("fig1")
    loads = [q.source(f"load_{i}", {"server": "i8", "cpu": "f8"}, punctuate_every=every, max_disorder=disorder)
             for i in range(n_servers)]
    pings = [q.source(f"ping_{i}", {"server": "i8", "rtt": "f8"}, punctuate_every=every, max_disorder=disorder)
             for i in range(n_servers)]
    j = q.union(*loads, name="loads").join(q.union(*pings, name="pings"), window=window, on="server")
    j.filter(lambda b: b["cpu"] > b["rtt"], name="hot").sink("alerts")
    j.sink("all_pairs", ordered=True)
    q.build()
    inputs = {}
    for i in range(n_servers):
        inputs[f"load_{i}"] = feed(make_records(rng, n // n_servers, {"server": "key", "cpu": "float"},
                                                disorder=disorder), prng, explicit)
        inputs[f"ping_{i}"] = feed(make_records(rng, n // n_servers, {"server": "key", "rtt": "float"},
                                                disorder=disorder), prng, explicit)
    check(q, inputs, k, seed, crash, ordered_sinks=("all_pairs",))


@pytest.mark.parametrize("seed", range(5))
def test_harness_really_perturbs(seed):
    """Guard against a harness that cannot fail: with k=3 it must split, re-send,
    crash, and deliver copies from more than one stream replica."""
    rng, prng = np.random.default_rng(seed), random.Random(seed)
    q = Query("guard")
    s = q.source("s", {"key": "i8", "x": "i8"}, punctuate_every=50)
    s.filter(lambda b: b["x"] > -2000).sink("out")
    q.build()
    inputs = {"s": chunked(make_records(rng, 200, {"key": "key", "x": "int"}), 10)}
    rep = run_replicated(q, inputs, k=3, seed=seed, crash=True, resend_prob=0.2)
    h = rep.stats["harness"]
    assert h.splits > 0 and h.resent > 0 and h.crashed
    calm = run_replicated(q, inputs, k=3, seed=seed, crash=False)
    assert sum(w > 0 for w in calm.stats["weights"]["out"][0]) >= 2


def test_harness_detects_a_broken_operator():
    """A replica-inconsistent operator (its output depends on arrival order) must be caught."""
    from replistream.operators import OperatorLogic

    class FirstSeen(OperatorLogic):
        """Order-dependent on purpose: tags each tuple with how many it has seen before."""

        def __init__(self, name, in_schemas, strict=False):
            from replistream import Schema
            super().__init__(name, in_schemas, Schema({"x": "i8", "rank": "i8"}), strict)
            self.seen = 0

        def _on_batch(self, port, batch):
            out = np.empty(len(batch), self.out_schema.dtype)
            for f in ("ts", "id", "x"):
                out[f] = batch[f]
            out["rank"] = self.seen + np.arange(len(batch))
            self.seen += len(batch)
            return [out]

    q = Query("broken")
    a = q.source("a", {"x": "i8"}, punctuate_every=10)
    b = q.source("b", {"x": "i8"}, punctuate_every=10)
    a.union(b).apply(FirstSeen).sink("out")
    q.build()
    rng, prng = np.random.default_rng(0), random.Random(0)
    inputs = {"a": feed(make_records(rng, 50, {"x": "int"}), prng, 3),
              "b": feed(make_records(rng, 50, {"x": "int"}), prng, 3)}
    ref = run_reference(q, inputs)
    rep = run_replicated(q, inputs, k=2, seed=3)
    with pytest.raises(AssertionError, match="output differs from reference"):
        assert_same_output(ref.outputs["out"], rep.outputs["out"])
