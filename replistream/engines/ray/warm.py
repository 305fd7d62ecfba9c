"""A warm pool of actor processes kept in a running cluster between scripts (issue #29).

Every replica is a Ray actor with a process of its own; starting one costs a Python process,
``import ray`` and replistream's modules (about half a second of CPU each here), and a fresh
script pays it for every actor of its deployment. :mod:`.pool` reuses processes within one
script; this module keeps started processes in the cluster itself, so that a script that joins
a running cluster (``replistream up``, ``RAY_ADDRESS``) finds them ready.

:class:`WarmPool` is a detached, named actor (``replistream-warm`` in namespace ``replistream``)
that starts idle actors of each class (entry, operator, application, coordinator) with a blank
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

__all__ = ["WarmPool", "warm_size", "use_cluster", "take", "start", "NAME"]

NAME = "replistream-warm"
NAMESPACE = "replistream"

#: The share of each actor class among the idle actors kept (a k=1 query of 4 actors and a k=3
#: query of 10 take from it in about these proportions, and each deployment 2 coordinators: it and
#: its standby).
MIX = {"EntryActor": 3, "ReplicaActor": 8, "SinkActor": 2, "CoordinatorActor": 3}

#: Where the pool keeps its idle actors and leases in Ray's key-value store (namespace
#: :data:`~.coordinator.KV_NAMESPACE`): ``<prefix>idle/<actor id>``, ``<prefix>lease/<actor id>``.
KV_PREFIX = "replistream/warm/"

#: Seconds between two looks for actors leased to a taker that has ended.
REAP_EVERY_S = 1.0

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


def take(cls_name: str, timeout: float = 2.0) -> Any | None:
    """A warm actor of class ``cls_name`` from the cluster's pool, leased to this script (or
    host), to ``reinit``; None when this process did not join a cluster, the pool is off or
    empty, or it does not answer within ``timeout`` s."""
    global _handle
    if not _joined or warm_size() == 0 or not ray.is_initialized():  # (never start Ray again at exit)
        return None
    keeper = _keeper(create=True)
    try:
        return ray.get(keeper.take.remote(cls_name, _owner()), timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        return None  # (busy starting its actors): a new process instead
    except ray.exceptions.RayActorError:
        _handle = None  # it died: started again next time
        return None


def _blank_query():
    from ...query import Query

    q = Query("warm")
    q.source("s", {"x": "i8"}).filter(lambda b: b["x"] > 0, name="f").sink("out")
    return q.build()


def _kv_put(key: str, value) -> None:
    from .lifecycle import put_value

    put_value(KV_PREFIX + key, value)


def _kv_del(key: str) -> None:
    from .lifecycle import delete_value

    delete_value(KV_PREFIX + key)


def _kv_items(prefix: str) -> list[tuple[str, object]]:
    """``(key after the prefix, value)`` of what the pool kept under ``prefix``."""
    from .lifecycle import get_value, keys

    return [(key[len(KV_PREFIX) + len(prefix):], get_value(key)) for key in keys(KV_PREFIX + prefix)]


#: Seconds a restarted pool waits, all at once, for its idle actors to answer; one silent by then is
#: forgotten and stopped (a loaded machine: idle processes answer in well under a second otherwise).
RESTORE_ASK_S = 15.0


@ray.remote(num_cpus=0, max_restarts=-1, max_concurrency=4)
class WarmPool:
    """The cluster's pool of idle actors (see the module doc). ``size`` idle actors are kept,
    shared among the classes as :data:`MIX`.

    >>> keeper = start()                                  # doctest: +SKIP
    >>> ray.get(keeper.stats.remote())["idle"]            # doctest: +SKIP
    {'EntryActor': 3, 'ReplicaActor': 8, 'SinkActor': 2, 'CoordinatorActor': 3}
    """

    def __init__(self, size: int):
        total = sum(MIX.values())
        self.want = {c: max(1, round(size * n / total)) for c, n in MIX.items()} if size > 0 else {}
        self.idle: dict[str, list] = {c: [] for c in MIX}
        self.leases: dict[str, tuple[str, Any]] = {}  # actor id -> (owner, handle)
        self.taken = 0
        self.reaped = 0
        self.lock = lockorder.lock("WarmPool.lock", 1)
        self.query = _blank_query()
        self.stop = threading.Event()
        self.restored = self._restore()
        threading.Thread(target=self._loop, daemon=True, name="replistream-warm").start()

    def _restore(self) -> dict:
        """Take up the idle actors and leases an earlier process of the pool kept (its process died
        and Ray restarted it): idle ones that still answer are kept, the others forgotten."""
        from .lifecycle import kill_actors

        idle = [(key, cls_name, h) for key, (cls_name, h) in _kv_items("idle/")]
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
            _kv_del("idle/" + key)  # gone, or not answering: forgotten (killed in case it only hangs)
            lost.append(h)
        if broken:
            warnings.warn(f"replistream: the warm pool forgot {len(broken)} idle actor(s) that answered with an error: "
                          f"{broken[:3]}", RuntimeWarning, stacklevel=1)
        kill_actors(lost)
        for key, (owner, h) in _kv_items("lease/"):
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
                _kv_put("idle/" + h._actor_id.hex(), (cls_name, h))

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
                    _kv_del("lease/" + actor_id)
            elif gone:
                ray.kill(h, no_restart=True)
                with self.lock:
                    self.leases.pop(actor_id, None)
                    _kv_del("lease/" + actor_id)
                    self.reaped += 1

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
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
            _kv_put("lease/" + aid, (owner, h))
            _kv_del("idle/" + aid)
            self.taken += 1
            return h

    def stats(self) -> dict:
        """Idle actors per class, leases, actors taken and reaped so far, the last start error."""
        with self.lock:
            return {"idle": {c: len(v) for c, v in self.idle.items()}, "want": dict(self.want),
                    "leased": len(self.leases), "taken": self.taken, "reaped": self.reaped,
                    "last_error": getattr(self, "last_error", None), "restored": self.restored}

    def shutdown(self) -> int:
        """Kill every idle actor (leased ones stay with their takers); returns how many."""
        self.stop.set()
        with self.lock:
            idle = [h for v in self.idle.values() for h in v]
            self.idle = {c: [] for c in MIX}
        for h in idle:
            _kv_del("idle/" + h._actor_id.hex())
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
                _kv_del("lease/" + aid)
        return n


def wait_warm(timeout: float = 60.0) -> dict:
    """Wait until the cluster's pool holds every idle actor it wants (for benchmarks and
    ``replistream up``); returns its stats."""
    keeper = _keeper()
    if keeper is None:
        return {}
    deadline = time.time() + timeout
    st = ray.get(keeper.stats.remote(), timeout=timeout)
    while (any(st["idle"].get(c, 0) < n for c, n in st["want"].items()) and st["last_error"] is None
           and time.time() < deadline):
        time.sleep(0.2)
        st = ray.get(keeper.stats.remote(), timeout=max(1.0, deadline - time.time()))
    return st
