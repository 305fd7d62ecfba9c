"""Per-replica and per-application metrics through Ray's metrics API (issue #43).

Every data-path actor (:mod:`.actors`) carries a :class:`ReplicaMetrics`; a thread of its own
(:func:`start`) reads the actor's cumulative counters every :data:`EXPORT_EVERY_S` seconds, under
the actor's lock for a moment, and adds what changed to Ray metrics (``ray.util.metrics``), so
Ray's Prometheus endpoint carries them, prefixed ``ray_`` by Ray, tagged ``replica`` (label),
``operator`` (``entry`` for entry points, the application's name for an application) and
``server``:

* ``replistream_tuples_in`` (counter): tuples that passed the replica's duplicate filters into its
  logic (an entry replica: rows it read);
* ``replistream_tuples_out`` (counter): tuples its logic emitted (an application: tuples delivered);
* ``replistream_duplicates_dropped`` (counter): copies its duplicate filters dropped;
* ``replistream_dead_letters`` (counter): tuples it set aside (late, malformed, a user function raised);
* ``replistream_latency_ms_bucket`` (counter, tag ``le``), ``replistream_latency_ms_count``,
  ``replistream_latency_ms_sum`` (counters), per application: the end-to-end latency of the
  tuples it delivered (paced runs only: arrival minus the tuple's time on the feeder's clock, as
  ``Deployment.latencies_ms``), as cumulative buckets in Prometheus's histogram layout
  (``histogram_quantile(0.99, rate(ray_replistream_latency_ms_bucket_total[1m]))``). Buckets
  are counted per delivered batch with numpy (:meth:`ReplicaMetrics.observe`): Ray's
  ``Histogram.observe`` takes one value per call, which the data path cannot afford per tuple.

Nothing here runs per tuple; the data path's only cost is :meth:`ReplicaMetrics.observe` per
application batch. Where Ray runs no metrics agent (Ray installed without ``ray[default]``) the
metrics are recorded and go nowhere.

>>> m = ReplicaMetrics("join#0", "join", "tokyo", factory=FakeMetrics)
>>> m.export({"tuples_in": 10, "tuples_out": 4, "duplicates": 10, "dead_letters": 0})
>>> m.export({"tuples_in": 15, "tuples_out": 4, "duplicates": 12, "dead_letters": 1})
>>> FakeMetrics.totals["replistream_tuples_in"], FakeMetrics.totals["replistream_duplicates_dropped"]
(15.0, 12.0)
"""
from __future__ import annotations

import logging
import threading
import time

import numpy as np

__all__ = ["ReplicaMetrics", "start", "counters_of", "latencies_ms", "EXPORT_EVERY_S", "LATENCY_BOUNDS_MS",
           "FakeMetrics"]

#: Seconds between two exports of an actor's counters.
EXPORT_EVERY_S = 2.0
#: Upper bounds (ms) of the latency buckets (then ``+Inf``).
LATENCY_BOUNDS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 30000, 60000)

_COUNTERS = {"tuples_in": "replistream_tuples_in", "tuples_out": "replistream_tuples_out",
             "duplicates": "replistream_duplicates_dropped", "dead_letters": "replistream_dead_letters"}
_DESCRIPTIONS = {
    "replistream_tuples_in": "tuples that passed the replica's duplicate filters (entry: rows read)",
    "replistream_tuples_out": "tuples the replica's logic emitted (application: delivered)",
    "replistream_duplicates_dropped": "copies the replica's duplicate filters dropped",
    "replistream_dead_letters": "tuples the replica set aside",
    "replistream_latency_ms_bucket": "delivered tuples with end-to-end latency <= le ms (paced runs)",
    "replistream_latency_ms_count": "delivered tuples with a measured end-to-end latency",
    "replistream_latency_ms_sum": "sum of the end-to-end latencies (ms) of those tuples",
}
_TAGS = ("replica", "operator", "server")

_objects: dict = {}
_objects_lock = threading.Lock()


