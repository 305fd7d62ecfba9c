"""Live rescaling in the simulator (issue #41; replistream/sim/rescale.py): every strategy, more and
fewer partitions, a join, crashes during the move, the records (simulated duration, latency), and
the one-line refusals. Every run is compared with the reference run as a multiset."""
from __future__ import annotations

import numpy as np
import pytest

from replistream import Query
from replistream.errors import QueryError
from replistream.network import GeoLatencyModel, ZeroLatency, default_servers
from replistream.scenario import Event, Scenario
from replistream.sim import CpuModel, Simulator
from replistream.sources import KillReplica, Rescale
from replistream.testing import assert_same_output, chunked, run_reference, run_replicated

SERVERS = [s.name for s in default_servers(6)]
NET = GeoLatencyModel(default_servers(6), seed=0)


def keyed_count(punctuate_every: int = 10, window_us: int = 500_000) -> Query:
    q = Query()
    s = q.source("s", {"k": "i8"}, punctuate_every=punctuate_every)
    s.window(size=window_us, by="k", name="w").sink("out")
    return q


def records(n: int = 2000, keys: int = 40, step_us: int = 5_000, seed: int = 1) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"ts": i * step_us, "k": int(rng.integers(0, keys))} for i in range(n)]


def plan(extra: dict | None = None) -> dict:
    """Entry points and partition 0 on servers 0 and 1; the partitions a rescale starts on 2 and 3
    (partition 2 on 4 and 5): the bins' state crosses the wide-area network."""
    return {"entry": SERVERS[:2], "w": SERVERS[:2], "w.1": SERVERS[2:4], "w.2": SERVERS[4:6],
            "w.3": SERVERS[2:4], "out": [SERVERS[5]], **(extra or {})}


def run(q, data, parallelism, rescales=(), scenario=None, cpu=None, **kw):
    sim = Simulator(q, plan(), NET, parallelism=parallelism, bits=4, rescales=list(rescales), scenario=scenario,
                    cpu=cpu, **kw)
    return sim.run(data)


@pytest.mark.parametrize("strategy", ["fluid", "batched", "all-at-once"])
@pytest.mark.parametrize("start, to", [(1, 3), (3, 2), (2, 4)])
def test_every_strategy_more_and_fewer_partitions_is_exact(strategy, start, to):
    q = keyed_count()
    data = {"s": chunked(records(), 20)}
    ev = Rescale("w", to, strategy, bins_per_step=3 if strategy == "batched" else None, gap=20_000)
    res = run(q, data, {"w": start}, [(4.0, ev)], cpu=CpuModel(per_state_row_us=50.0))
    assert_same_output(run_reference(q, data).outputs["out"], res.outputs["out"])
    rec, = res.stats["rescales"]
    moving = {(1, 3): 10, (3, 2): 5, (2, 4): 8}[(start, to)]  # bins that change owner of 16
    assert (rec["from"], rec["to"], rec["bins_moved"], rec["lost"]) == (start, to, moving, 0)
    if strategy == "fluid":
        assert rec["steps"] == moving  # one bin a step
    elif strategy == "all-at-once":
        assert rec["steps"] == {(1, 3): 2, (3, 2): 2, (2, 4): 4}[(start, to)]  # one step per pair of partitions
    else:
        assert 2 <= rec["steps"] < moving  # three bins a step
    assert rec["start_s"] == 4.0 and rec["end_s"] > rec["start_s"] and rec["duration_s"] > 0
    assert rec["sent"] > 0 and rec["outputs_during"] > 0 and rec["latency_during_max_s"] > 0
    assert len(rec["new_replicas"]) == 2 * max(0, to - start)
    assert len(rec["retired_replicas"]) == 2 * max(0, start - to)


