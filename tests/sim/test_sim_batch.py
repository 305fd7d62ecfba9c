"""The batched engine (Simulator(batch_s=...)): the same outputs, latencies and weights as the
per-packet engine, whatever the epoch; the vectorised network and CPU queue equal the scalar ones."""
import math

import numpy as np
import pytest

from replistream import Query
from replistream.engines import run_reference
from replistream.gc import snapshot_from_plan
from replistream.network import GeoLatencyModel, NetworkConditions, ZeroLatency, delivery_times
from replistream.scenario import Scenario
from replistream.sim import CpuModel, Simulator
from replistream.sim.batch import fifo_done
from replistream.testing import assert_same_output
from replistream.workloads import fig1_inputs

from fig1_sim import DATA, NAMES, PLAN, Q, REF, SERVERS  # tests/sim/fig1_sim.py

FAULTS = Scenario.from_dict({"events": [
    {"at": 120, "action": "kill_server", "server": NAMES[2]},
    {"at": 60, "action": "cut_link", "a": NAMES[4], "b": NAMES[6], "duration": 50},
    {"at": 250, "action": "delay_link", "a": NAMES[0], "b": NAMES[2], "extra_ms": 3000, "duration": 30},
    {"at": 300, "action": "kill_replica", "operator": "entry", "replica": 0},
]})


def by_id(res, app="alerts"):
    o = np.argsort(res.outputs[app]["id"], kind="stable")
    return res.outputs[app]["id"][o], res.latencies(app)[1][o]


def assert_same_run(a, b, app="alerts", atol=1e-9):
    ia, la = by_id(a, app)
    ib, lb = by_id(b, app)
    assert np.array_equal(ia, ib)
    assert np.allclose(la, lb, rtol=0, atol=atol)


@pytest.mark.slow
@pytest.mark.parametrize("epoch", [0.7, 30.0, 1000.0])
@pytest.mark.parametrize("faults", [False, True])
def test_batched_equals_per_packet(epoch, faults):
    net = GeoLatencyModel(SERVERS, seed=1)
    sc = FAULTS if faults else None
    a_sim = Simulator(Q, PLAN, net, scenario=sc)
    b_sim = Simulator(Q, PLAN, net, scenario=sc, batch_s=epoch)
    a, b = a_sim.run(DATA), b_sim.run(DATA)
    assert b.complete
    assert_same_output(REF.outputs["alerts"], b.outputs["alerts"])
    assert_same_run(a, b)
    wa, wb = a_sim.weights(), b_sim.weights()
    assert wa.keys() == wb.keys() and all(math.isclose(wa[k], wb[k], abs_tol=1e-9) for k in wa)
    assert [e["event"] for e in a.events] == [e["event"] for e in b.events]
    da, db = a_sim.input_delays(a.end_time + 1), b_sim.input_delays(a.end_time + 1)
    assert da.keys() == db.keys() and all(math.isclose(da[k], db[k], abs_tol=1e-6) for k in da)
    assert {(x["id"], x["tuples"]) for x in a.links} == {(x["id"], x["tuples"]) for x in b.links}


def test_exact_delays_and_cuts_on_a_zero_network():
    plan = {n: ["a"] for n in ["entry", "loads", "pings"]} | {n: ["b"] for n in ["correlate", "hot", "alerts"]}
    sc = Scenario.from_dict({"events": [{"at": 100, "action": "delay_link", "a": "a", "b": "b", "extra_ms": 250,
                                         "duration": 100}, {"at": 250, "action": "cut_link", "a": "a", "b": "b",
                                                            "duration": 37}]})
    res = Simulator(Q, plan, ZeroLatency(["a", "b"]), cpu=CpuModel(scale=0), scenario=sc, batch_s=60).run(DATA)
    assert_same_output(REF.outputs["alerts"], res.outputs["alerts"])
    arrival, lat = res.latencies("alerts")
    sent = arrival - lat
    inside = (sent >= 100) & (sent < 200 - 0.25)
    assert inside.sum() > 10 and np.allclose(lat[inside], 0.25)
    held = (sent >= 250) & (sent < 287)
    assert held.any() and np.all(arrival[held] >= 287) and np.all(arrival[held] < 287.01)
    assert np.all(lat[(sent > 200) & (sent < 250)] == 0.0)


def test_chunks_of_many_readings_release_each_at_its_timestamp():
    """A source chunk holding an hour of readings behaves as one reading per chunk."""
    net = GeoLatencyModel(SERVERS, seed=4)
    big = fig1_inputs(4, duration_s=400, period_s=10, seed=3, chunk=40)
    a = Simulator(Q, PLAN, net, batch_s=50).run(DATA)
    b = Simulator(Q, PLAN, net, batch_s=50).run(big)
    assert_same_output(REF.outputs["alerts"], b.outputs["alerts"])
    assert_same_run(a, b, atol=0)


