"""Entry partitions and partitioned applications in the simulator (issue #41): a source split
between entry partitions (``parallelism={"entry": p}``) and an application run as partitions
(``parallelism={app: p}``), routed as the in-process engine routes them. Every run is compared
with the reference run as a multiset (the reference engine ignores ``parallelism``), with and
without a replica crashing mid-run."""
from __future__ import annotations

import numpy as np
import pytest

from replistream import Query
from replistream.errors import QueryError
from replistream.network import GeoLatencyModel, ZeroLatency, default_servers
from replistream.scenario import Event, Scenario
from replistream.sim import Simulator
from replistream.sources import KillReplica, Rescale
from replistream.testing import assert_same_output, chunked, run_reference, run_replicated

SERVERS = [s.name for s in default_servers(6)]
NET = GeoLatencyModel(default_servers(6), seed=0)


def keyed_window() -> Query:
    q = Query()
    s = q.source("s", {"k": "i8"}, punctuate_every=10)
    s.window(size=500_000, by="k", name="w").sink("out")
    return q


def keyed_join() -> Query:
    q = Query()
    a = q.source("a", {"k": "i8", "x": "i8"}, punctuate_every=10)
    b = q.source("b", {"k": "i8", "y": "i8"}, punctuate_every=10)
    a.join(b, window=200_000, on="k", name="j").sink("out")
    return q


def records(n: int = 2000, keys: int = 40, step_us: int = 5_000, seed: int = 1, **cols) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"ts": i * step_us, "k": int(rng.integers(0, keys)), **{c: int(rng.integers(0, 100)) for c in cols}}
            for i in range(n)]


def window_data(seed: int = 1) -> dict:
    return {"s": chunked(records(seed=seed), 20)}


def join_data(seed: int = 1) -> dict:
    return {"a": chunked(records(1500, keys=30, seed=seed, x=1), 15),
            "b": chunked(records(1500, keys=30, seed=seed + 100, y=1), 25)}


def window_plan(out=None) -> dict:
    """Entry points on servers 0 and 1, the window on 2 and 3, the application on ``out`` (default
    4 and 5: a partitioned application's partitions there)."""
    return {"entry": SERVERS[:2], "w": SERVERS[2:4], "out": out or SERVERS[4:6]}


def entry_tuples(res, source_readers: set[str]) -> dict[str, int]:
    """Tuples each entry partition sent to the replicas reading the sources, from its first replica."""
    out: dict[str, int] = {}
    for lk in res.links:
        if lk["sender"].startswith("entry.") and lk["sender"].endswith("#0") and \
                lk["receiver"].split(".")[0].split("#")[0] in source_readers:
            part = lk["sender"].split("#")[0]
            out[part] = out.get(part, 0) + lk["tuples"]
    return out


