"""Changing a running query at logical times (issue #8 item 4; Bartnik §3): replace a function, add and
remove operators, change the degree of replication, each replication-transparent (the output equals a
reference run of the changed query) while another replica is killed."""
from __future__ import annotations

import numpy as np
import pytest

from replistream import Query, run_reference, seconds
from replistream.errors import QueryError
from replistream.replica.changes import CutSpec, TimeSwitch
from replistream.engines.ray import deploy
from replistream.testing import Call, KillReplica, assert_same_output, inject_at

pytestmark = pytest.mark.usefixtures("ray_session")


def query() -> Query:
    q = Query("reconf")
    a = q.source("a", {"k": "i8", "x": "f8"}, punctuate_every=seconds(0.5))
    b = q.source("b", {"k": "i8", "y": "f8"}, punctuate_every=seconds(0.5))
    hot = a.filter(lambda t: t["x"] > 0.5, name="hot")
    hot.join(b, window=seconds(2), left_key="k", right_key="k", name="join").sink("pairs")
    a.window(size=seconds(4), slide=seconds(2), by="k", name="agg").sink("sums")
    return q.build()


def inputs(n=300, seed=1) -> dict:
    rng = np.random.default_rng(seed)
    ts = np.arange(n, dtype=np.int64) * seconds(0.1)
    return {"a": [{"ts": ts[i:i + 10], "k": rng.integers(0, 5, 10), "x": rng.random(10)} for i in range(0, n, 10)],
            "b": [{"ts": ts[i:i + 10] + 7, "k": rng.integers(0, 5, 10), "y": rng.random(10)}
                  for i in range(0, n, 10)]}


def check_all(dep, data, res) -> dict:
    """Every application's output equals the reference run of the query as changed (dep.query)."""
    ref = run_reference(dep.query, data)
    for app in dep.query.sinks:
        assert_same_output(ref.outputs[app], res.outputs[app])
    return {app: len(ref.outputs[app]) for app in dep.query.sinks}


@pytest.mark.slow
def test_time_switch_splits_by_timestamp_for_every_kind():
    from replistream import Schema

    s = Schema({"x": "i8"})
    b = s.from_columns({"ts": [1, 5, 2, 9, 3], "x": [1, 2, 3, 4, 5]})
    m = TimeSwitch("map", [lambda t: {"y": t["x"] * 10}, lambda t: {"y": t["x"] * 100}], after=[3])
    assert m(b)["y"].tolist() == [10, 200, 30, 400, 50]
    fm = TimeSwitch("flat_map", [lambda t: (np.arange(len(t)), {"y": t["x"]}),
                                 lambda t: (np.repeat(np.arange(len(t)), 2), {"y": np.repeat(t["x"], 2)})], after=[3])
    parent, cols = fm(b)
    assert sorted(zip(parent.tolist(), cols["y"].tolist())) == [(0, 1), (1, 2), (1, 2), (2, 3), (3, 4), (3, 4), (4, 5)]
    ext = TimeSwitch.extend("filter", m, lambda t: t["x"] > 0, 2)  # a switch at 2 drops the version from 3 on
    assert ext.after.tolist() == [2] and len(ext.versions) == 2


def test_changes_are_checked_before_anything_runs():
    q = query()
    with pytest.raises(QueryError, match="only Filter, Map and FlatMap"):
        from replistream.replica.changes import ReplaceFunction

        ReplaceFunction("join", lambda t: t).check(q)
    from replistream.replica.changes import AddOperator, RemoveOperator

    with pytest.raises(QueryError, match="application"):
        AddOperator("a", lambda s: s.filter(lambda t: t["x"] > 0, name="f2")).extend(q)
    with pytest.raises(QueryError, match="not an operator"):
        RemoveOperator("pairs").check(q)
    q2, add = AddOperator("a", lambda s: s.filter(lambda t: t["x"] > 0.9, name="f2").sink("top")).extend(q, 5)
    assert add.added == ("f2", "top") and isinstance(q2.spec("f2"), CutSpec) and q2.spec("f2").lower == 5


