"""The paper's workload: the Fig. 1 network-monitoring query (Hwang §II-B, §VI-A).

Every monitored server runs two stream sources: one reports the server's CPU
load, the other the latency of its connection to another server. Load
readings merge in one Union, latency readings in another, and a windowed Join
correlates the load of each server with the latencies it measured; a Filter
keeps the correlations that matter and applications receive them.

>>> q = fig1_query(n_servers=3)
>>> sorted(q.sinks)
['alerts']
>>> data = fig1_inputs(n_servers=3, duration_s=2, period_s=0.5, seed=1)
>>> sorted(data)[:2]
['load_0', 'load_1']
"""
from __future__ import annotations

import numpy as np

from .query import Query
from .schema import seconds

LOAD_SCHEMA = {"server": "i4", "cpu": "f8"}
PING_SCHEMA = {"src": "i4", "dst": "i4", "rtt_ms": "f8"}


def fig1_query(n_servers: int = 10, window_s: float = 10.0, punctuate_s: float = 1.0,
               cpu_threshold: float = 0.0, rtt_threshold_ms: float = 0.0, name: str = "fig1") -> Query:
    """The Fig. 1 query over ``n_servers`` monitored servers.

    Sources ``load_i`` and ``ping_i``; Unions ``loads`` and ``pings``; Join
    ``correlate`` (load of ``server`` with pings whose ``src`` is that server,
    within ``window_s``); Filter ``hot`` keeping ``cpu > cpu_threshold`` and
    ``rtt_ms > rtt_threshold_ms`` (the paper's experiments let everything
    pass: thresholds 0); application ``alerts``.
    """
    if n_servers < 1:
        raise ValueError(f"n_servers must be >= 1, got {n_servers}")
    q = Query(name)
    every = seconds(punctuate_s)
    loads = [q.source(f"load_{i}", LOAD_SCHEMA, punctuate_every=every) for i in range(n_servers)]
    pings = [q.source(f"ping_{i}", PING_SCHEMA, punctuate_every=every) for i in range(n_servers)]
    u_load = q.union(*loads, name="loads")
    u_ping = q.union(*pings, name="pings")
    joined = u_load.join(u_ping, window=seconds(window_s), left_key="server", right_key="src", name="correlate")
    hot = joined.filter(lambda b: (b["cpu"] > cpu_threshold) & (b["rtt_ms"] > rtt_threshold_ms), name="hot")
    hot.sink("alerts")
    return q.build()


def fig1_inputs(n_servers: int = 10, duration_s: float = 60.0, period_s: float = 10.0, seed: int = 0,
                chunk: int = 1) -> dict[str, list]:
    """Periodic readings for :func:`fig1_query`: every ``period_s`` each server
    reports its CPU load and the round-trip time to one other server.

    Readings of server ``i`` are offset by a fixed per-server phase so that
    servers do not report at the same instant. Returns
    ``{source: [chunk of columns, ...]}`` with ``chunk`` readings per chunk.
    """
    rng = np.random.default_rng(seed)
    period = seconds(period_s)
    steps = int(round(duration_s / period_s))
    out: dict[str, list] = {}
    for i in range(n_servers):
        phase = int(rng.integers(0, max(1, period)))
        ts = phase + period * np.arange(steps, dtype=np.int64)
        cpu = np.round(rng.beta(2, 5, steps), 4)
        others = [j for j in range(n_servers) if j != i] or [i]
        dst = rng.choice(others, steps).astype(np.int32)
        rtt = np.round(rng.gamma(4.0, 20.0, steps), 3)
        src = np.full(steps, i, dtype=np.int32)
        out[f"load_{i}"] = [{"ts": ts[a:a + chunk], "server": src[a:a + chunk], "cpu": cpu[a:a + chunk]}
                            for a in range(0, steps, chunk)]
        out[f"ping_{i}"] = [{"ts": ts[a:a + chunk] + 1, "src": src[a:a + chunk], "dst": dst[a:a + chunk],
                             "rtt_ms": rtt[a:a + chunk]} for a in range(0, steps, chunk)]
    return out


#: Start of the readings :func:`fig1_tables` writes (2026-11-22T00:00:00Z, in µs since the epoch).
FIG1_EPOCH_US = 1_795_305_600_000_000


def fig1_tables(n_servers: int = 10, duration_s: float = 60.0, period_s: float = 10.0, seed: int = 0,
                start_us: int = FIG1_EPOCH_US) -> dict:
    """The readings of :func:`fig1_inputs` as two Arrow tables, as a monitoring system would store them.

    ``loads`` has ``event_time`` (UTC timestamp), ``server``, ``cpu``;
    ``pings`` has ``event_time``, ``src``, ``dst``, ``rtt_ms``. Event times are
    ``start_us`` plus the offsets of :func:`fig1_inputs`, so feeding either
    form gives the same tuples, shifted in time.

    >>> t = fig1_tables(n_servers=2, duration_s=2, period_s=1, seed=1)
    >>> t["loads"].column_names, t["pings"].num_rows
    (['event_time', 'server', 'cpu'], 4)
    """
    import pyarrow as pa

    data = fig1_inputs(n_servers, duration_s, period_s, seed, chunk=1 << 62)
    ts_type = pa.timestamp("us", tz="UTC")
    out = {}
    for kind, fields in (("loads", ("server", "cpu")), ("pings", ("src", "dst", "rtt_ms"))):
        prefix = "load" if kind == "loads" else "ping"
        parts = [c for i in range(n_servers) for c in data[f"{prefix}_{i}"]]
        cols = {"event_time": pa.array(np.concatenate([c["ts"] for c in parts]) + start_us, ts_type)}
        for f in fields:
            cols[f] = pa.array(np.concatenate([c[f] for c in parts]))
        out[kind] = pa.table(cols)
    return out
