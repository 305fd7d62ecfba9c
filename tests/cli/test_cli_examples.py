"""The CLI and the examples, run as a user would run them."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*args, timeout=300, env=None):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


@pytest.fixture
def joined(ray_session):
    """The environment of a script that joins the test session's Ray (``RAY_ADDRESS``, as a script joins
    a cluster that ``replistream up`` started) instead of starting a Ray of its own: the examples' Ray
    start-ups cost 5-15 s each. Starting a Ray of its own is what test_ray_demo_json_survives_a_server_kill
    runs, as the README's `replistream demo` does."""
    port = ray_session.get_runtime_context().gcs_address.rpartition(":")[2]  # the session's Ray: loopback only
    return {**os.environ, "RAY_ADDRESS": f"127.0.0.1:{port}"}


def test_help_lists_commands():
    out = run(sys.executable, "-m", "replistream.cli", "--help")
    assert out.returncode == 0
    assert "demo" in out.stdout


@pytest.mark.parametrize("k", [pytest.param(1, marks=pytest.mark.slow), 2, pytest.param(3, marks=pytest.mark.slow)])
def test_inprocess_demo_json_matches_reference(k):  # the quick subset (#31) runs k=2, with crashes
    out = run(sys.executable, "-m", "replistream.cli", "demo", "--engine", "inprocess", "--json", "--k", str(k),
              "--servers", "4", "--duration", "120", "--period", "10", "--seed", str(k))
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["lost"] == 0 and summary["duplicates"] == 0
    assert summary["matches_reference"] is True and summary["complete"] is True
    assert summary["outputs"] == summary["reference_outputs"] > 0
    if k > 1:
        assert summary["crashed_replicas"], "the demo is meant to crash replicas"


@pytest.mark.slow
def test_ray_demo_json_survives_a_server_kill():
    """The main job, as the README runs it, at a small scale (its own Ray instance)."""
    out = run(sys.executable, "-m", "replistream.cli", "demo", "--json", "--servers", "4", "--duration", "8",
              "--seed", "3", timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout)
    assert summary["engine"] == "ray"
    assert summary["lost"] == 0 and summary["duplicates"] == 0 and summary["matches_reference"] is True
    assert summary["failure_at_s"] is not None and summary["failures"]
    for phase in ("before_failure", "after_failure"):
        assert summary["latency_ms"][phase]["count"] > 0
        assert summary["latency_ms"][phase]["p50"] <= summary["latency_ms"][phase]["p99"]


def test_demo_rejects_bad_k():
    out = run(sys.executable, "-m", "replistream.cli", "demo", "--engine", "inprocess", "--k", "0")
    assert out.returncode != 0
    assert "--k must be >= 1" in out.stderr


# failure_injection.py takes arguments (test below); spark_pipeline.py runs in tests/spark/test_spark.py in this
# process's shared Ray and Spark sessions (a subprocess would start Spark again: +20 s)
#: Examples run with a smaller setting than their default (the suite's time on two cores).
SMALLER = {"placement_tuning.py": ("--servers", "10", "--kmax", "3", "--seeds", "5")}


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "examples").glob("*.py")
                                           if p.name not in ("failure_injection.py", "spark_pipeline.py")))
@pytest.mark.slow
def test_example_runs(script, joined):
    args = SMALLER.get(script, ())  # (the example's own smaller setting, from its usage lines: every phase still runs)
    out = run(sys.executable, str(ROOT / "examples" / script), *args, env=joined)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip()
    assert "identical to the ideal run" in out.stdout


@pytest.mark.slow
def test_failure_injection_example_writes_a_plot(tmp_path, joined):
    png = tmp_path / "latency.png"
    out = run(sys.executable, str(ROOT / "examples" / "failure_injection.py"),
              str(ROOT / "examples" / "scenario.toml"), str(png), "--duration", "11", env=joined)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "identical to the ideal run" in out.stdout
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sim_is_a_subcommand():
    out = run(sys.executable, "-m", "replistream.cli", "sim", "--help")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "fig4" in out.stdout and "--quick" in out.stdout


@pytest.mark.slow
def test_sim_shows_progress_on_stderr_and_keeps_stdout_json():
    """#17: sim is never silent (a start line, then a line per simulated run off a terminal), and its
    progress never mixes into the JSON on stdout."""
    out = run(sys.executable, "-m", "replistream.cli", "sim", "fig5", "--quick", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout)["experiment"] == "fig5"
    assert out.stderr.startswith("replistream sim fig5 (quick scale, seed 0)")
    assert "simulated" in out.stderr
    quiet = run(sys.executable, "-m", "replistream.cli", "sim", "fig5", "--quick", "--json", "--no-progress")
    assert quiet.returncode == 0 and "simulated" not in quiet.stderr
