"""Scripted network conditions on top of a latency model, and message delivery times.

:func:`delivery_time` is when one message arrives, outages waited out as TCP
would; :func:`delivery_times` is the same for many messages on one link at once
(vectorised; optionally in FIFO order), as the batched simulator sends them.
"""
from __future__ import annotations

import math
import threading
from typing import Sequence

import numpy as np

from .latency import GeoLatencyModel, LatencyModel, ZeroLatency  # noqa: F401 (the doctests use ZeroLatency)

__all__ = ["NetworkConditions", "delivery_time", "delivery_times"]

# ---------------------------------------------------------------------------
# scripted conditions
# ---------------------------------------------------------------------------

class NetworkConditions(LatencyModel):
    """Time-interval overrides on top of a base model (failure injection).

    * :meth:`add_delay`: ``extra_ms`` added on a link during ``[start, end)``;
    * :meth:`cut`: the link is down (``inf``) during ``[start, end)``;
    * :meth:`slow_server`: a CPU slow-down factor the runtime applies to the
      replicas on a server (:meth:`slowdown` reads it; overlapping slow-downs
      take the largest factor);
    * :meth:`restore`: ends the overrides active at a time.

    ``end=None`` means "until restored". Overrides are plain tuples, so the
    object pickles with its base model. Overrides may be added from one thread
    while another pickles the object (a fault injected while a replica is
    started with the conditions): a lock keeps each change whole, and what is
    pickled is a copy taken under it.

    >>> net = NetworkConditions(ZeroLatency(["a", "b"]))
    >>> net.add_delay("a", "b", 5, 10, 40.0)
    >>> net.cut("a", "b", 20, None)
    >>> [net.latency_ms("a", "b", t) for t in (0, 5, 9.9, 10, 20, 30)]
    [0.0, 40.0, 40.0, 0.0, inf, inf]
    >>> net.restore("a", "b", at=25)
    >>> net.latency_ms("b", "a", 30)
    0.0
    >>> net.slow_server("a", 0, 60, 3.0); net.slowdown("a", 30), net.slowdown("a", 60)
    (3.0, 1.0)
    """

    def __init__(self, base: LatencyModel):
        if not isinstance(base, LatencyModel):
            raise TypeError(f"base must be a LatencyModel, got {type(base).__name__}")
        self.base = base
        self._servers = base.servers
        self._index = {s.name: i for i, s in enumerate(self._servers)}
        self.local_ms = base.local_ms
        # (src, dst) -> list of [kind, start, end, extra_ms]; kind "delay" | "cut"
        self._links: dict[tuple[str, str], list[list]] = {}
        # server -> list of [start, end, factor]
        self._slow: dict[str, list[list]] = {}
        self._lock = threading.Lock()  # a leaf lock: held around one change or one copy, nothing inside

    def __getstate__(self) -> dict:
        with self._lock:
            state = {k: v for k, v in self.__dict__.items() if k != "_lock"}
            state["_links"] = {key: [list(ov) for ov in ovs] for key, ovs in self._links.items()}
            state["_slow"] = {key: [list(ov) for ov in ovs] for key, ovs in self._slow.items()}
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # -- installing overrides ----------------------------------------------
    @staticmethod
    def _interval(start, end) -> tuple[float, float]:
        s = float(start)
        e = math.inf if end is None else float(end)
        if math.isnan(s) or math.isnan(e) or e < s:
            raise ValueError(f"need start <= end, got [{start!r}, {end!r})")
        return s, e

    def _known(self, *names: str) -> None:
        if self._index:
            self._check(*names)

    def _add_link(self, kind, a, b, start, end, extra, both):
        if a == b:
            raise ValueError(f"a link needs two different servers, got {a!r} twice")
        self._known(a, b)
        s, e = self._interval(start, end)
        with self._lock:
            for src, dst in ((a, b), (b, a)) if both else ((a, b),):
                self._links.setdefault((src, dst), []).append([kind, s, e, extra])

    def add_delay(self, a: str, b: str, start: float, end: float | None, extra_ms: float,
                  both_directions: bool = True) -> None:
        """Add ``extra_ms`` to the latency of ``a -> b`` (and ``b -> a``) during ``[start, end)``."""
        extra = float(extra_ms)
        if not (extra >= 0 and not math.isnan(extra)):
            raise ValueError(f"extra_ms must be >= 0, got {extra_ms!r}")
        self._add_link("delay", a, b, start, end, extra, both_directions)

    def cut(self, a: str, b: str, start: float, end: float | None, both_directions: bool = True) -> None:
        """Take the link ``a -> b`` (and ``b -> a``) down (latency ``inf``) during ``[start, end)``."""
        self._add_link("cut", a, b, start, end, 0.0, both_directions)

    def slow_server(self, name: str, start: float, end: float | None, factor: float) -> None:
        """Record a CPU slow-down ``factor >= 1`` of server ``name`` during ``[start, end)``."""
        self._known(name)
        f = float(factor)
        if not (f >= 1.0 and math.isfinite(f)):
            raise ValueError(f"factor must be a finite number >= 1, got {factor!r}")
        s, e = self._interval(start, end)
        with self._lock:
            self._slow.setdefault(name, []).append([s, e, f])

    def restore(self, a: str | None = None, b: str | None = None, server: str | None = None,
                *, at: float) -> None:
        """End, at time ``at``, the overrides active at ``at``.

        ``restore(a, b, at=t)``: delays and cuts on the link a-b (both
        directions); ``restore(server=s, at=t)``: the slow-downs of ``s`` and
        the delays and cuts on every link touching ``s``; ``restore(at=t)``:
        everything. Overrides that start after ``at`` are kept.
        """
        t = float(at)
        if (a is None) != (b is None):
            raise ValueError("restore of a link needs both a and b")
        if a is not None and server is not None:
            raise ValueError("give either a and b, or server, not both")

        def links_match(src, dst):
            if a is not None:
                return {src, dst} == {a, b}
            if server is not None:
                return server in (src, dst)
            return True

        with self._lock:
            for (src, dst), ovs in self._links.items():
                if links_match(src, dst):
                    for ov in ovs:
                        if ov[1] <= t < ov[2]:
                            ov[2] = t
            if a is None:
                for name, ovs in self._slow.items():
                    if server is None or name == server:
                        for ov in ovs:
                            if ov[0] <= t < ov[1]:
                                ov[1] = t

    # -- reading -----------------------------------------------------------
    def overrides(self) -> list[tuple]:
        """All overrides as plain tuples ``(kind, src_or_server, dst_or_None, start, end, value)``."""
        with self._lock:
            out = [(k, src, dst, s, e, x) for (src, dst), ovs in self._links.items() for k, s, e, x in ovs]
            out += [("slow", name, None, s, e, f) for name, ovs in self._slow.items() for s, e, f in ovs]
        return out

    def slowdown(self, name: str, t: float) -> float:
        """CPU slow-down factor of server ``name`` at ``t`` (1.0 normally)."""
        f = 1.0
        for s, e, x in self._slow.get(name, ()):
            if s <= t < e and x > f:
                f = x
        return f

    def _adjust(self, a: str, b: str, t: float, lat: float) -> float:
        for kind, s, e, x in self._links.get((a, b), ()):
            if s <= t < e:
                if kind == "cut":
                    return math.inf
                lat += x
        return lat

    def latency_ms(self, a: str, b: str, t: float) -> float:
        return self._adjust(a, b, t, self.base.latency_ms(a, b, t))

    def latencies_ms(self, a: str, b: str, t) -> np.ndarray:
        """As the base model's while nothing is scripted, else point by point."""
        if not self._links and not self._slow:
            return self.base.latencies_ms(a, b, t)
        return super().latencies_ms(a, b, t)

    def link_latencies_ms(self, pairs, times) -> list[np.ndarray]:
        if not self._links and not self._slow:
            return self.base.link_latencies_ms(pairs, times)
        return super().link_latencies_ms(pairs, times)

    def matrix(self, names: Sequence[str] | None = None, t: float = 0.0) -> np.ndarray:
        names = self.names if names is None else list(names)
        m = np.array(self.base.matrix(names, t), dtype=np.float64)
        pos = {n: i for i, n in enumerate(names)}
        with self._lock:
            links = list(self._links)
        for (a, b) in links:
            if a in pos and b in pos:
                m[pos[a], pos[b]] = self._adjust(a, b, t, float(m[pos[a], pos[b]]))
        return m

    def __repr__(self) -> str:
        return f"NetworkConditions({self.base!r}, {len(self.overrides())} overrides)"


