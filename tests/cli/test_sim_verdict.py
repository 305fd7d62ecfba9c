"""``replistream sim``: the first stdout line is a verdict beside the paper's claim, and every
simulated run has one labelled progress line (experiment, kmax, strategy) on stderr (#31)."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from replistream.sim.experiments import verdict

ROOT = Path(__file__).resolve().parents[2]


def run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "replistream.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.mark.slow
def test_fig2_prints_the_verdict_first_and_one_labelled_line_per_run():
    out = run("sim", "fig2", "--quick")
    assert out.returncode == 0, out.stderr[-2000:]
    first = out.stdout.splitlines()[0]
    assert re.match(r"fig2: madison killed at 60 s: no replication delivers 0 tuples after it, .*: holds$", first)
    runs = [line for line in out.stderr.splitlines() if re.match(r"fig2 [a-z ]+: 90 simulated s in [\d.]+ s$", line)]
    assert [line.split(":")[0] for line in runs] == ["fig2 no replication", "fig2 replication",
                                                     "fig2 synchronization", "fig2 deterministic"]


def test_json_carries_the_verdict_and_table1_compares_with_the_paper():
    out = run("sim", "table1", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads(out.stdout)
    assert data["verdict"] == verdict(data) and data["verdict"].startswith("table1: per-replica CPU at k=4 is ")


def fig4_rows(min_cost_p, min_cost_cost, random_cost):
    return {"experiment": "fig4", "rows": [
        {"strategy": "min-cost", "k": 3, "ccdf": {"1.0": min_cost_p}, "cost_ratio": min_cost_cost},
        {"strategy": "random", "k": 3, "ccdf": {"1.0": 0.0}, "cost_ratio": random_cost}]}


@pytest.mark.parametrize("data,ends", [
    (fig4_rows(0.0, 25.8, 43.9), "0.59x random's network cost; paper 0.82x (10.99x vs 13.39x): holds"),
    (fig4_rows(0.01, 25.8, 43.9), "does not hold"),  # a tuple later than 1 s
    (fig4_rows(0.0, 50.0, 43.9), "does not hold"),  # dearer than random
    ({"experiment": "fig3", "rows": [{"k": k, "mean_s": m, "std_s": s} for k, m, s in
                                     ((1, 0.2, 0.1), (2, 0.15, 0.05), (3, 0.14, 0.04))]}, ": holds"),
    ({"experiment": "fig3", "rows": [{"k": k, "mean_s": m, "std_s": 0.1} for k, m in ((1, 0.2), (2, 0.25))]},
     "does not hold"),
    ({"experiment": "fig5", "guarantee_s": 1.0, "rows": [
        {"k": 2, "static_cost": 9.9, "gc_cost": 1.0, "revival_cost": 1.0}]}, ": holds"),
    ({"experiment": "fig5", "guarantee_s": 1.0, "rows": [
        {"k": 2, "static_cost": 9.9, "gc_cost": 9.9, "revival_cost": 1.0}]}, "does not hold"),
])
def test_the_verdict_says_whether_the_paper_holds(data, ends):
    assert verdict(data).endswith(ends)


def test_on_a_terminal_each_run_has_a_labelled_bar():
    import io

    from replistream.sim.engine import RunProgress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    line = RunProgress("fig4 random kmax=3", 1800.0, stream=Terminal())
    line.update(0, completed=1800.0)
    line.stop()
    text = line.stream.getvalue()
    assert "fig4 random kmax=3" in text and "1,800/1,800 simulated s" in text
