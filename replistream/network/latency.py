"""Latency models: one-way latency between servers over time (docs/design.md, decision 5).

* :class:`LatencyModel`: the interface (``latency_ms(a, b, t)``; ``latencies_ms`` over
  many send times; ``link_latencies_ms`` over many links; ``matrix`` at one time);
* :class:`ZeroLatency`: no network;
* :class:`GeoLatencyModel`: real coordinates plus seeded, time-varying noise; its
  formula is written once and evaluated on floats or numpy arrays;
* :class:`TraceLatencyModel`: a recorded trace; :func:`to_csv` writes one.
"""
from __future__ import annotations

import bisect
import csv
import hashlib
import math
import os
from typing import Iterable, Mapping, Sequence

import numpy as np

from .servers import LOCAL_MS, FIBRE_KM_PER_MS, Server, as_servers, default_servers, haversine_km  # noqa: F401 (doctests)

__all__ = ["LatencyModel", "ZeroLatency", "GeoLatencyModel", "TraceLatencyModel", "to_csv", "TRACE_HEADER"]

# ---------------------------------------------------------------------------
# counter-based deterministic randomness
# ---------------------------------------------------------------------------
# Every random quantity is a pure function of (seed, component, pair, time
# index, draw index), computed with the splitmix64 finaliser. No generator
# state is carried between calls, so values never depend on call order, and
# names are hashed with blake2b (Python's own str hash is salted per process).

_M64 = 0xFFFFFFFFFFFFFFFF
_GOLDEN = 0x9E3779B97F4A7C15
_C1 = 0xBF58476D1CE4E5B9
_C2 = 0x94D049BB133111EB
_INV53 = 2.0 ** -53

#: Tags of the independent draws of a link's latency parts (the look-ahead in replistream/sim/lookahead.py draws them too).
TAG_INFLATION, TAG_JITTER, TAG_SPIKE, TAG_OUTAGE = 1, 2, 3, 4


def _sm(x: int) -> int:
    z = (x + _GOLDEN) & _M64
    z = ((z ^ (z >> 30)) * _C1) & _M64
    z = ((z ^ (z >> 27)) * _C2) & _M64
    return z ^ (z >> 31)


