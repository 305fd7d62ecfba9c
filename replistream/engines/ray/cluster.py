"""A local Ray cluster kept between scripts: ``replistream up`` / ``replistream down``.

``up()`` starts a Ray head on this machine with replistream's settings (:data:`.deployment.RAY_SYSTEM_CONFIG`),
listening on the loopback interface only (127.0.0.1: nothing on the machine's other interfaces,
docs/reliability.md), without the dashboard or usage statistics, in a process of its own
(``ray start --head --block``) whose id and address it records in :data:`STATE_FILE`. Every later
``deploy()`` in any script on the machine joins it instead of starting its own Ray (so it skips
Ray's start-up), and a detached deployment (``deploy(..., name=..., detached=True)``) lives in it
after its script ends. ``down()`` stops that cluster, and every deployment in it; it never
touches another Ray instance on the machine (``ray stop`` would stop them all).

>>> up(num_cpus=4)     # doctest: +SKIP
'127.0.0.1:6379'
>>> down()             # doctest: +SKIP
True
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

__all__ = ["up", "down", "STATE_FILE", "recorded", "answers"]

#: Where ``up()`` records the cluster it started (``{"pid", "address", "log"}``).
STATE_FILE = os.path.join(os.path.expanduser("~"), ".replistream", "cluster.json")


def _ray_cli() -> str:
    exe = os.path.join(os.path.dirname(sys.executable), "ray")
    return exe if os.path.exists(exe) else (shutil.which("ray") or "ray")


def answers(address: str, timeout: float = 0.5) -> bool:
    """Whether something accepts a TCP connection at ``host:port`` within ``timeout`` s.

    >>> answers("127.0.0.1:1")
    False
    """
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def recorded() -> dict | None:
    """The cluster ``up()`` started and that still runs (``{"pid", "address", "log"}``), or None."""
    try:
        with open(STATE_FILE) as f:
            st = json.load(f)
    except (OSError, ValueError):
        return None
    return st if _alive(int(st["pid"])) and answers(st["address"]) else None


def up(num_cpus: int | None = None, port: int = 6379, timeout: float = 120.0, warm: bool = True) -> str:
    """Start a local Ray head for replistream (loopback only); returns its address once it answers
    and (``warm``) its warm pool of actor processes is full (:mod:`.warm`, so the first script
    finds them started). Raises ``RuntimeError`` naming the fix if a cluster runs already or Ray
    cannot start.

    >>> up(num_cpus=2)     # doctest: +SKIP
    '127.0.0.1:6379'
    """
    from .deployment import RAY_SYSTEM_CONFIG
    from .host import cluster_address

    running = cluster_address()
    if running is not None:
        raise RuntimeError(f"a Ray cluster runs already at {running}: deployments join it "
                           f"({'`replistream down` stops it' if recorded() else 'it was not started by replistream up'})")
    address = f"127.0.0.1:{int(port)}"
    if answers(address):
        raise RuntimeError(f"port {port} is in use on 127.0.0.1: choose another with --port")
    cmd = [_ray_cli(), "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={int(port)}",
           "--include-dashboard=false", "--disable-usage-stats", f"--system-config={json.dumps(RAY_SYSTEM_CONFIG)}"]
    if num_cpus is not None:
        cmd.append(f"--num-cpus={int(num_cpus)}")
    os.makedirs(os.path.dirname(STATE_FILE), exist_ok=True)
    log = os.path.join(os.path.dirname(STATE_FILE), "cluster.log")
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}  # keep 127.0.0.1 (single-machine mode)
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)  # not stopped with the shell that ran `up`
    deadline = time.time() + timeout
    while not answers(address):
        if proc.poll() is not None:
            with open(log) as f:
                tail = f.read().strip().splitlines()[-3:]
            raise RuntimeError(f"`ray start` exited with {proc.returncode}: {' / '.join(tail)} (log: {log})")
        if time.time() > deadline:
            proc.terminate()
            raise RuntimeError(f"the Ray head did not answer at {address} within {timeout:g} s (log: {log})")
        time.sleep(0.2)
    with open(STATE_FILE, "w") as f:
        json.dump({"pid": proc.pid, "address": address, "log": log}, f)
    if warm:
        start_warm_pool(address, timeout=timeout)
    return address


def start_warm_pool(address: str, timeout: float = 120.0) -> dict:
    """Start the cluster's warm pool of actor processes (:mod:`.warm`) and wait until it is full,
    from a process of its own (the caller may run a Ray of its own); returns its stats ({} when
    ``REPLISTREAM_CLUSTER_POOL=0``). Raises ``RuntimeError`` with the reason if it cannot."""
    code = ("import json, sys; from replistream.engines.ray import init_ray; from replistream.engines.ray import warm; "
            "init_ray(address=sys.argv[1]); warm.start(); print(json.dumps(warm.wait_warm(float(sys.argv[2]))))")
    out = subprocess.run([sys.executable, "-c", code, address, str(timeout)], capture_output=True, text=True,
                         timeout=timeout + 60, env={**os.environ, "RAY_ADDRESS": address})
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the cluster at {address} runs, but its warm pool could not start: {tail}")
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def down(timeout: float = 60.0) -> bool:
    """Stop the cluster ``up()`` started (and every deployment in it). Returns whether one ran.
    A cluster it did not start is left alone: ``RuntimeError`` names it and how to stop it.

    >>> down()     # doctest: +SKIP
    True
    """
    from .host import cluster_address

    st = recorded()
    if st is None:
        other = cluster_address()
        if other is not None:
            raise RuntimeError(f"the Ray cluster at {other} (RAY_ADDRESS) was not started by `replistream up`: "
                               f"stop it where it was started (`ray stop` stops every Ray instance on this machine)")
        if os.path.exists(STATE_FILE):  # a record of a cluster that no longer runs
            os.unlink(STATE_FILE)
        return False
    pid = int(st["pid"])
    os.killpg(pid, signal.SIGTERM)  # `ray start --block` stops its node's processes as it exits
    deadline = time.time() + timeout
    while _alive(pid) and time.time() < deadline:
        time.sleep(0.2)
    if _alive(pid):
        os.killpg(pid, signal.SIGKILL)
    os.unlink(STATE_FILE)
    return True