def _ray_counter(name: str, tag_keys: tuple):
    from ray.util.metrics import Counter

    return Counter(name, _DESCRIPTIONS.get(name, name), tag_keys=tag_keys)


def _metric(factory, name: str, tag_keys: tuple = _TAGS):
    """One metric object per (factory, name) in this process (Ray refuses none, but keeps one)."""
    key = (factory, name)
    with _objects_lock:
        m = _objects.get(key)
        if m is None:
            m = _objects[key] = factory(name, tag_keys)
        return m


class FakeMetrics:
    """A stand-in for ``ray.util.metrics.Counter`` (tests, doctests): sums every ``inc`` by name in
    :attr:`totals` and by (name, tags) in :attr:`by_tags`."""

    totals: dict = {}
    by_tags: dict = {}

    def __init__(self, name: str, tag_keys: tuple):
        self.name, self.tag_keys = name, tag_keys

    def inc(self, value: float = 1.0, tags: dict | None = None) -> None:
        FakeMetrics.totals[self.name] = FakeMetrics.totals.get(self.name, 0.0) + float(value)
        key = (self.name, tuple(sorted((tags or {}).items())))
        FakeMetrics.by_tags[key] = FakeMetrics.by_tags.get(key, 0.0) + float(value)


class ReplicaMetrics:
    """The metrics of one actor: its tags, the counts exported so far, and the latency buckets
    counted since the last export. ``factory(name, tag_keys)`` makes a counter (default: Ray's).

    >>> m = ReplicaMetrics("out", "out", "boston", factory=FakeMetrics)
    >>> m.observe(np.array([0.5, 3.0, 3.5, 70000.0]))
    >>> m.export({})
    >>> FakeMetrics.by_tags[("replistream_latency_ms_bucket", (("application", "out"), ("le", "5")))]
    3.0
    """

    def __init__(self, label: str, operator: str, server: str, factory=None):
        self.tags = {"replica": str(label), "operator": str(operator), "server": str(server)}
        self.factory = factory or _ray_counter
        self.sent = {k: 0 for k in _COUNTERS}
        self.source = None  # what the counts were read from (a core, entry points): a new one is a baseline
        self.exported: dict[str, float] = {}  # metric name -> total this object added (all tags)
        self.errors = 0  # exports that raised (logged once per kind of error)
        self.error_kinds: set = set()
        self.buckets = np.zeros(len(LATENCY_BOUNDS_MS) + 1, dtype=np.int64)  # since the last export
        self.lat_sum = 0.0
        self.last = time.time()

    def _inc(self, name: str, tag_keys: tuple, value: float, tags: dict) -> None:
        _metric(self.factory, name, tag_keys).inc(value, tags=tags)
        self.exported[name] = self.exported.get(name, 0.0) + float(value)

    def observe(self, latencies_ms: np.ndarray) -> None:
        """Count one delivered batch's latencies (ms) into the buckets (numpy, no per-tuple call)."""
        if len(latencies_ms):
            idx = np.searchsorted(np.asarray(LATENCY_BOUNDS_MS, dtype=float), latencies_ms, side="left")
            self.buckets += np.bincount(idx, minlength=len(self.buckets))
            self.lat_sum += float(np.sum(latencies_ms))

    def export(self, counts: dict, source=None) -> None:
        """Add to the Ray counters what grew since the last export. ``counts``: cumulative
        ``{tuples_in, tuples_out, duplicates, dead_letters}`` of the actor (missing keys: not
        exported), read from ``source`` (its core, its entry points): counts read from a new source
        (a state installed from a peer carries the peer's counts) are a baseline, not exported."""
        if source is not None and source != self.source:
            self.source = source
            self.sent.update({k: int(v) for k, v in counts.items() if k in self.sent})
            counts = {}
        for key, name in _COUNTERS.items():
            if key not in counts:
                continue
            now = int(counts[key])
            delta = now - self.sent[key] if now >= self.sent[key] else now
            if delta > 0:
                self._inc(name, _TAGS, delta, self.tags)
            self.sent[key] = now
        if self.buckets.any():
            app = {"application": self.tags["operator"]}
            cum = np.cumsum(self.buckets)
            for bound, c in zip([*(str(b) for b in LATENCY_BOUNDS_MS), "+Inf"], cum):
                if c:
                    self._inc("replistream_latency_ms_bucket", ("application", "le"), int(c), {**app, "le": bound})
            self._inc("replistream_latency_ms_count", ("application",), int(cum[-1]), app)
            if self.lat_sum > 0:
                self._inc("replistream_latency_ms_sum", ("application",), self.lat_sum, app)
            self.buckets[:] = 0
            self.lat_sum = 0.0
        self.last = time.time()


