"""Server files: where replicas can run, read from CSV or TOML, or built in Python.

Every server has a ``name``; a location, either ``lat``/``lon`` (degrees) or
network coordinates ``x``, ``y`` (and ``z``) in milliseconds (as from Vivaldi
or :func:`~replistream.placement.coords.network_coordinates`); a CPU
``capacity`` (default 1.0, the unit of operator loads); optionally where it
runs on Ray: ``node`` (a Ray node id, ``label:KEY=VALUE`` or
``resource:NAME``, see :mod:`replistream.placement.nodes`) or ``label``
(``KEY=VALUE``, short for ``node = "label:KEY=VALUE"``). A row with only the
name of a built-in city takes the city's coordinates.

CSV::

    name,lat,lon,capacity,node
    boston,42.36,-71.06,2,
    london,51.51,-0.13,1,label:zone=eu

TOML::

    [[server]]
    name = "a"
    coords = [0.0, 12.5]
    capacity = 1.5

>>> import tempfile, os
>>> path = os.path.join(tempfile.mkdtemp(), "servers.csv")
>>> _ = open(path, "w").write("name,lat,lon,capacity\\nboston,42.36,-71.06,2\\ntokyo,,,\\n")
>>> ss = load_servers(path)
>>> ss.names, ss.servers[0].capacity, ss.servers[1].lat
(['boston', 'tokyo'], 2.0, 35.68)
>>> 50 < float(ss.latency()[0, 1]) < 200
True
"""
from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import numpy as np

from ..network import LOCAL_MS, GeoLatencyModel, Server, city, default_servers
from .coords import coordinate_latency
from .nodes import parse_node

__all__ = ["ServerSet", "load_servers", "servers_from_rows"]


@dataclass(frozen=True)
class ServerSet:
    """Servers plus, optionally, their network coordinates (ms; one row per server).

    :meth:`latency` gives the latency matrix placement uses: distances between
    coordinates when there are coordinates, else the static geographic model
    of the servers' latitude/longitude.

    >>> ss = ServerSet.builtin(3)
    >>> ss.names
    ['boston', 'london', 'tokyo']
    >>> float(ServerSet((Server("a", math.nan, math.nan), Server("b", math.nan, math.nan)), np.array([[0.0, 0], [3, 4]])).latency()[0, 1])
    5.0
    """

    servers: tuple[Server, ...]
    coords: np.ndarray | None = None

    def __post_init__(self):
        object.__setattr__(self, "servers", tuple(self.servers))
        names = self.names
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"server names must be unique; repeated: {dup}")
        if self.coords is not None:
            c = np.asarray(self.coords, dtype=np.float64)
            if c.ndim != 2 or c.shape[0] != len(self.servers) or not np.all(np.isfinite(c)):
                raise ValueError(f"coords must be finite, one row per server ({len(self.servers)}), got shape {c.shape}")
            object.__setattr__(self, "coords", c)
        for s in self.servers:
            try:
                parse_node(s.node)
            except ValueError as e:
                raise ValueError(f"server {s.name!r}: {e}") from None

    @classmethod
    def builtin(cls, n: int = 30) -> "ServerSet":
        """The first ``n`` built-in cities (:func:`replistream.network.default_servers`)."""
        return cls(tuple(default_servers(n)))

    @property
    def names(self) -> list[str]:
        """Server names in order."""
        return [s.name for s in self.servers]

    def latency(self, seed: int = 0) -> np.ndarray:
        """One-way latency matrix (ms): coordinate distances, or the static geographic model.

        >>> ServerSet.builtin(2).latency().shape
        (2, 2)
        """
        if self.coords is not None:
            m = coordinate_latency(self.coords)
            np.fill_diagonal(m, LOCAL_MS)
            return m
        missing = [s.name for s in self.servers if not s.located]
        if missing:
            raise ValueError(f"servers {missing[:5]} have neither lat/lon nor network coordinates")
        return GeoLatencyModel(list(self.servers), seed=seed, static=True).base_matrix()

    def to_csv(self, path: str | os.PathLike) -> None:
        """Write a server file that :func:`load_servers` reads back."""
        dim = 0 if self.coords is None else self.coords.shape[1]
        axes = ["x", "y", "z"][:dim]
        if dim > 3:
            raise ValueError("CSV server files hold at most 3 coordinates (x, y, z); use TOML for more")
        with open(path, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["name", "lat", "lon", *axes, "capacity", "node"])
            for i, s in enumerate(self.servers):
                c = [repr(float(v)) for v in self.coords[i]] if dim else []
                w.writerow([s.name, "" if math.isnan(s.lat) else s.lat, "" if math.isnan(s.lon) else s.lon,
                            *c, s.capacity, s.node or ""])


