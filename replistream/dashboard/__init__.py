"""A live web dashboard of the detached deployments of a Ray cluster (issue #43, docs/dashboard.md).

It lists the deployments running on the cluster and shows, for each, the query graph with every
replica on its server and in its state (live, suspected, failed, dormant, moving, spare), how many
more losses each operator survives, per application tuples per second, latency p50 / p99 and dead
letters by reason, and the timeline of faults and control actions; the page asks for what changed
every second, without a reload. All of it comes from one JSON API (``/api/deployments``,
``/api/deployments/<name>``), the same data as ``replistream status --json``
(:mod:`.server`). It listens on 127.0.0.1 unless told otherwise; a control action (killing a
replica) needs the cluster's token.

``replistream dashboard [--port P]`` serves it in the foreground; :func:`launch` starts it in a
process of its own (what ``replistream up`` calls) and returns its address.

>>> launch("127.0.0.1:6379")        # doctest: +SKIP
'http://127.0.0.1:8270/'
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

__all__ = ["DEFAULT_PORT", "launch", "stop", "launched", "port_free"]

#: The dashboard's port unless told otherwise (Ray's own dashboard would take 8265).
DEFAULT_PORT = 8270


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether nothing listens on ``host:port`` (so the dashboard can).

    >>> port_free(0)
    True
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, int(port)))
        except OSError:
            return False
    return True


def launch(address: str, port: int = DEFAULT_PORT, host: str = "127.0.0.1", token_file: str | None = None,
           log: str | None = None, timeout: float = 60.0) -> str:
    """Start the dashboard of the Ray cluster at ``address`` in a background process of its own
    (it outlives the caller and stops by itself once the cluster stops answering) and return its
    URL once it answers. ``host``: the interface it listens on (loopback unless asked);
    ``token_file``: a file holding the token control actions need (default: the cluster's Ray
    token, if it has one; without any, the page offers none); ``log``: where its output goes
    (default ``~/.replistream/dashboard.log``); its process is recorded beside it
    (``dashboard.json``: pid, url, address), for :func:`stop`. Raises ``RuntimeError`` naming the
    fix if the port is taken or it does not start within ``timeout`` s.

    >>> url = launch("127.0.0.1:6379", port=8270)     # doctest: +SKIP
    """
    if not port_free(port, host):
        raise RuntimeError(f"port {port} is in use on {host}: choose another for the dashboard (--port)")
    if log is None:
        log = os.path.join(os.path.expanduser("~"), ".replistream", "dashboard.log")
    os.makedirs(os.path.dirname(os.path.abspath(log)), exist_ok=True)
    cmd = [sys.executable, "-m", "replistream.dashboard", "--address", address, "--port", str(int(port)),
           "--host", host]
    if token_file:
        cmd += ["--token-file", token_file]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env={**os.environ, "RAY_ADDRESS": address})
    url = f"http://{host}:{int(port)}/"
    deadline = time.time() + timeout
    while True:
        if proc.poll() is not None:
            with open(log) as f:
                tail = f.read().strip().splitlines()[-3:]
            raise RuntimeError(f"the dashboard exited with {proc.returncode}: {' / '.join(tail) or 'no output'} "
                               f"(log: {log})")
        if not port_free(port, host) and _answers(url):
            with open(_record(log), "w") as f:
                json.dump({"pid": proc.pid, "url": url, "address": address, "log": log}, f)
            return url
        if time.time() > deadline:
            proc.terminate()
            raise RuntimeError(f"the dashboard did not answer at {url} within {timeout:g} s (log: {log})")
        time.sleep(0.2)


def _answers(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url + "api/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _record(log: str | None) -> str:
    folder = os.path.dirname(os.path.abspath(log)) if log else os.path.join(os.path.expanduser("~"), ".replistream")
    return os.path.join(folder, "dashboard.json")


def launched(log: str | None = None) -> dict | None:
    """The dashboard :func:`launch` started (with this ``log``) and that still runs:
    ``{"pid", "url", "address", "log"}``, or None."""
    try:
        with open(_record(log)) as f:
            rec = json.load(f)
        os.kill(int(rec["pid"]), 0)
    except (OSError, ValueError, KeyError):
        return None
    return rec


def stop(log: str | None = None, timeout: float = 10.0) -> bool:
    """Stop the dashboard :func:`launch` started (with this ``log``); returns whether one ran.
    (It also stops by itself within seconds of its cluster.)

    >>> stop(log="/nonexistent/dashboard.log")
    False
    """
    rec = launched(log)
    if rec is None:
        return False
    pid = int(rec["pid"])
    os.killpg(pid, signal.SIGTERM)
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:  # our own child (launched by this process): reaped
                break
        except ChildProcessError:
            pass  # another process's child
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.killpg(pid, signal.SIGKILL)
    try:
        os.unlink(_record(log))
    except FileNotFoundError:
        pass
    return True
