"""A local Ray cluster kept between scripts: ``replistream up`` / ``replistream down``.

``up()`` starts a Ray head on this machine with replistream's settings (:data:`.deployment.RAY_SYSTEM_CONFIG`),
listening on the loopback interface only (127.0.0.1: nothing on the machine's other interfaces,
docs/reliability.md), with Ray's token authentication on (``RAY_AUTH_MODE=token``; the token is
Ray's own file ``~/.ray/auth_token``, created readable by this user only when missing, so every
script of this user joins and no other account can), without the dashboard or usage statistics,
in a process of its own (``ray start --head --block``). It returns once the head has started
(Ray prints "Ray runtime started"); the cluster's warm pool of actor processes (:mod:`.warm`)
then fills in the background, from a process of its own whose outcome goes to ``warm.log``.

Each cluster has a record of its own, one per Ray address: ``~/.replistream/clusters/<host>-<port>/``
(a folder only this user may read, 0700) holds ``cluster.json`` (the head's pid, its start time
and command line), ``cluster.log`` (what ``ray start`` printed) and ``warm.log``, each 0600. A
record is believed only while the process it names is the one ``up`` started (same pid, same
start time, a ``ray start --head`` on that port): a pid reused by another process is never
signalled. Two checkouts or two people sharing an account each start their cluster on a port of
their own and stop it by its port; a script joins the one cluster that runs, or the one its
``RAY_ADDRESS`` names.

``down()`` stops a cluster in the order Ray needs: it sends SIGTERM to the ``ray start`` process
only, whose handler stops the raylet first (which stops its workers) and Ray's control service
(GCS) last, as ``ray stop`` does; what is left of the head's process group after that is stopped
in the same order (raylet, then the other processes, then the GCS). Signalling the whole group at
once, as before, stopped the GCS first and left the raylet waiting 30 s for it; and ``up`` starts
the head with ``RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0``, or its SIGTERM handler would first wait
up to 30 s for the node to drain, which a node holding detached actors never does. It never touches
another Ray instance on the machine (``ray stop`` would stop them all).

>>> up(num_cpus=4)     # doctest: +SKIP
'127.0.0.1:6379'
>>> down()             # doctest: +SKIP
True
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from typing import Callable

__all__ = ["up", "down", "recorded", "records", "answers", "cluster_dir", "home_dir", "ensure_auth_token",
           "AUTH_TOKEN_FILE"]

#: Ray's default token file (what ``ray start`` and every driver of this user read when
#: ``RAY_AUTH_TOKEN`` / ``RAY_AUTH_TOKEN_PATH`` are unset).
AUTH_TOKEN_FILE = os.path.join("~", ".ray", "auth_token")

#: The line ``ray start`` prints once the head's processes run (then ``up`` returns).
_STARTED = "Ray runtime started"


def home_dir() -> str:
    """``~/.replistream``, where the clusters' records live (read at each call: ``HOME`` may change).

    >>> home_dir().endswith(".replistream")
    True
    """
    return os.path.join(os.path.expanduser("~"), ".replistream")


def cluster_dir(address: str) -> str:
    """The folder of the record of the cluster at ``address`` (``host:port``).

    >>> cluster_dir("127.0.0.1:6379").endswith(os.path.join("clusters", "127.0.0.1-6379"))
    True
    """
    host, _, port = address.rpartition(":")
    return os.path.join(home_dir(), "clusters", f"{host}-{int(port)}")


def _private_dir(path: str) -> None:
    os.makedirs(path, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)


def _private_file(path: str, mode: str = "w"):
    """Open ``path`` for writing, readable and writable by this user only (0600), whatever the umask."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_APPEND if "a" in mode else os.O_TRUNC), 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, mode)


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


def _process(pid: int):
    """The live process ``pid`` (psutil), or None."""
    import psutil

    try:
        p = psutil.Process(int(pid))
        return None if p.status() == psutil.STATUS_ZOMBIE else p
    except (psutil.NoSuchProcess, ValueError):
        return None


def _identity(pid: int) -> dict | None:
    """What a record keeps of a process to know it again: its start time and command line."""
    import psutil

    p = _process(pid)
    try:
        return None if p is None else {"create_time": p.create_time(), "cmdline": p.cmdline()}
    except psutil.Error:
        return None


