"""Servers and the emulated wide-area network (DESIGN.md decisions 5 and 6).

A *server* is where replicas live: on one machine it is a label plus a row in
a latency model, on a Ray cluster it may name a Ray node (:attr:`Server.node`).
A *latency model* answers "how long does a message sent from server ``a`` to
server ``b`` at time ``t`` take?", in milliseconds, one way. The Ray runtime
delays every batch by that much on the data path and the simulator uses the
very same object, so a run on Ray and a simulated run of the same scenario can
be compared. Nothing here imports Ray; everything is plain, picklable data and
a deterministic function of its seed.

Models:

* :class:`GeoLatencyModel`: great-circle distance between real city
  coordinates at the speed of light in fibre, times a per-pair route
  inflation, plus a fixed overhead, plus time-varying jitter, diurnal
  congestion, heavy-tailed spikes and minutes-long outages (``inf``).
* :class:`TraceLatencyModel`: a recorded or generated trace of
  ``time_s,src,dst,latency_ms`` rows, piecewise constant in time (the paper's
  simulator replays a month of PlanetLab pings sampled every 10 s, Hwang et
  al. 2008 §VI-A). :func:`to_csv` writes such a trace from any model.
* :class:`ZeroLatency`: no network at all (throughput runs).
* :class:`NetworkConditions`: scripted overrides (extra delay, cut links,
  slow servers) on top of any model; :mod:`replistream.scenario` fills it.

:func:`delivery_time` turns a latency into the time a message sent at
``t_send`` arrives, waiting out outages as TCP would.

>>> net = GeoLatencyModel(default_servers(5), seed=1, static=True)
>>> net.names
['boston', 'london', 'tokyo', 'saopaulo', 'berkeley']
>>> 25 < net.latency_ms("boston", "london", 0.0) < 80
True
>>> net.latency_ms("boston", "london", 0.0) == net.latency_ms("london", "boston", 99.0)
True
"""
from __future__ import annotations

import bisect
import csv
import hashlib
import math
import os
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np

__all__ = [
    "Server", "CITIES", "REGION", "default_servers", "city",
    "LatencyModel", "GeoLatencyModel", "TraceLatencyModel", "ZeroLatency", "NetworkConditions",
    "to_csv", "delivery_time", "haversine_km", "LOCAL_MS", "FIBRE_KM_PER_MS",
]

#: One-way latency between two replicas on the same server, in ms (a local
#: socket / shared-memory hop; an assumption of the right order of magnitude).
LOCAL_MS = 0.05

#: Light in silica fibre travels at about c / 1.47, i.e. ~4.9 us per km, so
#: ~200 km per millisecond one way.
FIBRE_KM_PER_MS = 200.0

_EARTH_RADIUS_KM = 6371.0088  # mean Earth radius (IUGG)


# ---------------------------------------------------------------------------
# servers and cities
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Server:
    """A place that runs replicas.

    ``lat``/``lon`` are degrees (WGS84; ``nan`` when the location is unknown,
    e.g. a server known only from a trace), ``capacity`` is its relative
    processing capacity (Algorithm 5 compares load with ``alpha * capacity``),
    ``node`` optionally names the Ray node that hosts it.

    >>> Server("boston", 42.36, -71.06)
    Server(name='boston', lat=42.36, lon=-71.06, capacity=1.0, node=None)
    >>> Server("x", 95.0, 0.0)
    Traceback (most recent call last):
    ...
    ValueError: Server 'x': lat must be in [-90, 90], got 95.0
    """

    name: str
    lat: float
    lon: float
    capacity: float = 1.0
    node: str | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Server name must be a non-empty string, got {self.name!r}")
        if not (math.isnan(self.lat) or -90.0 <= self.lat <= 90.0):
            raise ValueError(f"Server {self.name!r}: lat must be in [-90, 90], got {self.lat!r}")
        if not (math.isnan(self.lon) or -180.0 <= self.lon <= 180.0):
            raise ValueError(f"Server {self.name!r}: lon must be in [-180, 180], got {self.lon!r}")
        if not (self.capacity > 0 and math.isfinite(self.capacity)):
            raise ValueError(f"Server {self.name!r}: capacity must be a positive number, got {self.capacity!r}")

    @property
    def located(self) -> bool:
        """True when the server has coordinates."""
        return not (math.isnan(self.lat) or math.isnan(self.lon))


