"""Ray's own node process (the raylet) killed mid-run: the run ends at once with a RunFailed that
names the node, the raylet and the logical time up to which the output is complete, not with Ray's
GetTimeoutError 60-80 s later (found by killing each of Ray's processes during a paced run: the
coordinator's replacement waited 60 s for an actor that could never start)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from types import SimpleNamespace

import pytest

from replistream.engines.ray import common

CHILD = r"""
import json, os, signal, sys, threading, time
import numpy as np
import replistream as rs
from replistream.engines.ray import deploy, init_ray
init_ray(num_cpus=2)
import ray
raylet = ray._private.worker._global_node.all_processes["raylet"][0].process.pid  # this script's own
q = rs.Query()
s = q.source("events", {"key": "i8"}, punctuate_every=rs.millis(100))
s.window(rs.seconds(1), by="key", aggs={"n": "count"}, name="per_key").sink("out")
q = q.build()
n = 12 * 1000
data = np.zeros(n, dtype=[("ts", "i8"), ("key", "i8")])
data["ts"] = np.arange(n) * 1000
data["key"] = np.arange(n) % 10
dep = deploy(q, servers=3, k=2, network="zero")
def kill_when_results_come():
    while dep.output.reached() is None or dep.output.reached() < 2_000_000:
        time.sleep(0.05)
    os.kill(raylet, signal.SIGKILL)
threading.Thread(target=kill_when_results_come, daemon=True).start()
t = time.time()
try:
    dep.run({"events": [data]}, pace=1.0, timeout=120)
    out = {"raised": None}
except Exception as e:
    out = {"raised": type(e).__name__, "message": str(e), "operator": getattr(e, "operator", None),
           "logical_time": getattr(e, "logical_time", None)}
out["seconds_after_start"] = round(time.time() - t, 1)
print(json.dumps(out), flush=True)
os._exit(0)
"""


@pytest.mark.slow
def test_killing_the_raylet_ends_the_run_naming_the_node_and_the_time_reached():
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=240)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    assert lines, done.stderr[-3000:]
    out = json.loads(lines[-1])
    assert out["raised"] == "RunFailed", out
    assert "raylet" in out["message"] and "is down" in out["message"], out
    # the output is complete up to a logical time at or after the first results (the kill came then)
    assert out["logical_time"] is not None and out["logical_time"] >= 2_000_000, out
    assert f"complete up to logical time {out['logical_time']}" in out["message"], out
    # ended by the check, not by a deadline: the feed is 12 s of event time paced in real time
    assert out["seconds_after_start"] < 12.0, out


def test_the_raylet_socket_says_whether_the_node_is_down(monkeypatch):
    # a refused or missing socket says down; one that accepts says nothing; so does a process not
    # connected to Ray (no node)
    folder = tempfile.mkdtemp(dir="/tmp")  # (a unix socket's path must be short)
    path = os.path.join(folder, "raylet")
    monkeypatch.setattr(common.ray, "get_runtime_context", lambda: SimpleNamespace(get_node_id=lambda: "n1"))
    monkeypatch.setattr(common.ray._private.worker, "global_worker",
                        SimpleNamespace(node=SimpleNamespace(raylet_socket_name=path)))
    assert "node n1" in common.ray_node_down() and "FileNotFoundError" in common.ray_node_down()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(8)
    try:
        assert common.ray_node_down() is None
    finally:
        server.close()
    assert "ConnectionRefusedError" in common.ray_node_down()  # the file stays, nobody listens
    os.unlink(path)
    os.rmdir(folder)
    monkeypatch.setattr(common.ray._private.worker, "global_worker", SimpleNamespace())
    assert common.ray_node_down() is None
