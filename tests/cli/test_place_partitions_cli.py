"""`replistream place --parallelism OP=P [--bits B]` (issue #41 point 5), in-process through main()."""
from __future__ import annotations

import json
import sys
import textwrap

import pytest

from replistream.cli import main
from replistream.network import default_servers
from replistream.placement import QueryStats, ServerSet, fig1_sources, place, problem_from_query
from replistream.testing import run_reference
from replistream.workloads import fig1_inputs, fig1_query


@pytest.mark.parametrize("args, message", [
    (["--parallelism", "corelate=2"], "--parallelism: query 'fig1' has no operator 'corelate' (operators: loads, "
                                      "pings, correlate, hot); did you mean 'correlate'?"),
    (["--parallelism", "correlate=0"], "must be an integer >= 1 (the number of partitions), got 0"),
    (["--parallelism", "correlate=5", "--bits", "2"], "exceeds the 4 bins (2**2) a key space is cut into; use at "
                                                      "most 4 partitions (or raise --bits)"),
    (["--parallelism", "correlate"], "--parallelism takes OPERATOR=PARTITIONS, e.g. --parallelism correlate=2; "
                                     "got 'correlate'"),
    (["--parallelism", "hot=2", "--parallelism", "hot=3"], "--parallelism names 'hot' twice"),
    (["--bits", "21"], "--bits must be an integer from 0 to 20"),
    (["--load", "hot=x"], "--load takes NODE=LOAD with LOAD a number >= 0"),
    (["--load", "hot=-1"], "--load takes NODE=LOAD with LOAD a number >= 0"),
    (["--load", "corelate=1"], "--load: 'corelate' is not a node of query 'fig1' (entry, loads, pings, correlate, "
                               "hot, alerts); did you mean 'correlate'?"),
])
def test_place_parallelism_mistakes_are_one_line_before_any_work(args, message, capsys, monkeypatch):
    import replistream.cli as cli

    monkeypatch.setattr(cli, "_place_inputs", lambda a: pytest.fail("the placement started"))
    assert main(["place", "--servers", "6", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("replistream place: error: ") and message in err and "\n" not in err, err


def test_place_refuses_an_operator_that_cannot_be_partitioned(tmp_path, capsys, monkeypatch):
    (tmp_path / "globalq.py").write_text(textwrap.dedent("""
        from replistream import Query

        def q():
            q = Query("g"); s = q.source("s", {"k": "i8"})
            s.window(10, name="total").sink("out")
            return q
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["place", "--servers", "4", "--query", "globalq:q", "--parallelism", "total=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--parallelism: 'total' is a window with no by= key" in err and "give it by=" in err, err
    sys.modules.pop("globalq", None)


def test_place_json_lists_every_partition_with_its_replicas(capsys, tmp_path):
    assert main(["place", "--servers", "8", "--k", "2", "--parallelism", "correlate=2", "--parallelism", "hot=3",
                 "--bits", "4", "--json", "--plot", str(tmp_path / "p.png")]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["parallelism"] == {"correlate": 2, "hot": 3} and s["bits"] == 4
    plan = s["placement"]
    assert "correlate" not in plan and "hot" not in plan
    for part in ["correlate.0", "correlate.1", "hot.0", "hot.1", "hot.2"]:
        assert len(plan[part]) == 2 and len(set(plan[part])) == 2, part
    assert {r["node"] for r in s["replicas"]} >= {"correlate.1", "hot.2"}
    assert (tmp_path / "p.png").stat().st_size > 0
    # the same placement as the library's, with the same rates (the test run the command makes)
    servers = default_servers(8)
    q = fig1_query(8)
    stats = QueryStats.from_run(q, run_reference(q, fig1_inputs(8, duration_s=600.0, period_s=10.0, seed=0)), 600.0)
    problem = problem_from_query(q, servers, ServerSet.builtin(8).latency(), stats, sources=fig1_sources(q, servers),
                                 parallelism={"correlate": 2, "hot": 3}, bits=4)
    lib = place(problem, 2, "min-cost", alpha=0.8, d_min=30.0, initial="spring")
    assert plan == lib.plan()
    assert s["network_cost"] == pytest.approx(lib.network_cost) and s["bandwidth"] == pytest.approx(lib.bandwidth)


def test_place_table_shows_partitions(capsys):
    assert main(["place", "--servers", "6", "--k", "2", "--parallelism", "correlate=2"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps the title at the terminal's width
    assert "correlate.0" in out and "correlate.1" in out and "correlate in 2 partitions" in out
    assert "network cost" in out and "bandwidth" in out


def test_place_an_operator_too_heavy_for_one_server_fits_as_partitions(capsys):
    """--load correlate=1.2 exceeds alpha 0.8 on every server: refused whole, placed as halves, the
    two halves on disjoint servers (0.6 + 0.6 >= 0.8)."""
    assert main(["place", "--servers", "8", "--k", "2", "--load", "correlate=1.2", "--json"]) == 2
    assert "fails the load constraint load(s) + load(correlate)=1.2" in capsys.readouterr().err
    assert main(["place", "--servers", "8", "--k", "2", "--load", "correlate=1.2", "--parallelism", "correlate=2",
                 "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    plan = s["placement"]
    assert not set(plan["correlate.0"]) & set(plan["correlate.1"])
    # without the loads the halves share servers (collocation is cheapest): the load test spreads them
    assert main(["place", "--servers", "8", "--k", "2", "--parallelism", "correlate=2", "--json"]) == 0
    free = json.loads(capsys.readouterr().out)
    assert free["placement"]["correlate.0"] == free["placement"]["correlate.1"]
    assert free["network_cost"] < s["network_cost"]