def _sm_np(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x + np.uint64(_GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_C1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_C2)
        return z ^ (z >> np.uint64(31))


def _hash(*vals: int) -> int:
    h = 0
    for v in vals:
        h = _sm(h ^ (int(v) & _M64))
    return h


def _name_id(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest(), "little")


def _draw(prefix: int, index: int, j: int) -> float:
    """Uniform [0, 1) for (prefix, time index, draw j)."""
    return (_sm(_sm(prefix ^ (index & _M64)) ^ j) >> 11) * _INV53


def draw_np(prefix, index, j: int) -> np.ndarray:
    """:func:`_draw` for arrays of prefixes and/or time indices: uniform draws in [0, 1), the same
    for the same (prefix, index, j) in every process (the batched simulator's look-ahead bounds
    links with it, replistream/sim/lookahead.py).

    >>> a = draw_np(np.uint64(7), np.arange(3), 0); bool(((a >= 0) & (a < 1)).all())
    True
    >>> bool((draw_np(np.uint64(7), np.arange(3), 0) == a).all())
    True
    """
    h = _sm_np(_sm_np(np.asarray(prefix, dtype=np.uint64) ^ np.asarray(index).astype(np.uint64)) ^ np.uint64(j))
    return (h >> np.uint64(11)).astype(np.float64) * _INV53

class _Ops:
    """The functions a latency formula needs, for floats or for numpy arrays."""

    def __init__(self, maximum, minimum, log1p, cos, exp):
        self.maximum, self.minimum, self.log1p, self.cos, self.exp = maximum, minimum, log1p, cos, exp


_SCALAR = _Ops(max, min, math.log1p, math.cos, math.exp)
#: The latency formula's functions for numpy arrays (with :func:`draw_np`, what replistream/sim/lookahead.py bounds links with).
ARRAY_OPS = _Ops(np.maximum, np.minimum, np.log1p, np.cos, np.exp)


class LatencyModel:
    """One-way latencies between named servers over time.

    Subclasses implement :meth:`latency_ms`; :meth:`matrix` has a generic
    implementation that subclasses may vectorise. Times are seconds since the
    start of the run; latencies are milliseconds; ``math.inf`` means the link
    is down (outage or cut).

    >>> m = ZeroLatency(["a", "b"])
    >>> m.names, m.latency_ms("a", "b", 3.0)
    (['a', 'b'], 0.0)
    """

    local_ms: float = LOCAL_MS

    def __init__(self, servers: Iterable[Server | str] = (), local_ms: float = LOCAL_MS):
        self._servers = as_servers(servers)
        self._index = {s.name: i for i, s in enumerate(self._servers)}
        self.local_ms = float(local_ms)

    @property
    def servers(self) -> list[Server]:
        """The servers this model knows, in order."""
        return list(self._servers)

    @property
    def names(self) -> list[str]:
        """The names of :attr:`servers`, in order."""
        return [s.name for s in self._servers]

    def __contains__(self, name: str) -> bool:
        return name in self._index

    def _check(self, *names: str) -> None:
        for n in names:
            if n not in self._index:
                raise KeyError(f"unknown server {n!r} (known: {', '.join(self.names[:10])}"
                               f"{', ...' if len(self._index) > 10 else ''})")

    def latency_ms(self, a: str, b: str, t: float) -> float:
        """One-way latency in ms of a message sent from ``a`` to ``b`` at time ``t`` (s)."""
        raise NotImplementedError

    def latencies_ms(self, a: str, b: str, t) -> np.ndarray:
        """:meth:`latency_ms` of link ``a -> b`` for every send time in ``t`` (models vectorise it).

        >>> ZeroLatency(["a", "b"]).latencies_ms("a", "b", [0.0, 1.0]).tolist()
        [0.0, 0.0]
        """
        t = np.asarray(t, dtype=np.float64)
        return np.fromiter((self.latency_ms(a, b, float(x)) for x in t), dtype=np.float64, count=len(t))

    def link_latencies_ms(self, pairs: Sequence[tuple[str, str]], times: Sequence[np.ndarray]) -> list[np.ndarray]:
        """:meth:`latencies_ms` of several links, ``times[k]`` on ``pairs[k]`` (models evaluate them at once)."""
        return [self.latencies_ms(a, b, t) for (a, b), t in zip(pairs, times)]

    def matrix(self, names: Sequence[str] | None = None, t: float = 0.0) -> np.ndarray:
        """``M[i, j] = latency_ms(names[i], names[j], t)`` for all pairs (default: all servers)."""
        names = self.names if names is None else list(names)
        n = len(names)
        out = np.empty((n, n), dtype=np.float64)
        for i, a in enumerate(names):
            for j, b in enumerate(names):
                out[i, j] = self.latency_ms(a, b, t)
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self._servers)} servers)"


class ZeroLatency(LatencyModel):
    """No network delay at all, ever (throughput runs).

    >>> ZeroLatency(default_servers(3)).matrix().tolist()
    [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    """

    def __init__(self, servers_or_names: Iterable[Server | str] = ()):
        super().__init__(servers_or_names, local_ms=0.0)

    def latency_ms(self, a: str, b: str, t: float) -> float:
        return 0.0

    def latencies_ms(self, a: str, b: str, t) -> np.ndarray:
        self._check(a, b)
        return np.zeros(len(np.asarray(t)))

    def matrix(self, names: Sequence[str] | None = None, t: float = 0.0) -> np.ndarray:
        n = len(self.names if names is None else list(names))
        return np.zeros((n, n))


def _knob(value, default: float, what: str) -> float:
    """``True`` -> default, ``False``/``None``/0 -> off (0.0), a number -> that number."""
    if value is True:
        return float(default)
    if value is False or value is None:
        return 0.0
    v = float(value)
    if not (v >= 0 and math.isfinite(v)):
        raise ValueError(f"{what} must be True, False or a finite number >= 0, got {value!r}")
    return v