# ---------------------------------------------------------------------------
# delivery
# ---------------------------------------------------------------------------

def delivery_time(model: LatencyModel, a: str, b: str, t_send: float, *, resolution: float = 1.0,
                  horizon: float = 3600.0, tol: float = 1e-4) -> float:
    """Time (s) at which a message sent from ``a`` to ``b`` at ``t_send`` arrives.

    Normally ``t_send + latency_ms(a, b, t_send) / 1000``. If the link is
    down at ``t_send`` (latency ``inf``: outage or cut), the sender's TCP
    keeps retransmitting and the message gets through once the link is back:
    this function probes forward every ``resolution`` seconds up to
    ``horizon`` seconds, refines the first time the link is up again ``t_up``
    by bisection to within ``tol`` seconds (``t_up`` is never earlier than
    the true restoration), and returns ``t_up + latency_ms(a, b, t_up) / 1000``;
    ``math.inf`` if the link stays down for the whole horizon (the runtime
    should treat that as a lost channel). Simplifications: retransmission
    back-off is ignored (delivery right at restoration), an outage shorter
    than ``resolution`` that starts and ends between two probes is not seen,
    and FIFO order across messages is the caller's job (deliver at
    ``max(previous delivery, delivery_time(...))``).

    >>> net = NetworkConditions(ZeroLatency(["a", "b"]))
    >>> net.add_delay("a", "b", 0, None, 50.0); net.cut("a", "b", 10, 12.5)
    >>> delivery_time(net, "a", "b", 1.0)
    1.05
    >>> round(delivery_time(net, "a", "b", 10.2), 3)
    12.55
    >>> net.cut("a", "b", 100, None); delivery_time(net, "a", "b", 100.0)
    inf
    """
    if not (resolution > 0 and horizon >= 0 and tol > 0):
        raise ValueError("resolution and tol must be > 0 and horizon >= 0")
    t_send = float(t_send)
    lat = model.latency_ms(a, b, t_send)
    if math.isfinite(lat):
        return t_send + lat / 1000.0
    lo = t_send
    steps = int(math.ceil(horizon / resolution))
    for k in range(1, steps + 1):
        hi = t_send + min(k * resolution, horizon)
        lat = model.latency_ms(a, b, hi)
        if math.isfinite(lat):
            while hi - lo > tol:
                mid = 0.5 * (lo + hi)
                if math.isfinite(model.latency_ms(a, b, mid)):
                    hi = mid
                else:
                    lo = mid
            return hi + model.latency_ms(a, b, hi) / 1000.0
        lo = hi
    return math.inf


