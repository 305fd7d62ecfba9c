"""Changes of a running query on a deployment with partitioned operators (issue #41; Bartnik §3):
``replace_function``, ``add_operator``, ``remove_operator`` and ``set_replication`` with
``parallelism={op: 2}``, each application equal (as a multiset) to the reference run of the query as
changed (``dep.query``), with a partition replica killed mid-run; the same with entry partitions;
and what is still refused, in one line, before anything changes (a change while a rescale moves
bins, a partitioned application)."""
from __future__ import annotations

import time

import numpy as np
import pytest
import ray

from replistream import Query, deploy, run_reference, seconds
from replistream.testing import Call, KillReplica, assert_same_output, inject_at

pytestmark = pytest.mark.usefixtures("ray_session")

SERVERS = ["boston", "london", "tokyo"]


def query() -> Query:
    q = Query("changes_partitions")
    s = q.source("s", {"k": "i8", "x": "f8"}, punctuate_every=seconds(0.5))
    hot = s.filter(lambda t: t["x"] > 0.2, name="hot")  # unpartitioned, next to partitions
    m = hot.map(lambda t: {"k": t["k"], "x": t["x"] * 2}, {"k": "i8", "x": "f8"}, name="m")  # partitioned by id
    m.window(size=seconds(2), by="k", aggs={"n": "count", "s": ("x", "sum")}, name="per_k").sink("sums")
    return q.build()


def inputs(n=400, seed=5) -> dict:
    rng = np.random.default_rng(seed)
    ts = np.arange(n, dtype=np.int64) * seconds(0.05)
    return {"s": [{"ts": ts[i:i + 10], "k": rng.integers(0, 12, 10), "x": rng.random(10)} for i in range(0, n, 10)]}


def check_all(dep, data, res) -> dict:
    """Every application equals the reference run of the query as changed (dep.query), as a multiset."""
    assert res.complete, res.punctuation
    ref = run_reference(dep.query, data)
    for app in dep.query.sinks:
        assert_same_output(ref.outputs[app], res.outputs[app])
    return {app: len(ref.outputs[app]) for app in dep.query.sinks}


def change(recs, fn):
    return Call(lambda d: recs.append(fn(d)))


@pytest.mark.slow
def test_replace_function_of_a_partitioned_map_and_of_its_unpartitioned_neighbour_with_a_kill():
    """p=2, k=2: m (partitioned) and hot (not) get new functions; m.1#0 is killed between the two
    changes; every replica of every partition switched at p (the output is the changed reference's);
    then an operator is added on hot's (unpartitioned) stream, beside the partitions."""
    data, recs = inputs(), []
    s = inject_at(data["s"], seconds(6), change(recs, lambda d: d.replace_function(
        "m", lambda t: {"k": t["k"], "x": t["x"] * 10})))
    s = inject_at(s, seconds(9), KillReplica("m.1", 0))
    s = inject_at(s, seconds(12), change(recs, lambda d: d.replace_function("hot", lambda t: t["x"] > 0.6)))
    s = inject_at(s, seconds(14), change(recs, lambda d: d.add_operator(  # an unpartitioned stream, too
        "hot", lambda st: st.window(size=seconds(1), by="k", aggs={"n": "count"}, name="hot_k").sink("hot_counts"))))
    with deploy(query(), servers=SERVERS, k=2, network="zero", parallelism={"m": 2, "per_k": 2}) as dep:
        res = dep.run({"s": s}, pace=None, timeout=180)
        sizes = check_all(dep, data, res)
        assert [r["change"] for r in recs] == ["replace_function"] * 2 + ["add_operator"]
        assert sizes["hot_counts"] > 0
        assert seconds(5.9) <= recs[0]["p"] < seconds(6) and seconds(11.9) <= recs[1]["p"] < seconds(12)
        # both changes did something: the unchanged query's reference differs
        orig = run_reference(query(), data).outputs["sums"]
        assert len(orig) > len(res.outputs["sums"]) or not np.allclose(np.sort(orig["s"]),
                                                                         np.sort(res.outputs["sums"]["s"]))
        assert not dep.alive["m.1#0"] and dep.alive["m.1#1"]


