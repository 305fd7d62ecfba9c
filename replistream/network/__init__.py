"""Servers and the emulated wide-area network (docs/design.md, decisions 5 and 6).

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
``t_send`` arrives, waiting out outages as TCP would; :func:`delivery_times`
does it for many messages on one link at once (vectorised, optionally FIFO).

>>> net = GeoLatencyModel(default_servers(5), seed=1, static=True)
>>> net.names
['boston', 'london', 'tokyo', 'saopaulo', 'berkeley']
>>> 25 < net.latency_ms("boston", "london", 0.0) < 80
True
>>> net.latency_ms("boston", "london", 0.0) == net.latency_ms("london", "boston", 99.0)
True
"""
from .conditions import NetworkConditions, delivery_time, delivery_times
from .latency import TRACE_HEADER, GeoLatencyModel, LatencyModel, TraceLatencyModel, ZeroLatency, to_csv
from .servers import CITIES, FIBRE_KM_PER_MS, LOCAL_MS, REGION, Server, as_servers, city, default_servers, haversine_km

__all__ = [
    "Server", "CITIES", "REGION", "default_servers", "city", "as_servers",
    "LatencyModel", "GeoLatencyModel", "TraceLatencyModel", "ZeroLatency", "NetworkConditions",
    "to_csv", "delivery_time", "delivery_times", "haversine_km", "LOCAL_MS", "FIBRE_KM_PER_MS", "TRACE_HEADER",
]
