"""The simulator's discrete-event engine: exact outputs under failures, and timing that follows the model."""
import math

import numpy as np
import pytest

from replistream.engines import run_reference
from replistream.network import GeoLatencyModel, NetworkConditions, ZeroLatency, default_servers
from replistream.scenario import Scenario
from replistream.sim import CpuModel, Simulator
from replistream.testing import assert_same_output
from replistream.workloads import fig1_inputs, fig1_query

SERVERS = default_servers(8)
NAMES = [s.name for s in SERVERS]
Q = fig1_query(4, window_s=10)
DATA = fig1_inputs(4, duration_s=400, period_s=10, seed=3)
REF = run_reference(Q, DATA)
PLAN = {"entry": NAMES[:2], "loads": NAMES[1:3], "pings": NAMES[2:4], "correlate": NAMES[3:5],
        "hot": NAMES[4:6], "alerts": [NAMES[7]]}
NOCPU = CpuModel(scale=0)


def chain_plan(servers):
    return {n: [servers[0]] for n in ["entry", "loads", "pings"]} | {n: [servers[1]] for n in ["correlate", "hot", "alerts"]}


FAULTS = Scenario.from_dict({"events": [
    {"at": 120, "action": "kill_server", "server": NAMES[2]},
    {"at": 60, "action": "cut_link", "a": NAMES[1], "b": NAMES[3], "duration": 50},
    {"at": 200, "action": "slow_server", "server": NAMES[4], "factor": 500, "duration": 60},
    {"at": 250, "action": "delay_link", "a": NAMES[0], "b": NAMES[1], "extra_ms": 3000, "duration": 30},
    {"at": 300, "action": "kill_replica", "operator": "entry", "replica": 0},
]})


@pytest.mark.parametrize("mode", ["replication", "synchronization", "deterministic"])
@pytest.mark.parametrize("faults", [pytest.param(False, marks=pytest.mark.slow), True])  # quick subset (#31): with faults
def test_output_equals_reference(mode, faults):
    net = GeoLatencyModel(SERVERS, seed=1)
    res = Simulator(Q, PLAN, net, scenario=FAULTS if faults else None, mode=mode).run(DATA)
    assert res.complete
    assert_same_output(REF.outputs["alerts"], res.outputs["alerts"])
    if faults:
        assert sum(e["event"] == "killed" for e in res.events) == 3  # two replicas on the server, one entry
        if mode != "replication":
            assert any(e["event"] == "failover" for e in res.events)


def test_no_replication_crash_loses_output():
    plan = {n: [v[0]] for n, v in PLAN.items()}
    sc = Scenario.from_dict({"events": [{"at": 100, "action": "kill_server", "server": plan["loads"][0]}]})
    res = Simulator(Q, plan, GeoLatencyModel(SERVERS, seed=1), scenario=sc).run(DATA)
    assert not res.complete
    assert 0 < len(res.outputs["alerts"]) < len(REF.outputs["alerts"])
    assert res.latencies("alerts")[0].max() < 100 + 2  # nothing arrives long after the crash


def test_zero_network_zero_cpu_gives_zero_latency():
    res = Simulator(Q, chain_plan(["a", "b"]), ZeroLatency(["a", "b"]), cpu=NOCPU).run(DATA)
    arrival, lat = res.latencies("alerts")
    assert len(lat) == len(REF.outputs["alerts"])
    assert np.all(lat == 0.0)


def test_delay_link_adds_exactly_its_delay():
    sc = Scenario.from_dict({"events": [{"at": 100, "action": "delay_link", "a": "a", "b": "b",
                                         "extra_ms": 250, "duration": 100}]})
    res = Simulator(Q, chain_plan(["a", "b"]), ZeroLatency(["a", "b"]), cpu=NOCPU, scenario=sc).run(DATA)
    arrival, lat = res.latencies("alerts")
    sent = arrival - lat
    inside = (sent >= 100) & (sent < 200 - 0.25)
    assert inside.sum() > 10
    assert np.allclose(lat[inside], 0.25)
    assert np.all(lat[sent > 200] == 0.0)


def test_cut_link_waits_for_restoration_and_keeps_fifo():
    sc = Scenario.from_dict({"events": [{"at": 100, "action": "cut_link", "a": "a", "b": "b", "duration": 37}]})
    res = Simulator(Q, chain_plan(["a", "b"]), ZeroLatency(["a", "b"]), cpu=NOCPU, scenario=sc).run(DATA)
    assert_same_output(REF.outputs["alerts"], res.outputs["alerts"])
    arrival, lat = res.latencies("alerts")
    held = (arrival - lat >= 100) & (arrival - lat < 137)
    assert held.any() and np.all(arrival[held] >= 137) and np.all(arrival[held] < 137.01)
    assert np.all(np.diff(arrival) >= 0)  # one FIFO link: arrivals in order


def test_replication_masks_a_slow_server():
    """Two replicas of everything; one server is 1000x slower for a while: latency stays low (§VI-B)."""
    net = ZeroLatency(NAMES[:5])
    plan = {n: [NAMES[0], NAMES[1]] for n in ["entry", *Q.operators]} | {"alerts": [NAMES[4]]}
    slow = Scenario.from_dict({"events": [{"at": 50, "action": "slow_server", "server": NAMES[0],
                                           "factor": 20000, "duration": 200}]})
    one = {n: [v[0]] for n, v in plan.items()}
    lat1 = Simulator(Q, one, net, scenario=slow).run(DATA).latencies("alerts")[1]
    lat2 = Simulator(Q, plan, net, scenario=slow).run(DATA).latencies("alerts")[1]
    assert lat1.max() > 1.0  # the overloaded server delays its outputs
    assert lat2.max() < 0.05


