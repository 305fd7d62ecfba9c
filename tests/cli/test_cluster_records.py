"""The records of the clusters ``replistream up`` started (#44 point 2, #40 point 6): one per Ray
address, believed only while the process they name is the one ``up`` started, and ``down`` stops
nothing else. Stand-in heads are ``sleep`` processes (no Ray): a record names a pid, its start time
and command line exactly as ``up`` writes it."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
import time

import pytest

from replistream.engines.ray import cluster


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return tmp_path


def _stand_in(address: str) -> subprocess.Popen:
    """A process recorded as the head of ``address``, as ``up()`` records one."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    ident = None
    for _ in range(100):  # /proc shows the command line once exec has run
        ident = cluster._identity(proc.pid)
        if ident and ident["cmdline"] == ["sleep", "300"]:
            break
        time.sleep(0.01)
    cluster._write_record({"pid": proc.pid, "address": address, "log": "", **ident})
    return proc


def test_each_address_has_a_private_record(home):
    procs = [_stand_in("127.0.0.1:7001"), _stand_in("127.0.0.1:7002")]
    try:
        folder = home / ".replistream" / "clusters" / "127.0.0.1-7001"
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert stat.S_IMODE((folder / "cluster.json").stat().st_mode) == 0o600
        assert stat.S_IMODE((home / ".replistream").stat().st_mode) == 0o700
        assert [r["address"] for r in cluster.records(check=False)] == ["127.0.0.1:7001", "127.0.0.1:7002"]
        # two clusters and no address: `down` names them and how to choose, and stops neither
        with pytest.raises(RuntimeError, match=r"2 clusters .*\(127\.0\.0\.1:7001, 127\.0\.0\.1:7002.*--port"):
            cluster.down()
        assert all(p.poll() is None for p in procs)
        # RAY_ADDRESS chooses among them
        os.environ["RAY_ADDRESS"] = "127.0.0.1:7002"
        try:
            assert cluster.down(timeout=5.0) is True
        finally:
            del os.environ["RAY_ADDRESS"]
        assert procs[1].wait(timeout=10) is not None and procs[0].poll() is None
        assert not (home / ".replistream" / "clusters" / "127.0.0.1-7002" / "cluster.json").exists()
        # by its port: the other one
        assert cluster.down("127.0.0.1:7001", timeout=5.0) is True
        assert procs[0].wait(timeout=10) is not None
        assert cluster.down() is False
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_record_naming_another_process_stops_nothing(home):
    me = cluster._identity(os.getpid())
    # a record whose pid is now this test's process (a reused pid): another start time
    cluster._write_record({"pid": os.getpid(), "address": "127.0.0.1:7003", "log": "",
                           "create_time": me["create_time"] - 100.0, "cmdline": me["cmdline"]})
    assert cluster.records(check=False) == []
    assert cluster.recorded("127.0.0.1:7003") is None
    with pytest.raises(RuntimeError, match=rf"names pid {os.getpid()}, which is now another process.*nothing stopped"):
        cluster.down("127.0.0.1:7003")
    assert not (home / ".replistream" / "clusters" / "127.0.0.1-7003" / "cluster.json").exists()
    # the same start time but another command line is not the head either
    cluster._write_record({"pid": os.getpid(), "address": "127.0.0.1:7003", "log": "",
                           "create_time": me["create_time"], "cmdline": ["ray", "start", "--head"]})
    with pytest.raises(RuntimeError, match="now another process"):
        cluster.down("127.0.0.1:7003")


def test_the_token_is_made_private_and_a_readable_one_refused(home, monkeypatch):
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    path = cluster.ensure_auth_token()
    assert path == str(home / ".ray" / "auth_token")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600 and len(open(path).read().strip()) >= 32
    os.chmod(path, 0o644)
    with pytest.raises(RuntimeError, match=r"can be read by other users \(mode 644\): run `chmod 600 "):
        cluster.ensure_auth_token()
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(home / "missing"))
    with pytest.raises(RuntimeError, match="RAY_AUTH_TOKEN_PATH names .*missing, which does not exist"):
        cluster.ensure_auth_token()


def test_up_refuses_token_authentication_turned_off(home, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with pytest.raises(RuntimeError, match="RAY_AUTH_MODE=disabled is set.*unset RAY_AUTH_MODE"):
        cluster.up(port=7004)


def _reaped_when_it_exits(proc: subprocess.Popen) -> None:
    """Wait for ``proc`` in a thread of its own, as init waits for a head whose ``up`` has exited: a
    stand-in stopped by another process (the ``down`` command) is then gone at once, not a zombie of
    this one that ``down`` waits on for its whole grace (15 s)."""
    threading.Thread(target=proc.wait, daemon=True).start()


def test_down_cli_names_the_choice_in_one_line(home):
    procs = [_stand_in("127.0.0.1:7005"), _stand_in("127.0.0.1:7006")]
    for p in procs:
        _reaped_when_it_exits(p)
    try:
        env = {**os.environ, "HOME": str(home)}
        got = subprocess.run([sys.executable, "-m", "replistream.cli", "down"], env=env, capture_output=True,
                             text=True, timeout=120)
        assert got.returncode == 2 and len(got.stderr.strip().splitlines()) == 1, got.stderr
        assert "replistream down --port P" in got.stderr
        got = subprocess.run([sys.executable, "-m", "replistream.cli", "down", "--port", "7005"], env=env,
                             capture_output=True, text=True, timeout=120)
        assert got.returncode == 0 and "127.0.0.1:7005 is stopped" in got.stdout, got.stderr
        assert json.loads((home / ".replistream" / "clusters" / "127.0.0.1-7006" / "cluster.json").read_text())
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_the_record_of_a_started_script_names_it_as_it_runs(home, tmp_path):
    """``up`` starts ``ray``, a script: right after Popen returns its command line may still read
    empty (the kernel is setting up the interpreter); the record waits for the command line that
    ``down`` will compare with (a record of the empty one made ``down`` refuse, once, at load 70)."""
    script = tmp_path / "head"
    script.write_text("#!/bin/sh\nsleep 300\n")
    script.chmod(0o755)
    cmd = [str(script), "start", "--head"]
    proc = subprocess.Popen(cmd, start_new_session=True)
    try:
        ident = cluster._exec_identity(proc.pid, cmd)
        assert ident["cmdline"][-2:] == ["start", "--head"] and ident["create_time"] > 0
        cluster._write_record({"pid": proc.pid, "address": "127.0.0.1:7007", "log": "", **ident})
        assert cluster._is_head(cluster._read(str(home / ".replistream" / "clusters" / "127.0.0.1-7007" /
                                                  "cluster.json")))
    finally:
        os.killpg(proc.pid, 9)  # the shell and its sleep
        proc.wait()