def test_new_partitions_run_on_the_servers_the_plan_names_and_state_crosses_the_network():
    q = keyed_count()
    data = {"s": chunked(records(), 20)}
    sim = Simulator(q, plan(), NET, parallelism={"w": 1}, bits=4, rescales=[(4.0, Rescale("w", 3, "all-at-once"))])
    res = sim.run(data)
    assert_same_output(run_reference(q, data).outputs["out"], res.outputs["out"])
    where = {r.label: r.server for r in sim.replicas("w")}
    assert where == {"w.0#0": SERVERS[0], "w.0#1": SERVERS[1], "w.1#0": SERVERS[2], "w.1#1": SERVERS[3],
                     "w.2#0": SERVERS[4], "w.2#1": SERVERS[5]}
    rec, = res.stats["rescales"]
    # the move waits at least for a state message over the wide-area network (partition 0 to 1)
    assert rec["duration_s"] >= NET.latency_ms(SERVERS[0], SERVERS[2], 4.0) / 1000 * 0.5


def test_a_rescale_sentinel_in_the_input_gives_what_the_in_process_engine_gives():
    q = keyed_count()
    recs = records(1200)
    data = {"s": chunked(recs[:500], 20) + [Rescale("w", 3, "fluid", gap=5_000)] + chunked(recs[500:900], 20)
            + [Rescale("w", 2, "batched", bins_per_step=2, gap=5_000)] + chunked(recs[900:], 20)}
    ref = run_reference(q, data).outputs["out"]
    res = Simulator(q, {"entry": SERVERS[:2], "w": SERVERS[:2], "out": [SERVERS[5]]}, NET, parallelism={"w": 1},
                    bits=4).run(data)
    assert_same_output(ref, res.outputs["out"])
    assert_same_output(ref, run_replicated(q, data, k=2, seed=2, parallelism={"w": 1}, bits=4).outputs["out"])
    first, second = res.stats["rescales"]
    assert (first["from"], first["to"], second["from"], second["to"]) == (1, 3, 3, 2)
    assert first["start_s"] == pytest.approx((recs[480]["ts"]) / 1e6)  # the release of the chunk before it
    assert second["at"] > first["at"]


@pytest.mark.parametrize("victim", ["w.0", "w.1"])
def test_a_replica_crash_during_the_move_loses_nothing(victim):
    """One replica of the giving partition (w.0) or of the taking one (w.1, started by the rescale)
    crashes halfway through a fluid move spread over 0.8 s of event time; its peer goes on."""
    q = keyed_count()
    data = {"s": chunked(records(2400), 20)}
    ev = Rescale("w", 2, "fluid", gap=100_000)  # 8 steps, one every 0.1 s of event time
    scen = Scenario([Event(4.35, "kill_replica", operator=victim, replica=0)])
    res = run(q, data, {"w": 1}, [(4.0, ev)], scenario=scen, cpu=CpuModel(per_state_row_us=50.0))
    assert_same_output(run_reference(q, data).outputs["out"], res.outputs["out"])
    rec, = res.stats["rescales"]
    killed = [e for e in res.events if e["event"] == "killed"]
    assert [e["replica"] for e in killed] == [f"{victim}#0"]
    assert rec["start_s"] < killed[0]["t"] < rec["end_s"]  # the crash came during the move


def test_a_crash_before_the_giver_gave_its_peer_gives():
    q = keyed_count()
    recs = records(1200)
    data = {"s": chunked(recs[:500], 20) + [Rescale("w", 2, "all-at-once"), KillReplica("w.0", 1)]
            + chunked(recs[500:], 20)}
    res = Simulator(q, plan(), NET, parallelism={"w": 1}, bits=4).run(data)
    assert_same_output(run_reference(q, data).outputs["out"], res.outputs["out"])
    rec, = res.stats["rescales"]
    assert rec["sent"] == 2 and rec["end_s"] is not None  # w.0#0 alone sent the state to w.1#0 and w.1#1