def test_a_keyed_window_fed_by_two_entry_partitions_is_exact():
    q, data = keyed_window(), window_data()
    sim = Simulator(q, window_plan(out=[SERVERS[5]]), NET, parallelism={"entry": 2})
    res = sim.run(data)
    assert_same_output(run_reference(q, data).outputs["out"], res.outputs["out"])
    assert res.complete
    assert [r.label for r in sim.replicas("entry")] == ["entry.0#0", "entry.0#1", "entry.1#0", "entry.1#1"]
    # each chunk was read by one partition: the two partitions' shares add up to the input, both non-empty
    shares = entry_tuples(res, {"w"})
    per_receiver = {p: n // 2 for p, n in shares.items()}  # each partition's first replica feeds both w replicas
    assert sorted(per_receiver) == ["entry.0", "entry.1"] and min(per_receiver.values()) > 0
    assert sum(per_receiver.values()) == 2000


def test_a_join_of_two_sources_split_between_entry_partitions_is_exact():
    q, data = keyed_join(), join_data()
    plan = {"entry": SERVERS[:2], "j": SERVERS[2:4], "out": [SERVERS[5]]}
    res = Simulator(q, plan, NET, parallelism={"entry": 3, "j": 2}, bits=4).run(data)
    ref = run_reference(q, data).outputs["out"]
    assert len(ref) > 100
    assert_same_output(ref, res.outputs["out"])


@pytest.mark.parametrize("query, data, op", [(keyed_window, window_data, "w"), (keyed_join, join_data, "j")],
                         ids=["window", "join"])
def test_a_partitioned_application_delivers_the_reference_output(query, data, op):
    q, data = query(), data()
    plan = {"entry": SERVERS[:2], op: SERVERS[2:4], "out": SERVERS[4:6]}
    sim = Simulator(q, plan, NET, parallelism={"out": 2}, bits=4)
    res = sim.run(data)
    assert_same_output(run_reference(q, data).outputs["out"], res.outputs["out"])
    assert res.complete and len(res.arrivals["out"]) == len(res.outputs["out"])
    assert [r.label for r in sim.replicas("out")] == ["out.0#0", "out.0#1", "out.1#0", "out.1#1"]
    # each partition's replicas took a share of the tuples, routed by tuple id: both partitions got some
    into = {}
    for lk in res.links:
        if lk["receiver"].startswith("out."):
            into[lk["receiver"].split("#")[0]] = into.get(lk["receiver"].split("#")[0], 0) + lk["tuples"]
    assert sorted(into) == ["out.0", "out.1"] and min(into.values()) > 0


def test_a_partitioned_application_placed_per_partition_as_replistream_place_lays_it_out():
    """``replistream place`` writes ``"entry.P"`` (the entry points' servers) and ``"out.P"`` entries."""
    q, data = keyed_window(), window_data()
    plan = {"entry": SERVERS[:2], "entry.0": SERVERS[:2], "entry.1": SERVERS[:2], "w": SERVERS[2:4],
            "out.0": [SERVERS[4], SERVERS[0]], "out.1": [SERVERS[5], SERVERS[1]]}
    sim = Simulator(q, plan, NET, parallelism={"entry": 2, "out": 2})
    res = sim.run(data)
    assert_same_output(run_reference(q, data).outputs["out"], res.outputs["out"])
    assert [r.server for r in sim.replicas("out")] == [SERVERS[4], SERVERS[0], SERVERS[5], SERVERS[1]]


CRASHES = [("entry.1", 0), ("entry.0", 1), ("w.0", 1), ("w.1", 0), ("out.1", 0), ("out.0", 1)]


@pytest.mark.parametrize("victim", CRASHES, ids=lambda v: f"{v[0]}#{v[1]}")
@pytest.mark.parametrize("seed", [1, 2])
def test_entry_and_application_partitions_with_a_crash_mid_run_are_exact(victim, seed):
    """k=2, entry points in 2 partitions, the window in 2, the application in 2: one replica
    crashes mid-run (scripted at 4 virtual s of 10), seeded input; the output is the reference's."""
    q, data = keyed_window(), window_data(seed)
    op, replica = victim
    scenario = Scenario([Event(4.0, "kill_replica", operator=op, replica=replica)])
    sim = Simulator(q, window_plan(), NET, parallelism={"entry": 2, "w": 2, "out": 2}, bits=4, scenario=scenario)
    res = sim.run(data)
    assert_same_output(run_reference(q, data).outputs["out"], res.outputs["out"])
    assert res.complete
    killed = [e for e in res.events if e["event"] == "killed"]
    assert [(e["t"], e["replica"]) for e in killed] == [(4.0, f"{op}#{replica}")]
    # the crash was mid-run: outputs arrived both before and after it
    at = res.arrivals["out"]
    assert (at < 4.0).any() and (at > 4.0).any()


def test_a_crash_scripted_among_the_input_and_a_server_loss_are_exact():
    """A KillReplica sentinel naming an entry partition's replica, then that replica's server lost
    (with it one replica of every partition of the entry points, the window and the application)."""
    q = keyed_window()
    recs = records(seed=3)
    data = {"s": chunked(recs[:700], 20) + [KillReplica("entry.0", 1)] + chunked(recs[700:], 20)}
    plan = {"entry": SERVERS[:2], "w": [SERVERS[1], SERVERS[2]], "out": [SERVERS[1], SERVERS[3]]}
    scenario = Scenario([Event(6.0, "kill_server", server=SERVERS[1])])
    res = Simulator(q, plan, NET, parallelism={"entry": 2, "w": 2, "out": 2}, bits=4, scenario=scenario).run(data)
    ref = run_reference(q, {"s": chunked(recs, 20)}).outputs["out"]
    assert_same_output(ref, res.outputs["out"])
    killed = sorted(e["replica"] for e in res.events if e["event"] == "killed")
    assert killed == ["entry.0#1", "entry.1#1", "out.0#0", "out.1#0", "w.0#0", "w.1#0"]


def test_the_simulator_and_the_in_process_engine_agree():
    """The in-process engine is the model: same parallelism, same output (as a multiset), with crashes."""
    q, data = keyed_window(), window_data(5)
    par = {"entry": 2, "w": 2, "out": 2}
    sim = Simulator(q, window_plan(), ZeroLatency(SERVERS), parallelism=par, bits=4).run(data)
    rep = run_replicated(q, data, k=2, seed=5, crash=True, parallelism=par, bits=4)
    assert_same_output(rep.outputs["out"], sim.outputs["out"])
    assert sim.punctuation["out"] == rep.punctuation["out"]


def test_the_refusal_of_entry_and_application_partitions_is_gone():
    q = keyed_window()
    z = ZeroLatency(SERVERS)
    for par in ({"entry": 2}, {"out": 2}, {"entry": 2, "out": 2}):
        sim = Simulator(q, {"entry": SERVERS[:2], "w": SERVERS[:2], "out": [SERVERS[5]]}, z, parallelism=par)
        assert sim.physical.partitions("entry") == par.get("entry", 1)
        assert sim.physical.partitions("out") == par.get("out", 1)


def test_what_stays_unsupported_beside_entry_partitions_is_refused_in_one_line():
    q = keyed_window()
    z = ZeroLatency(SERVERS)
    small = {"entry": SERVERS[:2], "w": SERVERS[:2], "out": [SERVERS[5]]}
    cases = [
        (dict(parallelism={"entry": 2}, scenario=Scenario([Event(1.0, "kill_replica", operator="entry", replica=0)])),
         QueryError, r"the entry points run as 2 entry partitions; name one of them: entry\.0, entry\.1"),
        (dict(parallelism={"entry": 2, "w": 1}, rescales=[(1.0, Rescale("w", 2))]), QueryError,
         r"does not rescale beside entry partitions"),
        (dict(parallelism={"entry": 2}, batch_s=1.0), ValueError, r"entry partitions .* per-packet engine only"),
        (dict(parallelism={"out": 2}, mode="deterministic"), ValueError, r"run in mode 'replication' only"),
        (dict(parallelism={"entry": 0}), ValueError, r"parallelism\['entry'\] must be an integer >= 1"),
    ]
    for kw, exc, msg in cases:
        with pytest.raises(exc, match=msg) as e:
            Simulator(q, small, z, **kw)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"every entry partition runs on the entry points' servers") as e:
        Simulator(q, {**small, "entry.1": SERVERS[2:4]}, z, parallelism={"entry": 2})
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"does not add replicas beside entry partitions") as e:
        Simulator(q, small, z, parallelism={"entry": 2}).add_replica("w", SERVERS[3])
    assert "\n" not in str(e.value)
    # a Rescale sentinel beside entry partitions is refused when the feeder reaches it
    data = {"s": chunked(records(100), 20) + [Rescale("w", 2)]}
    with pytest.raises(QueryError, match=r"does not rescale beside entry partitions") as e:
        Simulator(q, small, z, parallelism={"entry": 2, "w": 1}).run(data)
    assert "\n" not in str(e.value)