@pytest.mark.slow
def test_keep_outputs_false_keeps_times():
    net = GeoLatencyModel(SERVERS, seed=1)
    a = Simulator(Q, PLAN, net, batch_s=100).run(DATA)
    b = Simulator(Q, PLAN, net, batch_s=100, keep_outputs=False).run(DATA)
    assert np.array_equal(a.outputs["alerts"]["ts"], b.outputs["alerts"]["ts"])
    assert np.array_equal(a.arrivals["alerts"], b.arrivals["alerts"])


@pytest.mark.slow
@pytest.mark.parametrize("retain", [False, True])
def test_gc_and_revival_hand_over_as_per_packet(retain):
    plan = {n: NAMES[2 * i:2 * i + 2] for i, n in enumerate(["entry", *Q.operators])} | {"alerts": [NAMES[0]]}
    snap = snapshot_from_plan(Q, plan)
    dormant = {s.id: False for s in snap.streams if "correlate#1" in s.id}

    def coordinator(sim, t):
        if t == 100.0:
            sim.apply_snapshot(snap.evolve(streams_live=dormant))
        if t == 200.0:
            sim.apply_snapshot(snap)

    runs = [Simulator(Q, plan, GeoLatencyModel(SERVERS, seed=1), coordinator=(100.0, coordinator), retain=retain,
                      batch_s=e).run(DATA) for e in (None, 25.0)]
    assert_same_output(REF.outputs["alerts"], runs[1].outputs["alerts"])
    assert_same_run(*runs)
    assert [e["replica"] for e in runs[1].events if e["event"] == "handover"] == ["correlate#1"]


def test_other_operators_go_packet_by_packet():
    """A windowed aggregate is not on the fast path: driven packet by packet, still exact."""
    q = Query("agg")
    s = q.source("s", {"k": "i8"}, punctuate_every=5_000_000)
    s.window(size=10_000_000, by="k", name="w").sink("out")
    q = q.build()
    rng = np.random.default_rng(0)
    data = {"s": [{"ts": [int(t)], "k": [int(rng.integers(3))]} for t in np.arange(0, 200_000_000, 700_000)]}
    plan = {"entry": NAMES[:2], "w": NAMES[2:4], "out": [NAMES[5]]}
    net = GeoLatencyModel(SERVERS, seed=2)
    a = Simulator(q, plan, net).run(data)
    b = Simulator(q, plan, net, batch_s=40).run(data)
    assert_same_output(run_reference(q, data).outputs["out"], b.outputs["out"])
    assert_same_run(a, b, app="out")


def test_geo_latencies_vectorised_equal_the_model():
    m = GeoLatencyModel(SERVERS, seed=7, outages=1 / 600, spikes=1 / 60)  # many events, to test them
    t = np.sort(np.random.default_rng(1).uniform(0, 7 * 86400, 3000))
    down = 0
    for a, b in [(NAMES[0], NAMES[1]), (NAMES[3], NAMES[8]), (NAMES[2], NAMES[2])]:
        fast = m.latencies_ms(a, b, t)
        slow = np.array([m.latency_ms(a, b, x) for x in t])
        assert np.array_equal(np.isinf(fast), np.isinf(slow))
        assert np.allclose(fast[np.isfinite(fast)], slow[np.isfinite(slow)], rtol=1e-12, atol=0)
        down += int(np.isinf(slow).sum())
    assert down > 0  # outages were hit


def test_arrivals_wait_out_cuts_in_fifo_order():
    net = NetworkConditions(ZeroLatency(["a", "b"]))
    net.cut("a", "b", 10, 20)
    at = delivery_times(net, "a", "b", np.array([9.0, 12.0, 15.0, 21.0]), after=9.5)
    assert at[0] == 9.5 and np.all(at[1:3] >= 20) and np.all(at[1:3] < 20.01) and at[3] == 21.0


def test_fifo_done_is_lindleys_recursion():
    rng = np.random.default_rng(3)
    arr = np.sort(rng.uniform(0, 10, 500))
    cost = rng.exponential(0.03, 500)
    want, busy = [], 2.0
    for a, c in zip(arr, cost):
        busy = max(a, busy) + c
        want.append(busy)
    assert np.allclose(fifo_done(arr, cost, 2.0), want, rtol=0, atol=1e-9)


def test_batched_errors_name_the_problem():
    with pytest.raises(ValueError, match="replication"):
        Simulator(Q, PLAN, mode="synchronization", batch_s=10)
    with pytest.raises(ValueError, match="batch_s"):
        Simulator(Q, PLAN, batch_s=0)