def test_a_join_rescales_both_inputs_exactly():
    from replistream.workloads import fig1_inputs, fig1_query

    q = fig1_query(2, window_s=10)
    data = fig1_inputs(2, duration_s=120, period_s=2, seed=3)
    servers = SERVERS[:4]
    p = {n: servers[:2] for n in ["entry", *q.operators]} | {"alerts": [servers[3]], "correlate.1": servers[2:4]}
    for ev in (Rescale("correlate", 2, "fluid", gap=2_000_000), Rescale("correlate", 2, "all-at-once")):
        sim = Simulator(q, p, NET, parallelism={"correlate": 1}, bits=3,
                        rescales=[(40.0, ev), (80.0, Rescale("correlate", 1, ev.strategy, gap=ev.gap))])
        res = sim.run(data)
        assert_same_output(run_reference(q, data).outputs["alerts"], res.outputs["alerts"])
        assert [(r["from"], r["to"]) for r in res.stats["rescales"]] == [(1, 2), (2, 1)]
        assert all(r["end_s"] is not None for r in res.stats["rescales"])


def test_a_run_that_cannot_finish_the_move_says_what_is_undone():
    """Both replicas of the giving partition crash before giving: nothing can give the bins."""
    q = keyed_count()
    recs = records(1200)
    data = {"s": chunked(recs[:500], 20) + [Rescale("w", 2, "all-at-once"), KillReplica("w.0", 0),
                                             KillReplica("w.0", 1)] + chunked(recs[500:], 20)}
    with pytest.raises(RuntimeError, match=r"rescales did not complete:\n  w\.1#0: 1 step\(s\) to take"):
        Simulator(q, plan(), NET, parallelism={"w": 1}, bits=4).run(data)


def test_refusals_are_one_line_and_name_the_fix():
    q = keyed_count()
    z = ZeroLatency(SERVERS)
    small = {"entry": SERVERS[:2], "w": SERVERS[:2], "out": [SERVERS[5]]}
    cases = [
        (dict(rescales=[(1.0, Rescale("w", 2))]), QueryError, r"'w' is not partitioned; run it with parallelism="),
        (dict(parallelism={"w": 1}, bits=2, rescales=[(1.0, Rescale("w", 5))]), ValueError,
         r"5 partitions cannot share 2\*\*2 bins; use at most 4"),
        (dict(parallelism={"w": 1}, rescales=[Rescale("w", 2)]), ValueError,
         r"each entry must be \(at_s, Rescale\(\.\.\.\)\)"),
        (dict(parallelism={"w": 1}, rescales=[(-1.0, Rescale("w", 2))]), ValueError, r"virtual seconds >= 0"),
        (dict(parallelism={"w": 1}, rescales=[(1.0, Rescale("w", 2, "slow"))]), ValueError, r"unknown strategy"),
        (dict(parallelism={"w": 2}, rescales=[(1.0, Rescale("w", 1)), (2.0, Rescale("w", 2))]), QueryError,
         r"would start w\.1 again after a rescale retired it; the simulator does not restart"),
        (dict(parallelism={"w": 1}, rescale_after_s=-1), ValueError, r"rescale_after_s must be"),
    ]
    for kw, exc, msg in cases:
        with pytest.raises(exc, match=msg) as e:
            Simulator(q, small, z, **kw)
        assert "\n" not in str(e.value)
    # a sentinel is checked when the feeder reaches it
    data = {"s": chunked(records(100), 20) + [Rescale("w", 2)]}
    with pytest.raises(QueryError, match=r"'w' is not partitioned") as e:
        Simulator(q, small, z).run(data)
    assert "\n" not in str(e.value)
    # entry partitions and partitioned applications run (tests/sim/test_sim_entry_app_partitions.py);
    # beside entry partitions a rescale is refused in one line
    with pytest.raises(QueryError, match="does not rescale beside entry partitions") as e:
        Simulator(q, small, z, parallelism={"entry": 2, "w": 1}, rescales=[(1.0, Rescale("w", 2))])
    assert "\n" not in str(e.value)


def test_a_simulator_that_rescaled_refuses_a_second_run():
    q = keyed_count()
    data = {"s": chunked(records(600), 20)}
    sim = Simulator(q, plan(), NET, parallelism={"w": 1}, bits=4, rescales=[(1.0, Rescale("w", 2))])
    sim.run(data)
    with pytest.raises(RuntimeError, match="make a new Simulator for each run with rescales"):
        sim.run(data)