def test_the_plan_replistream_place_prints_simulates_exactly(capsys):
    """Placement tuning: `replistream place --parallelism entry=2 --parallelism alerts=2 --json`
    lays out the entry and application partitions; its placement, parallelism and bits go to the
    simulator as they are, and the run (one replica of an application partition killed mid-run) is exact."""
    import json

    from replistream.cli import main as cli_main
    from replistream.workloads import fig1_inputs, fig1_query

    assert cli_main(["place", "--servers", "6", "--k", "2", "--parallelism", "entry=2",
                     "--parallelism", "alerts=2", "--json"]) == 0
    placed = json.loads(capsys.readouterr().out)
    assert placed["parallelism"] == {"entry": 2, "alerts": 2}
    q = fig1_query(2, window_s=10)
    data = fig1_inputs(2, duration_s=120, period_s=10, seed=4)
    scenario = Scenario([Event(60.0, "kill_replica", operator="alerts.1", replica=0)])
    sim = Simulator(q, placed["placement"], GeoLatencyModel(default_servers(6), seed=0),
                    parallelism=placed["parallelism"], bits=placed["bits"], scenario=scenario)
    res = sim.run(data)
    ref = run_reference(q, data).outputs["alerts"]
    assert len(ref) > 0
    assert_same_output(ref, res.outputs["alerts"])
    assert [r.server for r in sim.replicas("alerts")] == placed["placement"]["alerts.0"] + placed["placement"]["alerts.1"]
    assert any(e["event"] == "killed" and e["replica"] == "alerts.1#0" for e in res.events)


def test_stream_replicas_discarded_then_revived_replay_each_entry_partition_s_own_log():
    """``retain=True``: from 2 s to 6 s the coordinator discards the stream replicas of entry.0#0,
    entry.1#1 and w.1#0 (as GC would), then revives them; each revived one first replays what its
    sender retains (an entry partition's replica its own partition's items), and the output is exact."""
    from types import SimpleNamespace

    q, data = keyed_window(), window_data(2)
    cut = {"entry.0#0", "entry.1#1", "w.1#0"}

    def coordinator(sim, t):
        live = [SimpleNamespace(id=lk.id, live=not (2.0 <= t < 6.0 and lk.sender.label in cut))
                for lk in sim.stream_replicas()]
        sim.apply_snapshot(SimpleNamespace(streams=live))

    sim = Simulator(q, window_plan(), NET, parallelism={"entry": 2, "w": 2, "out": 2}, bits=4, retain=True,
                    coordinator=(1.0, coordinator))
    res = sim.run(data)
    assert_same_output(run_reference(q, data).outputs["out"], res.outputs["out"])
    assert sorted(sim.entry_logs) == [("s", f"entry.{p}#{r}") for p in range(2) for r in range(2)]
    assert not any(lk["live"] is False for lk in res.links)
