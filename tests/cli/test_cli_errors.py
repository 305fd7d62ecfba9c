"""The command line answers a mistake with one line naming it and the fix, exit code 2, before anything
slow starts (#17): each case runs with a ``ray`` and a ``pyspark`` that refuse to be imported, so a check
that came after Ray or Spark started would show as that import error instead of the expected line."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

FENCE = "imported before the arguments were checked"


@pytest.fixture(scope="module")
def fenced_env(tmp_path_factory):
    root = tmp_path_factory.mktemp("fence")
    for pkg in ("ray", "pyspark"):
        (root / pkg).mkdir()
        (root / pkg / "__init__.py").write_text(f"raise ImportError('{pkg} {FENCE}')\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("files")
    (d / "broken.toml").write_text("[[event]\nat = 3\n")
    (d / "stranger.json").write_text('{"events": [{"at": 5, "action": "kill_server", "server": "atlantis"}]}')
    (d / "late.json").write_text('{"events": [{"at": 500, "action": "kill_server", "server": "boston"}]}')
    (d / "bad.csv").write_text("time_s,src,dst\n0,a,b\n")
    return d


CASES = [
    (["demo", "--servers", "1", "--k", "3"], "--k 3 needs at least 3 servers"),
    (["demo", "--scenario", "{d}/missing.json"], "--scenario: no scenario file at"),
    (["demo", "--scenario", "{d}/broken.toml"], "--scenario: "),
    (["demo", "--scenario", "{d}/stranger.json"], "atlantis"),
    (["demo", "--scenario", "{d}/late.json"], "comes after the run's 30 s"),
    (["demo", "--duration", "-5"], "--duration must be > 0 seconds, got -5"),
    (["demo", "--network", "{d}/missing.csv"], "--network: no latency trace at"),
    (["demo", "--network", "{d}/bad.csv"], "--network: "),
    (["demo", "--network", "wan"], "--network must be geo, geo-static, zero or a trace .csv file"),
    (["demo", "--engine", "inprocess", "--scenario", "{d}/late.json"], "--scenario FILE needs the Ray engine"),
    (["demo", "--netwrk", "geo"], "did you mean --network?"),
    (["demo", "--k", "2.5"], "argument --k: invalid int value: '2.5'"),
    (["demo", "--gc", "--kmin", "5"], "--kmin must be between 1 and --k 2"),
    (["place", "--servers", "{d}/missing.csv"], "--servers: no server file at"),
    (["place", "--plot", "{d}/no/such/folder/map.png"], "--plot: the folder"),
    (["place", "--k", "0"], "--k must be >= 1"),
    (["reconfigure", "--servers", "1"], "--k 2 needs at least 2 servers"),
    (["sim", "fig2", "--out", "/proc/no-such-folder"], "--out: cannot create or write the folder"),
    (["sim", "trace", "--servers", "500", "--out", "{d}/t"], "--servers must be between 1 and 119"),
    (["sim", "fig5", "--trials", "/proc/no-such-folder"], "--trials: cannot create or write the folder"),
    (["sim", "fig2", "--trials", "{d}/runs"], "are fig5's options"),
    (["sim", "fig5", "--thetas", "0.03", "0.05"], "--thetas must be fractions of the static cost in (0, 1]"),
    (["sim", "fig5", "--volatility", "-1"], "--volatility must be a finite number >= 0"),
]


# the quick subset (``-m "not slow"``, #31) checks one mistake per command and the suggestion; each
# case is a fresh interpreter (1-8 s on a loaded 2-core machine), so the rest run in the whole suite
QUICK = {"demo --servers 1 --k 3", "demo --netwrk geo", "place --k 0", "reconfigure --servers 1",
         "sim trace --servers 500 --out {d}/t"}
PARAMS = [pytest.param(argv, expected, id=" ".join(argv),
                       marks=() if " ".join(argv) in QUICK else pytest.mark.slow) for argv, expected in CASES]


def test_the_quick_cases_are_cases():
    assert QUICK <= {" ".join(a) for a, _ in CASES}


@pytest.mark.parametrize("argv,expected", PARAMS)
def test_a_mistake_gives_one_line_and_exit_2(fenced_env, files, argv, expected):
    argv = [a.format(d=files) for a in argv]
    out = subprocess.run([sys.executable, "-m", "replistream.cli", *argv], capture_output=True, text=True,
                         env=fenced_env, timeout=120)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr
    assert len(lines) == 1 and "Traceback" not in out.stderr and FENCE not in out.stderr, out.stderr
    assert expected in lines[0] and lines[0].startswith("replistream")
    assert out.stdout == ""


def test_debug_shows_the_traceback_of_an_unexpected_error(fenced_env):
    """Past the checks, an error is one line by default and a traceback with --debug (here: Ray is fenced)."""
    base = [sys.executable, "-m", "replistream.cli"]
    quiet = subprocess.run([*base, "demo", "--duration", "2", "--period", "1"], capture_output=True, text=True,
                           env=fenced_env, timeout=120)
    assert quiet.returncode == 1 and "Traceback" not in quiet.stderr
    assert quiet.stderr.strip().splitlines()[-1].endswith("(run with --debug for the traceback)")
    loud = subprocess.run([*base, "--debug", "demo", "--duration", "2", "--period", "1"], capture_output=True,
                          text=True, env=fenced_env, timeout=120)
    assert loud.returncode != 0 and "Traceback" in loud.stderr and FENCE in loud.stderr
