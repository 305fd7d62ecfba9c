"""Garbage collection per partition replica on Ray (issue #41 point 5; Hwang §V-B): with
``parallelism=`` and ``gc=``, each partition's replicas are an operator's replica set of their own
(``kmin`` per partition, utility per partition replica, inputs per upstream partition), no partition
ever loses its last live replica, and the output equals the reference run exactly."""
from __future__ import annotations

import threading
import time

import pytest

from replistream.engines.ray import GCConfig, deploy
from replistream.plan import label_group, replica_partition
from replistream.testing import assert_same_output, run_reference
from replistream.workloads import fig1_inputs, fig1_query

pytestmark = pytest.mark.usefixtures("ray_session")

PARTS = ("correlate.0", "correlate.1", "hot.0", "hot.1", "hot.2")


def live_by_group(dep) -> dict:
    out: dict[str, int] = {}
    for r in dep.topology.replicas():
        g = label_group(r.label) if replica_partition(r.label) is not None else r.operator
        out[g] = out.get(g, 0) + (1 if r.live else 0)
    return out


@pytest.mark.slow
def test_gc_discards_per_partition_replica_and_keeps_every_partition_and_the_output():
    """Algorithm 6 on a Fig. 1 deployment whose Join runs as 2 key partitions and whose filter as 3,
    k=2, kmin=1, theta 0.05 of the first cost (garbage collection goes as far as kmin lets it): partition replicas are discarded (each decision names the
    partitions it touched), every partition keeps a live replica at every period and at the end, and
    the alerts are exactly the reference run's."""
    q = fig1_query(n_servers=3, window_s=2.0, punctuate_s=0.5)
    data = fig1_inputs(n_servers=3, duration_s=30, period_s=0.25, seed=4, chunk=2)
    cfg = GCConfig(utility_period_s=0.5, gc_period_s=0.5, theta_fraction=0.05, max_steps=None, kmin=1)
    with deploy(q, servers=4, k=2, network="geo", gc=cfg, parallelism={"correlate": 2, "hot": 3}, bits=4) as dep:
        ref = run_reference(q, data)
        res = dep.run(data, timeout=180, pace=2.0)
        assert res.complete, res.punctuation
        assert_same_output(ref.outputs["alerts"], res.outputs["alerts"])
        gcs = [e for e in dep.gc_events() if e["kind"] == "gc"]
        assert gcs, dep.gc_events()
        for e in gcs:
            assert e["cost_after"] < e["cost_before"]
            assert set(PARTS) <= set(e["live_after"]) and "correlate" not in e["live_after"], e["live_after"]
            assert all(n >= 1 for g, n in e["live_after"].items() if g != "alerts"), e["live_after"]
            gone = [r for r in e["replicas"] if replica_partition(r) is not None]
            assert e.get("partitions", []) == sorted({label_group(r) for r in gone}), e
            # the stream ids are the deployment's own (real ports), not the view's
            assert all(dep.topology.stream(s).live is False for s in e["streams"]), e["streams"]
        went = sorted(r for e in gcs for r in e["replicas"] if replica_partition(r) is not None)
        assert went, gcs  # partition replicas went, not only stream replicas or entry points
        hist = dep.network_cost_history()
        assert all(set(PARTS) <= set(h["min_live"]) for h in hist), hist[-1]["min_live"]
        assert all(min(v for g, v in h["min_live"].items() if g != "alerts") >= 1 for h in hist)
        live = live_by_group(dep)
        assert all(live[g] >= 1 for g in PARTS), live
        assert any(live[g] == 1 for g in PARTS), live  # GC took some partition down to kmin
        for g in PARTS:  # the last live replica of each partition still runs
            assert any(dep.alive.get(r.label) for r in dep.topology.replicas(g, state="live")), g
        # dormant checkpoints (on by default) are per partition: each partition GC took down to one
        # live replica gets one of its own (when the monitor next looks: a GC just before the run's
        # end is followed within a period), never one under the partitioned operator's name
        deadline, tick = time.monotonic() + 60, threading.Event()
        while True:
            live = live_by_group(dep)
            on = {e["operator"] for e in dep.events if e.get("event") == "dormant_on"}
            if {g for g in PARTS if live[g] == 1} <= on or time.monotonic() > deadline:
                break
            tick.wait(0.1)
        assert {g for g in PARTS if live[g] == 1} <= on and not on & {"correlate", "hot"}, (on, live)