# Real city coordinates (degrees, city centre, rounded to 0.01 deg). Many are
# PlanetLab-era research sites (Brown, MIT, Wisconsin, Purdue, Ohio State,
# Berkeley, Cambridge, ETH Zurich, KAIST, Tsinghua, ...); the rest fill in
# continents so that a cluster can span the globe.
_REGIONS: dict[str, list[tuple[str, float, float]]] = {
    "na": [
        ("boston", 42.36, -71.06), ("berkeley", 37.87, -122.27), ("madison", 43.07, -89.40),
        ("westlafayette", 40.43, -86.91), ("columbus", 39.96, -83.00), ("seattle", 47.61, -122.33),
        ("providence", 41.82, -71.41), ("princeton", 40.35, -74.66), ("pittsburgh", 40.44, -79.99),
        ("austin", 30.27, -97.74), ("toronto", 43.65, -79.38), ("atlanta", 33.75, -84.39),
        ("losangeles", 34.05, -118.24), ("chicago", 41.88, -87.63), ("newyork", 40.71, -74.01),
        ("vancouver", 49.28, -123.12), ("mexicocity", 19.43, -99.13), ("denver", 39.74, -104.99),
        ("sandiego", 32.72, -117.16), ("washington", 38.91, -77.04), ("montreal", 45.50, -73.57),
        ("saltlakecity", 40.76, -111.89), ("miami", 25.76, -80.19), ("minneapolis", 44.98, -93.27),
        ("houston", 29.76, -95.37), ("annarbor", 42.28, -83.74), ("ithaca", 42.44, -76.50),
        ("corvallis", 44.56, -123.26), ("paloalto", 37.44, -122.14), ("honolulu", 21.31, -157.86),
    ],
    "eu": [
        ("london", 51.51, -0.13), ("zurich", 47.37, 8.54), ("paris", 48.86, 2.35),
        ("berlin", 52.52, 13.40), ("cambridge", 52.21, 0.12), ("madrid", 40.42, -3.70),
        ("stockholm", 59.33, 18.07), ("rome", 41.90, 12.50), ("amsterdam", 52.37, 4.90),
        ("warsaw", 52.23, 21.01), ("athens", 37.98, 23.73), ("helsinki", 60.17, 24.94),
        ("dublin", 53.35, -6.26), ("vienna", 48.21, 16.37), ("lisbon", 38.72, -9.14),
        ("moscow", 55.76, 37.62), ("prague", 50.08, 14.44), ("barcelona", 41.39, 2.17),
        ("oslo", 59.91, 10.75), ("budapest", 47.50, 19.04), ("copenhagen", 55.68, 12.57),
        ("milan", 45.46, 9.19), ("brussels", 50.85, 4.35), ("munich", 48.14, 11.58),
        ("edinburgh", 55.95, -3.19), ("istanbul", 41.01, 28.98), ("kyiv", 50.45, 30.52),
        ("bucharest", 44.43, 26.10), ("geneva", 46.20, 6.14), ("lausanne", 46.52, 6.63),
    ],
    "as": [
        ("tokyo", 35.68, 139.69), ("beijing", 39.90, 116.41), ("singapore", 1.35, 103.82),
        ("seoul", 37.57, 126.98), ("bangalore", 12.97, 77.59), ("hongkong", 22.32, 114.17),
        ("taipei", 25.03, 121.57), ("telaviv", 32.09, 34.78), ("shanghai", 31.23, 121.47),
        ("delhi", 28.61, 77.21), ("osaka", 34.69, 135.50), ("bangkok", 13.76, 100.50),
        ("mumbai", 19.08, 72.88), ("kualalumpur", 3.14, 101.69), ("jakarta", -6.21, 106.85),
        ("manila", 14.60, 120.98), ("dubai", 25.20, 55.27), ("hanoi", 21.03, 105.85),
        ("chennai", 13.08, 80.27), ("guangzhou", 23.13, 113.26), ("kolkata", 22.57, 88.36),
        ("karachi", 24.86, 67.01), ("tehran", 35.69, 51.39), ("riyadh", 24.71, 46.68),
        ("almaty", 43.24, 76.89),
    ],
    "sa": [
        ("saopaulo", -23.55, -46.63), ("buenosaires", -34.60, -58.38), ("santiago", -33.45, -70.67),
        ("riodejaneiro", -22.91, -43.17), ("lima", -12.05, -77.04), ("bogota", 4.71, -74.07),
        ("portoalegre", -30.03, -51.23), ("montevideo", -34.90, -56.16), ("caracas", 10.48, -66.90),
        ("quito", -0.18, -78.47), ("brasilia", -15.79, -47.88), ("recife", -8.05, -34.88),
    ],
    "oc": [
        ("sydney", -33.87, 151.21), ("auckland", -36.85, 174.76), ("melbourne", -37.81, 144.96),
        ("perth", -31.95, 115.86), ("brisbane", -27.47, 153.03), ("wellington", -41.29, 174.78),
        ("adelaide", -34.93, 138.60), ("canberra", -35.28, 149.13), ("christchurch", -43.53, 172.64),
        ("hobart", -42.88, 147.33),
    ],
    "af": [
        ("capetown", -33.92, 18.42), ("nairobi", -1.29, 36.82), ("cairo", 30.04, 31.24),
        ("johannesburg", -26.20, 28.05), ("lagos", 6.52, 3.38), ("casablanca", 33.57, -7.59),
        ("accra", 5.60, -0.19), ("addisababa", 9.03, 38.74), ("dakar", 14.72, -17.47),
        ("tunis", 36.81, 10.18), ("kampala", 0.35, 32.58), ("algiers", 36.75, 3.06),
    ],
}

