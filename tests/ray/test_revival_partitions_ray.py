"""Delay-triggered revival within a partition on Ray (issue #41 point 5; Hwang §V-C): with
``parallelism=`` and ``gc=``, garbage collection leaves one path, the live input links of one
operator group on it are congested, and the revival policy brings back or creates a replica of
the hindered replica's own partition (here: a dormant stream replica into that partition's
replica is revived); the alerts equal the reference run's exactly."""
from __future__ import annotations

import pytest

from replistream.engines.ray import GCConfig, deploy
from replistream.plan import label_group, replica_partition
from replistream.sources import Call
from replistream.testing import assert_same_output, run_reference
from replistream.workloads import fig1_inputs, fig1_query

pytestmark = pytest.mark.usefixtures("ray_session")


@pytest.mark.slow
def test_a_congested_partition_replica_is_revived_within_its_partition():
    q = fig1_query(n_servers=3, window_s=2.0, punctuate_s=0.5)
    data = {k: list(v) for k, v in fig1_inputs(n_servers=3, duration_s=22, period_s=0.5, seed=3, chunk=1).items()}
    hit = []
    data["load_0"].insert(16, Call(lambda d: hit.extend(d.manager.congest_surviving_path(3000.0))))  # 8 s in
    threshold = 1.5
    cfg = GCConfig(utility_period_s=1, gc_period_s=1, theta_fraction=0.2, max_steps=None, revival=True,
                   threshold_s=threshold, proactive=False, kmin=1)
    with deploy(q, servers=4, k=2, network="geo", gc=cfg, parallelism={"hot": 2, "pings": 2}, bits=4) as dep:
        ref = run_reference(q, data)
        res = dep.run(data, timeout=180, pace=1.0)
        events = dep.gc_events()
        t_cong = next(e for e in dep.events if e.get("event") == "delay_link")["t"]
        revived = [e for e in events if e["kind"] == "revival" and e.get("applied") and e["t"] > t_cong]
    assert res.complete, res.punctuation
    assert_same_output(ref.outputs["alerts"], res.outputs["alerts"])
    # the congestion hit the inputs of one partition's live replicas (each stream id ends "->op.P#R:port")
    groups = {label_group(s.split("->")[1].rsplit(":", 1)[0]) for s in hit}
    assert len(groups) == 1 and replica_partition(next(iter(groups)) + "#0") is not None, hit
    (group,) = groups
    assert revived and revived[0]["trigger"] == "delay" and revived[0]["delay_s"] > threshold, (hit, events)
    for e in revived:  # every revival after it repaired that partition, within it
        assert label_group(e["replica"]) == group, e
        # a revived stream ends in the partition, or leaves a revived replica of it (a dormant
        # peer that takes over gets its input and its output links back: "op.P#R->down:port")
        revived_reps = set(e["revive_replicas"])
        assert all(label_group(r) == group for r in revived_reps), e
        for s in e["revive_streams"]:
            src, dst = s.split("->")[0], s.split("->")[1].rsplit(":", 1)[0]
            assert label_group(dst) == group or src in revived_reps, (s, e)
        # a created replica is of that partition, or a new upstream replica feeding it: each new
        # stream (a dict: src, dst) ends in the partition or in a created replica, or leaves a
        # created replica (its outputs go to every downstream replica), and every created replica
        # outside the partition feeds it
        new = {n if isinstance(n, str) else n["label"] for n in e["new_replicas"]}
        streams = [(x["src"], x["dst"]) for x in e["new_streams"]]
        stray = [(src, dst) for src, dst in streams if not (label_group(dst) == group or dst in new or src in new)]
        assert not stray, (stray, e["action"], e["replica"], sorted(new))
        assert all(label_group(r) == group or any(src == r and label_group(dst) == group for src, dst in streams)
                   for r in new), e
