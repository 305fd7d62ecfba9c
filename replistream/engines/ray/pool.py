"""Reuse of actor processes across deployments in one Ray session (issue #16: start-up).

Every replica is a Ray actor with a process of its own, and starting one costs about half a
second of CPU here (a Python, ``import ray``, replistream's modules); on two cores a deployment
of four actors took 1.6-1.9 s, the second one as long as the first. When a deployment shuts
down, its actors are not killed but kept, up to :func:`pool_size` of them, and the next
deployment in the same Ray session re-initialises them (``reinit``: every attribute dropped,
``__init__`` run again) instead of starting processes.

An actor is kept only when nothing can reach it from its old deployment any more:

1. every actor of the deployment stops sending (``stop_sending``) and from then on ignores
   input (its ``push`` returns at once), so no call of one old actor can make another one act;
2. the driver waits until each has no call of its own in flight (``settled``): after that no
   old call is on its way anywhere;
3. only then do actors enter the pool, and only those that are reusable: no failure of their
   own code, no state transfer ever started in them (its thread), no Parquet output, on a
   logical server of the local machine (a server pinned to a Ray node is not interchangeable).

``deploy(..., spares=n)`` adds ``n`` warm spares: replica actors started with the deployment,
never connected, kept idle; a replica the deployment replaces or adds while it runs (a crash
repaired by revival, a move, a hand-over) takes one instead of starting a process.

A replica that cannot answer (stopped by a fault and not resumed, or suspected by the failure
detector) is killed before the others are quiesced (``Deployment.shutdown``): the pool would
otherwise wait its deadline on it, and on every actor with a call to it still in flight, and keep
none of them.

The driver's own threads of the old deployment (feeder, scenario, control loop) must have
ended, or nothing is kept. A pooled actor that died meanwhile is noticed when re-initialised
and replaced by a new one. The coordinator is never kept: it receives reports from replicas,
and one from an old replica must not reach a new deployment.

``REPLISTREAM_ACTOR_POOL=0`` (or :func:`set_pool_size`) turns reuse off; :func:`clear_pool`
kills what is kept.

>>> set_pool_size(0); pool_size()
0
>>> set_pool_size(None) is None  # back to the default (REPLISTREAM_ACTOR_POOL or 16)
True
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any

import ray

from .common import is_actor_death

__all__ = ["pool_size", "set_pool_size", "clear_pool", "take", "prefetch", "recycle", "pooled", "keep_spare"]

_lock = threading.Lock()
_pool: dict[str, list] = {}  # actor class name -> handles, oldest first
_job: str | None = None  # the Ray job the handles belong to
_size: int | None = None


def pool_size() -> int:
    """How many idle actors are kept at most (``REPLISTREAM_ACTOR_POOL``, default 16; 0: none)."""
    if _size is not None:
        return _size
    try:
        return max(0, int(os.environ.get("REPLISTREAM_ACTOR_POOL", "16")))
    except ValueError:
        raise ValueError(f"REPLISTREAM_ACTOR_POOL must be a whole number, got "
                         f"{os.environ['REPLISTREAM_ACTOR_POOL']!r}") from None


def set_pool_size(n: int | None) -> None:
    """Keep at most ``n`` idle actors (None: the default); surplus ones are killed."""
    global _size
    if n is not None and (isinstance(n, bool) or int(n) < 0):
        raise ValueError(f"pool size must be >= 0, got {n!r}")
    _size = None if n is None else int(n)
    _trim(pool_size())


def pooled() -> dict[str, int]:
    """``{actor class: idle actors kept}`` (for tests and inspection)."""
    with _lock:
        _check_job()
        return {k: len(v) for k, v in _pool.items() if v}


def clear_pool() -> None:
    """Kill every kept actor."""
    _trim(0)


def _current_job() -> str | None:
    try:
        return ray.get_runtime_context().get_job_id() if ray.is_initialized() else None
    except Exception:  # no Ray context: nothing can be reused
        return None


def _check_job() -> None:
    """Forget handles of an earlier Ray session (call under the lock)."""
    global _job
    job = _current_job()
    if job != _job:
        _pool.clear()
        _job = job


def _trim(limit: int) -> None:
    kill = []
    with _lock:
        _check_job()
        total = sum(len(v) for v in _pool.values())
        while total > limit:
            name = max(_pool, key=lambda k: len(_pool[k]))
            kill.append(_pool[name].pop(0))
            total -= 1
    for h in kill:
        try:
            ray.kill(h, no_restart=True)
        except Exception:  # already gone
            pass


def take(cls_name: str) -> Any | None:
    """A kept actor of class ``cls_name`` (to ``reinit``): one this script's deployments left, else
    one of the running cluster's warm pool (:mod:`.warm`, when this script joined a cluster), or None."""
    if pool_size() == 0:
        return None
    with _lock:
        _check_job()
        handles = _pool.get(cls_name)
        if handles:
            return handles.pop()
    from . import warm

    return warm.take(cls_name)