def delivery_times(model: LatencyModel, a: str, b: str, t_send, *, after: float | None = None,
                   latencies_ms=None, resolution: float = 1.0, horizon: float = 3600.0,
                   tol: float = 1e-4) -> np.ndarray:
    """:func:`delivery_time` of many messages sent from ``a`` to ``b`` at times ``t_send``
    (sorted), vectorised: equal to it message by message.

    ``t_send + latency / 1000`` from one vectorised evaluation of the model
    (:meth:`~replistream.network.LatencyModel.latencies_ms`; or ``latencies_ms``,
    when the caller has evaluated them already, e.g. for many links at once with
    ``link_latencies_ms``). Messages sent while the link is down wait as
    :func:`delivery_time` makes them wait, with the same probes and bisection, so
    the times are the same: for a :class:`~replistream.network.GeoLatencyModel`
    (alone, or under conditions that script nothing) the first probe at which the
    link is up again comes from the outage's end (``model.outage``) and the
    bisection runs on all messages at once, taking the link to be up from the
    outage's end on (a second outage starting less than ``resolution`` later would
    be missed, as the probes would miss it); other models go through
    :func:`delivery_time` one message at a time. ``inf`` where a message cannot
    be delivered within ``horizon``.

    With ``after`` (the arrival of the previous message on a FIFO link, ``-inf``
    for none), each time is ``max(previous arrival, delivery_time(...))``, as a
    FIFO link delivers them; an ``inf`` then marks every later message too.

    >>> net = NetworkConditions(ZeroLatency(["a", "b"])); net.add_delay("a", "b", 0, None, 50.0)
    >>> net.cut("a", "b", 10, 12.5)
    >>> delivery_times(net, "a", "b", [1.0, 10.2, 11.0, 13.0]).round(3).tolist()
    [1.05, 12.55, 12.55, 13.05]
    >>> delivery_times(net, "a", "b", [1.0, 13.0], after=5.0).tolist()
    [5.0, 13.05]
    """
    if not (resolution > 0 and horizon >= 0 and tol > 0):
        raise ValueError("resolution and tol must be > 0 and horizon >= 0")
    t = np.asarray(t_send, dtype=np.float64)
    if not len(t):
        return t.copy()
    lat = model.latencies_ms(a, b, t) if latencies_ms is None else np.asarray(latencies_ms, dtype=np.float64)
    if lat.shape != t.shape:
        raise ValueError(f"latencies_ms has {lat.shape} values for {t.shape} send times")
    at = t + lat / 1000.0
    bad = ~np.isfinite(at)
    if bad.any():
        at[bad] = _after_outage(model, a, b, t[bad], resolution, horizon, tol)
    if after is not None:
        at = np.maximum.accumulate(np.maximum(at, after))
    return at


