"""Python's cyclic garbage collector in a data-path process: its pauses, measured, and kept short
(issue #42 point 1).

A collection stops the whole process (every thread waits on the GIL): a full one walks every
container object the process holds. A Ray worker that imported the data-path actors holds about
68,000, and one full collection of them took 32 ms here (``python bench/steady.py
--collect-cost``; under other load). Python starts one rarely on its own, but Ray's core worker
asks every worker for one every ten minutes (``local_gc_interval_s``) and whenever the object
store is 70% full: a latency spike with no fault and no move. So each data-path actor

* **measures** every collection (:class:`GcWatch`, a ``gc.callbacks`` hook: count, total and
  longest pause per generation, and the pauses of the last minute with their wall times), reported
  in the actor's ``stats()["gc"]``;
* **freezes** what it has built once it is set up and after each state install
  (:func:`settle`: ``gc.freeze()`` moves every object alive now into a permanent generation no
  collection walks again; the operator's state lives in numpy arrays, so what is frozen is mostly
  code, modules and Ray's own objects). Frozen objects are still freed by reference counting;
  a reference cycle among them would stay until the process exits, so the set-up collects once
  before it freezes (no data flows yet), and a pooled actor puts its earlier life's objects back
  under the collector (:func:`thaw`) before it drops them;
* **collects young objects less often** (:data:`THRESHOLDS`): a batch makes a few hundred
  containers, so the default (a young collection every 700 net new containers) ran several per
  batch.

>>> w = GcWatch()
>>> w.install()
>>> import gc; _ = gc.collect(0)
>>> w.stats()["collections"][0] >= 1
True
>>> w.uninstall()
"""
from __future__ import annotations

import gc
import os
import time
from collections import deque

__all__ = ["GcWatch", "THRESHOLDS", "freezes", "settle", "thaw", "watch"]

#: ``gc.set_threshold`` of a data-path process: young collections after 50,000 net new containers
#: (default 700), the older generations as by default (every 10th collection of the one below).
THRESHOLDS = (50_000, 10, 10)

#: Seconds of recent pauses :meth:`GcWatch.stats` lists, and the shortest pause it keeps (ms).
RECENT_S = 300.0
RECENT_MIN_MS = 1.0

#: ``REPLISTREAM_GC=default`` in the environment (inherited by Ray's workers) leaves the
#: collector as Python sets it, still measured: the "before" of a comparison (bench/steady.py).
ENV = "REPLISTREAM_GC"


class GcWatch:
    """Every collection of this process: per generation, how many, their total and longest pause
    (milliseconds), and the recent ones of :data:`RECENT_MIN_MS` or more as ``(wall time,
    generation, ms)``.

    >>> w = GcWatch(); w.install()
    >>> import gc; _ = gc.collect()
    >>> s = w.stats(); s["collections"][2] >= 1 and s["max_ms"][2] >= 0
    True
    >>> w.uninstall()
    """

    def __init__(self, recent: int = 4096):
        self.count = [0, 0, 0]
        self.total = [0.0, 0.0, 0.0]
        self.longest = [0.0, 0.0, 0.0]
        self.recent: deque = deque(maxlen=recent)
        self._started: float | None = None

    def _callback(self, phase: str, info: dict) -> None:
        # called by the interpreter around each collection, on the thread that triggered it
        if phase == "start":
            self._started = time.perf_counter()
            return
        if self._started is None:
            return
        ms = (time.perf_counter() - self._started) * 1e3
        self._started = None
        g = int(info.get("generation", 2))
        self.count[g] += 1
        self.total[g] += ms
        if ms > self.longest[g]:
            self.longest[g] = ms
        if ms >= RECENT_MIN_MS:
            self.recent.append((time.time(), g, ms))

    def install(self) -> None:
        """Start measuring (idempotent)."""
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        """Stop measuring."""
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def stats(self) -> dict:
        """``{"collections": [n0, n1, n2], "total_ms": [...], "max_ms": [...], "recent": [(wall,
        gen, ms), ...] (pauses of a millisecond or more, the last five minutes), "tuned": whether
        :data:`THRESHOLDS` and freezing apply, "frozen": objects in the permanent generation,
        "thresholds": gc.get_threshold(), "thaws": {"thawed": n, "kept": n}}`` (:data:`THAWS`)."""
        cut = time.time() - RECENT_S
        recent = [r for r in list(self.recent) if r[0] >= cut]  # (list(): one step under the GIL)
        return {"collections": list(self.count), "total_ms": [round(t, 3) for t in self.total],
                "max_ms": [round(t, 3) for t in self.longest], "recent": recent, "tuned": tuned(),
                "frozen": gc.get_freeze_count(), "thresholds": list(gc.get_threshold()), "thaws": dict(THAWS)}


