"""Issue #29 on Ray: a detached deployment lives in the cluster, not in its script. A driver that
deploys one (reading Parquet files, writing a ParquetSink) and is killed with SIGKILL while the run
is paced leaves it running; another driver attaches by name, waits, and the Parquet output equals
the reference run exactly (replistream/engines/ray/host.py)."""
from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import ray

import replistream as rs
from replistream import FileSource, ParquetSink, seconds
from replistream.engines.ray.host import list_deployments
from replistream.testing import assert_same_output, run_reference

pytestmark = pytest.mark.usefixtures("ray_session")

SCRIPT = Path(__file__).parent / "scripts" / "detached_driver.py"
spec = importlib.util.spec_from_file_location("detached_driver", SCRIPT)
driver = importlib.util.module_from_spec(spec)
spec.loader.exec_module(driver)


def write_inputs(folder: Path, files: int = 4, rows: int = 1500, span_s: int = 24, seed: int = 3) -> str:
    rng = np.random.default_rng(seed)
    folder.mkdir()
    t = np.sort(rng.integers(0, seconds(span_s), files * rows))
    for i in range(files):
        part = slice(i * rows, (i + 1) * rows)
        pq.write_table(pa.table({"t": t[part], "k": rng.integers(0, 20, rows), "v": rng.normal(size=rows)}),
                       folder / f"part-{i}.parquet")
    return str(folder)


def wait_for_line(proc, text: str, timeout: float) -> None:
    seen = threading.Event()

    def read():
        for line in proc.stdout:
            if text in line:
                seen.set()
                return

    threading.Thread(target=read, daemon=True).start()
    if not seen.wait(timeout):
        proc.kill()
        raise AssertionError(f"the driver never printed {text!r} within {timeout} s; stderr: {proc.stderr.read()}")


def test_a_detached_deployment_outlives_its_killed_driver_and_is_attached(tmp_path):
    in_dir = write_inputs(tmp_path / "in")
    out_dir = str(tmp_path / "out")
    ref = run_reference(driver.build(in_dir), {"s": FileSource(in_dir, time="t")})
    port = ray.get_runtime_context().gcs_address.rpartition(":")[2]  # the session's Ray listens on loopback only
    env = {**os.environ, "RAY_ADDRESS": f"127.0.0.1:{port}"}
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "monitor", in_dir, out_dir], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for_line(proc, "fed", 180)
        os.kill(proc.pid, signal.SIGKILL)  # the driver dies mid-run (the replay takes 8 s of wall time)
        proc.wait(30)
        assert "monitor" in list_deployments()
        dep = rs.attach("monitor")
        assert type(dep) is rs.Deployment and dep.detached and dep.name == "monitor"  # one client class (#40)
        assert not dep.status()["complete"]  # killed before the end of the stream
        with pytest.raises(ValueError, match="on_output runs callbacks in this script"):
            dep.on_output("out", print)  # a callback cannot run in the host: refused in one line
        with pytest.raises(ValueError, match="'s' is fed from a Python iterator of this script"):
            dep.feed({"s": iter([])})  # it would end with this script: refused here, in one line
        with pytest.raises(ValueError, match="source 's': a detached deployment keeps its input"):
            dep.feed({"s": [{"lock": threading.Lock()}]})  # what the host cannot keep to read again
        with pytest.raises(ValueError, match="has no replica 7") as raised:
            dep.kill_replica("per_k", 7)  # raised in the host: it reaches the client as itself, as in process
        assert not isinstance(raised.value, ray.exceptions.RayTaskError), type(raised.value)
        assert dep.wait(120)
        status = dep.status()
        assert status["complete"] and status["applications"]["out"]["delivered"] == len(ref.outputs["out"])
    finally:
        if proc.poll() is None:
            proc.kill()
        try:
            rs.attach("monitor").stop()
        except LookupError:
            pass
    assert "monitor" not in list_deployments()
    sink = ParquetSink(out_dir)
    assert_same_output(ref.outputs["out"], sink.read())


def test_detached_mistakes_are_named_before_anything_starts(tmp_path):
    q = driver.build(write_inputs(tmp_path / "in", files=1, rows=10))
    with pytest.raises(ValueError, match="needs name="):
        rs.deploy(q, servers=3, k=2, detached=True)
    with pytest.raises(ValueError, match="pass detached=True"):
        rs.deploy(q, servers=3, k=2, name="x")
    with pytest.raises(ValueError, match="ParquetSink"):
        rs.deploy(q, servers=3, k=2, name="x", detached=True, on_output={"out": print})
    with pytest.raises(LookupError, match="no detached deployment named 'nope'"):
        rs.attach("nope")
