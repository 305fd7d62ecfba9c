"""A warm pool of actor processes kept in a running cluster between scripts (issue #29).

Every replica is a Ray actor with a process of its own; starting one costs a Python process,
``import ray`` and replistream's modules (about half a second of CPU each here), and a fresh
script pays it for every actor of its deployment. :mod:`.pool` reuses processes within one
script; this module keeps started processes in the cluster itself, so that a script that joins
a running cluster (``replistream up``, ``RAY_ADDRESS``) finds them ready.

:class:`WarmPool` is a detached, named actor (``replistream-warm`` in namespace ``replistream``)
that starts idle actors of each class (entry, operator, application, coordinator, file reader) with a blank
query and keeps :func:`warm_size` of them (``REPLISTREAM_CLUSTER_POOL``, default 16; 0 turns it
off). A deployment takes one (:meth:`WarmPool.take`) and re-initialises it exactly as it does a
kept actor of its own script (``reinit``); the pool starts a replacement in the background.

Each actor taken is leased to its taker: the script's Ray job, or the actor that deployed (a
detached deployment's host). The pool starts its actors *detached*: no process owns them, so
losing the pool loses no actor, idle or leased (issue #40: the pool's loss used to kill every
leased replica of every deployment at once). They would also outlive a taker that dies without
shutting its deployment down (a killed script); every second the pool kills the actors leased to a
job that has ended or to an actor that is dead for good (a host Ray is restarting is not). The
pool itself is restarted by Ray when its process dies, and it keeps its idle actors and leases in
Ray's key-value store (:data:`KV_PREFIX`), so the new process takes them up. A deployment that
shuts down kills or keeps its actors as before (:mod:`.pool`); a kept one stays leased to its script.

The pool is used only by a driver that joined a running cluster (:func:`use_cluster`), never by
a script's own Ray, and ``replistream up`` starts it so the first script finds it warm.

>>> warm_size() >= 0
True
"""
from __future__ import annotations

import os
import threading
import time
import warnings
from typing import Any

import ray

from . import lockorder
from .common import is_actor_death

__all__ = ["WarmPool", "warm_size", "use_cluster", "take", "take_many", "start", "NAME"]

NAME = "replistream-warm"
NAMESPACE = "replistream"

#: The share of each actor class among the idle actors kept (a k=1 query of 4 actors and a k=3
#: query of 10 take from it in about these proportions, and each deployment 2 coordinators: it and
#: its standby; a script that reads files, one reader: :mod:`.reader`).
MIX = {"EntryActor": 3, "ReplicaActor": 8, "SinkActor": 2, "CoordinatorActor": 3, "ReaderActor": 1}

#: Where the pool keeps its idle actors and leases in Ray's key-value store (namespace
#: :data:`~.coordinator.KV_NAMESPACE`): ``<prefix>idle/<actor id>``, ``<prefix>lease/<actor id>``.
KV_PREFIX = "replistream/warm/"

#: Seconds between two looks for actors leased to a taker that has ended.
REAP_EVERY_S = 1.0

#: Seconds a script waits for the pool to answer a take, then starts processes of its own. A
#: script's first call to the pool also finds the pool's process (2 s was too short on loaded
#: cores: a script started every actor anew with the pool full).
TAKE_TIMEOUT_S = 10.0

#: Replacements for taken actors start only when they cost the takers nothing: starting one is a
#: process and replistream's imports (about a CPU-second each here), and a deployment takes its
#: actors all at once and then runs. Starting five replacements beside a two-core run halved its
#: rate (W1 joined to a cluster). The pool waits until :data:`REFILL_AFTER_TAKE_S` seconds passed
#: since the last take and the machine's CPUs were less than :data:`REFILL_BUSY` busy over the last
#: round, or until it has waited :data:`REFILL_MAX_WAIT_S` seconds (a machine that never quiets).
REFILL_AFTER_TAKE_S = 3.0
REFILL_BUSY = 0.5
REFILL_MAX_WAIT_S = 60.0