# Interleave regions so that any prefix spans the globe, weighted roughly like
# PlanetLab (North America and Europe heavier): per 10 cities, 2 NA, 3 EU,
# 2 Asia, 1 South America, 1 Oceania, 1 Africa while they last.
_PATTERN = ("na", "eu", "as", "sa", "na", "eu", "oc", "as", "af", "eu")


def _interleave() -> tuple[Server, ...]:
    pos = {r: 0 for r in _REGIONS}
    out: list[Server] = []
    total = sum(len(v) for v in _REGIONS.values())
    while len(out) < total:
        for r in _PATTERN:
            if pos[r] < len(_REGIONS[r]):
                name, lat, lon = _REGIONS[r][pos[r]]
                pos[r] += 1
                out.append(Server(name, lat, lon))
    return tuple(out)


#: All known cities as :class:`Server` objects, in an order that spreads
#: continents (the first 30 cover all six inhabited continents).
CITIES: tuple[Server, ...] = _interleave()
_CITY_BY_NAME = {s.name: s for s in CITIES}
assert len(_CITY_BY_NAME) == len(CITIES), "duplicate city name"
#: Region code ("na", "eu", "as", "sa", "oc", "af") of every city.
REGION: dict[str, str] = {name: r for r, rows in _REGIONS.items() for name, _, _ in rows}


def city(name: str) -> Server:
    """The :class:`Server` for a known city name.

    >>> city("zurich").lat
    47.37
    """
    try:
        return _CITY_BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown city {name!r}; see replistream.network.CITIES") from None


def default_servers(n: int = 30, seed: int | None = None) -> list[Server]:
    """``n`` servers at real cities.

    With ``seed=None`` this is the first ``n`` entries of :data:`CITIES`, a
    deterministic order that already spreads continents (30 servers per
    cluster, as in Hwang et al. §VI-A). With a seed, a seeded random sample of
    ``n`` cities, kept in :data:`CITIES` order.

    >>> [s.name for s in default_servers(4)]
    ['boston', 'london', 'tokyo', 'saopaulo']
    >>> default_servers(3, seed=7) == default_servers(3, seed=7)
    True
    """
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or not 0 <= n <= len(CITIES):
        raise ValueError(f"n must be an integer in [0, {len(CITIES)}], got {n!r}")
    if seed is None:
        return list(CITIES[:n])
    idx = np.sort(np.random.default_rng(seed).choice(len(CITIES), size=int(n), replace=False))
    return [CITIES[i] for i in idx]