class GeoLatencyModel(LatencyModel):
    """Latency from real coordinates plus seeded, time-varying noise.

    One-way latency from ``a`` to ``b`` at time ``t`` (ms)::

        base(a, b)  = overhead_ms + distance_km / km_per_ms * inflation(a, b)   (symmetric)
        latency     = base + jitter + congestion + spikes,  or inf during an outage

    Components and the measurements behind their defaults (what is an
    assumption is said so):

    * **propagation**: haversine great-circle distance at ``km_per_ms=200``
      (light in fibre, refractive index ~1.47, i.e. ~4.9 us/km).
    * **route inflation**: a factor per unordered pair drawn once in
      ``inflation=(1.2, 2.5)`` with a triangular density falling from the low
      end (mean ~1.63, median ~1.58). Internet paths are typically 1.5-2x
      longer in delay than the great-circle fibre path (indirect routes,
      peering points); the exact shape is an assumption.
    * **overhead**: ``overhead_ms=2.0`` for access links, routers and the
      host stack (assumption, order of magnitude of a LAN/last-mile hop).
    * **jitter** (``jitter=0.03``): per direction and per ``step_s=1`` second,
      exponential with mean ``max(jitter_min_ms, jitter * base)``; queueing
      only adds delay, so jitter is never negative (assumption).
    * **diurnal congestion** (``congestion=0.2``): up to ``congestion * base``
      extra, the mean over both endpoints of a raised cosine of local solar
      time (longitude / 15 h) peaking at ``busy_hour=21`` (the evening busy
      hour of residential traffic). ``start_utc_hour`` is the UTC hour at
      ``t = 0`` (assumption: amplitude).
    * **spikes** (``spikes=1/600`` per second per direction): rare episodes of
      ``spike_duration=(1, 10)`` s adding a Pareto(``spike_alpha=1.5``,
      scale ``spike_scale_ms=20``) delay, capped at ``spike_max_ms``. PlanetLab
      all-pairs pings (the trace behind Hwang et al. §VI-A, 100 servers every
      10 s for a month) show such heavy-tailed latency; the rate and tail
      index are assumptions.
    * **outages** (``outages=1/(12*3600)`` per second per unordered pair, i.e.
      about one every 12 hours per link): the link is down (``inf`` both
      ways) for a log-uniform ``outage_duration=(60, 1200)`` s. Hwang et al.
      §I cite WAN outages that "sometimes last tens of minutes or more"
      (Chandra et al. 2001, Paxson 1997); with these defaults a link is
      unavailable ~0.9% of the time, an assumption of that order.

    ``static=True`` turns all four time-varying components off; each can also
    be turned off alone (``jitter=False`` ...) or given a number instead of
    ``True`` to set its magnitude / rate. Every random value is a pure
    function of ``(seed, pair, time step)``: two instances with equal
    arguments agree everywhere, in any process, whatever the call order.

    >>> m = GeoLatencyModel(["boston", "london", "zurich"], seed=3)
    >>> m.latency_ms("boston", "london", 10.0) == GeoLatencyModel(["boston", "london", "zurich"], seed=3).latency_ms("boston", "london", 10.0)
    True
    >>> round(m.base_ms("boston", "london"), 1) == round(m.base_ms("london", "boston"), 1)
    True
    """

    def __init__(
        self,
        servers: Iterable[Server | str],
        seed: int = 0,
        *,
        static: bool = False,
        jitter: bool | float = True,
        congestion: bool | float = True,
        spikes: bool | float = True,
        outages: bool | float = True,
        km_per_ms: float = FIBRE_KM_PER_MS,
        inflation: tuple[float, float] = (1.2, 2.5),
        overhead_ms: float = 2.0,
        local_ms: float = LOCAL_MS,
        step_s: float = 1.0,
        jitter_min_ms: float = 0.1,
        busy_hour: float = 21.0,
        start_utc_hour: float = 0.0,
        spike_duration: tuple[float, float] = (1.0, 10.0),
        spike_scale_ms: float = 20.0,
        spike_alpha: float = 1.5,
        spike_max_ms: float = 10_000.0,
        outage_duration: tuple[float, float] = (60.0, 1200.0),
    ):
        super().__init__(servers, local_ms=local_ms)
        missing = [s.name for s in self._servers if not s.located]
        if missing:
            raise ValueError(f"GeoLatencyModel needs coordinates; unknown location for {missing}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an int, got {seed!r}")
        self.seed = int(seed)
        self.static = bool(static)
        self.jitter = 0.0 if static else _knob(jitter, 0.03, "jitter")
        self.congestion = 0.0 if static else _knob(congestion, 0.2, "congestion")
        self.spike_rate = 0.0 if static else _knob(spikes, 1 / 600, "spikes")
        self.outage_rate = 0.0 if static else _knob(outages, 1 / (12 * 3600), "outages")
        lo, hi = (float(x) for x in inflation)
        if not 1.0 <= lo <= hi:
            raise ValueError(f"inflation must be (lo, hi) with 1 <= lo <= hi, got {inflation!r}")
        if not (km_per_ms > 0 and step_s > 0 and overhead_ms >= 0 and jitter_min_ms >= 0):
            raise ValueError("km_per_ms and step_s must be > 0, overhead_ms and jitter_min_ms >= 0")
        for nm, (d0, d1) in (("spike_duration", spike_duration), ("outage_duration", outage_duration)):
            if not 0 < d0 <= d1 < math.inf:
                raise ValueError(f"{nm} must be (lo, hi) with 0 < lo <= hi < inf, got {(d0, d1)!r}")
        if not (spike_alpha > 0 and spike_scale_ms >= 0 and spike_max_ms >= 0):
            raise ValueError("spike_alpha must be > 0, spike_scale_ms and spike_max_ms >= 0")
        self.km_per_ms, self.inflation, self.overhead_ms = float(km_per_ms), (lo, hi), float(overhead_ms)
        self.step_s, self.jitter_min_ms = float(step_s), float(jitter_min_ms)
        self.busy_hour, self.start_utc_hour = float(busy_hour), float(start_utc_hour)
        self.spike_duration = (float(spike_duration[0]), float(spike_duration[1]))
        self.spike_scale_ms, self.spike_alpha, self.spike_max_ms = float(spike_scale_ms), float(spike_alpha), float(spike_max_ms)
        self.outage_duration = (float(outage_duration[0]), float(outage_duration[1]))
        # Events are drawn per window; a window holds at most one event and an
        # event never outlasts its window, so time t only needs windows w, w-1.
        self.spike_window_s = max(60.0, self.spike_duration[1])
        self.outage_window_s = max(3600.0, self.outage_duration[1])
        self.spike_p = min(1.0, self.spike_rate * self.spike_window_s)
        self.outage_p = min(1.0, self.outage_rate * self.outage_window_s)

        n = len(self._servers)
        lat = np.array([s.lat for s in self._servers])
        lon = np.array([s.lon for s in self._servers])
        self._lon = lon.tolist()
        self._lon_arr = lon
        self.distance_km = np.asarray(haversine_km(lat[:, None], lon[:, None], lat[None, :], lon[None, :]),
                                      dtype=np.float64).reshape(n, n)
        ids = [_name_id(s.name) for s in self._servers]
        seed_key = self.seed & _M64
        directed = np.empty((n, n), dtype=np.uint64)
        undirected = np.empty((n, n), dtype=np.uint64)
        for i in range(n):
            for j in range(n):
                directed[i, j] = _hash(seed_key, ids[i], ids[j])
                x, y = (ids[i], ids[j]) if ids[i] <= ids[j] else (ids[j], ids[i])
                undirected[i, j] = _hash(seed_key, x, y, 0xD1CE)
        self._prefix = {
            tag: _sm_np(base ^ np.uint64(tag))
            for tag, base in ((TAG_INFLATION, undirected), (TAG_JITTER, directed),
                              (TAG_SPIKE, directed), (TAG_OUTAGE, undirected))
        }
        u1 = draw_np(self._prefix[TAG_INFLATION], 0, 0)
        u2 = draw_np(self._prefix[TAG_INFLATION], 0, 1)
        self.inflation_factor = lo + (hi - lo) * np.minimum(u1, u2)
        base = self.overhead_ms + self.distance_km / self.km_per_ms * self.inflation_factor
        np.fill_diagonal(base, self.local_ms)
        self._base = base
        # plain Python copies for the scalar path (no numpy scalar overhead)
        self._base_list = base.tolist()
        self._plist = {tag: p.tolist() for tag, p in self._prefix.items()}

    # -- static part ------------------------------------------------------
    def base_ms(self, a: str, b: str) -> float:
        """The symmetric, time-independent part of the latency (ms)."""
        self._check(a, b)
        return self._base_list[self._index[a]][self._index[b]]

    def base_matrix(self, names: Sequence[str] | None = None) -> np.ndarray:
        """:meth:`base_ms` for all pairs (a copy)."""
        if names is None:
            return self._base.copy()
        self._check(*names)
        idx = [self._index[n] for n in names]
        return self._base[np.ix_(idx, idx)].copy()

    # -- time-varying part: one formula, evaluated on floats or on numpy arrays ---------
    # Each term below is written once; ``xp`` is the math of floats (_SCALAR) or of arrays
    # (ARRAY_OPS), so the scalar path (latency_ms, one message at a time) and the vectorised
    # paths (latencies_ms over many send times, matrix over many pairs) compute the same
    # numbers, up to the rounding of numpy's transcendental functions.
    def _jitter_ms(self, xp, base, u):
        """Queueing jitter: exponential with mean ``max(jitter_min_ms, jitter * base)`` from a uniform ``u``."""
        return xp.maximum(self.jitter_min_ms, self.jitter * base) * -xp.log1p(-u)

    def _diurnal(self, xp, lon, t):
        """Diurnal load in [0, 1] at longitude ``lon`` and time ``t`` (a raised cosine of local solar time)."""
        hour = (self.start_utc_hour + t / 3600.0 + lon / 15.0) % 24.0
        return 0.5 * (1.0 + xp.cos(2.0 * math.pi * (hour - self.busy_hour) / 24.0))

    def _congestion_ms(self, xp, base, lon_a, lon_b, t):
        """Diurnal congestion: up to ``congestion * base``, the mean of both endpoints' load."""
        return self.congestion * base * (0.5 * (self._diurnal(xp, lon_a, t) + self._diurnal(xp, lon_b, t)))

    def _spike_ms(self, xp, u):
        """A spike's extra delay: Pareto(``spike_alpha``, ``spike_scale_ms``) from a uniform ``u``, capped."""
        return xp.minimum(self.spike_max_ms, self.spike_scale_ms * (1.0 - u) ** (-1.0 / self.spike_alpha))

    @staticmethod
    def _span(xp, w, window, u_start, u_len, dur, log_dur):
        """(start, duration) of the event drawn for window ``w``."""
        start = w * window + u_start * window
        if log_dur:
            d = xp.exp(math.log(dur[0]) + u_len * (math.log(dur[1]) - math.log(dur[0])))
        else:
            d = dur[0] + u_len * (dur[1] - dur[0])
        return start, d

    def _event(self, prefix: int, t: float, window: float, p: float, dur: tuple[float, float], log_dur: bool):
        """The (start, end, u_size) of an event covering t, or None (one pair, one time).

        Events are drawn per window; a window holds at most one event and an event
        never outlasts its window, so time t only needs windows w and w-1."""
        w0 = math.floor(t / window)
        for w in (w0, w0 - 1):
            if _draw(prefix, w, 0) < p:
                start, d = self._span(_SCALAR, w, window, _draw(prefix, w, 1), _draw(prefix, w, 2), dur, log_dur)
                if start <= t < start + d:
                    return start, start + d, _draw(prefix, w, 3)
        return None

    def _events(self, prefix, t: np.ndarray, window: float, p: float, dur: tuple, log_dur: bool):
        """:meth:`_event` for arrays of times and pair prefixes: (covered mask, u_size).

        The draws depend on (pair, window) only: they are made once per run of equal
        (pair, window) (times grouped by pair), and beyond "does an event occur" only where one does."""
        prefix = np.broadcast_to(np.asarray(prefix, dtype=np.uint64), t.shape)
        w0 = np.floor(t / window).astype(np.int64)
        n = len(t)
        covered = np.zeros(n, dtype=bool)
        usize = np.zeros(n)
        if not n:
            return covered, usize
        first = np.empty(n, dtype=bool)
        first[0] = True
        np.not_equal(w0[1:], w0[:-1], out=first[1:])
        first[1:] |= prefix[1:] != prefix[:-1]
        heads = np.flatnonzero(first)
        grp = np.cumsum(first) - 1
        hp, hw0 = prefix[heads], w0[heads]
        for hw in (hw0, hw0 - 1):
            occ = np.flatnonzero(draw_np(hp, hw, 0) < p)  # groups whose window holds an event
            if not len(occ):
                continue
            gp, gw = hp[occ], hw[occ]
            start, d = self._span(ARRAY_OPS, gw, window, draw_np(gp, gw, 1), draw_np(gp, gw, 2), dur, log_dur)
            gi = np.full(len(heads), -1)
            gi[occ] = np.arange(len(occ))
            el = np.flatnonzero(gi[grp] >= 0)  # elements in such windows
            k = gi[grp[el]]
            te = t[el]
            hit = (start[k] <= te) & (te < start[k] + d[k]) & ~covered[el]
            if hit.any():
                eh = el[hit]
                usize[eh] = draw_np(gp, gw, 3)[k[hit]]
                covered[eh] = True
        return covered, usize

    def outage(self, a: str, b: str, t: float) -> tuple[float, float] | None:
        """The ``(start, end)`` of the outage of link a-b covering ``t``, or None."""
        self._check(a, b)
        i, j = self._index[a], self._index[b]
        if i == j or self.outage_p <= 0:
            return None
        ev = self._event(self._plist[TAG_OUTAGE][i][j], t, self.outage_window_s, self.outage_p,
                         self.outage_duration, True)
        return None if ev is None else ev[:2]

    def latency_ms(self, a: str, b: str, t: float) -> float:
        """One-way latency (ms) from ``a`` to ``b`` at ``t`` seconds; ``inf`` in an outage."""
        i, j = self._index.get(a), self._index.get(b)
        if i is None or j is None:
            self._check(a, b)
        if i == j:
            return self.local_ms
        t = float(t)
        if math.isnan(t):
            raise ValueError("t must not be NaN")
        if self.outage_p > 0 and self._event(self._plist[TAG_OUTAGE][i][j], t, self.outage_window_s,
                                             self.outage_p, self.outage_duration, True) is not None:
            return math.inf
        base = self._base_list[i][j]
        lat = base
        if self.jitter > 0:
            lat += self._jitter_ms(_SCALAR, base, _draw(self._plist[TAG_JITTER][i][j], math.floor(t / self.step_s), 0))
        if self.congestion > 0:
            lat += self._congestion_ms(_SCALAR, base, self._lon[i], self._lon[j], t)
        if self.spike_p > 0:
            ev = self._event(self._plist[TAG_SPIKE][i][j], t, self.spike_window_s, self.spike_p,
                             self.spike_duration, False)
            if ev is not None:
                lat += self._spike_ms(_SCALAR, ev[2])
        return lat

    def index_of(self, names: Sequence[str]) -> np.ndarray:
        """Row numbers of servers ``names`` (for :meth:`latencies_at`)."""
        self._check(*names)
        return np.array([self._index[n] for n in names], dtype=np.intp)

    def latencies_at(self, i: np.ndarray, j: np.ndarray, t: np.ndarray) -> np.ndarray:
        """:meth:`latency_ms` for arrays of (sender row, receiver row, time) (:meth:`index_of`);
        message ``k`` goes from server ``i[k]`` to ``j[k]`` at ``t[k]``. Times of one pair
        are best given together and sorted (the outage and spike windows are then drawn once)."""
        i, j = np.asarray(i, dtype=np.intp), np.asarray(j, dtype=np.intp)
        t = np.asarray(t, dtype=np.float64)
        if np.isnan(t).any():
            raise ValueError("t must not be NaN")
        base = self._base[i, j]
        lat = base.copy()
        if self.jitter > 0:
            u = draw_np(self._prefix[TAG_JITTER][i, j], np.floor(t / self.step_s).astype(np.int64), 0)
            lat += self._jitter_ms(ARRAY_OPS, base, u)
        if self.congestion > 0:
            lat += self._congestion_ms(ARRAY_OPS, base, self._lon_arr[i], self._lon_arr[j], t)
        if self.spike_p > 0:
            hit, us = self._events(self._prefix[TAG_SPIKE][i, j], t, self.spike_window_s, self.spike_p,
                                   self.spike_duration, False)
            if hit.any():
                lat[hit] += self._spike_ms(ARRAY_OPS, us[hit])
        if self.outage_p > 0:
            down, _ = self._events(self._prefix[TAG_OUTAGE][i, j], t, self.outage_window_s, self.outage_p,
                                   self.outage_duration, True)
            lat[down] = math.inf
        lat[i == j] = self.local_ms
        return lat

    def latencies_ms(self, a: str, b: str, t) -> np.ndarray:
        """:meth:`latency_ms` of link ``a -> b`` for every send time in ``t`` (vectorised)."""
        t = np.asarray(t, dtype=np.float64)
        ij = self.index_of([a, b])
        return self.latencies_at(np.full(len(t), ij[0]), np.full(len(t), ij[1]), t)

    def link_latencies_ms(self, pairs: Sequence[tuple[str, str]], times: Sequence[np.ndarray]) -> list[np.ndarray]:
        """:meth:`latencies_ms` of several links at once (one evaluation of the model)."""
        if not len(times):
            return []
        n = [len(x) for x in times]
        i = np.repeat(self.index_of([a for a, _ in pairs]), n)
        j = np.repeat(self.index_of([b for _, b in pairs]), n)
        lat = self.latencies_at(i, j, np.concatenate(times))
        return np.split(lat, np.cumsum(n)[:-1])

    def matrix(self, names: Sequence[str] | None = None, t: float = 0.0) -> np.ndarray:
        """Latency matrix at time ``t``, row = sender (:meth:`latencies_at` over every pair)."""
        idx = np.arange(len(self._servers)) if names is None else self.index_of(names)
        t = float(t)
        if math.isnan(t):
            raise ValueError("t must not be NaN")
        n = len(idx)
        i, j = np.repeat(idx, n), np.tile(idx, n)
        return self.latencies_at(i, j, np.full(n * n, t)).reshape(n, n)

    def __repr__(self) -> str:
        parts = [f"{len(self._servers)} servers", f"seed={self.seed}"]
        if self.static or not (self.jitter or self.congestion or self.spike_rate or self.outage_rate):
            parts.append("static")
        return f"GeoLatencyModel({', '.join(parts)})"