_WATCH: list[GcWatch] = []
#: Set-ups of this process after a pooled life: how many thawed the frozen generation, how many
#: kept it frozen (:func:`thaw`'s ``since``: a spare never fed); in :meth:`GcWatch.stats`.
THAWS = {"thawed": 0, "kept": 0}
_FREEZES = [0]  # settle()'s freezes in this process (freezes())


def tuned() -> bool:
    """Whether this process tunes its collector (not when ``REPLISTREAM_GC=default``).

    >>> tuned() in (True, False)
    True
    """
    return os.environ.get(ENV, "").strip().lower() != "default"


def watch() -> GcWatch:
    """This process's watch, installed on first use, with :data:`THRESHOLDS` set (a data-path
    actor calls it as it is set up; a pooled process keeps its one watch across lives).

    >>> watch() is watch()
    True
    """
    if not _WATCH:
        w = GcWatch()
        w.install()
        if tuned():
            gc.set_threshold(*THRESHOLDS)
        _WATCH.append(w)
    return _WATCH[0]


def settle(collect: bool = False) -> None:
    """Freeze every object alive now (``gc.freeze()``, microseconds), after one full collection
    with ``collect`` (an actor's set-up, before any data flows: so that no garbage, reference
    cycles included, is frozen for good): called when a data-path actor is set up and after it
    installs a state, so later collections walk only what was made since. An install does not
    collect: a full collection there would itself be the pause this avoids.

    >>> settle(collect=True); import gc; gc.get_freeze_count() > 0
    True
    >>> _ = thaw()
    """
    if tuned():
        if collect:
            gc.collect()
        gc.freeze()
        _FREEZES[0] += 1


def thaw(since: int | None = None) -> bool:
    """Put every frozen object back under the collector (``gc.unfreeze()``): a pooled actor does it
    before it drops its earlier life's attributes (``reinit``), so the state of that life, frozen
    at its install, is collected like any garbage instead of staying in the process for good.
    Returns whether it thawed.

    ``since``: :func:`freezes` right after the earlier life's set-up. If this process froze nothing
    since (a warm spare taken by a running deployment: set up, never fed, no state installed),
    nothing of that life is frozen to give back, and it does not thaw: the next set-up's full
    collection then walks only what was made since, not every module's and Ray's objects again.
    That collection pauses the whole process (about 150 ms of py-spy samples on this machine's
    loaded cores for the spare a fluid move took, competing for the cores with the replica that
    serves; docs/migration.md).

    >>> import gc; gc.freeze(); _ = thaw(); gc.get_freeze_count()
    0
    >>> n = freezes(); thaw(since=n)
    False
    >>> settle(); thaw(since=n)
    True
    """
    if since is not None and _FREEZES[0] == since:
        THAWS["kept"] += 1
        return False
    gc.unfreeze()
    THAWS["thawed"] += 1
    return True


def freezes() -> int:
    """How many times :func:`settle` froze in this process: what a set-up records for
    :func:`thaw`'s ``since`` (the permanent generation's size is no witness: it shrinks as frozen
    objects are freed by reference counting).

    >>> n = freezes(); settle(); freezes() == n + (1 if tuned() else 0)
    True
    >>> _ = thaw()
    """
    return _FREEZES[0]
