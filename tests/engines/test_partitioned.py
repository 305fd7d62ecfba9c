"""Partitioned operators on the in-process engine (issue #41): ``parallelism={op: p}`` runs ``op``
as ``p`` partitions x ``k`` replicas, and the output equals the reference run's exactly, with
random crashes (up to ``k - 1`` per partition), with scripted kills of named partition replicas,
and under the audit (every replica's emissions against the ideal run's, per partition).
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replistream import Query, QueryError, seconds
from replistream.ids import fmix
from replistream.operators.keyed import KeyedCount
from replistream.sources import KillReplica, KillServer, Revive, StopReplica
from replistream.engines.inprocess import InProcessEngine
from replistream.testing import assert_same_output, run_reference, run_replicated
from replistream.workloads import fig1_inputs, fig1_query


def columns(ts, chunk, **cols):
    return [{"ts": ts[a:a + chunk], **{k: v[a:a + chunk] for k, v in cols.items()}} for a in range(0, len(ts), chunk)]


def keyed_case():
    q = Query("keyed")
    s = q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=seconds(1))
    f = s.filter(lambda b: b["v"] > -1.0, name="f")
    f.window(size=seconds(4), slide=seconds(2), by="k", aggs={"n": "count", "t": ("v", "sum")},
             name="w").sink("out")
    f.count_window(size=3, slide=2, by="k", aggs={"t": ("v", "sum")}, name="cw").sink("out2")
    s.apply(KeyedCount(by="k", bits=6), name="kc").sink("out3")
    rng = np.random.default_rng(1)
    n = 250
    ts = np.sort(rng.integers(0, seconds(30), n))
    return q.build(), {"s": columns(ts, 7, k=rng.integers(0, 20, n), v=rng.normal(size=n) * 1e3)}


def check(q, data, **kw):
    ref = run_reference(q, data)
    got = run_replicated(q, data, **kw)
    assert got.complete
    for app in q.sinks:
        assert len(ref.outputs[app]), "a vacuous case"
        assert_same_output(ref.outputs[app], got.outputs[app])
    return got


@pytest.mark.parametrize("parallelism", [{"w": 2}, {"w": 3, "f": 2, "kc": 4, "cw": 2}, {"f": 3}])
@pytest.mark.parametrize("seed", [0, 1])
def test_keyed_partitions_with_crashes_equal_the_reference(parallelism, seed):
    got = check(*keyed_case(), k=2, seed=seed, crash=True, audit=True, parallelism=parallelism)
    for label in got.stats["harness"].crashed:
        node, _, _ = label.rpartition("#")
        base = node.split(".")[0]
        assert (base in parallelism) == ("." in node), label  # partition replicas are labelled op.P#R


@pytest.mark.parametrize("parallelism", [{"correlate": 2}, {"correlate": 3, "hot": 2, "loads": 2, "pings": 3}])
def test_join_and_unions_partitioned(parallelism):
    q = fig1_query(n_servers=3, window_s=3.0, punctuate_s=1.0)
    data = fig1_inputs(n_servers=3, duration_s=25, period_s=1.0, seed=1, chunk=5)
    check(q, data, k=3, seed=5, crash=True, audit=True, parallelism=parallelism)


def test_every_partition_works_and_receives_only_its_share():
    q, data = keyed_case()
    eng = InProcessEngine(q, k=2, seed=3, parallelism={"w": 4, "f": 2})
    eng.run(data)
    for node, p in (("w", 4), ("f", 2)):
        router = eng.routers[node]
        fed = {}
        for ch in eng.channels:
            if ch.receiver.node == node:
                fed.setdefault(ch.receiver.label, 0)
                fed[ch.receiver.label] += ch.delivered
        assert len(fed) == 2 * p and all(n > 0 for n in fed.values()), fed
        for r in eng.groups[node]:  # what each replica's logic saw: only tuples of its partition's bins
            assert r.core.filters[0].passed > 0
        assert router.partitions == p
    # the application's filters merge p x k channels, per upstream partition
    (flt,) = eng.groups["out"][0].core.filters
    assert flt.n_channels == 8 and flt.groups == [0, 0, 1, 1, 2, 2, 3, 3]


def test_named_partition_replicas_are_killed_and_stopped():
    q, data = keyed_case()
    chunks = data["s"]
    mid = len(chunks) // 2
    script = {"s": chunks[:mid] + [KillReplica("w.1", 0), StopReplica("kc.0", 1), KillServer("s1")] + chunks[mid:]}
    got = check(q, script, k=2, seed=4, parallelism={"w": 2, "kc": 2})
    h = got.stats["harness"]
    assert "w.1#0" in h.crashed and h.stopped == ["kc.0#1"]
    assert "w.1#1" in h.spared  # KillServer("s1") would have left partition w.1 without a replica
    assert {"w.0#1", "kc.1#1"} <= set(h.crashed)


@pytest.mark.parametrize("event, match", [
    (KillReplica("w", 0), r"'w' runs as 2 partitions; name one of them: w\.0, w\.1"),
    (KillReplica("w.2", 0), r"'w' runs as 2 partitions"),
    (StopReplica("cw.0", 0), r"'cw' is not partitioned; name it 'cw'"),
    (Revive("w", 0), r"partitioned operator 'w'"),
])
def test_events_naming_partitions_wrongly_are_refused_before_the_run(event, match):
    q, data = keyed_case()
    script = {"s": [event] + data["s"]}
    with pytest.raises(QueryError, match=match):
        run_replicated(q, script, k=2, parallelism={"w": 2})


def test_unpartitionable_operator_is_refused():
    q = Query()
    q.source("s", {"k": "i8"}).window(10, name="total").sink("out")
    with pytest.raises(QueryError, match="no by= key"):
        run_replicated(q, {"s": [{"ts": 1, "k": 1}]}, k=2, parallelism={"total": 2})


def test_routing_keys_apart_breaks_the_output(monkeypatch):
    """The comparison can fail: a router that splits a window's keys by tuple id (as for a stateless
    operator) gives partial counts in several partitions, and the audit and the output say so."""
    from replistream.engines.inprocess import ReplicaDivergence
    from replistream.partition import Router

    q, data = keyed_case()
    monkeypatch.setattr(Router, "key_hash", lambda self, port, batch: fmix(batch["id"]))
    with pytest.raises(ReplicaDivergence, match="emitted .* tuple\\(s\\) the ideal run does not"):
        run_replicated(q, data, k=2, seed=0, audit=True, parallelism={"w": 2})
    got = run_replicated(q, data, k=2, seed=0, parallelism={"w": 2})
    with pytest.raises(AssertionError):
        assert_same_output(run_reference(q, data).outputs["out"], got.outputs["out"])


def test_simulator_runs_partitions_over_a_wide_area_network():
    """The simulator honours parallelism= (per-packet engine, replication mode): exact output with a
    partition replica and then a server killed, over the geographic latency model."""
    from replistream.network import GeoLatencyModel, default_servers
    from replistream.sim import Simulator

    q = fig1_query(n_servers=3, window_s=3.0, punctuate_s=1.0)
    data = fig1_inputs(n_servers=3, duration_s=30, period_s=1.0, seed=1, chunk=5)
    servers = [s.name for s in default_servers(4)]
    plan = {n: servers[:2] for n in ["entry", *q.operators]} | {"alerts": [servers[3]],
                                                                  "correlate.1": [servers[2], servers[1]]}
    src = dict(data)
    mid = len(src["load_0"]) // 2
    src["load_0"] = src["load_0"][:mid] + [KillReplica("correlate.1", 0), KillServer(servers[0])] + src["load_0"][mid:]
    sim = Simulator(q, plan, GeoLatencyModel(default_servers(4), seed=0),
                    parallelism={"correlate": 2, "hot": 2, "loads": 2})
    res = sim.run(src)
    assert res.complete
    assert_same_output(run_reference(q, data).outputs["alerts"], res.outputs["alerts"])
    killed = {e["replica"] for e in res.events if e.get("event") == "killed"}
    assert {"correlate.1#0", "correlate.0#0", "hot.0#0", "loads.1#0"} <= killed
    assert [sim.physical.server(r) for r in sim.physical.replicas("correlate.1")] == [servers[2], servers[1]]
    fed = {lk.receiver.label for lk in sim.links if lk.tuples}
    assert {"correlate.0#1", "correlate.1#1", "hot.1#1"} <= fed
    with pytest.raises(ValueError, match="mode 'replication' only"):
        Simulator(q, plan, mode="deterministic", parallelism={"correlate": 2})
    with pytest.raises(ValueError, match="per-packet engine only"):
        Simulator(q, plan, batch_s=1.0, parallelism={"correlate": 2})
    with pytest.raises(QueryError, match="'correlate' runs as 2 partitions; name one of them"):
        Simulator(q, plan, parallelism={"correlate": 2}).run(
            {**data, "load_0": [KillReplica("correlate", 0)] + data["load_0"]})


PROPS = settings(max_examples=20, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.slow
@PROPS
@given(seed=st.integers(0, 2**31 - 1), k=st.integers(1, 3), n=st.integers(0, 60),
       every=st.one_of(st.none(), st.integers(1, 200)), explicit=st.integers(1, 10), disorder=st.integers(0, 30),
       crash=st.booleans(), parts=st.lists(st.integers(1, 4), min_size=5, max_size=5), window=st.integers(1, 200))
def test_random_partitionings_of_a_two_level_query(seed, k, n, every, explicit, disorder, crash, parts, window):
    """Unions into a keyed join into a filter and a keyed count window, each partitioned at random
    (1..4), k replicas, crashes, out-of-order input and explicit punctuations; two applications
    sorted by (ts, id), which only the merged punctuation (the minimum over upstream partitions)
    can release in order: exactly the reference output."""
    import random

    from replistream.testing import with_punctuations

    rng, prng = np.random.default_rng(seed), random.Random(seed)
    q = Query("two_level")
    loads = [q.source(f"load_{i}", {"server": "i8", "cpu": "f8"}, punctuate_every=every, max_disorder=disorder)
             for i in range(2)]
    pings = [q.source(f"ping_{i}", {"server": "i8", "rtt": "f8"}, punctuate_every=every, max_disorder=disorder)
             for i in range(2)]
    j = q.union(*loads, name="loads").join(q.union(*pings, name="pings"), window=window, on="server", name="j")
    j.filter(lambda b: b["cpu"] > b["rtt"], name="hot").sink("alerts", ordered=True)
    j.count_window(size=3, slide=2, by="server_l", aggs={"n": "count", "c": ("cpu", "sum")}, name="cw").sink(
        "counts", ordered=True)
    q.build()
    inputs = {}
    for name, field in (("load", "cpu"), ("ping", "rtt")):
        for i in range(2):
            ts = np.sort(rng.integers(0, 600, n)) + rng.integers(-disorder, disorder + 1, n)
            recs = [{"ts": int(t), "server": int(rng.integers(0, 6)), field: float(rng.normal())} for t in ts]
            inputs[f"{name}_{i}"] = with_punctuations(recs, explicit, prng, max_chunk=prng.randint(1, 12))
    parallelism = dict(zip(["loads", "pings", "j", "hot", "cw"], parts))
    ref = run_reference(q, inputs)
    got = run_replicated(q, inputs, k=k, seed=seed, crash=crash, parallelism=parallelism)
    assert ref.complete and got.complete
    for app in q.sinks:
        assert_same_output(ref.outputs[app], got.outputs[app], ordered=True)
