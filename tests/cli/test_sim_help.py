"""``replistream sim --help`` says what the experiments are, one line each, and each experiment's
help lists only the options it takes (#44 point 7); fig5's options on another experiment are
answered in one line."""
import subprocess
import sys

from replistream.sim.cli import ABOUT, FIG5_OPTIONS


def sim(*args):
    return subprocess.run([sys.executable, "-m", "replistream.cli", "sim", *args], capture_output=True, text=True,
                          timeout=120)


def test_the_help_lists_every_experiment_with_one_line():
    out = sim("--help")
    assert out.returncode == 0
    for name, text in ABOUT.items():
        assert f"  {name:<7} {text}" in out.stdout
    assert "--volatility" not in out.stdout and "--servers SERVERS" not in out.stdout  # no per-experiment option


def test_each_experiment_lists_its_own_options():
    fig5, fig2, trace = sim("fig5", "--help").stdout, sim("fig2", "--help").stdout, sim("trace", "--help").stdout
    for opt in FIG5_OPTIONS:
        assert f"--{opt}" in fig5 and f"--{opt}" not in fig2 and f"--{opt}" not in trace
    assert "--quick" in fig2 and "--servers" in trace and "--servers" not in fig2
    got = sim("fig2", "--kmax", "3")
    assert got.returncode == 2 and "are fig5's options" in got.stderr and len(got.stderr.strip().splitlines()) == 1