def _exec_identity(pid: int, cmd: list[str], wait_s: float = 5.0) -> dict:
    """The identity of a process just started with ``cmd``, once its command line shows ``cmd``: right
    after ``Popen`` returns, the kernel may still be setting up the new program (and a script's
    interpreter), and ``/proc/<pid>/cmdline`` reads empty; a record of that would never match again
    (seen once at load 70: ``down`` then refused to stop the head)."""
    deadline = time.monotonic() + wait_s
    while True:
        ident = _identity(pid)
        tail = cmd[1:]
        if ident is not None and ident["cmdline"] and (not tail or ident["cmdline"][-len(tail):] == tail):
            return ident
        if ident is None or time.monotonic() > deadline:
            return ident or {"create_time": -1, "cmdline": cmd}
        time.sleep(0.02)


def _is_head(rec: dict) -> bool:
    """Whether the process ``rec`` names is the ``ray start --head`` that ``up`` started: same pid,
    same start time, the same command line (a reused pid is another process)."""
    now = _identity(rec.get("pid", -1))
    return (now is not None and abs(now["create_time"] - float(rec.get("create_time", -1))) < 0.01
            and now["cmdline"] == rec.get("cmdline"))


def _read(path: str) -> dict | None:
    try:
        with open(path) as f:
            rec = json.load(f)
        return rec if isinstance(rec, dict) and "pid" in rec and "address" in rec else None
    except (OSError, ValueError):
        return None


def _write_record(rec: dict) -> None:
    d = cluster_dir(rec["address"])
    _private_dir(os.path.dirname(os.path.dirname(d)))
    _private_dir(os.path.dirname(d))
    _private_dir(d)
    tmp = os.path.join(d, "cluster.json.tmp")
    with _private_file(tmp) as f:
        json.dump(rec, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(d, "cluster.json"))


def records(check: bool = True) -> list[dict]:
    """Every cluster ``up()`` started that still runs (its record names the process ``up``
    started, and, with ``check``, its address answers), sorted by address.

    >>> isinstance(records(), list)
    True
    """
    base = os.path.join(home_dir(), "clusters")
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    out = []
    for name in names:
        rec = _read(os.path.join(base, name, "cluster.json"))
        if rec is not None and _is_head(rec) and (not check or answers(rec["address"])):
            out.append(rec)
    return out


def recorded(address: str | None = None) -> dict | None:
    """The cluster ``up()`` started at ``address`` and that still runs (``{"pid", "address", "log", ...}``),
    or None. Without ``address``: the one such cluster, None when none runs; when several run,
    ``RuntimeError`` naming them and how to choose (``RAY_ADDRESS``).

    >>> recorded("127.0.0.1:1") is None
    True
    """
    if address is not None:
        rec = _read(os.path.join(cluster_dir(address), "cluster.json"))
        return rec if rec is not None and _is_head(rec) and answers(rec["address"]) else None
    running = records()
    if len(running) > 1:
        raise RuntimeError(f"{len(running)} clusters started by `replistream up` run "
                           f"({', '.join(r['address'] for r in running)}): set RAY_ADDRESS to the one to join")
    return running[0] if running else None


def ensure_auth_token() -> str:
    """Make sure this user has a Ray authentication token; returns where it comes from. Ray reads
    ``RAY_AUTH_TOKEN``, else the file ``RAY_AUTH_TOKEN_PATH`` names, else ``~/.ray/auth_token``;
    that last one is created (0600) when missing, with Ray's own generator. ``RuntimeError`` naming
    the fix when the file is missing or readable by other users.

    >>> ensure_auth_token()   # doctest: +SKIP
    '/home/me/.ray/auth_token'
    """
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN"
    path = os.path.expanduser(os.environ.get("RAY_AUTH_TOKEN_PATH") or AUTH_TOKEN_FILE)
    if not os.path.exists(path):
        if os.environ.get("RAY_AUTH_TOKEN_PATH"):
            raise RuntimeError(f"RAY_AUTH_TOKEN_PATH names {path}, which does not exist: create it "
                               f"(`ray get-auth-token --generate` makes one at {os.path.expanduser(AUTH_TOKEN_FILE)}) "
                               f"or unset RAY_AUTH_TOKEN_PATH")
        from ray._private.authentication.authentication_token_generator import generate_new_authentication_token

        _private_dir(os.path.dirname(path))
        with _private_file(path) as f:
            f.write(generate_new_authentication_token())
        return path
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077:
        raise RuntimeError(f"the Ray token {path} can be read by other users (mode {mode:o}): run "
                           f"`chmod 600 {path}`, then `replistream up` again")
    return path


