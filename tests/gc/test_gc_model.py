"""The deployment snapshot (replistream.gc.snapshot) and replica utility (Hwang §V-B)."""
from __future__ import annotations

import json
import math

import pytest

from replistream import Query
from replistream.gc import OperatorReplica as R
from replistream.gc import Snapshot, StreamReplica as S, snapshot_from_plan, utilities
from replistream.workloads import fig1_query


def chain(weights=None, **kw):
    """entry#0, entry#1 -> f#0, f#1 -> app; rate 1, latency 10 everywhere."""
    reps = [R("entry#0", "entry", "a", "entry"), R("entry#1", "entry", "b", "entry"),
            R("f#0", "f", "c"), R("f#1", "f", "d"), R("app", "app", "e", "application")]
    w = weights or {}
    streams = [S(u, d, 0, 1.0, 10.0, w.get(f"{u}->{d}:0", 0.0))
               for u, d in [("entry#0", "f#0"), ("entry#0", "f#1"), ("entry#1", "f#0"), ("entry#1", "f#1"),
                            ("f#0", "app"), ("f#1", "app")]]
    return Snapshot(reps, streams, **kw)


# -- the snapshot ----------------------------------------------------------------------

def test_cost_is_rate_times_latency_over_live_streams():
    snap = chain()
    assert snap.total_cost() == 60.0
    snap = snap.evolve(streams_live={"entry#1->f#1:0": False})
    assert snap.total_cost() == 50.0
    assert S("x", "y", rate=2.5, latency_ms=4).cost == 10.0


@pytest.mark.parametrize("bad, match", [
    (lambda r, s: (r + [R("f#0", "f", "z")], s), "repeated"),
    (lambda r, s: (r, s + [S("f#0", "nowhere")]), "unknown replica"),
    (lambda r, s: (r, s + [S("f#0", "entry#0")]), "takes no input"),
    (lambda r, s: (r + [R("app2", "app2", "z", "application")], s + [S("app", "app2")]), "no output streams"),
    (lambda r, s: (r, s + [S("f#0", "app")]), "repeated"),
    (lambda r, s: ([x if x.label != "f#1" else R("f#1", "f", "d", state="dormant") for x in r], s), "is live but"),
    (lambda r, s: (r + [R("g#0", "g", "z")], s + [S("f#0", "g#0"), S("entry#0", "g#0", port=0)]), "fed by both"),
    (lambda r, s: (r + [R("g#0", "f", "z", "application")], s), "kinds"),
    (lambda r, s: (r + [R("g#0", "g", "z", state="sleeping")], s), "state must be"),
    (lambda r, s: (r + [R("g#0", "g", "z"), R("h#0", "h", "z")], s + [S("g#0", "h#0"), S("h#0", "g#0")]), "cycle"),
])
def test_snapshot_rejects_inconsistent_deployments(bad, match):
    snap = chain()
    reps, streams = bad(list(snap.replicas), list(snap.streams))
    with pytest.raises(ValueError, match=match):
        Snapshot(reps, streams)


@pytest.mark.parametrize("field, value", [("rate", -1.0), ("latency_ms", math.inf), ("weight", math.nan),
                                          ("port", -1), ("port", True), ("rate", "3")])
def test_stream_replica_rejects_bad_figures(field, value):
    with pytest.raises(ValueError, match=field if field != "port" else "port"):
        S("a#0", "b#0", **{field: value})


@pytest.mark.parametrize("kmin, theta", [(0, 1.0), (1.5, 1.0), (1, -1.0), (1, math.nan)])
def test_snapshot_rejects_bad_kmin_and_theta(kmin, theta):
    with pytest.raises(ValueError):
        chain(kmin=kmin, theta=theta)


def test_failed_replicas_lose_their_streams():
    snap = chain().with_failed(["f#0"])
    assert snap.replica("f#0").state == "failed"
    assert {s.id for s in snap.live_streams()} == {"entry#0->f#1:0", "entry#1->f#1:0", "f#1->app:0"}
    assert snap.live_count("f") == 1


def test_json_round_trip_keeps_everything():
    snap = chain({"f#0->app:0": 2.5}, kmin=2, theta=45.0).evolve(
        streams_live={"entry#0->f#1:0": False}).with_failed(["entry#1"])
    back = Snapshot.from_json(snap.to_json())
    assert back == snap
    assert back.replica("entry#1").state == "failed" and back.stream("f#0->app:0").weight == 2.5
    inf = Snapshot.from_dict(json.loads(chain().to_json()))
    assert inf.theta == math.inf and json.loads(chain().to_json())["theta"] is None


def test_snapshot_from_plan_builds_every_stream_replica_of_fig1():
    q = fig1_query(2)
    servers = [f"s{i}" for i in range(8)]
    plan = {"entry": servers[:3], "loads": servers[1:4], "pings": servers[2:5], "correlate": servers[3:6],
            "hot": servers[4:7], "alerts": ["s7"]}
    lat = lambda a, b: abs(int(a[1:]) - int(b[1:])) * 10.0  # noqa: E731
    rates = {"load_0": 1, "load_1": 1, "ping_0": 2, "ping_1": 2, "loads": 2, "pings": 4, "correlate": 3, "hot": 3}
    snap = snapshot_from_plan(q, plan, rates=rates, latency=lat, kmin=2, theta=100.0)
    # 4 sources x 3 entry x 3 union replicas, 2 unions x 3 x 3 into the join, 3 x 3 join->filter, 3 filter->app
    assert len(snap.streams) == 4 * 9 + 2 * 9 + 9 + 3
    assert snap.ports("correlate") == (0, 1)
    assert snap.upstream_operator("correlate", 1) == "pings" and snap.upstream_operator("loads", 1) == "entry"
    assert snap.replica("correlate#2").stateful and not snap.replica("hot#0").stateful
    s = snap.stream("entry#0->pings#2:1")
    assert (s.stream, s.rate, s.latency_ms, s.cost) == ("ping_1", 2.0, 40.0, 80.0)
    assert snap.replica("alerts").kind == "application" and snap.kmin == 2 and snap.theta == 100.0
    assert snap.topological() == ["entry", "loads", "pings", "correlate", "hot", "alerts"]
    assert math.isclose(snap.total_cost(), sum(rates.get(s.stream, 1) * lat(snap.replica(s.src).server,
                                                                          snap.replica(s.dst).server)
                                               for s in snap.streams))