def haversine_km(lat1, lon1, lat2, lon2):
    """Great-circle distance in km (works on scalars and numpy arrays).

    >>> round(float(haversine_km(42.36, -71.06, 51.51, -0.13)))
    5264
    """
    p1, p2 = np.radians(lat1), np.radians(lat2)
    dphi = p2 - p1
    dlmb = np.radians(np.asarray(lon2) - np.asarray(lon1))
    h = np.sin(dphi / 2) ** 2 + np.cos(p1) * np.cos(p2) * np.sin(dlmb / 2) ** 2
    return 2 * _EARTH_RADIUS_KM * np.arcsin(np.sqrt(np.clip(h, 0.0, 1.0)))


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

_TAG_INFLATION, _TAG_JITTER, _TAG_SPIKE, _TAG_OUTAGE = 1, 2, 3, 4


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


def _draw_np(prefix: np.ndarray, index: int, j: int) -> np.ndarray:
    h = _sm_np(_sm_np(prefix ^ np.uint64(index & _M64)) ^ np.uint64(j))
    return (h >> np.uint64(11)).astype(np.float64) * _INV53


# ---------------------------------------------------------------------------
# latency models
# ---------------------------------------------------------------------------

def _as_servers(servers_or_names: Iterable[Server | str]) -> list[Server]:
    out = []
    for s in servers_or_names:
        if isinstance(s, Server):
            out.append(s)
        elif isinstance(s, str):
            out.append(_CITY_BY_NAME.get(s) or Server(s, math.nan, math.nan))
        else:
            raise TypeError(f"expected a Server or a server name, got {s!r}")
    names = [s.name for s in out]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"duplicate server names: {dup}")
    return out


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
        self._servers = _as_servers(servers)
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
            for tag, base in ((_TAG_INFLATION, undirected), (_TAG_JITTER, directed),
                              (_TAG_SPIKE, directed), (_TAG_OUTAGE, undirected))
        }
        u1 = _draw_np(self._prefix[_TAG_INFLATION], 0, 0)
        u2 = _draw_np(self._prefix[_TAG_INFLATION], 0, 1)
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

    # -- time-varying part --------------------------------------------------
    def _diurnal(self, lon: float, t: float) -> float:
        hour = (self.start_utc_hour + t / 3600.0 + lon / 15.0) % 24.0
        return 0.5 * (1.0 + math.cos(2.0 * math.pi * (hour - self.busy_hour) / 24.0))

    def _event(self, prefix: int, t: float, window: float, p: float, dur: tuple[float, float], log_dur: bool):
        """The (start, end, u_size) of an event covering t, or None."""
        w0 = math.floor(t / window)
        for w in (w0, w0 - 1):
            if _draw(prefix, w, 0) < p:
                start = w * window + _draw(prefix, w, 1) * window
                u = _draw(prefix, w, 2)
                if log_dur:
                    d = math.exp(math.log(dur[0]) + u * (math.log(dur[1]) - math.log(dur[0])))
                else:
                    d = dur[0] + u * (dur[1] - dur[0])
                if start <= t < start + d:
                    return start, start + d, _draw(prefix, w, 3)
        return None

    def outage(self, a: str, b: str, t: float) -> tuple[float, float] | None:
        """The ``(start, end)`` of the outage of link a-b covering ``t``, or None."""
        self._check(a, b)
        i, j = self._index[a], self._index[b]
        if i == j or self.outage_p <= 0:
            return None
        ev = self._event(self._plist[_TAG_OUTAGE][i][j], t, self.outage_window_s, self.outage_p,
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
        if self.outage_p > 0 and self._event(self._plist[_TAG_OUTAGE][i][j], t, self.outage_window_s,
                                             self.outage_p, self.outage_duration, True) is not None:
            return math.inf
        base = self._base_list[i][j]
        lat = base
        if self.jitter > 0:
            k = math.floor(t / self.step_s)
            u = _draw(self._plist[_TAG_JITTER][i][j], k, 0)
            lat += max(self.jitter_min_ms, self.jitter * base) * -math.log1p(-u)
        if self.congestion > 0:
            c = 0.5 * (self._diurnal(self._lon[i], t) + self._diurnal(self._lon[j], t))
            lat += self.congestion * base * c
        if self.spike_p > 0:
            ev = self._event(self._plist[_TAG_SPIKE][i][j], t, self.spike_window_s, self.spike_p,
                             self.spike_duration, False)
            if ev is not None:
                lat += min(self.spike_max_ms, self.spike_scale_ms * (1.0 - ev[2]) ** (-1.0 / self.spike_alpha))
        return lat

    def _event_np(self, prefix, t, window, p, dur, log_dur):
        """Vectorised :meth:`_event`: (covered mask, u_size)."""
        w0 = math.floor(t / window)
        covered = np.zeros(prefix.shape, dtype=bool)
        usize = np.zeros(prefix.shape)
        for w in (w0, w0 - 1):
            occurs = _draw_np(prefix, w, 0) < p
            start = w * window + _draw_np(prefix, w, 1) * window
            u = _draw_np(prefix, w, 2)
            if log_dur:
                d = np.exp(math.log(dur[0]) + u * (math.log(dur[1]) - math.log(dur[0])))
            else:
                d = dur[0] + u * (dur[1] - dur[0])
            hit = occurs & (start <= t) & (t < start + d) & ~covered
            usize = np.where(hit, _draw_np(prefix, w, 3), usize)
            covered |= hit
        return covered, usize

    def matrix(self, names: Sequence[str] | None = None, t: float = 0.0) -> np.ndarray:
        """Vectorised latency matrix at time ``t`` (equal to :meth:`latency_ms`
        pointwise up to floating-point rounding of numpy's transcendental functions)."""
        if names is None:
            idx = np.arange(len(self._servers))
        else:
            self._check(*names)
            idx = np.array([self._index[n] for n in names], dtype=np.intp)
        t = float(t)
        if math.isnan(t):
            raise ValueError("t must not be NaN")
        sel = np.ix_(idx, idx)
        base = self._base[sel]
        lat = base.copy()
        if self.jitter > 0:
            k = math.floor(t / self.step_s)
            u = _draw_np(self._prefix[_TAG_JITTER][sel], k, 0)
            lat = lat + np.maximum(self.jitter_min_ms, self.jitter * base) * -np.log1p(-u)
        if self.congestion > 0:
            lon = self._lon_arr[idx]
            hour = (self.start_utc_hour + t / 3600.0 + lon / 15.0) % 24.0
            d = 0.5 * (1.0 + np.cos(2.0 * np.pi * (hour - self.busy_hour) / 24.0))
            lat = lat + self.congestion * base * (0.5 * (d[:, None] + d[None, :]))
        if self.spike_p > 0:
            hit, us = self._event_np(self._prefix[_TAG_SPIKE][sel], t, self.spike_window_s, self.spike_p,
                                     self.spike_duration, False)
            size = np.minimum(self.spike_max_ms, self.spike_scale_ms * (1.0 - us) ** (-1.0 / self.spike_alpha))
            lat = lat + np.where(hit, size, 0.0)
        if self.outage_p > 0:
            down, _ = self._event_np(self._prefix[_TAG_OUTAGE][sel], t, self.outage_window_s, self.outage_p,
                                     self.outage_duration, True)
            lat = np.where(down, np.inf, lat)
        same = idx[:, None] == idx[None, :]
        lat[same] = self.local_ms
        return lat

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
    object pickles with its base model.

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

    def matrix(self, names: Sequence[str] | None = None, t: float = 0.0) -> np.ndarray:
        names = self.names if names is None else list(names)
        m = np.array(self.base.matrix(names, t), dtype=np.float64)
        pos = {n: i for i, n in enumerate(names)}
        for (a, b) in self._links:
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
