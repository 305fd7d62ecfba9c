"""``replistream sim rescale`` (replistream.sim.experiments.rescale): each strategy's live rescaling
in simulated time, exact, with its duration and the latency during the move; the table and the
verdict line."""
from __future__ import annotations

import argparse
import json
import os

import pytest

from replistream.sim.cli import register
from replistream.sim.experiments import run_experiment, table, verdict


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("rescale")
    return run_experiment("rescale", quick=True, seed=0, out=str(out)), out


def test_every_strategy_moves_exactly_and_reports_duration_and_latency(quick):
    data, out = quick
    rows = data["rows"]
    assert [(r["strategy"], r["move"]) for r in rows] == [(s, m) for s in ("fluid", "batched", "all-at-once")
                                                          for m in ("1->2", "2->4")]
    assert data["baseline_exact"] and all(r["exact"] for r in rows)
    by = {(r["strategy"], r["move"]): r for r in rows}
    assert by[("fluid", "1->2")]["steps"] == by[("fluid", "1->2")]["bins_moved"] == 128  # one bin a step, of 256
    assert by[("all-at-once", "1->2")]["steps"] == 1
    for r in rows:
        assert r["duration_s"] > 0 and r["outputs"] > 0 and r["max_s"] >= r["median_s"] > 0
        assert r["baseline_max_s"] is not None and r["after_max_s"] is not None
    assert data["assumptions"]["state_row_us"] == 20.0
    for ext in ("json", "csv", "png"):
        assert os.path.getsize(out / f"rescale.{ext}") > 0
    assert json.loads((out / "rescale.json").read_text())["rows"] == json.loads(json.dumps(rows))


def test_the_table_and_the_verdict(quick):
    data, _ = quick
    lines = table(data).splitlines()
    assert lines[0].split()[:3] == ["strategy", "move", "steps"] and len(lines) == 7
    line = verdict(data)
    assert line.startswith("rescale: max latency during the move, fluid against all-at-once: 1->2 ")
    assert line.endswith(("fluid lower: holds", "fluid lower: does not hold")) and "NOT EXACT" not in line


def test_the_verdict_says_when_fluid_is_not_lower_or_a_run_is_not_exact():
    row = {"steps": 1, "duration_s": 0.1, "p99_s": 0.1, "baseline_max_s": 0.1, "after_max_s": 0.1}
    data = {"experiment": "rescale", "rows": [{**row, "strategy": "fluid", "move": "1->2", "max_s": 0.3, "exact": True},
                                              {**row, "strategy": "all-at-once", "move": "1->2", "max_s": 0.2,
                                               "exact": False}]}
    assert verdict(data) == ("rescale: max latency during the move, fluid against all-at-once: 1->2 0.300 s against "
                             "0.200 s (NOT EXACT); Megaphone: fluid lower: does not hold")


def test_the_cli_lists_it_and_refuses_partition_options():
    p = argparse.ArgumentParser(prog="replistream")
    sub = p.add_subparsers(dest="command")
    register(sub)
    args = p.parse_args(["sim", "rescale", "--quick", "--json"])
    assert (args.experiment, args.quick, args.json) == ("rescale", True, True)
    from replistream.sim.cli import check

    args = p.parse_args(["sim", "rescale", "--parallelism", "per_key=2"])
    assert "--parallelism and --bits are fig3 and fig4's options" in check(args)
