"""`replistream demo --gc --revival --json` (issue #6, item 6): the fields the done-when reads, at small scale.

Wall-clock figures (latency, when the cost falls) depend on the loaded machine and are not asserted;
what is asserted is what a run must always show: exact output, a theta, cost recorded over time,
discards that lower it, the injected congestion and the latency phases around it.
"""
from __future__ import annotations

import json

import pytest

from replistream.cli import _ray_notes, _verdict, main


def test_the_gc_verdict_names_the_cost_fall_the_discards_and_what_is_left_to_lose():
    """What `demo --gc` prints first, from the fields of its --json summary (no Ray: the quick subset's
    case of this file, #31)."""
    summary = {"matches_reference": True, "complete": True, "outputs": 120, "reference_outputs": 120, "lost": 0,
               "duplicates": 0, "unexpected": 0, "failures": [],
               "latency_ms": {"all": {"p99": 310.4}, "before_failure": {"p99": None}, "after_failure": {"p99": None}},
               "network_cost": [{"t": 0.5, "cost": 15704.2}, {"t": 6.0, "cost": 9120.0}], "gc_discards": 3,
               "revivals": 1, "fault_tolerance": 1}
    assert _verdict(summary, _ray_notes(summary, gc=True)) == (
        "PASS: 120 alerts identical to the ideal run (0 lost, 0 duplicated); p99 latency 310 ms; "
        "network cost 15,704 -> 9,120 bytes/s x ms (3 replicas discarded, 1 revived); "
        "fault tolerance 1 at the end: 1 more server loss survivable")
    assert "network cost" not in " ".join(_ray_notes(summary, gc=False))  # only a GC run reports the cost


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_demo_gc_revival_json(capsys):
    code = main(["demo", "--gc", "--revival", "--json", "--servers", "4", "--duration", "12", "--period", "0.5",
                 "--congest-at", "6", "--kmin", "1"])  # GC may leave one path (the default kmin is min(2, k))
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out
    assert out["matches_reference"] and out["lost"] == 0 and out["duplicates"] == 0 and out["complete"], out
    assert out["theta"] is not None and out["theta"] > 0
    costs = out["network_cost"]
    assert costs and all({"t", "cost", "live_stream_replicas"} <= set(h) for h in costs)
    kinds = [e["kind"] for e in out["events"]]
    assert "theta" in kinds and "congestion" in kinds, out["events"]
    gcs = [e for e in out["events"] if e["kind"] == "gc"]
    assert gcs and all(e["cost_after"] < e["cost_before"] for e in gcs)
    assert out["gc_discards"] == len(gcs)
    assert min(h["live_stream_replicas"] for h in costs) < costs[0]["live_stream_replicas"]
    assert set(out["latency_phases_ms"]) == {"before_congestion", "congested", "after_revival"}
    assert sum(b["count"] for b in out["latency_over_time_ms"]) == out["latency_ms"]["all"]["count"]


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_demo_gc_keeps_fault_tolerance_by_default(capsys):
    """kmin defaults to min(2, k): with k = 2, collection never takes an operator below two live
    replicas, and the report says the deployment still masks one crash."""
    code = main(["demo", "--gc", "--json", "--servers", "4", "--duration", "8", "--period", "0.5"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["matches_reference"], out
    assert out["fault_tolerance"] == 1, out.get("fault_tolerance_per_node")
    assert "; fault tolerance 1 at the end: 1 more server loss survivable" in out["verdict"], out["verdict"]
    assert all(v >= 1 for n, v in out["fault_tolerance_per_node"].items() if n != "alerts")