def prefetch(counts: dict[str, int]) -> int:
    """Before a deployment starts its actors: take from the running cluster's warm pool, in one call,
    what it will ask :func:`take` for (``counts`` per class) beyond what this script keeps already;
    they wait here for those calls. A round trip to the pool cost 70-90 ms per actor, sent one
    after another (a k=1 deployment asks for five). Returns how many were taken.

    >>> prefetch({"EntryActor": 1, "ReplicaActor": 1, "SinkActor": 1, "CoordinatorActor": 2})  # doctest: +SKIP
    5
    """
    if pool_size() == 0:
        return 0
    with _lock:
        _check_job()
        need = {c: n - len(_pool.get(c, ())) for c, n in counts.items()}
    need = {c: n for c, n in need.items() if n > 0}
    if not need:
        return 0
    from . import warm

    got = warm.take_many(need)
    with _lock:
        for cls_name, h in got:
            _pool.setdefault(cls_name, []).insert(0, h)  # take() pops the newest: the script's own kept ones first
    return len(got)


def keep_spare(cls_name: str, handle: Any) -> bool:
    """Keep ``handle``, a new actor that was never connected to anything and was told to
    ``stop_sending`` right after its creation (a warm spare, Hwang §V-C repairs without
    starting a process); False (and killed) when the pool is full."""
    with _lock:
        _check_job()
        if sum(len(v) for v in _pool.values()) < pool_size():
            _pool.setdefault(cls_name, []).insert(0, handle)  # taken after actors left by a deployment
            return True
    try:
        ray.kill(handle, no_restart=True)
    except Exception:
        pass
    return False


def recycle(actors: list[tuple[str, Any]], timeout: float = 3.0) -> list[tuple[str, Any]]:
    """Quiesce ``actors`` (``(class name, handle)`` of one deployment that is shutting down, all of
    them; class name None for one that must not be kept, e.g. pinned to a Ray node) and keep the
    reusable ones; returns those not kept, for the caller to kill."""
    limit = pool_size()
    if limit == 0 or not actors:
        return list(actors)
    stop = [h.stop_sending.remote() for _, h in actors]
    ready, _ = ray.wait(stop, num_returns=len(stop), timeout=timeout)  # one deadline for all of them
    ready = set(ready)
    live = []
    for a, ref in zip(actors, stop):
        if ref not in ready:
            continue  # stuck (e.g. blocked on a receiver): not kept
        try:
            ray.get(ref)
            live.append(a)
        except Exception:  # dead: not kept
            pass
    rejected = [a for a in actors if a not in live]
    pending = list(live)
    keep = []
    deadline = time.time() + timeout
    while pending and time.time() < deadline:
        answers = [h.settled.remote() for _, h in pending]
        still = []
        for a, ref in zip(pending, answers):
            try:
                done, reusable = ray.get(ref, timeout=max(0.1, deadline - time.time()))
            except Exception as e:
                if not is_actor_death(e):
                    rejected.append(a)
                continue
            if not reusable:
                rejected.append(a)
            elif done:
                keep.append(a)
            else:
                still.append(a)
        pending = still
        if pending:
            time.sleep(0.01)
    rejected += pending
    if pending:  # an old call may still be on its way to one of those kept: keep none
        rejected += keep
        keep = []
    rejected += [a for a in keep if a[0] is None]  # settled, but not interchangeable (pinned to a node)
    keep = [a for a in keep if a[0] is not None]
    with _lock:
        _check_job()
        room = max(0, limit - sum(len(v) for v in _pool.values()))
        for name, h in keep[:room]:
            _pool.setdefault(name, []).append(h)
    return rejected + keep[room:]
