"""`replistream place --parallelism entry=P` and `--parallelism APP=P`: entry partitions and
application partitions shown and laid out as ``deploy()`` lays them out (every entry partition on the
entry points' servers; an application's partitions spread from its server), the network cost with
the application's partitions where they run."""
from __future__ import annotations

import json

import pytest

from replistream.cli import main
from replistream.network import default_servers
from replistream.placement import (PlacementProblem, application_partition_layout, cost_with_application_partitions,
                                   entry_partition_layout)
from replistream.workloads import fig1_query


def place_json(capsys, *args) -> dict:
    assert main(["place", "--servers", "8", "--k", "2", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_entry_partitions_run_on_the_entry_points_servers_at_the_same_cost(capsys):
    """Entry partitions change no link between servers: the placement and its cost are the unpartitioned one's."""
    plain = place_json(capsys)
    s = place_json(capsys, "--parallelism", "entry=3")
    assert s["parallelism"] == {"entry": 3}
    assert s["partitions"] == {f"entry.{i}": s["placement"]["entry"] for i in range(3)}
    assert s["placement"] == plain["placement"]  # (what deploy(placement=) takes: "entry", not "entry.P")
    assert s["network_cost"] == pytest.approx(plain["network_cost"]) and s["bandwidth"] == pytest.approx(plain["bandwidth"])


def test_application_partitions_are_spread_from_its_server_and_costed_there(capsys):
    plain = place_json(capsys)
    s = place_json(capsys, "--parallelism", "alerts=2", "--parallelism", "correlate=2")
    assert s["parallelism"] == {"correlate": 2, "alerts": 2}
    names = [x.name for x in default_servers(8)]
    start = names.index(s["placement"]["alerts"][0])
    assert s["partitions"] == {"alerts.0": [names[start], names[(start + 1) % 8]],
                               "alerts.1": [names[(start + 2) % 8], names[(start + 3) % 8]]}
    assert {n: s["placement"][n] for n in s["partitions"]} == s["partitions"]
    # four application replicas each take half the stream into alerts: more bandwidth and cost than one
    assert s["bandwidth"] > plain["bandwidth"] and s["network_cost"] > plain["network_cost"]
    # k = 1: each tuple reaches one replica of one partition, as it reached the one application replica
    assert s["baseline"]["bandwidth"] == pytest.approx(plain["baseline"]["bandwidth"])


def test_the_layout_is_the_one_deploy_runs():
    """The same servers for every application partition as the Ray engine's placement resolution
    (``resolve_placement_with_cost``, ``"spread"`` from the application's server)."""
    pytest.importorskip("ray")
    from replistream.engines.ray.resolve import resolve_placement_with_cost

    q, servers = fig1_query(2), default_servers(7)
    names = [x.name for x in servers]
    for k, p, app_server in [(2, 2, "tokyo"), (2, 3, names[-1]), (3, 2, names[1]), (1, 3, names[0])]:
        plan, _ = resolve_placement_with_cost(q, servers, k, {"alerts": [app_server]}, None, {"alerts": p})
        mine = application_partition_layout({"alerts": [app_server]}, names, k, {"alerts": p})
        assert mine == {n: plan[n] for n in plan if n.startswith("alerts.")}, (k, p, app_server)
        assert entry_partition_layout(plan, p) == {f"entry.{i}": plan["entry"] for i in range(p)}


def test_the_cost_counts_each_partition_replica_with_its_share():
    p = PlacementProblem(["a", "b", "c"], [[0, 5, 7], [5, 0, 3], [7, 3, 0]],
                         [("s", "o", 2.0), ("o", "out", 6.0)], fixed={"s": "a"}, single=["out"])
    replicas = {"o": ["a", "b"], "out": ["a"]}
    assert cost_with_application_partitions(p, replicas, {"out.0": ["a"]}, {"out": 1}) == \
        (p.network_cost(replicas), p.bandwidth(replicas))
    cost, bw = cost_with_application_partitions(p, replicas, {"out.0": ["a", "c"], "out.1": ["b", "c"]}, {"out": 2})
    # s->o: 2 x (0 + 5); o->out.0: 3 x (a->a 0 + a->c 7 + b->a 5 + b->c 3); o->out.1: 3 x (5 + 7 + 0 + 3)
    assert cost == pytest.approx(10 + 3 * 15 + 3 * 15) and bw == pytest.approx(2 * 2 + 3 * 4 + 3 * 4)


def test_place_table_shows_entry_and_application_partitions(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # (no row wrapped)
    assert main(["place", "--servers", "6", "--k", "2", "--parallelism", "entry=2", "--parallelism", "alerts=2"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "entry in 2 partitions" in out and "alerts in 2 partitions" in out
    for part in ["entry.0", "entry.1", "alerts.0", "alerts.1"]:
        assert part in out, part
    assert "(with the entry points)" in out and "(spread from the application's server)" in out


@pytest.mark.parametrize("args, message", [
    (["--parallelism", "entry=0"], "--parallelism: parallelism['entry'] must be an integer >= 1"),
    (["--parallelism", "alerts=x"], "--parallelism takes NODE=PARTITIONS, e.g. --parallelism alerts=2; got 'alerts=x'"),
    (["--parallelism", "entry=2", "--parallelism", "entry=3"], "--parallelism names 'entry' twice"),
    (["--parallelism", "alerts=17", "--bits", "4"], "exceeds the 16 bins (2**4)"),
])
def test_entry_and_application_mistakes_are_one_line_before_any_work(args, message, capsys, monkeypatch):
    import replistream.cli as cli

    monkeypatch.setattr(cli, "_place_inputs", lambda a: pytest.fail("the placement started"))
    assert main(["place", "--servers", "6", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("replistream place: error: ") and message in err and "\n" not in err, err


def test_too_few_servers_for_the_partitions_replicas_is_one_line(capsys):
    assert main(["place", "--servers", "2", "--k", "3", "--strategy", "random", "--parallelism", "alerts=2"]) == 2
    assert "\n" not in capsys.readouterr().err.strip()
