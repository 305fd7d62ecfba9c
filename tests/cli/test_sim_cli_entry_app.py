"""`replistream sim fig3|fig4 --parallelism entry=P` and `--parallelism alerts=P` (issue #41):
the experiments take entry and application partitions as `replistream place` does, lay them out
as deploy() does (entry partitions on the entry points' servers, an application's partitions
spread from its server) and run them in the simulator, each run exact and complete; the record,
the verdict and the table say what ran. The runs are --quick with fewer simulated minutes (and
kmax rows for fig4) to stay short."""
from __future__ import annotations

import functools
import json

import pytest

from replistream.cli import main as cli_main
from replistream.placement import cost_with_application_partitions
from replistream.sim import experiments


@pytest.fixture
def runs(monkeypatch):
    """Shortened fig3 and fig4 (the CLI's path otherwise), and every simulated run they make:
    ``(setting, plan, result)``."""
    seen = []
    real = experiments._simulate

    def spy(setting, plan, **kw):
        res = real(setting, plan, **kw)
        seen.append((setting, plan, res))
        return res

    monkeypatch.setattr(experiments, "_simulate", spy)
    monkeypatch.setitem(experiments.EXPERIMENTS, "fig3", functools.partial(experiments.fig3, simulated_hours=0.1))
    monkeypatch.setitem(experiments.EXPERIMENTS, "fig4",
                        functools.partial(experiments.fig4, kmax=(1, 2), simulated_hours=0.05))
    return seen


def sim_json(capsys, *args) -> dict:
    assert cli_main(["sim", *args, "--quick", "--no-progress", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def senders_and_receivers(res) -> set[str]:
    return {lk[side].split("#")[0] for lk in res.links for side in ("sender", "receiver")}


def test_fig3_runs_two_entry_partitions_on_the_entry_points_servers(runs, capsys):
    out = sim_json(capsys, "fig3", "--parallelism", "entry=2")
    assert out["parallelism"] == {"entry": 2} and "bits" not in out
    assert out["verdict"].endswith("[partitioned: entry in 2]"), out["verdict"]
    assert [r["k"] for r in out["rows"]] == [1, 2, 3] and len(runs) == 3
    for row, (setting, plan, res) in zip(out["rows"], runs):
        assert res.complete and row["tuples"] == len(res.outputs["alerts"]) > 0  # exact: fig3 checks it
        assert row["partitions"] == {"entry.0": plan["entry"], "entry.1": plan["entry"]}
        assert len(plan["entry"]) == row["k"]
        assert {"entry.0", "entry.1"} <= senders_and_receivers(res)  # both partitions ran


def test_fig3_runs_the_application_in_partitions_spread_from_its_server(runs, capsys):
    out = sim_json(capsys, "fig3", "--parallelism", "alerts=3")
    assert out["parallelism"] == {"alerts": 3} and out["verdict"].endswith("[partitioned: alerts in 3]")
    for row, (setting, plan, res) in zip(out["rows"], runs):
        assert res.complete and row["tuples"] == len(res.outputs["alerts"]) > 0
        names, k = setting.problem.servers, row["k"]
        start = names.index(plan["alerts"][0])
        assert row["partitions"] == {f"alerts.{p}": [names[(start + p * k + j) % len(names)] for j in range(k)]
                                     for p in range(3)}
        assert {plan[f"alerts.{p}"][0] for p in range(3)} == {row["partitions"][f"alerts.{p}"][0] for p in range(3)}
        assert {"alerts.0", "alerts.1", "alerts.2"} <= senders_and_receivers(res)


def test_fig4_runs_entry_partitions_with_both_strategies(runs, capsys):
    out = sim_json(capsys, "fig4", "--parallelism", "entry=2")
    assert out["parallelism"] == {"entry": 2} and out["verdict"].endswith("[partitioned: entry in 2]")
    assert [(r["strategy"], r["k"]) for r in out["rows"]] == [("min-cost", 1), ("min-cost", 2), ("random", 1),
                                                               ("random", 2)]
    for row, (_, plan, res) in zip(out["rows"], runs):
        assert res.complete and row["tuples"] == len(res.outputs["alerts"]) > 0
        assert row["partitions"] == {"entry.0": plan["entry"], "entry.1": plan["entry"]}
        assert {"entry.0", "entry.1"} <= senders_and_receivers(res)


def test_fig4_with_the_application_and_the_join_partitioned_says_so_in_the_table_and_the_files(runs, capsys,
                                                                                                 tmp_path):
    assert cli_main(["sim", "fig4", "--quick", "--no-progress", "--parallelism", "alerts=2", "--parallelism",
                     "correlate=2", "--bits", "4", "--out", str(tmp_path)]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0].endswith("[partitioned: correlate in 2, alerts in 2 (16 bins)]"), text[0]
    assert any(line.startswith("partitions per node: correlate in 2, alerts in 2 (16 bins) (entry.P on the entry "
                               "points' servers, app.P spread from the application's server") for line in text), text
    record = json.loads((tmp_path / "fig4.json").read_text())
    assert record["parallelism"] == {"correlate": 2, "alerts": 2} and record["bits"] == 4
    assert (tmp_path / "fig4.png").stat().st_size > 0
    for row, (setting, plan, res) in zip(record["rows"], runs):
        assert res.complete and row["tuples"] == len(res.outputs["alerts"]) > 0
        assert sorted(row["partitions"]) == ["alerts.0", "alerts.1"] and row["plan"]["alerts.1"] == \
            row["partitions"]["alerts.1"] and len(row["partitions"]["alerts.1"]) == row["k"]
        assert {"correlate.0", "correlate.1", "alerts.0", "alerts.1"} <= senders_and_receivers(res)
        # the cost is that of the application's partitions where they ran, as `replistream place` costs it
        replicas = {n: plan[n] for n in setting.problem.nodes}
        cost, _ = cost_with_application_partitions(setting.problem, replicas, row["partitions"], {"alerts": 2})
        assert row["network_cost"] == pytest.approx(cost) != setting.problem.network_cost(replicas)


@pytest.mark.parametrize("args, says", [
    (["--parallelism", "entry=0"], "--parallelism: parallelism['entry'] must be an integer >= 1 (the number of "
                                   "entry partitions), got 0; write 1 for unpartitioned entry points"),
    (["--parallelism", "alert=2"], "--parallelism: query 'fig1' has no operator 'alert' (operators: loads, pings, "
                                   "correlate, hot); did you mean 'alerts'?"),
    (["--parallelism", "entry=two"], "--parallelism takes NODE=PARTITIONS, e.g. --parallelism entry=2; got 'entry=two'"),
    (["--parallelism", "alerts=2", "--parallelism", "alerts=3"], "--parallelism names 'alerts' twice; give each node once"),
    (["--parallelism", "alerts=17", "--bits", "4"], "--parallelism: parallelism['alerts'] = 17 exceeds the 16 bins (2**4)"),
], ids=lambda a: " ".join(a) if isinstance(a, list) else "")
def test_a_mistake_is_one_line_naming_it_and_the_fix_before_any_simulation(args, says, capsys, monkeypatch):
    monkeypatch.setattr(experiments, "fig1_setting", lambda *a, **k: pytest.fail("the simulation started"))
    for exp in ("fig3", "fig4"):
        assert cli_main(["sim", exp, "--quick", *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"replistream sim {exp}: error: {says}") and err.count("\n") == 1, err
    assert cli_main(["place", "--servers", "6", *args]) == 2  # the same message as place's
    assert capsys.readouterr().err.startswith(f"replistream place: error: {says}")
