"""Sentinels among a source's input in the simulator: KillReplica and KillServer are the scenario's
kills at the virtual time the feeder reaches them, in both engines; the others are refused loudly."""
import numpy as np
import pytest

from replistream.errors import QueryError
from replistream.network import GeoLatencyModel
from replistream.scenario import Event, Scenario
from replistream.sim import Simulator
from replistream.sources import AddReplica, Call, KillReplica, KillServer, Pause, Revive, chunk_time
from replistream.testing import assert_same_output

from fig1_sim import DATA, NAMES, PLAN, Q, REF, SERVERS  # tests/sim/fig1_sim.py

NET = GeoLatencyModel(SERVERS, seed=1)


def with_sentinel(source: str, after: int, sentinel) -> dict:
    """DATA with ``sentinel`` placed after chunk ``after`` of ``source``."""
    chunks = list(DATA[source])
    return DATA | {source: chunks[:after + 1] + [sentinel] + chunks[after + 1:]}


@pytest.mark.slow
@pytest.mark.parametrize("epoch", [None, 30.0])
def test_a_kill_by_sentinel_is_the_scenario_kill_at_that_time(epoch):
    """The feeder reaches a sentinel at the release time of the source's chunk before it: the same
    outputs, arrival times and kill events as a scenario killing the same replicas at that time."""
    scripted = [("ping_1", 11, KillServer(NAMES[2])), ("load_3", 23, KillReplica("correlate", 1))]
    inputs = DATA
    for src, after, sentinel in scripted:
        chunks = list(inputs[src])
        inputs = inputs | {src: chunks[:after + 1] + [sentinel] + chunks[after + 1:]}
    by_sentinel = Simulator(Q, PLAN, NET, batch_s=epoch).run(inputs)
    ts0 = by_sentinel.ts0
    events = [Event((chunk_time(DATA[src][after]) - ts0) / 1e6, "kill_server", server=s.server)
              if isinstance(s, KillServer) else
              Event((chunk_time(DATA[src][after]) - ts0) / 1e6, "kill_replica", operator=s.operator,
                    replica=s.replica) for src, after, s in scripted]
    by_scenario = Simulator(Q, PLAN, NET, scenario=Scenario(events), batch_s=epoch).run(DATA)
    assert by_sentinel.complete and by_scenario.complete
    assert_same_output(REF.outputs["alerts"], by_sentinel.outputs["alerts"])
    assert by_sentinel.outputs["alerts"].tobytes() == by_scenario.outputs["alerts"].tobytes()
    assert np.array_equal(by_sentinel.arrivals["alerts"], by_scenario.arrivals["alerts"])
    kills = [e for e in by_sentinel.events if e["event"] == "killed"]
    assert kills == [e for e in by_scenario.events if e["event"] == "killed"]
    assert [e["replica"] for e in kills] == ["loads#0", "correlate#1"]
    assert [e["t"] for e in kills] == [ev.at for ev in events]
    assert by_sentinel.links == by_scenario.links


@pytest.mark.slow
@pytest.mark.parametrize("epoch", [None, 30.0])
def test_a_sentinel_first_in_the_input_kills_at_zero_and_keeps_the_time_origin(epoch):
    inputs = DATA | {"load_0": [KillReplica("hot", 0)] + list(DATA["load_0"])}
    res = Simulator(Q, PLAN, NET, batch_s=epoch).run(inputs)
    plain = Simulator(Q, PLAN, NET, batch_s=epoch).run(DATA)
    assert res.ts0 == plain.ts0
    assert [(e["t"], e["replica"]) for e in res.events if e["event"] == "killed"] == [(0.0, "hot#0")]
    assert_same_output(REF.outputs["alerts"], res.outputs["alerts"])


@pytest.mark.parametrize("epoch", [None, 30.0])
@pytest.mark.parametrize("sentinel", [Pause(0.1), Call(lambda d: None), Revive("correlate", 0),
                                      AddReplica("correlate")], ids=lambda s: type(s).__name__)
def test_sentinels_the_simulator_cannot_run_stop_the_run(epoch, sentinel):
    with pytest.raises(QueryError, match=f"{type(sentinel).__name__} in the input of source 'ping_2': the "
                                         f"simulator cannot run this sentinel"):
        Simulator(Q, PLAN, NET, batch_s=epoch).run(with_sentinel("ping_2", 5, sentinel))


@pytest.mark.parametrize("epoch", [None, 30.0])
def test_a_kill_naming_nothing_in_the_simulation_stops_the_run(epoch):
    with pytest.raises(QueryError, match="no server 'atlantis'"):
        Simulator(Q, PLAN, NET, batch_s=epoch).run(with_sentinel("ping_2", 5, KillServer("atlantis")))
    with pytest.raises(QueryError, match="no replica 7 of 'hot'"):
        Simulator(Q, PLAN, NET, batch_s=epoch).run(with_sentinel("ping_2", 5, KillReplica("hot", 7)))


def test_runs_return_the_engines_result_type_and_the_plan_checks_placements():
    from replistream.engines import RunResult
    from replistream.plan import PhysicalPlan

    sim = Simulator(Q, PLAN, NET, scenario=Scenario([Event(50.0, "kill_server", server=NAMES[6])]))
    res = sim.run(DATA)
    assert isinstance(res, RunResult) and res.pace == 1.0 and res.complete
    assert isinstance(sim.physical, PhysicalPlan)
    assert [r.label for r in sim.replicas("correlate")] == [r.label for r in sim.physical.replicas("correlate")]
    assert sorted(lk.id for lk in sim.stream_replicas()) == sorted(e.id for e in sim.physical.streams())
    with pytest.raises(ValueError, match="dead replica of 'correlate'"):
        sim.add_replica("correlate", NAMES[6])  # correlate#0 died there
    assert sim.add_replica("correlate", NAMES[5]) == "correlate#2"
    assert [r.label for r in sim.physical.replicas("correlate")] == ["correlate#0", "correlate#1", "correlate#2"]