def up(num_cpus: int | None = None, port: int = 6379, timeout: float = 120.0, warm: bool = True,
       say: Callable[[str], None] | None = None, dashboard_port: int | None = 8270) -> str:
    """Start a local Ray head for replistream (loopback only, token authentication); returns its
    address once the head has started. With ``warm``, its warm pool of actor processes (:mod:`.warm`)
    fills in the background afterwards (``warm.log`` in the cluster's folder says how it went). With
    ``dashboard_port``, the live web dashboard (:mod:`replistream.dashboard`) serves the cluster on
    ``http://127.0.0.1:<dashboard_port>/`` (its address is in the cluster's record, ``dashboard``).
    ``say`` is told each step as it starts. Raises ``RuntimeError`` naming the fix if a cluster runs
    at that address already, a port is taken or Ray cannot start.

    >>> up(num_cpus=2)     # doctest: +SKIP
    '127.0.0.1:6379'
    """
    say = say or (lambda text: None)
    if os.environ.get("RAY_AUTH_MODE", "token").lower() != "token":
        raise RuntimeError(f"RAY_AUTH_MODE={os.environ['RAY_AUTH_MODE']} is set: `replistream up` starts Ray with "
                           f"token authentication (every script of this user joins with ~/.ray/auth_token); "
                           f"unset RAY_AUTH_MODE")
    address = f"127.0.0.1:{int(port)}"
    joined = os.environ.get("RAY_ADDRESS")
    if joined:
        raise RuntimeError(f"RAY_ADDRESS={joined} is set: scripts join that cluster, not a new one; "
                           f"unset RAY_ADDRESS to start one with `replistream up`")
    if recorded(address) is not None:
        raise RuntimeError(f"a Ray cluster runs already at {address}: deployments join it "
                           f"(`replistream down --port {int(port)}` stops it)")
    if answers(address):
        raise RuntimeError(f"port {port} is in use on 127.0.0.1: choose another with --port")
    if dashboard_port is not None:
        from ...dashboard import port_free

        if not port_free(dashboard_port):
            raise RuntimeError(f"port {dashboard_port} is in use on 127.0.0.1: choose another for the dashboard "
                               f"with --dashboard-port (0: no dashboard)")
    token = ensure_auth_token()

    from .deployment import RAY_SYSTEM_CONFIG

    cmd = [_ray_cli(), "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={int(port)}",
           "--include-dashboard=false", "--disable-usage-stats", f"--system-config={json.dumps(RAY_SYSTEM_CONFIG)}"]
    if num_cpus is not None:
        cmd.append(f"--num-cpus={int(num_cpus)}")
    d = cluster_dir(address)
    _private_dir(home_dir())
    _private_dir(os.path.dirname(d))
    _private_dir(d)
    log = os.path.join(d, "cluster.log")
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # keep 127.0.0.1 (single-machine mode)
           "RAY_AUTH_MODE": "token",
           # on SIGTERM, `ray start` first drains the node for up to 30 s (for Ray Serve's proxies), which a node
           # holding detached actors (the warm pool, deployments) never finishes: no drain, its ordered stop at once
           "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
    say(f"starting a Ray head at {address} (loopback only, token authentication from {token}; log: {log})")
    with _private_file(log) as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)  # not stopped with the shell that ran `up`
    ident = _exec_identity(proc.pid, cmd)
    rec = {"pid": proc.pid, "address": address, "log": log, "started": time.time(), **ident}
    _write_record(rec)  # at once: `down` can stop a head whose `up` was interrupted
    deadline = time.time() + timeout
    while True:
        with open(log) as f:
            text = f.read()
        if _STARTED in text and answers(address):
            break
        if proc.poll() is not None:
            tail = text.strip().splitlines()[-3:]
            _stop_in_order(_group(proc.pid, float(rec["create_time"])), grace=5.0)  # what it left, if anything
            os.unlink(os.path.join(d, "cluster.json"))
            raise RuntimeError(f"`ray start` exited with {proc.returncode}: {' / '.join(tail)} (log: {log})")
        if time.time() > deadline:
            _stop_head(rec, grace=10.0)
            os.unlink(os.path.join(d, "cluster.json"))
            raise RuntimeError(f"the Ray head did not start at {address} within {timeout:g} s (log: {log})")
        time.sleep(0.1)
    rec.update(_exec_identity(proc.pid, cmd))  # as it runs now (the first look may come while exec still runs)
    _write_record(rec)
    others = [r["address"] for r in records() if r["address"] != address]
    if others:
        say(f"note: {len(others)} other cluster(s) started by `replistream up` run ({', '.join(others)}): a script "
            f"joins the one its RAY_ADDRESS names (RAY_ADDRESS={address} for this one)")
    if warm:
        from .warm import warm_size

        if warm_size():
            rec["warm_pid"] = start_warm_pool(address)
            _write_record(rec)
            say(f"the warm pool of {warm_size()} actor processes fills in the background "
                f"(log: {os.path.join(d, 'warm.log')})")
    if dashboard_port is not None:  # the live dashboard, in a process of its own (it stops with the cluster)
        from ...dashboard import launch

        say(f"starting the dashboard on 127.0.0.1:{dashboard_port}")
        rec["dashboard"] = launch(address, port=dashboard_port, log=os.path.join(d, "dashboard.log"))
        _write_record(rec)
    return address