@pytest.mark.slow
def test_cpu_cost_is_charged_per_copy():
    plan = {n: [NAMES[0], NAMES[1], NAMES[2]] for n in ["entry", *Q.operators]} | {"alerts": [NAMES[4]]}
    res3 = Simulator(Q, plan, ZeroLatency(NAMES[:5])).run(DATA)
    res1 = Simulator(Q, {n: [v[0]] for n, v in plan.items()}, ZeroLatency(NAMES[:5])).run(DATA)
    assert res3.stats["cpu_s"]["loads#0"] > 2 * res1.stats["cpu_s"]["loads#0"]


@pytest.mark.slow
def test_sources_at_servers_add_their_latency():
    net = GeoLatencyModel(SERVERS, static=True)
    src = {s: NAMES[6] for s in Q.sources}
    base = Simulator(Q, PLAN, net, cpu=NOCPU).run(DATA).latencies("alerts")[1]
    far = Simulator(Q, PLAN, net, cpu=NOCPU, sources=src).run(DATA).latencies("alerts")[1]
    extra = min(net.latency_ms(NAMES[6], e, 0) for e in PLAN["entry"]) / 1000
    assert np.median(far) - np.median(base) >= extra * 0.99


@pytest.mark.slow
def test_sync_and_deterministic_are_slower_than_replication():
    net = GeoLatencyModel(SERVERS, seed=2)
    med = {m: float(np.median(Simulator(Q, PLAN, net, mode=m).run(DATA).latencies("alerts")[1]))
           for m in ["replication", "synchronization", "deterministic"]}
    assert med["replication"] < med["synchronization"] and med["replication"] < med["deterministic"]


def test_caller_conditions_are_not_changed():
    net = NetworkConditions(ZeroLatency(["a", "b"]))
    sc = Scenario.from_dict({"events": [{"at": 1, "action": "cut_link", "a": "a", "b": "b"}]})
    Simulator(Q, chain_plan(["a", "b"]), net, scenario=sc)
    assert net.overrides() == []


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="mode must be one of"):
        Simulator(Q, PLAN, mode="fast")
    with pytest.raises(ValueError, match="does not know: \\['nowhere'\\]"):
        Simulator(Q, PLAN | {"hot": ["nowhere"]}, GeoLatencyModel(SERVERS))
    with pytest.raises(ValueError, match="distinct servers"):
        Simulator(Q, PLAN | {"hot": ["boston", "boston"]})
    with pytest.raises(ValueError, match="exactly one server"):
        Simulator(Q, PLAN | {"alerts": NAMES[:2]})
    with pytest.raises(ValueError, match="field 'replica'"):
        Simulator(Q, PLAN, GeoLatencyModel(SERVERS), scenario=Scenario.from_dict(
            {"events": [{"at": 1, "action": "kill_replica", "operator": "hot", "replica": 5}]}))
    with pytest.raises(Exception, match="unknown source"):
        Simulator(Q, PLAN).run({"nope": []})


@pytest.mark.slow
def test_runs_are_deterministic():
    net = GeoLatencyModel(SERVERS, seed=5)
    a = Simulator(Q, PLAN, net, scenario=FAULTS).run(DATA)
    b = Simulator(Q, PLAN, net, scenario=FAULTS).run(DATA)
    assert np.array_equal(a.arrivals["alerts"], b.arrivals["alerts"])
    assert math.isclose(a.end_time, b.end_time)


def test_discarded_streams_carry_nothing_and_revival_hands_over():
    """apply_snapshot switches stream replicas off as replistream.gc decides; reviving a dormant
    Join replica hands its state over from a live peer, and the output stays exact."""
    from replistream.gc import snapshot_from_plan

    plan = {n: NAMES[:2] for n in ["entry", *Q.operators]} | {"alerts": [NAMES[4]]}
    snap = snapshot_from_plan(Q, plan)
    dormant = {s.id: False for s in snap.streams if "correlate#1" in s.id}
    revived = {}

    def coordinator(sim, t):
        if t == 100.0:
            sim.apply_snapshot(snap.evolve(streams_live=dormant))
        if t == 200.0:
            revived["n"] = sim.apply_snapshot(snap)

    sim = Simulator(Q, plan, GeoLatencyModel(SERVERS, seed=1), coordinator=(100.0, coordinator))
    res = sim.run(DATA)
    assert_same_output(REF.outputs["alerts"], res.outputs["alerts"])
    assert revived["n"] == len(snap.streams)
    assert [e["replica"] for e in res.events if e["event"] == "handover"] == ["correlate#1"]
    by_id = {lk.id: lk for lk in sim.stream_replicas()}
    assert by_id["correlate#1->hot#0:0"].tuples < by_id["correlate#0->hot#0:0"].tuples
    assert sim.input_end() <= res.end_time
    delays = sim.input_delays(res.end_time + 1000, reset=False, silence_s=60)
    assert delays["hot#0"] < 1  # silence after the sources' last tuple is the input's end, not a delay
    sim._ended.clear()  # as if a source were still open: the same silence is ~1000 s beyond the allowance
    delays = sim.input_delays(res.end_time + 1000, silence_s=60)
    assert delays["hot#0"] > 900
    with pytest.raises(ValueError, match="does not"):
        sim.apply_snapshot(snapshot_from_plan(Q, {n: NAMES[:3] for n in plan if n != "alerts"} | {"alerts": [NAMES[4]]}))