@pytest.mark.slow  # 2.5 s in the quick subset (#31)
def test_outages_are_waited_out_as_delivery_time_does():
    from replistream.network import delivery_time

    m = GeoLatencyModel(SERVERS, seed=7, outages=1 / 600)
    a, b = NAMES[0], NAMES[1]
    t = np.arange(0.0, 2 * 86400, 7.3)
    lat = np.array([m.latency_ms(a, b, x) for x in t])
    down = t[np.isinf(lat)][:300]
    assert len(down) > 50
    want = [delivery_time(m, a, b, x) for x in down]
    assert np.allclose(delivery_times(m, a, b, down, after=-math.inf), np.maximum.accumulate(want), rtol=0, atol=1e-9)


@pytest.mark.parametrize("epoch", [None, 20.0])
def test_a_replica_created_mid_run_takes_over(epoch):
    """§V-C: revival may create a new replica. A third Join replica created at t=100 (handed over
    from a live peer, fed the senders' retained output) keeps the output exact after both
    original Join servers crash at t=200."""
    plan = {n: NAMES[2 * i:2 * i + 2] for i, n in enumerate(["entry", *Q.operators])} | {"alerts": [NAMES[0]]}
    crash = Scenario.from_dict({"events": [{"at": 200, "action": "kill_server", "server": s}
                                           for s in plan["correlate"]]})
    new_server = NAMES[1]
    created = {}

    def coordinator(sim, t):
        if t == 100.0:
            created["label"] = sim.add_replica("correlate", new_server)
            grown = plan | {"correlate": plan["correlate"] + [new_server]}
            sim.apply_snapshot(snapshot_from_plan(Q, grown))

    sim = Simulator(Q, plan, GeoLatencyModel(SERVERS, seed=1), scenario=crash, retain=True,
                    coordinator=(100.0, coordinator), batch_s=epoch)
    res = sim.run(DATA)
    assert created["label"] == "correlate#2"
    assert res.complete
    assert_same_output(REF.outputs["alerts"], res.outputs["alerts"])
    ev = [(e["event"], e.get("replica")) for e in res.events]
    assert ("created", "correlate#2") in ev and ("handover", "correlate#2") in ev
    late = res.latencies("alerts")[0] > 210
    assert late.sum() > 50  # outputs after the crash came through the new replica
    new_out = [lk for lk in sim.stream_replicas() if lk.sender.label == "correlate#2"]
    assert sum(lk.tuples for lk in new_out) > 0
    with pytest.raises(ValueError, match="already runs"):
        sim.add_replica("correlate", new_server)


@pytest.mark.parametrize("epoch", [None, 25.0])
def test_a_stream_revived_to_a_lagging_receiver_replays_from_its_acknowledgement(epoch):
    """Revival of a stream replica to a receiver that lags (decision 7): ``hot#0`` is fed by
    ``correlate#1`` alone, over a link 40 s slow, and alone feeds the sink; ``correlate#0``
    feeds only ``hot#1``, which is ahead. At t=300 the stream correlate#0 -> hot#0 is revived and correlate#1 -> hot#0
    discarded. correlate#0 must still retain what hot#0 has not acknowledged: a sender that
    trimmed its log to its *live* receivers' acknowledgements replays a punctuation ahead of
    the tuples hot#0 still waits for, and its filter then drops those as copies (tuples lost)."""
    servers = [f"s{i}" for i in range(10)]
    names = ["entry", "loads", "pings", "correlate", "hot"]
    plan = {n: servers[2 * i:2 * i + 2] for i, n in enumerate(names)} | {"alerts": [servers[0]]}
    slow = Scenario.from_dict({"events": [{"at": 100, "action": "delay_link", "a": plan["correlate"][1],
                                           "b": plan["hot"][0], "extra_ms": 40_000, "duration": 200}]})
    snap = snapshot_from_plan(Q, plan)
    gone = {("correlate#0", "hot#0"), ("correlate#1", "hot#1"), ("hot#1", "alerts")}  # alerts: hot#0's only
    one_each = {s.id: False for s in snap.streams if (s.src, s.dst) in gone}
    swapped = one_each | {s.id: s.src != "correlate#1" for s in snap.streams if s.dst == "hot#0"}
    assert len(one_each) == 3 and len(swapped) == 4

    def coordinator(sim, t):
        if t == 25.0:
            sim.apply_snapshot(snap.evolve(streams_live=one_each))
        if t == 300.0:
            sim.apply_snapshot(snap.evolve(streams_live=swapped))

    sim = Simulator(Q, plan, ZeroLatency(servers), cpu=CpuModel(scale=0), scenario=slow,
                    coordinator=(25.0, coordinator), retain=True, batch_s=epoch)
    res = sim.run(DATA)
    assert res.complete
    assert sum(e["event"] == "handover" for e in res.events) == 0  # hot#0 stayed fed: no hand-over
    assert_same_output(REF.outputs["alerts"], res.outputs["alerts"])