def counters_of(actor) -> tuple[dict, object]:
    """The cumulative counters of a data-path actor (the caller holds its lock): ``{tuples_in,
    tuples_out, duplicates, dead_letters}``, from its core (operator replica, application) or its
    entry points, and what they were read from; ({}, None) while it has none (a replica waiting
    for its state).

    >>> counters_of(object())
    ({}, None)
    """
    core = getattr(actor, "core", None)
    if core is not None:
        st = core.logic.stats()
        return {"tuples_in": st["tuples_in"], "tuples_out": st["tuples_out"],
                "duplicates": sum(f.duplicates for f in core.filters or ()),
                "dead_letters": sum(d.count for d in core.dead_letters())}, ("core", id(core))
    entries = getattr(actor, "entries", None)
    if entries:
        out = sum(e.tuples_out for e in entries.values())
        dead = sum(d.count for e in entries.values() for d in e.dead_letters)
        return ({"tuples_in": out + dead, "tuples_out": out, "duplicates": 0, "dead_letters": dead},
                ("entries", tuple(id(e) for e in entries.values())))
    return {}, None


def latencies_ms(actor, batch: np.ndarray, now: float) -> np.ndarray | None:
    """End-to-end latencies (ms) of ``batch`` delivered at wall time ``now`` by application
    ``actor`` (the feeder's clock, ``set_clock``), or None on an unpaced run.

    >>> from types import SimpleNamespace
    >>> app = SimpleNamespace(t0=100.0, ts0=0, pace=1.0)
    >>> latencies_ms(app, np.array([(1_000_000,)], dtype=[("ts", "i8")]), now=101.25).tolist()
    [250.0]
    """
    pace, ts0 = getattr(actor, "pace", None), getattr(actor, "ts0", None)
    if not pace or ts0 is None:
        return None
    return (now - (actor.t0 + (batch["ts"] - ts0) / (1e6 * pace))) * 1000.0


def start(actor, operator: str) -> ReplicaMetrics:
    """Give ``actor`` (set up by ``_Base._setup``, with a ``lock``) its :class:`ReplicaMetrics` and a
    daemon thread exporting its counters every :data:`EXPORT_EVERY_S` s while it is the actor's
    current one (a re-initialised actor gets a new one; the old thread ends).

    >>> metrics_export.start(self, "join")     # doctest: +SKIP
    """
    m = ReplicaMetrics(actor.label, operator, actor.server)
    m.export(*counters_of(actor))  # the baseline: what the actor starts with
    actor.metrics_export = m

    def loop():
        while getattr(actor, "metrics_export", None) is m:
            time.sleep(EXPORT_EVERY_S)
            lock = getattr(actor, "lock", None)
            if lock is None or getattr(actor, "quiet", False):
                continue
            try:
                with lock:  # observe() runs under it too
                    m.export(*counters_of(actor))
            except Exception as e:  # noqa: BLE001 - monitoring never takes a replica down: logged, tried again
                m.errors += 1
                if type(e).__name__ not in m.error_kinds:
                    m.error_kinds.add(type(e).__name__)
                    logging.getLogger("replistream.metrics").warning(
                        "%s: exporting its metrics raised %s: %s (tried again every %g s)", actor.label,
                        type(e).__name__, e, EXPORT_EVERY_S)

    threading.Thread(target=loop, daemon=True, name="replistream-metrics").start()
    return m
