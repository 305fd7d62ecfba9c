"""``replistream up / status / stop / down`` (#29): a local Ray cluster kept between scripts; a
detached deployment started by one script is listed, and stopped, by later commands; ``down`` stops
that cluster only (never another Ray on the machine) and answers a mistake with one line."""
from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import textwrap

import pytest

CLI = [sys.executable, "-c", "import sys; from replistream.cli import main; sys.exit(main())"]


def run(args, env, timeout=300):
    return subprocess.run(CLI + args, env=env, capture_output=True, text=True, timeout=timeout)


def isolated(tmp_path) -> dict:
    """A HOME of its own (the record of the cluster `up` started lives there) and no RAY_ADDRESS."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    env["HOME"] = str(tmp_path / "home")
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_without_a_cluster_the_commands_say_what_to_do(tmp_path):
    env = isolated(tmp_path)
    env["RAY_ADDRESS"] = f"127.0.0.1:{free_port()}"  # nothing listens there: status must not hang on it
    got = run(["status"], env, timeout=60)
    assert got.returncode == 1 and "no Ray cluster answers at" in got.stderr
    assert len(got.stderr.strip().splitlines()) == 1
    env.pop("RAY_ADDRESS")
    got = run(["down"], env)
    assert got.returncode == 0 and "no cluster started by `replistream up`" in got.stdout


@pytest.mark.slow
def test_up_deploy_detached_status_stop_down(tmp_path):
    env = isolated(tmp_path)
    port = free_port()
    board_port = free_port()
    got = run(["up", "--num-cpus", "2", "--port", str(port), "--dashboard-port", str(board_port)], env)
    assert got.returncode == 0, got.stderr
    assert f"127.0.0.1:{port}" in got.stdout
    board = f"http://127.0.0.1:{board_port}/"
    assert f"dashboard: {board}" in got.stdout  # issue #43: up prints the dashboard's address, and it answers
    import urllib.request

    with urllib.request.urlopen(board + "api/deployments", timeout=30) as r:
        assert json.loads(r.read()) == {"deployments": []}
    folder = tmp_path / "home" / ".replistream" / "clusters" / f"127.0.0.1-{port}"
    record = json.loads((folder / "cluster.json").read_text())
    # the user's files are the user's only (#40 point 6)
    for path, mode in [(folder, 0o700), (folder / "cluster.json", 0o600), (folder / "cluster.log", 0o600),
                       (tmp_path / "home" / ".ray" / "auth_token", 0o600)]:
        assert stat.S_IMODE(path.stat().st_mode) == mode, path
    try:
        again = run(["up", "--port", str(port)], env)
        assert again.returncode == 2 and "runs already" in again.stderr
        # token authentication: another account (another HOME, so no token, or a token of its own) is refused
        probe = ("from ray._raylet import GcsClient; import sys; "
                 "print(GcsClient(address=sys.argv[1]).internal_kv_get(b'x', namespace=None, timeout=10))")
        for stranger in ({"HOME": str(tmp_path / "stranger")},
                         {"HOME": str(tmp_path / "stranger"), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 32}):
            refused = subprocess.run([sys.executable, "-c", probe, f"127.0.0.1:{port}"], env={**env, **stranger},
                                     capture_output=True, text=True, timeout=120)
            assert refused.returncode != 0 and "AuthenticationError" in refused.stderr, refused.stderr[-2000:]
        mine = subprocess.run([sys.executable, "-c", "import os; os.environ['RAY_AUTH_MODE'] = 'token'; " + probe,
                               f"127.0.0.1:{port}"], env=env, capture_output=True, text=True, timeout=120)
        assert mine.returncode == 0 and mine.stdout.strip() == "None", mine.stderr[-2000:]
        script = textwrap.dedent("""
            import numpy as np
            from replistream import ParquetSink, Query, deploy, seconds
            q = Query("kept"); s = q.source("s", {"k": "i8"}, punctuate_every=seconds(1))
            s.window(size=seconds(1), by="k", aggs={"n": "count"}, name="per_k").sink("out")
            ts = np.arange(0, seconds(4), 1000)
            dep = deploy(q, servers=3, k=2, name="kept", detached=True, sinks={"out": ParquetSink(%r)})
            dep.feed({"s": [{"ts": ts, "k": ts %% 7}]})
            print("fed", flush=True)
        """ % str(tmp_path / "out"))
        # RAY_ADDRESS=auto finds this cluster and joins it on loopback (Ray alone waited for its GCS
        # at the machine's own address, where this cluster does not listen, without end)
        joined = subprocess.run([sys.executable, "-c", "from replistream.engines.ray import init_ray; import ray; "
                                 "init_ray('auto'); print(ray.get_runtime_context().gcs_address)"],
                                env={**env, "RAY_ADDRESS": "auto"}, capture_output=True, text=True, timeout=120)
        assert joined.returncode == 0 and joined.stdout.strip() == f"127.0.0.1:{port}", joined.stderr[-2000:]
        fed = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        assert fed.returncode == 0 and "fed" in fed.stdout, fed.stderr  # the script joined the cluster and ended
        status = run(["status", "--json"], env)
        assert status.returncode == 0, status.stderr
        (row,) = json.loads(status.stdout)
        assert row["name"] == "kept" and row["query"] == "kept" and row["fed"]
        assert run(["stop", "kept"], env).returncode == 0
        status = run(["status"], env)
        assert "no detached deployment" in status.stdout
        assert "warm pool: " in status.stdout  # filled in the background: status says how it went
    finally:
        down = run(["down"], env)
    assert down.returncode == 0 and "stopped" in down.stdout, down.stderr
    with pytest.raises(ProcessLookupError):
        os.killpg(record["pid"], 0)  # the head and its node's processes are gone