#: What the background process that fills the warm pool runs (it prints one JSON line: the pool's stats or the error).
_WARM_CODE = """\
import json, sys, traceback
try:
    from replistream.engines.ray import init_ray, warm
    init_ray(address=sys.argv[1]); warm.start(); st = warm.wait_warm(float(sys.argv[2]))
    print(json.dumps({"warm": st, "error": st.get("last_error")}), flush=True)
except Exception as e:
    traceback.print_exc()
    print(json.dumps({"warm": None, "error": f"{type(e).__name__}: {e}"}), flush=True)
    sys.exit(1)
"""


def start_warm_pool(address: str, timeout: float = 300.0, wait: bool = False) -> int | dict:
    """Start the cluster's warm pool of actor processes (:mod:`.warm`) from a process of its own (the
    caller may run a Ray of its own), writing its outcome to ``warm.log`` in the cluster's folder.
    Returns that process's pid; with ``wait``, waits for it and returns the pool's stats
    (``RuntimeError`` with the reason if it could not start).

    >>> start_warm_pool("127.0.0.1:6379", wait=True)   # doctest: +SKIP
    {'idle': {...}, ...}
    """
    d = cluster_dir(address)
    _private_dir(d)
    path = os.path.join(d, "warm.log")
    with _private_file(path) as out:
        proc = subprocess.Popen([sys.executable, "-c", _WARM_CODE, address, str(timeout)], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, "RAY_ADDRESS": address})
    if not wait:
        return proc.pid
    proc.wait(timeout=timeout + 60)
    got = warm_state(address)
    if proc.returncode != 0 or got is None or got.get("error"):
        raise RuntimeError(f"the cluster at {address} runs, but its warm pool could not start: "
                           f"{(got or {}).get('error') or 'no outcome'} (log: {path})")
    return got["warm"]


def warm_state(address: str) -> dict | None:
    """What the background process that fills the warm pool said (``{"warm": stats, "error": ...}``),
    or None while it runs (or when it was not started).

    >>> warm_state("127.0.0.1:1") is None
    True
    """
    try:
        with open(os.path.join(cluster_dir(address), "warm.log")) as f:
            lines = [line for line in f.read().splitlines() if line.startswith("{")]
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None


