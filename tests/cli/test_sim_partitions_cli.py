"""`replistream sim fig3|fig4 --parallelism OP=P [--bits B]` (issue #41 point 5): the simulator runs
the query with partitioned operators, checked with `replistream place --parallelism`'s messages.
Entry and application partitions (`entry=P`, `alerts=P`): tests/cli/test_sim_cli_entry_app.py."""
from __future__ import annotations

import json

import pytest

from replistream.cli import main as cli_main
from replistream.sim import experiments
from replistream.sim.cli import main as sim_main

MISTAKES = [
    ["--parallelism", "corelate=2"],
    ["--parallelism", "correlate=0"],
    ["--parallelism", "correlate=5", "--bits", "2"],
    ["--parallelism", "correlate"],
    ["--parallelism", "hot=2", "--parallelism", "hot=3"],
    ["--bits", "21"],
]


@pytest.mark.parametrize("args", MISTAKES, ids=lambda a: " ".join(a))
def test_mistakes_are_place_s_one_line_messages_before_any_simulation(args, capsys, monkeypatch):
    import replistream.cli as cli

    monkeypatch.setattr(cli, "_place_inputs", lambda a: pytest.fail("the placement started"))
    assert cli_main(["place", "--servers", "6", *args]) == 2
    place_err = capsys.readouterr().err.strip()
    assert place_err.startswith("replistream place: error: --"), place_err
    message = place_err[len("replistream place: error: "):]
    monkeypatch.setattr(experiments, "fig1_setting", lambda *a, **k: pytest.fail("the simulation started"))
    for run, exp in ((sim_main, "fig4"), (lambda argv: cli_main(["sim", *argv]), "fig3")):
        assert run([exp, "--quick", *args]) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"replistream sim {exp}: error: {message}", err


@pytest.mark.parametrize("exp", ["fig2", "fig5", "table1"])
def test_experiments_that_do_not_place_refuse_the_options_in_one_line(exp, capsys, monkeypatch):
    monkeypatch.setattr(experiments, "run_experiment", lambda *a, **k: pytest.fail("the experiment started"))
    assert sim_main([exp, "--quick", "--parallelism", "correlate=2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"replistream sim {exp}: error: --parallelism and --bits are fig3 and fig4's options (the "
                   f"experiments that place the query); {exp} runs unpartitioned operators"), err


def test_run_experiment_refuses_partitions_where_the_experiment_does_not_place():
    with pytest.raises(ValueError, match=r"fig2 takes no option bits, parallelism \(fig3 and fig4 do\)"):
        experiments.run_experiment("fig2", parallelism={"correlate": 2}, bits=4)


def test_fig3_runs_the_partitioned_setting_exactly(capsys, monkeypatch):
    plans = []
    real = experiments._simulate

    def spy(setting, plan, **kw):
        plans.append((dict(setting.parallelism), setting.bits, sorted(plan)))
        return real(setting, plan, **kw)

    monkeypatch.setattr(experiments, "_simulate", spy)
    assert cli_main(["sim", "fig3", "--quick", "--no-progress", "--json", "--parallelism", "correlate=2",
                     "--bits", "4"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["parallelism"] == {"correlate": 2} and out["bits"] == 4
    assert out["verdict"].endswith("[partitioned: correlate in 2 (16 bins)]"), out["verdict"]
    assert [r["k"] for r in out["rows"]] == [1, 2, 3] and all(r["tuples"] > 0 for r in out["rows"])
    assert len(plans) == 3  # one simulated run per kmax, each checked exact against the reference by fig3
    for parallelism, bits, nodes in plans:
        assert parallelism == {"correlate": 2} and bits == 4
        assert "correlate.0" in nodes and "correlate.1" in nodes and "correlate" not in nodes, nodes


def test_without_parallelism_the_record_names_no_partitions(capsys, monkeypatch):
    seen = {}
    monkeypatch.setattr(experiments, "fig3", lambda **kw: seen.update(kw) or {
        "experiment": "fig3", "rows": [{"k": 1, "tuples": 1, "mean_s": 0.1, "std_s": 0.0, "p99_s": 0.1,
                                        "max_s": 0.1}]})
    monkeypatch.setitem(experiments.EXPERIMENTS, "fig3", experiments.fig3)
    assert sim_main(["fig3", "--quick", "--no-progress", "--json"]) == 0
    assert "parallelism" not in seen and "bits" not in seen, seen
    assert "partitioned" not in json.loads(capsys.readouterr().out)["verdict"]