@pytest.mark.slow
def test_add_operator_reading_a_partitioned_stream_then_remove_a_partitioned_operator():
    """p=2, k=1: an operator added on m's stream (m partitioned) receives from both partitions of m,
    a channel group each, so its windows close only once both partitions' punctuations passed them;
    then per_k (partitioned) is removed: it sees its input up to p, and its partitions' replicas
    retire once its application got END."""
    data, recs = inputs(), []
    s = inject_at(data["s"], seconds(5), change(recs, lambda d: d.add_operator(
        "m", lambda st: st.window(size=seconds(1), by="k", aggs={"n": "count"}, name="per_k1").sink("counts"))))
    s = inject_at(s, seconds(12), change(recs, lambda d: d.remove_operator("per_k")))
    with deploy(query(), servers=SERVERS, k=1, network="zero", parallelism={"m": 2, "per_k": 2}) as dep:
        res = dep.run({"s": s}, pace=None, timeout=180)
        sizes = check_all(dep, data, res)
        assert [r["change"] for r in recs] == ["add_operator", "remove_operator"]
        assert sizes["counts"] > 0 and sizes["sums"] < len(run_reference(query(), data).outputs["sums"])
        assert recs[0]["added"] == ["per_k1", "counts"]
        # the added replica's input port has one channel per replica of m, grouped by m's partition
        groups = ray.get(dep.topology.handle("per_k1#0").stats.remote(), timeout=60)["core"]["filters"][0]
        assert len(groups["weights"]) == 2, groups
        deadline = time.time() + 60
        while recs[1]["retired"] is None and time.time() < deadline:
            time.sleep(0.05)
        assert recs[1]["replicas"] == ["per_k.0#0", "per_k.1#0"] and recs[1]["retired"] is not None
        assert {"per_k.0#0", "per_k.1#0"} <= dep.removed
        with pytest.raises(ValueError, match="'per_k' was removed from the running query"):
            dep.rescale("per_k", 1)  # it would start partitions of an operator that is gone


def test_a_removed_partitioned_operator_still_splits_as_what_it_wraps():
    """After remove_operator, the query holds per_k wrapped in a CutSpec: the plan of a later change
    (add_operator) and the routers of replicas started later still split it by its key."""
    from replistream.partition import Router, BinMap, partition_key
    from replistream.plan import PhysicalPlan
    from replistream.replica.changes import RemoveOperator

    q2 = RemoveOperator("per_k").apply_query(query(), seconds(5))
    assert partition_key(q2, "per_k") == "key"
    plan = PhysicalPlan(q2, {"entry": ["a"], "hot": ["a"], "m": ["a"], "per_k": ["a"], "sums": ["a"]},
                        parallelism={"m": 2, "per_k": 2})
    assert plan.channel_groups("per_k") == [[0, 1]]
    b = q2.schema_of("m").from_columns({"ts": [1, 2, 3], "k": [1, 2, 1], "x": [0.0, 0.0, 0.0]}, ids=[7, 8, 9])
    part = Router(q2, "per_k", BinMap.even(2, bits=4)).partition_of(0, b).tolist()
    assert part == Router(query(), "per_k", BinMap.even(2, bits=4)).partition_of(0, b).tolist()


