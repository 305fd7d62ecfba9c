"""Issue #43: every data-path actor exports its counters and, for an application, its latency
buckets through Ray's metrics API (replistream/engines/ray/metrics_export.py). After a paced run
each actor has exported exactly its own counters, the application's tuples out and latency count
equal what it delivered, its duplicates are the copies its k upstream replicas sent, and the entry
points' dead letters are the malformed record fed."""
from __future__ import annotations

import time

import numpy as np
import pytest
import ray

import replistream as rs
from replistream import seconds
from replistream.engines.ray.metrics_export import EXPORT_EVERY_S, FakeMetrics, ReplicaMetrics


def exported(handle) -> dict:
    """What the actor's exporter sent so far, and the actor's own counters (read in the actor)."""
    def read(actor):
        from replistream.engines.ray.metrics_export import counters_of

        with actor.lock:
            counts, _ = counters_of(actor)
        m = actor.metrics_export
        return {"sent": dict(m.sent), "exported": dict(m.exported), "counts": counts}

    return ray.get(handle.__ray_call__.remote(read), timeout=60)


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_actors_export_their_counters_and_the_applications_latency():
    q = rs.Query("metrics")
    s = q.source("s", {"k": "i8", "v": "f8"}, punctuate_every=seconds(1))
    s.window(size=seconds(2), by="k", aggs={"n": "count"}, name="per_k").sink("out")
    q.build()
    rows = [{"ts": i * seconds(1) // 50, "k": i % 5, "v": float(i)} for i in range(600)]
    rows.insert(300, {"ts": seconds(6), "k": "not a number", "v": 1.0})  # one malformed record
    with rs.deploy(q, servers=3, k=2, progress=False) as dep:
        res = dep.run({"s": rows}, pace=10.0)
        delivered = len(res.outputs["out"])
        assert delivered > 0 and sum(d.count for d in res.dead_letters) == 1
        handles = {label: h for label, h in dep.handles.items() if dep.alive[label]}
        deadline = time.time() + 20 * EXPORT_EVERY_S
        while True:  # an export runs every EXPORT_EVERY_S: wait until each actor's last one is done
            got = {label: exported(h) for label, h in handles.items()}
            if all(g["sent"] == {**g["sent"], **g["counts"]} for g in got.values()) or time.time() > deadline:
                break
            time.sleep(0.2)
    for label, g in got.items():
        assert g["sent"] == {**g["sent"], **g["counts"]}, (label, g)
    app = got["out"]["exported"]
    assert app["replistream_tuples_out"] == delivered
    assert app["replistream_latency_ms_count"] == delivered  # paced: every delivered tuple has a latency
    assert app["replistream_duplicates_dropped"] == delivered  # each tuple came from both per_k replicas
    assert sum(got[f"entry#{i}"]["exported"].get("replistream_dead_letters", 0) for i in (0, 1)) == 2  # one per replica
    for i in (0, 1):
        assert got[f"per_k#{i}"]["exported"]["replistream_tuples_in"] == got[f"per_k#{i}"]["counts"]["tuples_in"] > 0


def test_a_state_from_a_peer_is_a_baseline_and_latency_buckets_are_cumulative():
    FakeMetrics.totals.clear()
    FakeMetrics.by_tags.clear()
    m = ReplicaMetrics("j#2", "j", "a", factory=FakeMetrics)
    m.export({}, None)  # started pending: nothing yet
    m.export({"tuples_in": 500, "tuples_out": 50, "duplicates": 7, "dead_letters": 0}, ("core", 1))  # the peer's
    assert FakeMetrics.totals == {}
    m.export({"tuples_in": 520, "tuples_out": 52, "duplicates": 7, "dead_letters": 1}, ("core", 1))
    assert FakeMetrics.totals == {"replistream_tuples_in": 20, "replistream_tuples_out": 2,
                                  "replistream_dead_letters": 1}
    m.observe(np.array([0.2, 1.0, 1.5, 250.0, 1e9]))
    m.export({}, ("core", 1))
    b = {dict(t)["le"]: v for (n, t), v in FakeMetrics.by_tags.items() if n == "replistream_latency_ms_bucket"}
    assert b["1"] == 2 and b["2"] == 3 and b["200"] == 3 and b["500"] == 4 and b["60000"] == 4 and b["+Inf"] == 5
    assert FakeMetrics.totals["replistream_latency_ms_count"] == 5
    m.export({}, ("core", 1))  # nothing new: nothing added
    assert FakeMetrics.totals["replistream_latency_ms_count"] == 5