def refill_due(short_for_s: float, since_take_s: float, busy: float) -> bool:
    """Whether the pool starts its missing actors now: short of some for ``short_for_s`` seconds,
    the last take ``since_take_s`` seconds ago, the CPUs ``busy`` (0 to 1) over the last round.

    >>> refill_due(short_for_s=2.0, since_take_s=1.0, busy=0.1)    # a deployment is starting
    False
    >>> refill_due(short_for_s=5.0, since_take_s=5.0, busy=0.9)    # it runs on every core
    False
    >>> refill_due(short_for_s=5.0, since_take_s=5.0, busy=0.2)    # quiet again
    True
    >>> refill_due(short_for_s=61.0, since_take_s=61.0, busy=1.0)  # never quiet: started anyway
    True
    """
    if short_for_s >= REFILL_MAX_WAIT_S:
        return True
    return since_take_s >= REFILL_AFTER_TAKE_S and busy < REFILL_BUSY

_joined = False  # this process joined a running cluster (init_ray with an address, or a host actor)


def warm_size() -> int:
    """How many idle actors the cluster's pool keeps (``REPLISTREAM_CLUSTER_POOL``, default 16; 0: none)."""
    raw = os.environ.get("REPLISTREAM_CLUSTER_POOL", "16")
    try:
        return max(0, int(raw))
    except ValueError:
        raise ValueError(f"REPLISTREAM_CLUSTER_POOL must be a whole number, got {raw!r}") from None


def use_cluster(joined: bool = True) -> None:
    """Say that this process joined a running cluster (its deployments take warm actors from it)."""
    global _joined
    _joined = bool(joined)


def _owner() -> str:
    """Who a taken actor is leased to: this actor (a detached deployment's host) or this job."""
    ctx = ray.get_runtime_context()
    actor = ctx.get_actor_id()
    return f"actor:{actor}" if actor else f"job:{ctx.get_job_id()}"


_handle: Any = None


def _keeper(create: bool = False):
    """The cluster's pool actor (None when there is none and ``create`` is False)."""
    global _handle
    if _handle is not None:
        return _handle
    try:
        _handle = ray.get_actor(NAME, namespace=NAMESPACE)
    except ValueError:  # none yet
        if not create:
            return None
        _handle = WarmPool.options(name=NAME, namespace=NAMESPACE, lifetime="detached",
                                   get_if_exists=True).remote(warm_size())
    return _handle


def start() -> Any | None:
    """Start the cluster's pool if it does not run yet (``replistream up`` does); returns its handle."""
    if warm_size() == 0:
        return None
    return _keeper(create=True)


def take(cls_name: str, timeout: float = TAKE_TIMEOUT_S) -> Any | None:
    """A warm actor of class ``cls_name`` from the cluster's pool, leased to this script (or
    host), to ``reinit``; None when this process did not join a cluster, the pool is off or
    empty, or it does not answer within ``timeout`` s (then it is not asked again for
    :data:`SKIP_AFTER_TIMEOUT_S`)."""
    return _ask("take", cls_name, timeout)


def take_many(counts: dict[str, int], timeout: float = TAKE_TIMEOUT_S) -> list[tuple[str, Any]]:
    """Up to ``counts[c]`` warm actors of each class ``c`` in one call to the pool (a deployment's
    actors: one round trip, not one per actor), leased as :func:`take` leases them; as many as it
    has idle, ``[(class name, handle)]``; empty when :func:`take` would give None.

    >>> take_many({"ReplicaActor": 2, "CoordinatorActor": 2})   # doctest: +SKIP
    [('ReplicaActor', Actor(ReplicaActor, ...)), ...]
    """
    return (_ask("take_many", dict(counts), timeout) or []) if counts else []


#: Seconds a process leaves the pool alone after it did not answer a take in time: a deployment
#: asks it several times (its actors, its standby coordinator, a file reader), and each would wait
#: :data:`TAKE_TIMEOUT_S` again; it starts processes of its own meanwhile.
SKIP_AFTER_TIMEOUT_S = 60.0