@pytest.mark.slow
def test_set_replication_of_a_partitioned_operator_is_per_partition():
    """p=2, k=1 -> 2 -> 1: a new replica in each partition of per_k, by hand-over from its own
    partition's live replica; per_k.0#0 killed while k=2 (its peer carries partition 0); back to 1,
    the surplus discarded per partition (partition 0 has only one left)."""
    data, recs = inputs(), []
    s = inject_at(data["s"], seconds(5), change(recs, lambda d: d.set_replication("per_k", 2)))
    s = inject_at(s, seconds(9), KillReplica("per_k.0", 0))
    s = inject_at(s, seconds(13), change(recs, lambda d: d.set_replication("per_k", 1)))
    with deploy(query(), servers=SERVERS, k=1, network="zero", parallelism={"m": 2, "per_k": 2}) as dep:
        res = dep.run({"s": s}, pace=None, timeout=180)
        check_all(dep, data, res)
        assert sorted(recs[0]["added"]) == ["per_k.0#1", "per_k.1#1"], recs[0]
        assert recs[1]["discarded"] == ["per_k.1#1"], recs[1]
        live = sorted(label for label, on in dep.alive.items() if on and label.startswith("per_k."))
        assert live == ["per_k.0#1", "per_k.1#0"], live


@pytest.mark.slow
def test_changes_with_entry_partitions_and_an_entry_replica_killed():
    """Entry partitions (p=2, k=2) and m partitioned: an operator added on the source itself gets a
    channel group per entry partition; entry.1#0 killed; then m's function replaced."""
    data, recs = inputs(), []
    s = inject_at(data["s"], seconds(5), change(recs, lambda d: d.add_operator(
        "s", lambda st: st.window(size=seconds(1), by="k", aggs={"n": "count"}, name="raw_k").sink("raw_counts"))))
    s = inject_at(s, seconds(8), KillReplica("entry.1", 0))
    s = inject_at(s, seconds(10), change(recs, lambda d: d.replace_function(
        "m", lambda t: {"k": t["k"], "x": t["x"] * 10})))
    with deploy(query(), servers=SERVERS, k=2, network="zero", parallelism={"entry": 2, "m": 2}) as dep:
        res = dep.run({"s": s}, pace=None, timeout=180)
        sizes = check_all(dep, data, res)
        assert [r["change"] for r in recs] == ["add_operator", "replace_function"] and sizes["raw_counts"] > 0
        assert not dep.alive["entry.1#0"]
        filt = ray.get(dep.topology.handle("raw_k#0").stats.remote(), timeout=60)["core"]["filters"][0]
        assert len(filt["weights"]) == 4, filt  # a channel per entry replica of both partitions


@pytest.mark.slow
def test_what_is_refused_in_one_line():
    """A change while a rescale moves bins (or another change is made), and a change on a deployment
    with a partitioned application, are refused before anything changes."""
    q = query()
    with deploy(q, servers=SERVERS, k=1, network="zero", parallelism={"per_k": 2}) as dep:
        dep.rescaling.set()  # as rescale() does while it moves bins
        try:
            for call in (lambda: dep.remove_operator("per_k"), lambda: dep.set_replication("per_k", 2),
                         lambda: dep.add_operator("m", lambda st: st.sink("raw")),
                         lambda: dep.replace_function("m", lambda t: t)):
                with pytest.raises(RuntimeError, match="while a rescale moves bins"):
                    call()
        finally:
            dep.rescaling.clear()
        changing = dep.reconfig._changing  # as a change holds it while it is made
        changing.acquire()
        try:
            with pytest.raises(RuntimeError, match=r"rescale\(\) cannot run while .* another change is made"):
                dep.rescale("per_k", 3)
        finally:
            changing.release()
        assert dep.partitions("per_k") == 2
        opts = dep.channel_opts  # a partitioned application (parallelism={app: p}, not on this branch)
        dep.channel_opts = {**opts, "partitions": {**opts["partitions"], "sums": 2}}
        try:
            with pytest.raises(ValueError, match=r"partitioned applications \(sums: 2\); deploy them unpartitioned"):
                dep.set_replication("per_k", 2)
        finally:
            dep.channel_opts = opts
        assert dep.changes == [] and dep.query.sinks == ["sums"]
