"""Month-long wide-area latency traces for the simulator (Hwang §VI-A).

The paper's simulator replays "actual network delays between 100 PlanetLab
servers every 10 seconds for a month". That trace is not available, so
replistream generates one from the runtime's own model,
:class:`~replistream.network.GeoLatencyModel` (so a simulated and a Ray run
see the same network), over :func:`~replistream.network.default_servers`:
up to 119 real city coordinates. The model is a pure function of ``(seed,
pair, time)``: a month-long trace need not be stored to be replayed
exactly; :func:`write_trace` samples it into the runtime's CSV trace format
(``time_s,src,dst,latency_ms``, read back by
:meth:`~replistream.network.TraceLatencyModel.from_csv`), and
:func:`trace_stats` summarises what it contains.

Parameters of :func:`month_model` (the runtime model's defaults; docs/sim.md
says which rest on published measurements and which are assumptions):
propagation 200 km/ms (light in fibre), route inflation 1.2-2.5 per pair
(median ~1.58), 2 ms overhead, exponential jitter (3% of the base), diurnal
congestion up to +20% peaking at 21:00 local time, spikes (1 per 600 s per
direction, 1-10 s, Pareto(1.5) from 20 ms, capped at 10 s) and outages (one
per link per 12 h on average, log-uniform 1-20 min).

>>> m = month_model(100, seed=1)
>>> len(m.names), m.latency_ms("boston", "london", 29 * 86400.0) > 0
(100, True)
"""
from __future__ import annotations

import math
import os
from typing import Iterable, Sequence

import numpy as np

from replistream.network import GeoLatencyModel, LatencyModel, TraceLatencyModel, default_servers, to_csv

__all__ = ["month_model", "write_trace", "load_trace", "trace_stats", "MONTH_S"]

#: Thirty days in seconds: the length of the paper's trace.
MONTH_S = 30 * 86400.0


def month_model(n_servers: int = 100, seed: int = 0, **params) -> GeoLatencyModel:
    """The time-varying latency model of ``n_servers`` real cities (default 100, at most 119).

    ``params`` go to :class:`~replistream.network.GeoLatencyModel` (e.g.
    ``inflation=(1.5, 3.0)``, ``outages=False``). The first servers are those of
    :func:`~replistream.network.default_servers`, so the 30-server experiments
    use a subset of the 100-server trace.

    >>> month_model(3).names
    ['boston', 'london', 'tokyo']
    >>> month_model(200)
    Traceback (most recent call last):
    ...
    ValueError: n_servers must be in 1..119 (the built-in cities), got 200
    """
    from replistream.network import CITIES

    if not 1 <= int(n_servers) <= len(CITIES):
        raise ValueError(f"n_servers must be in 1..{len(CITIES)} (the built-in cities), got {n_servers}")
    return GeoLatencyModel(default_servers(int(n_servers)), seed=seed, **params)


def write_trace(model: LatencyModel, path: str | os.PathLike, names: Sequence[str] | None = None,
                duration_s: float = MONTH_S, step_s: float = 10.0, start_s: float = 0.0) -> int:
    """Sample ``model`` every ``step_s`` seconds for ``duration_s`` into a CSV trace; returns the rows.

    Every ordered pair of ``names`` (default: all of the model's servers) at
    every step; outages are written as ``inf``. Rows = steps x n x (n-1): a
    month at 10 s for 100 servers is 2.6 billion rows, so choose the servers
    a run uses (the replay is exact at the sample times either way).

    >>> import tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "t.csv")
    >>> write_trace(month_model(3, seed=2), p, duration_s=60, step_s=10)
    36
    >>> load_trace(p).latency_ms("boston", "tokyo", 25.0) == month_model(3, seed=2).latency_ms("boston", "tokyo", 20.0)
    True
    """
    if not (step_s > 0 and duration_s > 0):
        raise ValueError(f"step_s and duration_s must be > 0, got {step_s}, {duration_s}")
    times = start_s + step_s * np.arange(int(math.ceil(duration_s / step_s)))
    return to_csv(model, names, times, path)


def load_trace(path: str | os.PathLike, servers: Iterable | None = None) -> TraceLatencyModel:
    """A CSV trace (``time_s,src,dst,latency_ms``) as a latency model: the runtime's loader.

    >>> load_trace("/nonexistent.csv")
    Traceback (most recent call last):
    ...
    FileNotFoundError: [Errno 2] No such file or directory: '/nonexistent.csv'
    """
    return TraceLatencyModel.from_csv(path, servers=servers)


def trace_stats(model: GeoLatencyModel, names: Sequence[str] | None = None, duration_s: float = MONTH_S,
                step_s: float = 600.0, seed: int = 0, pairs: int = 200) -> dict:
    """What a month of ``model`` contains, measured by sampling (for docs/sim.md).

    ``pairs`` random ordered pairs of ``names`` (seeded) at every ``step_s``:
    latency percentiles (ms, outages excluded), the fraction of samples in an
    outage, the fraction above twice the pair's base (spikes and congestion),
    and the ratio of the base latency to the great-circle fibre time (route
    inflation plus overhead).

    >>> s = trace_stats(month_model(10), duration_s=86400, step_s=3600, pairs=20)
    >>> s["servers"], 0 <= s["outage_fraction"] < 0.1, s["latency_ms"][1] <= s["latency_ms"][50]
    (10, True, True)
    """
    names = list(model.names if names is None else names)
    rng = np.random.default_rng(seed)
    n = len(names)
    if n < 2:
        raise ValueError("trace_stats needs at least 2 servers")
    idx = [(i, j) for i in range(n) for j in range(n) if i != j]
    pick = [idx[k] for k in rng.choice(len(idx), size=min(pairs, len(idx)), replace=False)]
    rows = np.array([i for i, _ in pick]), np.array([j for _, j in pick])
    base = model.base_matrix(names)[rows]
    times = np.arange(0.0, duration_s, step_s)
    lat = np.stack([model.matrix(names, t)[rows] for t in times])
    finite = np.isfinite(lat)
    vals = lat[finite]
    dist = model.distance_km[np.ix_([model.names.index(x) for x in names], [model.names.index(x) for x in names])][rows]
    return {
        "servers": n, "pairs": len(pick), "days": duration_s / 86400, "step_s": step_s,
        "latency_ms": {q: float(np.percentile(vals, q)) for q in (1, 50, 90, 99, 99.9)} | {"max": float(vals.max())},
        "outage_fraction": float(1 - finite.mean()),
        "above_2x_base_fraction": float(np.mean(lat[finite] > 2 * np.broadcast_to(base, lat.shape)[finite])),
        "base_over_fibre_median": float(np.median(base / np.maximum(dist / model.km_per_ms, 1e-9))),
    }