def test_snapshot_from_plan_rejects_incomplete_plans():
    q = fig1_query(1)
    with pytest.raises(ValueError, match="entry"):
        snapshot_from_plan(q, {"loads": ["a"]})
    with pytest.raises(ValueError, match="correlate"):
        snapshot_from_plan(q, {"entry": ["a"], "loads": ["a"], "pings": ["a"], "hot": ["a"], "alerts": ["a"]})
    with pytest.raises(ValueError, match="at least one server"):
        snapshot_from_plan(q, {"entry": ["a"], "loads": ["a"], "pings": ["a"], "correlate": ["a"], "hot": ["a"],
                               "alerts": []})
    # an application may run as several replicas (deploy(..., app_replicas=)), each fed by "hot"
    snap = snapshot_from_plan(q, {"entry": ["a"], "loads": ["a"], "pings": ["a"], "correlate": ["a"], "hot": ["a"],
                                  "alerts": ["a", "b"]})
    apps = sorted(r.label for r in snap.replicas if r.kind == "application")
    assert apps == ["alerts", "alerts#1"]


def test_snapshot_from_plan_takes_weights_and_latency_mappings():
    q = Query()
    q.source("s", {"x": "i8"}).filter(lambda b: b["x"] > 0, name="f").sink("app")
    snap = snapshot_from_plan(q.build(), {"entry": ["a"], "f": ["a", "b"], "app": ["b"]},
                              latency={("a", "b"): 7.0}, weights={"f#1->app:0": 3.0})
    assert snap.stream("entry#0->f#1:0").latency_ms == 7.0
    assert snap.stream("entry#0->f#0:0").latency_ms == 0.0  # same server, not in the mapping
    assert snap.stream("f#1->app:0").weight == 3.0


# -- utility (§V-B) ----------------------------------------------------------------------

def test_utility_by_hand():
    # app: f#0 w=6, f#1 w=3 -> 2/3, 1/3; f#0: entry#0 w=6, entry#1 w=3; f#1: both 0 -> equal split
    u = utilities(chain({"f#0->app:0": 6, "f#1->app:0": 3, "entry#0->f#0:0": 6, "entry#1->f#0:0": 3}))
    assert u.replicas["app"] == 1.0
    assert math.isclose(u.replicas["f#0"], 2 / 3) and math.isclose(u.replicas["f#1"], 1 / 3)
    assert math.isclose(u.streams["entry#0->f#0:0"], 4 / 9) and math.isclose(u.streams["entry#1->f#0:0"], 2 / 9)
    assert math.isclose(u.streams["entry#0->f#1:0"], 1 / 6) and math.isclose(u.streams["entry#1->f#1:0"], 1 / 6)
    assert math.isclose(u.replicas["entry#0"], 4 / 9 + 1 / 6) and math.isclose(u.replicas["entry#1"], 2 / 9 + 1 / 6)


def test_utility_gives_each_port_the_whole_replica_utility():
    reps = [R("entry#0", "entry", "a", "entry"), R("entry#1", "entry", "b", "entry"), R("j#0", "j", "c"),
            R("app", "app", "d", "application")]
    streams = [S("entry#0", "j#0", 0, weight=1), S("entry#1", "j#0", 0, weight=3),
               S("entry#0", "j#0", 1, weight=5), S("entry#1", "j#0", 1, weight=0), S("j#0", "app")]
    u = utilities(Snapshot(reps, streams))
    assert u.streams["entry#0->j#0:0"] == 0.25 and u.streams["entry#1->j#0:0"] == 0.75
    assert u.streams["entry#0->j#0:1"] == 1.0 and u.streams["entry#1->j#0:1"] == 0.0
    assert u.replicas["entry#0"] == 1.25 and u.replicas["entry#1"] == 0.75


def test_utility_ignores_dormant_streams_and_renormalises_the_survivors():
    snap = chain({"f#0->app:0": 6, "f#1->app:0": 3}).evolve(streams_live={"f#1->app:0": False})
    u = utilities(snap)
    assert u.replicas["f#0"] == 1.0 and u.replicas["f#1"] == 0.0  # f#1 lost its output: useless
    assert "f#1->app:0" not in u.streams
    assert u.streams["entry#0->f#1:0"] == 0.0


def test_utilities_of_applications_add_up_upstream():
    reps = [R("entry#0", "entry", "a", "entry"), R("f#0", "f", "b"),
            R("a1", "a1", "c", "application"), R("a2", "a2", "c", "application"), R("a3", "a3", "c", "application")]
    streams = [S("entry#0", "f#0"), S("f#0", "a1"), S("f#0", "a2"), S("entry#0", "a3")]
    u = utilities(Snapshot(reps, streams))
    assert u.replicas["f#0"] == 2.0 and u.replicas["entry#0"] == 3.0
