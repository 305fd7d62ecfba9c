"""Upper bounds on the input delays replicas can observe over a window of virtual time.

Revival (§V-C, Hwang) acts when a replica observes an input delay above a threshold. In
the batched simulator a coordinator that looks every 10 virtual seconds used to stop the
engine every 10 s (docs/experiments.md, Fig. 5). With a bound that shows no replica can
observe a delay above the threshold in ``[t0, t1)``, the engine may run that window in
large epochs and replay the coordinator's calls afterwards from what it recorded
(:class:`~replistream.sim.batch.BatchRun`, "look-ahead epochs"). The bound only decides
*when* the engine may do so; the replayed calls check that nothing would have been done,
so the results do not depend on it (a wrong bound stops the run with
:class:`~replistream.sim.batch.LookaheadMiss`).

The bound follows the structure of :class:`~replistream.network.GeoLatencyModel`: per
directed link, ``base + congestion x base`` (the diurnal term's maximum) ``+`` the largest
jitter drawn for the seconds of the window ``+`` the largest spike whose span meets the
window; a link with an outage meeting the window has no bound (``inf``). A replica's first
copy of a tuple arrives no later than over any one live path, so per input port the bound
is the minimum over its live input stream replicas of (the sender's bound plus the link's),
and per replica the maximum over its ports (a Join's output carries the later of its two
timestamps, so its delay is at most the larger of its inputs'). CPU costs are microseconds:
``cpu_margin_s`` is added per hop.

>>> from replistream.network import GeoLatencyModel
>>> m = GeoLatencyModel(["boston", "london", "tokyo"], seed=1)
>>> b = link_bounds_ms(m, [("boston", "london"), ("london", "london")], 0.0, 60.0)
>>> bool(b[0] >= m.latency_ms("boston", "london", 30.0)), float(b[1]) == m.local_ms
(True, True)
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

__all__ = ["link_bounds_ms", "delay_bounds"]


def _event_max(model, prefix: np.ndarray, t0: float, t1: float, window: float, p: float, dur, log_dur: bool,
               size=None) -> np.ndarray:
    """Per pair prefix: the largest ``size(u)`` of an event (spike or outage) whose span meets
    ``[t0, t1]`` (``-inf`` when none; ``size=None``: ``inf`` when one does)."""
    from replistream.network.latency import ARRAY_OPS, draw_np

    ws = np.arange(math.floor(t0 / window) - 1, math.floor(t1 / window) + 1, dtype=np.int64)
    P = prefix[:, None]
    W = np.broadcast_to(ws[None, :], (len(prefix), len(ws)))
    occ = draw_np(P, W, 0) < p
    start, d = model._span(ARRAY_OPS, W, window, draw_np(P, W, 1), draw_np(P, W, 2), dur, log_dur)
    meet = occ & (start <= t1) & (start + d > t0)
    if size is None:
        val = np.where(meet, math.inf, -math.inf)
    else:
        val = np.where(meet, size(draw_np(P, W, 3)), -math.inf)
    return val.max(axis=1) if len(ws) else np.full(len(prefix), -math.inf)


def link_bounds_ms(model, pairs: Sequence[tuple[str, str]], t0: float, t1: float) -> np.ndarray:
    """An upper bound (ms) on the one-way latency of each directed pair ``(a, b)`` at every
    time in ``[t0, t1]``, from a :class:`~replistream.network.GeoLatencyModel`; ``inf``
    where an outage meets the window, and ``inf`` for every pair of any other model.

    >>> from replistream.network import GeoLatencyModel, ZeroLatency
    >>> link_bounds_ms(ZeroLatency(["a", "b"]), [("a", "b")], 0, 10).tolist()
    [inf]
    >>> m = GeoLatencyModel(["boston", "london"], seed=0, static=True)
    >>> float(link_bounds_ms(m, [("boston", "london")], 0, 10)[0]) == m.latency_ms("boston", "london", 5.0)
    True
    """
    from replistream.network.latency import GeoLatencyModel, TAG_JITTER, TAG_OUTAGE, TAG_SPIKE, draw_np

    n = len(pairs)
    if type(model) is not GeoLatencyModel:
        return np.full(n, math.inf)
    if not n:
        return np.zeros(0)
    idx = model._index
    i = np.array([idx[a] for a, _ in pairs], dtype=np.int64)
    j = np.array([idx[b] for _, b in pairs], dtype=np.int64)
    base = model._base[i, j]
    out = base * (1.0 + model.congestion)
    if model.jitter > 0:
        steps = np.arange(math.floor(t0 / model.step_s), math.floor(t1 / model.step_s) + 1, dtype=np.int64)
        u = draw_np(model._prefix[TAG_JITTER][i, j][:, None], steps[None, :], 0).max(axis=1)
        out = out + np.maximum(model.jitter_min_ms, model.jitter * base) * -np.log1p(-u)
    if model.spike_p > 0:
        s = _event_max(model, model._prefix[TAG_SPIKE][i, j], t0, t1, model.spike_window_s, model.spike_p,
                       model.spike_duration, False,
                       size=lambda u: np.minimum(model.spike_max_ms,
                                                 model.spike_scale_ms * (1.0 - u) ** (-1.0 / model.spike_alpha)))
        out = out + np.maximum(s, 0.0)
    if model.outage_p > 0:
        o = _event_max(model, model._prefix[TAG_OUTAGE][i, j], t0, t1, model.outage_window_s, model.outage_p,
                       model.outage_duration, True)
        out = np.where(o > 0, math.inf, out)
    local = i == j
    out[local] = model.local_ms
    return out


def delay_bounds(sim, t0: float, t1: float, cpu_margin_s: float = 0.005) -> dict[str, float]:
    """Per live replica of ``sim`` (a :class:`~replistream.sim.engine.Simulator`) that its live
    stream replicas feed: an upper bound (s) on the input delay it can observe for tuples
    sent within ``[t0, t1]`` (§V-C's observation, see the module docs); ``inf`` where a port
    has no live input or every path meets an outage.

    >>> from replistream.network import GeoLatencyModel
    >>> from replistream.sim import Simulator
    >>> from replistream.workloads import fig1_query
    >>> q = fig1_query(1)
    >>> plan = {n: ["boston"] for n in ["entry", "loads", "pings", "correlate", "hot"]} | {"alerts": ["london"]}
    >>> sim = Simulator(q, plan, GeoLatencyModel(["boston", "london"], seed=0, static=True))
    >>> b = delay_bounds(sim, 0.0, 60.0); 0.01 < b["alerts"] < 0.1
    True
    """
    from replistream.network import NetworkConditions

    model = sim.net.base if isinstance(sim.net, NetworkConditions) and not sim.net.overrides() else sim.net
    q = sim.query
    batch = getattr(sim, "_batch", None)
    sources = batch.sources if batch is not None else list(q.sources)  # (the query recomputes them per access)
    order = batch.order if batch is not None else [n for n in q.topological() if n in sim.groups]
    links = [lk for lk in sim.links if lk.live and lk.sender.alive and lk.receiver.alive]
    entries = [r for r in sim.groups.get("entry", []) if r.alive]
    src_pairs = [(sim.sources.get(s, r.server), r.server) for r in entries for s in sources]
    pairs = sorted({(lk.sender.server, lk.receiver.server) for lk in links} | set(src_pairs))
    bound = dict(zip(pairs, (link_bounds_ms(model, pairs, t0, t1) / 1000.0).tolist()))
    out_b: dict[int, float] = {}
    for r in entries:
        out_b[id(r)] = max((bound[(sim.sources.get(s, r.server), r.server)] for s in sources),
                           default=0.0) + cpu_margin_s
    into: dict[int, dict[int, list]] = {}
    for lk in links:
        into.setdefault(id(lk.receiver), {}).setdefault(lk.port, []).append(lk)
    res: dict[str, float] = {}
    for node in order:
        if node not in sim.groups or node == "entry":
            continue
        for r in sim.groups[node]:
            ports = into.get(id(r))
            if not r.alive or not ports:
                continue
            n_ports = len(r.core.filters) if r.core is not None else len(ports)
            worst = 0.0
            for p in range(n_ports):
                lks = ports.get(p, ())
                worst = max(worst, min((out_b.get(id(lk.sender), math.inf) + bound[(lk.sender.server,
                                                                                     lk.receiver.server)]
                                        for lk in lks), default=math.inf))
            res[r.label] = worst
            out_b[id(r)] = worst + cpu_margin_s
    return res