_skip_until = 0.0  # time.monotonic() before which this process does not ask the pool


def _ask(method: str, what, timeout: float):
    """``keeper.<method>(what, owner)``, or None: not joined, no pool, or it did not answer."""
    global _handle, _skip_until
    if not _joined or warm_size() == 0 or not ray.is_initialized():  # (never start Ray again at exit)
        return None
    if time.monotonic() < _skip_until:
        return None
    keeper = _keeper(create=True)
    try:
        return ray.get(getattr(keeper, method).remote(what, _owner()), timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        _skip_until = time.monotonic() + SKIP_AFTER_TIMEOUT_S  # (busy or stuck): new processes instead
        return None
    except ray.exceptions.RayActorError:
        _handle = None  # it died: started again next time
        return None


def _blank_query():
    from ...query import Query

    q = Query("warm")
    q.source("s", {"x": "i8"}).filter(lambda b: b["x"] > 0, name="f").sink("out")
    return q.build()


def _kv_put(key: str, value, prefix: str = KV_PREFIX) -> None:
    from .lifecycle import put_value

    put_value(prefix + key, value)


def _kv_del(key: str, prefix: str = KV_PREFIX) -> None:
    from .lifecycle import delete_value

    delete_value(prefix + key)


def _kv_items(sub: str, prefix: str = KV_PREFIX) -> list[tuple[str, object]]:
    """``(key after the prefix, value)`` of what the pool kept under ``prefix + sub``."""
    from .lifecycle import get_value, keys

    return [(key[len(prefix) + len(sub):], get_value(key)) for key in keys(prefix + sub)]


#: Seconds a restarted pool waits, all at once, for its idle actors to answer; one silent by then is
#: forgotten and stopped (a loaded machine: idle processes answer in well under a second otherwise).
RESTORE_ASK_S = 15.0


@ray.remote(num_cpus=0, max_restarts=-1, max_concurrency=4)
class WarmPool:
    """The cluster's pool of idle actors (see the module doc). ``size`` idle actors are kept,
    shared among the classes as :data:`MIX`; they and the leases are kept under ``kv_prefix`` in
    Ray's key-value store (a pool of a test's own keeps its own apart from the cluster's).

    >>> keeper = start()                                  # doctest: +SKIP
    >>> ray.get(keeper.stats.remote())["idle"]            # doctest: +SKIP
    {'EntryActor': 3, 'ReplicaActor': 8, 'SinkActor': 2, 'CoordinatorActor': 3}
    """

    def __init__(self, size: int, kv_prefix: str = KV_PREFIX):
        self.kv = kv_prefix  # where it keeps its idle actors and leases (a pool of a test's own: one of its own)
        total = sum(MIX.values())
        self.want = {c: max(1, round(size * n / total)) for c, n in MIX.items()} if size > 0 else {}
        self.idle: dict[str, list] = {c: [] for c in MIX}
        self.leases: dict[str, tuple[str, Any]] = {}  # actor id -> (owner, handle)
        self.taken = 0
        self.reaped = 0
        self.lock = lockorder.lock("WarmPool.lock", 1)
        self.query = _blank_query()
        self.stop = threading.Event()
        self.last_take = float("-inf")  # time.monotonic() of the last take
        self.short_since: float | None = None  # since when some idle actor is missing (after the first fill)
        self.filled_once = False  # the first fill, and one asked for (hurry), start at once
        self.restored = self._restore()
        threading.Thread(target=self._loop, daemon=True, name="replistream-warm").start()

    def _restore(self) -> dict:
        """Take up the idle actors and leases an earlier process of the pool kept (its process died
        and Ray restarted it): idle ones that still answer are kept, the others forgotten."""
        from .lifecycle import kill_actors

        idle = [(key, cls_name, h) for key, (cls_name, h) in _kv_items("idle/", self.kv)]
        asked = [h.settled.remote() for _, _, h in idle]
        ready = set(ray.wait(asked, num_returns=len(asked), timeout=RESTORE_ASK_S)[0]) if asked else set()
        lost, broken = [], []
        for (key, cls_name, h), ref in zip(idle, asked):
            try:
                if ref in ready:
                    ray.get(ref, timeout=0)
                    self.idle.setdefault(cls_name, []).append(h)
                    continue
            except Exception as e:  # noqa: BLE001 - gone or broken: forgotten below, like a silent one
                if not is_actor_death(e):
                    broken.append(f"{cls_name}: {e!r}"[:200])
            _kv_del("idle/" + key, self.kv)  # gone, or not answering: forgotten (killed in case it only hangs)
            lost.append(h)
        if broken:
            warnings.warn(f"replistream: the warm pool forgot {len(broken)} idle actor(s) that answered with an error: "
                          f"{broken[:3]}", RuntimeWarning, stacklevel=1)
        kill_actors(lost)
        for key, (owner, h) in _kv_items("lease/", self.kv):
            self.leases[key] = (owner, h)
        return {"idle": sum(len(v) for v in self.idle.values()), "leases": len(self.leases), "forgotten": len(lost)}

    def _new(self, cls_name: str):
        from . import actors
        from .coordinator import CoordinatorActor

        q = self.query
        detached = {"lifetime": "detached"}  # owned by no process: they outlive this pool
        if cls_name == "EntryActor":
            return actors.EntryActor.options(**detached).remote(q, 0, "warm", None, 0.0, {})
        if cls_name == "ReplicaActor":
            return actors.ReplicaActor.options(**detached).remote(q, "f", 0, "warm", [1], None, 0.0, {})
        if cls_name == "ReaderActor":
            from .reader import ReaderActor

            return ReaderActor.options(**detached).remote()
        if cls_name == "SinkActor":
            return actors.SinkActor.options(**detached).remote(q, "out", "warm", [1], None, 0.0, {})
        return CoordinatorActor.options(**detached).remote(0.0, None)

    def _fill(self) -> None:
        """Start every missing idle actor at once, and keep each once it answers (quiet, ready for
        ``reinit``); one that fails to start is said in :meth:`stats` and tried again next round."""
        started = []
        with self.lock:
            for cls_name, want in self.want.items():
                for _ in range(max(0, want - len(self.idle[cls_name]))):
                    started.append((cls_name, self._new(cls_name)))
        # every module a replica may need imported now (not at its reinit), then quiet: ready for reinit
        refs = [[*([] if cls_name == "CoordinatorActor" else [h.preload.remote()]), h.stop_sending.remote()]
                for cls_name, h in started]
        for (cls_name, h), calls in zip(started, refs):
            try:
                ray.get(calls, timeout=120)
            except Exception as e:  # a start that failed: tried again next round, said in stats
                self.last_error = f"{cls_name}: {type(e).__name__}: {e}"
                ray.kill(h, no_restart=True)
                continue
            with self.lock:
                self.idle[cls_name].append(h)
                _kv_put("idle/" + h._actor_id.hex(), (cls_name, h), self.kv)

    def _reap(self) -> None:
        import ray._private.state as state

        with self.lock:
            leases = dict(self.leases)
        if not leases:
            return
        dead_jobs = {j["JobID"] for j in state.jobs() if j.get("IsDead")}
        for actor_id, (owner, h) in leases.items():
            kind, _, who = owner.partition(":")
            gone = who in dead_jobs if kind == "job" else state.actors(who).get("State") == "DEAD"
            mine = state.actors(actor_id).get("State")
            if mine == "DEAD":
                with self.lock:
                    self.leases.pop(actor_id, None)
                    _kv_del("lease/" + actor_id, self.kv)
            elif gone:
                ray.kill(h, no_restart=True)
                with self.lock:
                    self.leases.pop(actor_id, None)
                    _kv_del("lease/" + actor_id, self.kv)
                    self.reaped += 1

    def _fill_due(self) -> bool:
        """The first fill at once; later ones when :func:`refill_due` says so."""
        import psutil

        busy = psutil.cpu_percent(interval=None) / 100.0  # over the time since the last call (a round)
        if not self.filled_once:
            self.filled_once = True
            return True
        now = time.monotonic()
        with self.lock:
            short = any(len(self.idle[c]) < n for c, n in self.want.items())
        if not short:
            self.short_since = None
            return False
        if self.short_since is None:
            self.short_since = now
        return refill_due(now - self.short_since, now - self.last_take, busy)

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                if self._fill_due():
                    self._fill()
                self._reap()
            except Exception as e:  # kept for stats(); the loop goes on
                self.last_error = f"{type(e).__name__}: {e}"
            self.stop.wait(REAP_EVERY_S)

    def take(self, cls_name: str, owner: str):
        """An idle actor of ``cls_name`` leased to ``owner`` (``job:<id>`` or ``actor:<id>``), or None."""
        with self.lock:
            idle = self.idle.get(cls_name)
            if not idle:
                return None
            h = idle.pop(0)
            aid = h._actor_id.hex()
            self.leases[aid] = (owner, h)
            _kv_put("lease/" + aid, (owner, h), self.kv)
            _kv_del("idle/" + aid, self.kv)
            self.taken += 1
            self.last_take = time.monotonic()
            return h

    def take_many(self, counts: dict[str, int], owner: str) -> list[tuple[str, Any]]:
        """Up to ``counts[c]`` idle actors of each class ``c``, leased to ``owner`` (:meth:`take`)."""
        got = []
        for cls_name, n in counts.items():
            for _ in range(int(n)):
                h = self.take(cls_name, owner)
                if h is None:
                    break
                got.append((cls_name, h))
        return got

    def hurry(self) -> None:
        """Start the missing idle actors at the next round, whatever the machine's load
        (:func:`wait_warm` asks it: who waits for a full pool wants it full)."""
        self.filled_once = False

    def stats(self) -> dict:
        """Idle actors per class, leases, actors taken and reaped so far, the last start error."""
        with self.lock:
            return {"idle": {c: len(v) for c, v in self.idle.items()}, "want": dict(self.want),
                    "leased": len(self.leases), "taken": self.taken, "reaped": self.reaped,
                    "last_error": getattr(self, "last_error", None), "restored": self.restored,
                    "refill_waiting_s": (None if self.short_since is None
                                         else round(time.monotonic() - self.short_since, 1))}

    def shutdown(self) -> int:
        """Kill every idle actor (leased ones stay with their takers); returns how many."""
        self.stop.set()
        with self.lock:
            idle = [h for v in self.idle.values() for h in v]
            self.idle = {c: [] for c in MIX}
        for h in idle:
            _kv_del("idle/" + h._actor_id.hex(), self.kv)
            ray.kill(h, no_restart=True)
        return len(idle)

    def release(self, actor_ids: list[str]) -> int:
        """Forget the leases of ``actor_ids`` (their deployment killed them or keeps them as its own
        detached actors); returns how many were leased."""
        n = 0
        with self.lock:
            for aid in actor_ids:
                if self.leases.pop(aid, None) is not None:
                    n += 1
                _kv_del("lease/" + aid, self.kv)
        return n


def wait_warm(timeout: float = 60.0) -> dict:
    """Wait until the cluster's pool holds every idle actor it wants (for benchmarks and
    ``replistream up``); returns its stats."""
    keeper = _keeper()
    if keeper is None:
        return {}
    deadline = time.time() + timeout
    keeper.hurry.remote()
    st = ray.get(keeper.stats.remote(), timeout=timeout)
    while (any(st["idle"].get(c, 0) < n for c, n in st["want"].items()) and st["last_error"] is None
           and time.time() < deadline):
        time.sleep(0.2)
        st = ray.get(keeper.stats.remote(), timeout=max(1.0, deadline - time.time()))
    return st