def _num(row: Mapping[str, Any], key: str, where: str) -> float | None:
    v = row.get(key)
    if v is None or (isinstance(v, str) and not v.strip()):
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {key} must be a number, got {v!r}") from None
    if not math.isfinite(x):
        raise ValueError(f"{where}: {key} must be a finite number, got {v!r} (leave it empty when unknown)")
    return x


def servers_from_rows(rows: Iterable[Mapping[str, Any]], where: str = "servers") -> ServerSet:
    """A :class:`ServerSet` from dict rows (the parsed lines of a server file).

    >>> float(servers_from_rows([{"name": "a", "coords": [0, 0]}, {"name": "b", "coords": [6, 8], "capacity": 2}]).latency()[0, 1])
    10.0
    >>> servers_from_rows([{"name": "x", "lat": 1, "lon": 2}, {"name": "y", "x": 1, "y": 2}])
    Traceback (most recent call last):
    ...
    ValueError: servers: give network coordinates for every server or for none (row 1 'x' has none)
    """
    servers, coords = [], []
    rows = list(rows)
    if not rows:
        raise ValueError(f"{where}: no servers")
    for i, row in enumerate(rows, 1):
        here = f"{where}: row {i}"
        name = str(row.get("name") or "").strip()
        if not name:
            raise ValueError(f"{here}: every server needs a name")
        here = f"{here} {name!r}"
        lat, lon = _num(row, "lat", here), _num(row, "lon", here)
        if (lat is None) != (lon is None):
            raise ValueError(f"{here}: give both lat and lon, or neither")
        c = row.get("coords")
        if c is None:
            axes = [_num(row, a, here) for a in ("x", "y", "z")]
            c = [v for v in axes if v is not None] or None
        elif isinstance(c, str):
            c = [float(v) for v in c.replace(";", " ").split()]
        if lat is None and c is None:
            try:
                known = city(name)
                lat, lon = known.lat, known.lon
            except KeyError:
                lat = lon = math.nan
        cap = _num(row, "capacity", here)
        node = str(row.get("node") or "").strip() or None
        label = str(row.get("label") or "").strip()
        if label:
            if node:
                raise ValueError(f"{here}: give node or label, not both")
            node = f"label:{label}"
        try:
            servers.append(Server(name, math.nan if lat is None else lat, math.nan if lon is None else lon,
                                  1.0 if cap is None else cap, node))
        except ValueError as e:
            raise ValueError(f"{here}: {e}") from None
        coords.append(None if c is None else [float(v) for v in c])
    have = [c is not None for c in coords]
    if any(have) and not all(have):
        i = have.index(False)
        raise ValueError(f"{where}: give network coordinates for every server or for none "
                         f"(row {i + 1} {servers[i].name!r} has none)")
    if all(have):
        dims = {len(c) for c in coords}
        if len(dims) != 1:
            raise ValueError(f"{where}: every server needs the same number of coordinates, got {sorted(dims)}")
        return ServerSet(tuple(servers), np.array(coords))
    return ServerSet(tuple(servers))


def load_servers(path: str | os.PathLike) -> ServerSet:
    """Read a server file: ``.csv`` (header row) or ``.toml`` (``[[server]]`` tables).

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "s.toml")
    >>> _ = open(path, "w").write('[[server]]\\nname = "a"\\ncoords = [0, 0]\\n[[server]]\\nname = "b"\\ncoords = [0, 9]\\n')
    >>> load_servers(path).names, float(load_servers(path).latency()[0, 1])
    (['a', 'b'], 9.0)
    """
    path = os.fspath(path)
    if path.endswith(".toml"):
        import tomllib

        with open(path, "rb") as fh:
            data = tomllib.load(fh)
        rows = data.get("server", data.get("servers"))
        if not isinstance(rows, list):
            raise ValueError(f"{path}: expected [[server]] tables")
        return servers_from_rows(rows, path)
    if path.endswith(".csv"):
        with open(path, newline="") as fh:
            reader = csv.DictReader(fh)
            if not reader.fieldnames or "name" not in reader.fieldnames:
                raise ValueError(f"{path}: the CSV header must include 'name'")
            return servers_from_rows(list(reader), path)
    raise ValueError(f"{path}: server files are .csv or .toml")