def _after_outage(model: LatencyModel, a: str, b: str, t: np.ndarray, resolution: float, horizon: float,
                  tol: float) -> np.ndarray:
    """:func:`delivery_time` for messages sent while the link is down (see :func:`delivery_times`)."""
    if isinstance(model, NetworkConditions) and not model.overrides():
        model = model.base
    if type(model) is not GeoLatencyModel:
        return np.array([delivery_time(model, a, b, float(x), resolution=resolution, horizon=horizon, tol=tol)
                         for x in t])
    out = np.empty(len(t))
    end = np.empty(len(t))
    for i, x in enumerate(t.tolist()):
        ev = model.outage(a, b, x)
        end[i] = math.inf if ev is None else ev[1]
    k = np.maximum(1, np.ceil((end - t) / resolution))
    k = np.where(t + np.minimum(k * resolution, horizon) < end, k + 1, k)
    k = np.where((k > 1) & (t + np.minimum((k - 1) * resolution, horizon) >= end), k - 1, k)
    hi = t + np.minimum(k * resolution, horizon)
    lo = np.where(k > 1, t + np.minimum((k - 1) * resolution, horizon), t)
    ok = np.isfinite(end) & (k * resolution <= horizon + resolution) & np.isfinite(model.latencies_ms(a, b, hi))
    ok &= (k == 1) | ~np.isfinite(model.latencies_ms(a, b, lo))
    while True:  # delivery_time's bisection; between lo (down) and hi (up) the link is up from ``end`` on
        act = ok & (hi - lo > tol)
        if not act.any():
            break
        mid = 0.5 * (lo + hi)
        up = mid >= end
        hi = np.where(act & up, mid, hi)
        lo = np.where(act & ~up, mid, lo)
    out[ok] = hi[ok] + model.latencies_ms(a, b, hi[ok]) / 1000.0
    for i in np.flatnonzero(~ok).tolist():
        out[i] = delivery_time(model, a, b, float(t[i]), resolution=resolution, horizon=horizon, tol=tol)
    return out