# ---------------------------------------------------------------------------
# traces
# ---------------------------------------------------------------------------

TRACE_HEADER = ("time_s", "src", "dst", "latency_ms")


def _parse_latency(text: str) -> float:
    s = text.strip().lower()
    if s in ("", "inf", "+inf", "infinity", "+infinity"):
        return math.inf
    v = float(s)
    if math.isnan(v) or v < 0:
        raise ValueError(f"latency must be >= 0 (or empty/inf for an outage), got {text!r}")
    return v


class TraceLatencyModel(LatencyModel):
    """Latencies replayed from a trace, piecewise constant in time.

    ``samples`` maps ``(src, dst)`` to a list of ``(time_s, latency_ms)``.
    The latency at ``t`` is the most recent sample at or before ``t`` (before
    the first sample, the first sample). A missing direction falls back to the
    reverse direction; a pair missing both ways raises ``KeyError``.
    ``latency_ms = inf`` records an outage. ``a == b`` gives ``local_ms``
    unless the trace has samples for ``(a, a)``.

    >>> m = TraceLatencyModel({("a", "b"): [(0.0, 10.0), (10.0, float("inf")), (20.0, 12.0)]})
    >>> [m.latency_ms("a", "b", t) for t in (-5, 0, 9.9, 10, 25)]
    [10.0, 10.0, 10.0, inf, 12.0]
    >>> m.latency_ms("b", "a", 0.0)  # reverse direction
    10.0
    """

    def __init__(
        self,
        samples: Mapping[tuple[str, str], Iterable[tuple[float, float]]],
        servers: Iterable[Server | str] | None = None,
        local_ms: float = LOCAL_MS,
    ):
        data: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
        seen: dict[str, None] = {}
        for (src, dst), rows in samples.items():
            pairs = sorted(((float(t), float(v)) for t, v in rows), key=lambda r: r[0])
            if not pairs:
                continue
            times, lats = [], []
            for t, v in pairs:  # a repeated time keeps the last sample given
                if times and times[-1] == t:
                    lats[-1] = v
                else:
                    times.append(t)
                    lats.append(v)
            data[(src, dst)] = (times, lats)
            seen.setdefault(src)
            seen.setdefault(dst)
        if servers is None:
            servers = list(seen)
        super().__init__(servers, local_ms=local_ms)
        unknown = [n for n in seen if n not in self._index]
        if unknown:
            raise ValueError(f"trace names servers not in `servers`: {unknown}")
        self._data = data

    @property
    def pairs(self) -> list[tuple[str, str]]:
        """The directed pairs that have samples."""
        return list(self._data)

    def sample_times(self, a: str, b: str) -> list[float]:
        """The sample times used for ``a -> b`` (after reverse fallback)."""
        return list(self._series(a, b)[0])

    def _series(self, a: str, b: str):
        s = self._data.get((a, b))
        if s is None:
            s = self._data.get((b, a))
        if s is None:
            self._check(a, b)
            raise KeyError(f"trace has no samples for {a!r} -> {b!r} nor {b!r} -> {a!r}")
        return s

    def latency_ms(self, a: str, b: str, t: float) -> float:
        if a == b and (a, a) not in self._data:
            self._check(a)
            return self.local_ms
        times, lats = self._series(a, b)
        k = bisect.bisect_right(times, float(t)) - 1
        return lats[max(k, 0)]

    @classmethod
    def from_csv(cls, path: str | os.PathLike, servers: Iterable[Server | str] | None = None,
                 local_ms: float = LOCAL_MS) -> "TraceLatencyModel":
        """Read a CSV trace with header ``time_s,src,dst,latency_ms``.

        Columns may come in any order; extra columns are ignored. An empty
        latency or ``inf`` is an outage. Malformed rows raise ``ValueError``
        naming the file and line.
        """
        samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
        with open(path, newline="") as f:
            reader = csv.reader(f)
            try:
                header = next(reader)
            except StopIteration:
                raise ValueError(f"{path}: line 1: empty file, expected header {','.join(TRACE_HEADER)}") from None
            cols = [h.strip() for h in header]
            missing = [c for c in TRACE_HEADER if c not in cols]
            if missing:
                raise ValueError(f"{path}: line 1: header must contain {','.join(TRACE_HEADER)}; missing {missing}")
            pos = [cols.index(c) for c in TRACE_HEADER]
            for row in reader:
                line = reader.line_num
                if not row or all(not c.strip() for c in row):
                    continue
                if len(row) != len(cols):
                    raise ValueError(f"{path}: line {line}: expected {len(cols)} fields, got {len(row)}: {row!r}")
                ts, src, dst, lat = (row[p].strip() for p in pos)
                try:
                    t = float(ts)
                except ValueError:
                    raise ValueError(f"{path}: line {line}: time_s is not a number: {ts!r}") from None
                if not math.isfinite(t):
                    raise ValueError(f"{path}: line {line}: time_s must be finite, got {ts!r}")
                if not src or not dst:
                    raise ValueError(f"{path}: line {line}: src and dst must be non-empty")
                try:
                    v = _parse_latency(lat)
                except ValueError as e:
                    raise ValueError(f"{path}: line {line}: bad latency_ms {lat!r}: {e}") from None
                samples.setdefault((src, dst), []).append((t, v))
        return cls(samples, servers=servers, local_ms=local_ms)

    def __repr__(self) -> str:
        return f"TraceLatencyModel({len(self._servers)} servers, {len(self._data)} directed pairs)"


def to_csv(model: LatencyModel, names: Sequence[str] | None, times: Iterable[float],
           path: str | os.PathLike) -> int:
    """Write ``model`` sampled at ``times`` for every ordered pair of ``names``
    (default: all) as a ``time_s,src,dst,latency_ms`` CSV. Values are written
    at full precision (``repr``) and outages as ``inf``, so
    ``TraceLatencyModel.from_csv`` reproduces the model exactly at the sample
    times. Returns the number of rows written.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "t.csv")
    >>> to_csv(GeoLatencyModel(default_servers(3), seed=0), None, [0, 10], p)
    12
    >>> TraceLatencyModel.from_csv(p).names
    ['boston', 'london', 'tokyo']
    """
    names = model.names if names is None else list(names)
    rows = 0
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(TRACE_HEADER)
        for t in times:
            t = float(t)
            m = model.matrix(names, t)
            for i, a in enumerate(names):
                for j, b in enumerate(names):
                    if i != j:
                        v = float(m[i, j])
                        w.writerow((repr(t), a, b, "inf" if math.isinf(v) else repr(v)))
                        rows += 1
    return rows