@pytest.mark.slow
def test_replace_add_remove_while_a_replica_dies():
    """Three changes at known points of the input, and join#1 killed between them: every application,
    including the added one and the removed one, equals the reference run of the changed query."""
    q = query()
    data = inputs()
    recs = []

    def change(fn):
        return Call(lambda d: recs.append(fn(d)))

    a = inject_at(data["a"], seconds(8), change(lambda d: d.replace_function("hot", lambda t: t["x"] > 0.8)))
    a = inject_at(a, seconds(12), KillReplica("join", 1))
    a = inject_at(a, seconds(15), change(lambda d: d.add_operator(
        "a", lambda s: s.map(lambda t: {"k": t["k"], "x2": t["x"] * 2}, {"k": "i8", "x2": "f8"}, name="double")
        .window(size=seconds(2), by="k", aggs={"n": "count", "s": ("x2", "sum")}, name="agg2").sink("doubled"))))
    a = inject_at(a, seconds(22), change(lambda d: d.remove_operator("agg")))
    data2 = {"a": a, "b": data["b"]}
    with deploy(q, servers=4, k=2, network="zero") as dep:
        res = dep.run(data2, timeout=180)
        assert res.complete, res.punctuation
        sizes = check_all(dep, {"a": data["a"], "b": data["b"]}, res)
        assert [r["change"] for r in recs] == ["replace_function", "add_operator", "remove_operator"]
        ps = [r["p"] for r in recs]
        # each change lands after everything fed before it and before what follows
        assert seconds(7.9) <= ps[0] < seconds(8) and seconds(14.9) <= ps[1] < seconds(15)
        assert seconds(21.9) <= ps[2] < seconds(22)
        # the changes did something: the reference of the unchanged query differs on each application
        orig = run_reference(q, {"a": data["a"], "b": data["b"]})
        assert len(orig.outputs["pairs"]) > sizes["pairs"] > 0  # a stricter filter from 8 s on
        assert len(orig.outputs["sums"]) > sizes["sums"] > 0  # no windows after 22 s
        assert sizes["doubled"] > 0
        import time

        deadline = time.time() + 60
        while recs[2]["retired"] is None and time.time() < deadline:
            time.sleep(0.05)  # the removal retires agg's replicas once its application got END
        assert recs[2]["retired"] is not None
        assert not any(dep.alive.get(l) for l in ("agg#0", "agg#1")) and {"agg#0", "agg#1"} <= dep.removed


@pytest.mark.slow
def test_set_replication_up_and_down_keeps_output_exact():
    q = query()
    data = inputs(200, seed=2)
    a = inject_at(data["a"], seconds(6), Call(lambda d: d.set_replication("join", 3)))
    a = inject_at(a, seconds(12), Call(lambda d: d.set_replication("join", 1)), KillReplica("agg", 0))
    with deploy(q, servers=4, k=2, network="zero") as dep:
        res = dep.run({"a": a, "b": data["b"]}, timeout=180)
        assert res.complete
        check_all(dep, data, res)
        ups = [c for c in dep.changes if c["change"] == "set_replication"]
        assert len(ups[0]["added"]) == 1 and len(ups[1]["discarded"]) == 2
        live = [l for l in dep.handles if l.startswith("join#") and dep.alive.get(l)]
        assert len(live) == 1


@pytest.mark.slow  # starts a deployment: 7.6 s of the quick subset (#31)
def test_a_change_needs_a_running_feed():
    q = query()
    with deploy(q, servers=2, k=1, network="zero") as dep:
        with pytest.raises(RuntimeError, match="feed"):
            dep.replace_function("hot", lambda t: t["x"] > 0.1)


@pytest.mark.slow
def test_cli_reconfigure_json(capsys):
    """`replistream reconfigure --json`: the scripted example (replace a function, add an operator, move a
    Join replica with the fluid strategy) ends with every application equal to the changed query's reference."""
    import json

    from replistream.cli import main

    assert main(["reconfigure", "--json", "--duration", "6", "--strategy", "batched"]) == 0
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])  # Ray may log warnings to stdout first
    assert rep["matches_reference"] and rep["complete"]
    assert [c["change"] for c in rep["changes"]] == ["replace_function", "add_operator"]
    assert rep["move"]["error"] is None and rep["move"]["new_replicas"] == ["correlate#2"]
    assert rep["move"]["transfers"] and rep["move"]["transfers"][0]["strategy"] == "batched"
    assert set(rep["applications"]) == {"alerts", "load_per_server"}
    assert all(a["lost"] == 0 and a["duplicates"] == 0 and a["outputs"] > 0 for a in rep["applications"].values())
    # the changed function made a difference: fewer alerts than the unchanged query gives
    assert rep["applications"]["alerts"]["outputs"] < rep["reference_unchanged_outputs"]["alerts"]
