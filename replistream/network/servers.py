"""Servers and cities: where replicas live (docs/design.md, decision 6)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np

__all__ = ["Server", "CITIES", "REGION", "default_servers", "city", "as_servers", "haversine_km", "LOCAL_MS",
           "FIBRE_KM_PER_MS"]

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
        if math.isnan(self.lat) != math.isnan(self.lon):
            raise ValueError(f"Server {self.name!r}: lat and lon must both be numbers or both nan (unknown), "
                             f"got lat={self.lat!r}, lon={self.lon!r}")
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


def as_servers(servers_or_names: Iterable[Server | str]) -> list[Server]:
    """Servers from :class:`Server` objects or names (a known city's name gives its coordinates;
    another name, a server without location).

    >>> [s.located for s in as_servers(["boston", "lab-1"])]
    [True, False]
    """
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