def _group(pgid: int, since: float) -> list:
    """The live processes of process group ``pgid`` started no earlier than ``since`` (so a process
    of another group that reused the number is not one of them)."""
    import psutil

    out = []
    for p in psutil.process_iter(["create_time"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["create_time"] >= since - 0.01 and p.status() != "zombie":
                out.append(p)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return out


def _stop_in_order(procs: list, grace: float) -> int:
    """SIGTERM, wait, then SIGKILL: the raylet first, the GCS last (what ``ray stop`` does); returns how many."""
    import psutil

    def rank(p):
        try:
            name = p.name()
        except psutil.Error:
            return 1
        return 0 if name == "raylet" else 2 if name == "gcs_server" else 1

    buckets: dict[int, list] = {}
    for p in procs:
        buckets.setdefault(rank(p), []).append(p)
    for r in sorted(buckets):
        for p in buckets[r]:
            try:
                p.terminate()
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(buckets[r], timeout=grace)
        for p in alive:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(alive, timeout=2.0)
    return len(procs)


def _stop_head(rec: dict, grace: float = 10.0, say: Callable[[str], None] | None = None) -> None:
    """Stop the head ``rec`` names and what is left of its process group, in Ray's order; ``say``
    is told how long each step took."""
    import psutil

    say = say or (lambda text: None)
    t0 = time.perf_counter()
    pid, since = int(rec["pid"]), float(rec.get("create_time", 0))
    head = _process(pid) if _is_head(rec) else None
    if head is not None:
        head.terminate()  # `ray start --block`'s handler: raylet (and its workers) first, the GCS last
        try:
            head.wait(timeout=grace)
        except psutil.TimeoutExpired:
            pass
        say(f"Ray's own shutdown took {time.perf_counter() - t0:.1f} s")
    left = [p for p in _group(pid, since) if p.pid != pid]
    if left:  # worker processes whose raylet is gone (Ray's handler gives each process 1 s, then kills it)
        t1 = time.perf_counter()
        _stop_in_order(left, grace=1.0)
        say(f"stopped {len(left)} process(es) left behind in {time.perf_counter() - t1:.1f} s")
    if head is not None and head.is_running():
        head.kill()
    warm = rec.get("warm_pid")
    if warm:  # the warm pool's starter, if it still runs (a session of its own, started after the head)
        p = _process(warm)
        try:
            if p is not None and p.create_time() >= since and "-c" in p.cmdline():
                _stop_in_order([p], grace=1.0)
        except psutil.Error:
            pass


def down(address: str | None = None, timeout: float = 15.0, say: Callable[[str], None] | None = None) -> bool:
    """Stop the cluster ``up()`` started at ``address`` (default: the one that runs) and every
    deployment in it; returns whether one ran. A cluster it did not start is left alone, and so
    is a process whose pid a record names but that is not the head ``up`` started:
    ``RuntimeError`` says so and what to do. Several clusters and no ``address``: ``RuntimeError``
    naming them.

    >>> down()     # doctest: +SKIP
    True
    """
    say = say or (lambda text: None)
    base = os.path.join(home_dir(), "clusters")
    if address is None:
        mine = records(check=False)
        env = os.environ.get("RAY_ADDRESS")
        if env and any(r["address"] == env for r in mine):
            mine = [r for r in mine if r["address"] == env]
        if len(mine) > 1:
            ports = ", ".join(r["address"].rpartition(":")[2] for r in mine)
            raise RuntimeError(f"{len(mine)} clusters started by `replistream up` run "
                               f"({', '.join(r['address'] for r in mine)}): stop one with `replistream down --port P` "
                               f"(P one of {ports})")
        if not mine:
            if env:
                raise RuntimeError(f"the Ray cluster at {env} (RAY_ADDRESS) was not started by `replistream up`: "
                                   f"stop it where it was started (`ray stop` stops every Ray instance on "
                                   f"this machine)")
            _forget_stale(base)
            return False
        rec = mine[0]
    else:
        rec = _read(os.path.join(cluster_dir(address), "cluster.json"))
        if rec is None:
            return False
        if not _is_head(rec):
            now = _identity(rec["pid"])
            os.unlink(os.path.join(cluster_dir(address), "cluster.json"))
            if now is None:
                left = _group(int(rec["pid"]), float(rec.get("create_time", 0)))
                if left:
                    say(f"the head of {address} (pid {rec['pid']}) had ended: stopping {len(left)} leftover "
                        f"process(es) of it")
                    _stop_in_order(left, grace=5.0)
                    return True
                return False
            raise RuntimeError(f"the record of {address} names pid {rec['pid']}, which is now another process "
                               f"({' '.join(now['cmdline'])[:80]!r}): nothing stopped, the stale record removed")
    say(f"stopping the Ray cluster at {rec['address']} (pid {rec['pid']}): raylet and workers first, "
        f"then Ray's control service")
    _stop_head(rec, grace=timeout, say=say)
    try:
        os.unlink(os.path.join(cluster_dir(rec["address"]), "cluster.json"))
    except FileNotFoundError:
        pass
    return True


def _forget_stale(base: str) -> None:
    """Remove the records whose head no longer runs (nothing else: their logs stay for a look)."""
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        path = os.path.join(base, name, "cluster.json")
        rec = _read(path)
        if rec is not None and not _is_head(rec) and not _group(int(rec["pid"]), float(rec.get("create_time", 0))):
            os.unlink(path)
