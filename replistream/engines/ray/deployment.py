"""Deploy a replicated query on Ray and run it (Hwang §II-B).

:func:`deploy` validates the request before any actor starts, places ``k``
replicas of every operator on distinct servers, starts the actors (entry
points, operator replicas, applications, a coordinator), connects every
upstream replica to every downstream replica, and returns a
:class:`Deployment`. ``Deployment.run(inputs)`` feeds the sources and waits
for the applications to receive the end of every stream.

>>> import replistream as rs                                  # doctest: +SKIP
>>> dep = rs.deploy(query, servers=6, k=2, network="geo")     # doctest: +SKIP
>>> result = dep.run(inputs, pace=1.0)                        # doctest: +SKIP
>>> result.outputs["alerts"][:3]                              # doctest: +SKIP
"""
from __future__ import annotations

import math
import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np
import ray

from ...errors import DeadLetter, QueryError
from ...plan import ENTRY
from ...sources import ChunkRef, Sentinel, TimeMerge, chunk_tmax, iter_chunks, needs_stamp, stamp
from ...query import Query
from ...operators.base import NO_PUNCTUATION
from ...schema import END, TS, Punctuation
from ...placement.nodes import ray_options
from ...placement.policy import STRATEGIES, PlacementPolicy
from .actors import CoordinatorActor, EntryActor, ReplicaActor, SinkActor


#: Ray settings replistream starts Ray with. Packets up to this size travel inline
#: in the actor call instead of through the object store (see channels.py: a dead
#: sender's objects stall their receiver about a second each). On a cluster you
#: start yourself, pass the same ``_system_config`` to ``ray.init``/``ray start``.
RAY_SYSTEM_CONFIG = {"max_direct_call_object_size": 8 * 1024 * 1024}


def init_ray(address: str | None = None, **kwargs) -> None:
    """Start (or join) Ray the way replistream expects, if it is not running yet.

    Without ``address`` a new local instance starts even when another Ray
    cluster runs on the machine (``address="local"``); give ``address`` to join one.

    >>> init_ray(num_cpus=2)  # doctest: +SKIP
    """
    if ray.is_initialized():
        return
    opts = {"include_dashboard": False, "logging_level": "ERROR", "log_to_driver": False}
    if address is None or address == "local":
        opts["address"] = "local"
        opts["_system_config"] = dict(RAY_SYSTEM_CONFIG)
    else:
        opts["address"] = address
    opts.update(kwargs)
    ray.init(**opts)


# -- servers and placement ---------------------------------------------------------

def resolve_servers(servers) -> list:
    """Servers from a count, names of known cities, :class:`~replistream.network.Server` objects,
    a :class:`~replistream.placement.ServerSet`, or the path of a server file (``.csv``/``.toml``)."""
    import os

    from ...network import CITIES, Server, default_servers
    from ...placement.servers import ServerSet, load_servers

    if servers is None:
        return default_servers(6)
    if isinstance(servers, (str, os.PathLike)):
        if not str(servers).endswith((".csv", ".toml")):
            raise ValueError(f"servers={servers!r}: give a count, a list of servers or city names, or the path "
                             f"of a .csv/.toml server file")
        servers = load_servers(servers)
    if isinstance(servers, ServerSet):
        return list(servers.servers)
    if isinstance(servers, int):
        if servers < 1:
            raise ValueError(f"servers must be >= 1, got {servers}")
        return default_servers(servers)
    out = []
    known = {c[0] if isinstance(c, tuple) else c.name: c for c in CITIES}
    for s in servers:
        if isinstance(s, Server):
            out.append(s)
        elif isinstance(s, str):
            c = known.get(s)
            if c is None:
                raise ValueError(f"unknown server {s!r}: give a Server(name, lat, lon) or one of the built-in "
                                 f"cities, e.g. {sorted(known)[:5]}")
            out.append(c if isinstance(c, Server) else Server(*c))
        else:
            raise ValueError(f"servers must be Server objects or city names, got {type(s).__name__}")
    names = [s.name for s in out]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"server names must be unique; repeated: {sorted(dup)}")
    return out


def spread_placement(query: Query, servers: list, k: int) -> dict[str, list[str]]:
    """A simple deterministic spread: replicas of each operator on ``k`` distinct servers,
    rotating the starting server per operator so load spreads evenly.

    Every strategy has this signature: ``(query, servers, k) -> {node: [server
    names]}``; the placement strategies (``"min-cost"``, ``"random"``,
    ``"non-replicated"``) are :class:`~replistream.placement.PlacementPolicy`
    objects, which also take the deployment's network.
    """
    names = [s.name for s in servers]
    out: dict[str, list[str]] = {}
    nodes = [ENTRY] + query.operators
    for i, node in enumerate(nodes):
        out[node] = [names[(i + j) % len(names)] for j in range(k)]
    for node in query.sinks:
        out[node] = [names[0]]
    return out


#: Placement strategies ``deploy(..., placement=name)`` knows: ``"spread"`` and those of
#: :data:`replistream.placement.STRATEGIES` (``"min-cost"`` is Algorithm 5, Hwang §V-A).
PLACEMENTS: dict[str, Callable] = {"spread": spread_placement,
                                   **{name: PlacementPolicy(name) for name in STRATEGIES}}


def resolve_placement(query: Query, servers: list, k: int, placement, network=None) -> dict[str, list[str]]:
    """The validated plan ``{node: [server, ...]}`` of ``placement`` (a name, mapping or callable).

    ``network`` (a latency model or matrix) is what placement policies cost
    latencies with.
    """
    return _resolve_placement(query, servers, k, placement, network)[0]


def _resolve_placement(query: Query, servers: list, k: int, placement, network=None):
    """(validated plan, the :class:`~replistream.placement.Placement` when a placement policy made it)."""
    names = {s.name for s in servers}
    placed = None
    if placement is None:
        placement = "spread"
    if isinstance(placement, str):
        if placement not in PLACEMENTS:
            raise ValueError(f"unknown placement strategy {placement!r}; known: {sorted(PLACEMENTS)}")
        placement = PLACEMENTS[placement]
    if isinstance(placement, PlacementPolicy):
        placed = placement.placement(query, servers, k, network)
        plan = placed.plan()
    elif callable(placement):
        plan = placement(query, servers, k)
    elif isinstance(placement, Mapping):
        plan = dict(spread_placement(query, servers, k))
        plan.update({n: list(v) for n, v in placement.items()})
    else:
        raise ValueError(f"placement must be a strategy name, a mapping or a callable, got {type(placement).__name__}")
    if not isinstance(plan, Mapping):
        raise ValueError("a placement strategy must return a mapping {node: [server, ...]}")
    valid_nodes = set(query.operators) | set(query.sinks) | {ENTRY}
    for node, where in plan.items():
        if node not in valid_nodes:
            raise ValueError(f"placement names {node!r}, which is not an operator, application or {ENTRY!r} "
                             f"of query {query.name!r}")
        for s in where:
            if s not in names:
                raise ValueError(f"placement puts {node!r} on unknown server {s!r}")
        if len(set(where)) != len(where):
            raise ValueError(f"placement puts two replicas of {node!r} on one server: {list(where)}")
    for node in [ENTRY] + query.operators:
        if node not in plan or len(plan[node]) != k:
            raise ValueError(f"placement must give {node!r} exactly k={k} distinct servers, "
                             f"got {plan.get(node)}")
    for node in query.sinks:
        if node not in plan or len(plan[node]) != 1:
            raise ValueError(f"placement must give application {node!r} exactly one server, got {plan.get(node)}")
    return {n: list(v) for n, v in plan.items()}, placed


def resolve_network(network, servers: list, seed: int):
    from ...network import GeoLatencyModel, LatencyModel, NetworkConditions, TraceLatencyModel, ZeroLatency

    if network is None or network == "zero":
        base = ZeroLatency([s.name for s in servers])
    elif network == "geo":
        base = GeoLatencyModel(servers, seed=seed)
    elif network == "geo-static":
        base = GeoLatencyModel(servers, seed=seed, static=True)
    elif isinstance(network, str) and network.endswith(".csv"):
        base = TraceLatencyModel.from_csv(network)
    elif isinstance(network, (LatencyModel, NetworkConditions)):
        base = network
    else:
        raise ValueError(f"network must be 'zero', 'geo', 'geo-static', a trace .csv path or a LatencyModel, "
                         f"got {network!r}")
    return base if isinstance(base, NetworkConditions) else NetworkConditions(base)


def _ray_options(server) -> dict:
    """Actor options pinning a replica to its server's Ray node (see :mod:`replistream.placement.nodes`)."""
    return ray_options(server)


# -- results ----------------------------------------------------------------------

@dataclass
class DeploymentResult:
    """What the applications received, with arrival times and metrics."""

    outputs: dict[str, np.ndarray]
    arrivals: dict[str, np.ndarray]
    punctuation: dict[str, int]
    dead_letters: list[DeadLetter]
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return all(p == END for p in self.punctuation.values())

    def dead_letter_count(self) -> int:
        return sum(d.count for d in self.dead_letters)


# -- the deployment ------------------------------------------------------------------

class Deployment:
    """A replicated query running on Ray. Created by :func:`deploy`."""

    def __init__(self, query: Query, servers: list, k: int, plan: dict, conditions, seed: int,
                 channel_opts: dict, strict: bool, on_malformed: str, parquet_dir: str | None, cluster=None,
                 gc=None):
        self.query = query
        self.channel_opts = dict(channel_opts)
        self.strict = strict
        self.manager = None  # the garbage collection / revival loop (runtime/manager.py), if gc= was given
        self.servers = {s.name: s for s in servers}
        self.k = k
        self.plan = plan
        self.conditions = conditions
        self.seed = seed
        self.cluster = cluster
        self.t0 = time.time()
        self.speed: float | None = None
        self.ts0 = 0.0  # timestamp replayed at t0 when paced
        self.events: list[dict] = []
        self.fed: list[tuple[float, str, int]] = []  # (time since start, source, chunk number) per chunk sent
        self._lock = threading.Lock()
        self._feeder: threading.Thread | None = None
        self._feed_error: BaseException | None = None
        # what the feeder has sent, under _feed_lock: markers of query changes go in between chunks
        self._feed_lock = threading.RLock()
        self._seqs: dict[str, int] = {}
        self._open_sources: set[str] = set()
        self._inflight: dict[int, list] = {}
        self._max_fed: int | None = None  # largest timestamp or punctuation sent (None: nothing yet)
        self._tmax_unknown = False
        self._feeding = False
        self.changes: list[dict] = []  # every change made to the running query (replistream.replica.changes)
        self.removed: set[str] = set()  # replicas of operators removed from the running query
        self._scenario_thread: threading.Thread | None = None
        self.alive: dict[str, bool] = {}
        self.actor_server: dict[str, str] = {}
        self.handles: dict[str, Any] = {}

        self.coordinator = CoordinatorActor.options(name=None).remote(self.t0)
        self.entries = []
        for i, srv in enumerate(plan[ENTRY]):
            h = EntryActor.options(**_ray_options(self.servers[srv])).remote(
                query, i, srv, conditions, self.t0, channel_opts, self.coordinator, strict, on_malformed)
            self.entries.append(h)
            self._register(f"entry#{i}", srv, h)
        self.replicas: dict[str, list] = {}
        for node in query.operators:
            chans = [len(plan[ENTRY]) if query.spec(u).kind == "source" else len(plan[u])
                     for u in query.inputs_of(node)]
            hs = []
            for i, srv in enumerate(plan[node]):
                h = ReplicaActor.options(**_ray_options(self.servers[srv])).remote(
                    query, node, i, srv, chans, conditions, self.t0, channel_opts, self.coordinator, strict)
                hs.append(h)
                self._register(f"{node}#{i}", srv, h)
            self.replicas[node] = hs
        self.sinks: dict[str, Any] = {}
        for node in query.sinks:
            chans = [len(plan[ENTRY]) if query.spec(u).kind == "source" else len(plan[u])
                     for u in query.inputs_of(node)]
            srv = plan[node][0]
            h = SinkActor.options(**_ray_options(self.servers[srv])).remote(
                query, node, srv, chans, conditions, self.t0, channel_opts, self.coordinator, strict,
                None if parquet_dir is None else f"{parquet_dir}/{node}")
            self.sinks[node] = h
            self._register(node, srv, h)
        # every upstream replica feeds every downstream replica
        calls = []
        for node in query.topological():
            ups = self._instances(node)
            for v, port in query.outputs_of(node):
                for ci, (ulabel, uh) in enumerate(ups):
                    for dlabel, dh in self._instances(v):
                        calls.append(uh.connect.remote(node, dlabel, self.actor_server[dlabel], dh, port, ci))
        ray.get(calls)
        self._fetched: dict[str, int] = {n: 0 for n in query.sinks}
        self._outputs: dict[str, list] = {n: [] for n in query.sinks}
        self._arrivals: dict[str, list] = {n: [] for n in query.sinks}
        self._punct: dict[str, int] = {n: int(np.iinfo(np.int64).min) for n in query.sinks}
        self._callbacks: dict[str, list[Callable]] = {n: [] for n in query.sinks}
        self._poll_lock = threading.Lock()
        self.dormant: set[str] = set()  # operator replicas whose actors garbage collection stopped
        if gc is not None:
            from .control import GCConfig, ReplicaManager

            if isinstance(gc, Mapping):
                gc = GCConfig(**gc)
            if not isinstance(gc, GCConfig):
                raise ValueError(f"gc must be a GCConfig or a mapping of its fields, got {type(gc).__name__}")
            self.manager = ReplicaManager(self, gc)

    def _register(self, label: str, server: str, handle) -> None:
        self.alive[label] = True
        self.actor_server[label] = server
        self.handles[label] = handle

    def adopt(self, label: str, server: str, handle) -> None:
        """Take a replica the coordinator loop started (revived or new) into the deployment."""
        with self._lock:
            self.dormant.discard(label)
            self._register(label, server, handle)

    def retire(self, label: str) -> None:
        """Stop the actor of a replica garbage collection made dormant (not a failure: no drop broadcast)."""
        with self._lock:
            if not self.alive.get(label):
                return
            self.alive[label] = False
            self.dormant.add(label)
        try:
            ray.kill(self.handles[label], no_restart=True)
        except Exception:
            pass

    def _replicas(self):
        if self.manager is None:
            from .control import GCConfig, ReplicaManager

            self.manager = ReplicaManager(self, GCConfig(gc=False))  # not started: applies requests only
        return self.manager

    def revive_replica(self, operator: str, replica: int, strategy: str | None = None,
                       bins_per_step: int | None = None, bits: int | None = None) -> dict:
        """Replace replica ``replica`` of ``operator`` (running or crashed) by a new replica on the same
        server, built by hand-over from a live peer (docs/design.md, decision 7, Hwang §V-C); returns the event.

        ``strategy`` (``"all-at-once"``, ``"batched"``, ``"fluid"``) moves the checkpoint in steps of
        ``2**bits`` bins at the peer's punctuations (Megaphone §3.3; docs/migration.md).

        >>> dep.revive_replica("correlate", 0)["new_replicas"][0]["label"]   # doctest: +SKIP
        'correlate#2'
        """
        return self._replicas().replace_replica(f"{operator}#{replica}", strategy=strategy,
                                                bins_per_step=bins_per_step, bits=bits)

    def add_replica(self, operator: str, strategy: str | None = None, bins_per_step: int | None = None,
                    bits: int | None = None) -> dict:
        """Add a replica of ``operator`` (on the server of replica 0) by hand-over from a live peer
        (``strategy`` as for :meth:`revive_replica`).

        >>> dep.add_replica("correlate")["action"]   # doctest: +SKIP
        'create-replica'
        """
        first = next((l for l in self.handles if l.rsplit("#", 1)[0] == operator), None)
        if first is None:
            raise ValueError(f"{operator!r} is not an operator of query {self.query.name!r}")
        return self._replicas().replace_replica(first, add=True, strategy=strategy, bins_per_step=bins_per_step,
                                                bits=bits)

    def move_replica(self, operator: str, replica: int, server: str, strategy: str = "all-at-once",
                     bins_per_step: int | None = None, bits: int | None = None) -> dict:
        """Move replica ``replica`` of ``operator`` to ``server`` while the query runs: a new replica
        there takes the state in steps (Megaphone §3.3: ``"all-at-once"``, ``"batched"`` with
        ``bins_per_step``, ``"fluid"``; ``2**bits`` bins, default 256) from a live peer (the
        replica itself if it is the only one) that keeps serving between steps; then the old
        replica retires. Returns the logged event (``handover`` has the transfer's figures).

        >>> ev = dep.move_replica("counts", 0, "s3", strategy="fluid", bits=6)   # doctest: +SKIP
        >>> ev["new_replicas"][0]["server"], ev["handover"]["counts#1"]["steps"]   # doctest: +SKIP
        ('s3', 64)
        """
        label = f"{operator}#{replica}"
        if label not in self.handles:
            raise ValueError(f"no replica {label!r}")
        if not self.alive.get(label):
            raise ValueError(f"{label} is not running; revive it with revive_replica")
        return self._replicas().replace_replica(label, server=server, strategy=strategy or "all-at-once",
                                                bins_per_step=bins_per_step, bits=bits)

    def transfers(self) -> list[dict]:
        """Progress of every staged state transfer (strategy, steps done of all, peer, restarts, times)."""
        return [] if self.manager is None else [dict(t) for t in self.manager.transfers]

    # -- changing the running query (Bartnik §3; replistream.reconfig) ---------------------------
    def replace_function(self, operator: str, fn: Callable) -> dict:
        """Give Filter/Map/FlatMap ``operator`` a new function for every tuple with ``ts > p``,
        where ``p`` is the largest timestamp fed so far; returns the change's record (with ``p``).

        A marker carries the change through the running replicas (Bartnik §3); the
        output equals a reference run of ``dep.query``, which now holds both
        functions (:class:`~replistream.replica.changes.TimeSwitch`).

        >>> dep.replace_function("hot", lambda b: b["cpu"] > 0.9)["p"]   # doctest: +SKIP
        15000000
        """
        from .reconfigure import replace_function

        return replace_function(self, operator, fn)

    def add_operator(self, upstream: str, build: Callable, servers=None) -> dict:
        """Add operators and their application(s) reading stream ``upstream``; they see its
        tuples with ``ts > p`` (``p``: the largest timestamp fed so far). ``build(stream)``
        adds them with the usual :class:`~replistream.query.Stream` methods. Each new
        operator gets ``k`` replicas, by default on the servers of ``upstream``'s replicas.

        >>> dep.add_operator("load", lambda s: s.filter(lambda b: b["cpu"] > 0.9, name="very_hot")
        ...                  .sink("very_hot_alerts"))["added"]                      # doctest: +SKIP
        ['very_hot', 'very_hot_alerts']
        """
        from .reconfigure import add_operator

        return add_operator(self, upstream, build, servers)

    def remove_operator(self, operator: str) -> dict:
        """Remove ``operator`` and the part of the query only it feeds: it sees its input up to
        ``p`` (the largest timestamp fed so far), then its inputs close, its windows flush and
        its applications complete; its replicas are then stopped (``changes[-1]["retired"]``).

        >>> dep.remove_operator("load_per_minute")["removed"]      # doctest: +SKIP
        ['load_per_minute', 'load_stats']
        """
        from .reconfigure import remove_operator

        return remove_operator(self, operator)

    def set_replication(self, operator: str, k: int) -> dict:
        """Run ``k`` live replicas of ``operator``: new ones by hand-over from a live peer,
        surplus ones discarded (their stream replicas first).

        >>> dep.set_replication("correlate", 3)["added"]      # doctest: +SKIP
        ['correlate#2']
        """
        from .reconfigure import set_replication

        return set_replication(self, operator, k)

    def gc_events(self) -> list[dict]:
        """Every garbage-collection and revival decision so far, with reason and figures (JSON-ready)."""
        return [] if self.manager is None else list(self.manager.events)

    def network_cost_history(self) -> list[dict]:
        """Network cost (and theta, live stream replicas, worst input delay) per utility period."""
        return [] if self.manager is None else list(self.manager.history)

    def _instances(self, node: str) -> list[tuple[str, Any]]:
        spec = self.query.spec(node)
        if spec.kind == "source":
            return [(f"entry#{i}", h) for i, h in enumerate(self.entries)]
        if spec.kind == "sink":
            return [(node, self.sinks[node])]
        return [(f"{node}#{i}", h) for i, h in enumerate(self.replicas[node])]

    # -- feeding -------------------------------------------------------------------------
    def feed(self, inputs: Mapping[str, Iterable], pace: float | None = None, chunk_size: int = 10_000) -> None:
        """Start feeding ``inputs`` (``{source: iterable of chunks or records}``) in a background thread.

        With ``pace=s`` a tuple with timestamp ``ts`` is released at wall time
        ``t0 + (ts - ts0) / (1e6 * s)`` (``s=1``: real time), where ``ts0`` is
        the earliest first timestamp over the sources (so epoch timestamps
        replay from now); without it, as fast as the entry points take it.
        Records without ``ts`` are stamped by the feeder's clock (one clock
        for every entry replica).

        An input may also be a source object with a ``bind(source, schema)``
        method, e.g. :class:`replistream.spark.SparkSource`: it is checked
        against the source's schema before anything is sent (a mismatch
        raises :class:`~replistream.errors.SchemaError` here) and then yields
        :class:`ChunkRef` s, chunks already in Ray's object store, which go
        to the entry points without passing through the driver.
        """
        unknown = set(inputs) - set(self.query.sources)
        if unknown:
            raise QueryError(f"inputs given for unknown source(s) {sorted(unknown)}; sources are {self.query.sources}")
        if pace is not None and pace <= 0:
            raise ValueError(f"pace must be > 0, got {pace}")
        for src, data in inputs.items():
            if hasattr(data, "bind"):
                data.bind(src, self.query.schema_of(src))
        self.speed = pace
        self.t0 = time.time() + 0.05
        self.feed_done_wall = None  # wall time the feeder sent its last chunk (input delays stop growing then)
        _get_quietly([h.set_start.remote(self.t0) for l, h in self.handles.items() if self.alive.get(l)])
        self._broadcast_network()
        self._feeder = threading.Thread(target=self._feed_loop, args=(dict(inputs), pace, chunk_size),
                                        daemon=True, name="replistream-feeder")
        self._feeder.start()

    def _feed_loop(self, inputs, pace, chunk_size):
        try:
            self._feed(inputs, pace, chunk_size)
        except BaseException as e:  # surfaced by wait()
            self._feed_error = e

    def _feed(self, inputs, pace, chunk_size):
        iters = {s: iter(iter_chunks(inputs.get(s, ()), chunk_size)) for s in self.query.sources}
        with self._feed_lock:
            self._seqs = {s: 0 for s in self.query.sources}
            self._open_sources = set(self.query.sources)
            self._inflight = {i: [] for i in range(len(self.entries))}
            self._max_fed, self._tmax_unknown = None, False
        merge = TimeMerge(iters)  # the sources in event-time order (a sentinel keeps its source's time)
        self.ts0 = float(merge.first) if merge.first is not None else 0.0
        # the clock replicas measure their input delay with (Hwang §V-C)
        _get_quietly([h.set_clock.remote(self.t0, self.ts0, pace) for l, h in list(self.handles.items())
                      if self.alive.get(l)])
        if self.manager is not None:
            self.manager.start()
        inflight = self._inflight
        self._feeding = True
        for t, src, chunk in merge:
            if isinstance(chunk, Sentinel):
                for i, refs in inflight.items():
                    self._settle(i, refs, 0)  # everything before the event has reached the entry points
                chunk.apply(self)
                self.events.append({"t": time.time() - self.t0, "event": repr(chunk)})
                continue
            if pace is not None and chunk is not None and math.isfinite(t):
                delay = self.t0 + (t - self.ts0) / (1e6 * pace) - time.time()
                if delay > 0:
                    time.sleep(delay)
            if chunk is not None and needs_stamp(chunk):
                chunk = stamp(chunk, int((time.time() - self.t0) * 1e6))
            with self._feed_lock:
                self._send_chunk(src, self._seqs[src], chunk, inflight)
                self._seqs[src] += 1
                if chunk is None:
                    self._open_sources.discard(src)
                else:
                    hi = chunk_tmax(chunk)
                    if hi is None:
                        self._tmax_unknown = True
                    elif self._max_fed is None or hi > self._max_fed:
                        self._max_fed = hi
        self._feeding = False
        for i, refs in inflight.items():
            self._settle(i, refs, 0)
        self.feed_done_wall = time.time()

    def _send_chunk(self, src, seq, chunk, inflight) -> None:
        self.fed.append((time.time() - self.t0, src, seq))
        sent = False
        if isinstance(chunk, ChunkRef):
            ref = chunk.ref  # already in the object store: the driver never holds the rows
        else:
            ref = ray.put(chunk) if chunk is not None else None
        for i, h in enumerate(self.entries):
            label = f"entry#{i}"
            if not self.alive.get(label):
                continue
            inflight[i].append(h.push_chunk.remote(src, seq, ref))
            sent = True
            self._settle(i, inflight[i], 32)
        if not sent:
            raise RuntimeError("every entry point replica is dead: the input cannot be delivered")

    def _settle(self, i: int, refs: list, limit: int) -> None:
        """Bound in-flight chunks per entry replica; notice dead entry replicas."""
        while len(refs) > limit:
            ready, _ = ray.wait(refs[:1], timeout=1.0)
            if not ready:
                if not self.alive.get(f"entry#{i}"):
                    refs.clear()
                    return
                continue
            try:
                ray.get(ready[0])
            except Exception:
                self._mark_dead(f"entry#{i}", "entry point failed")
                refs.clear()
                return
            refs.pop(0)

    # -- waiting and results ----------------------------------------------------------------
    def wait(self, timeout: float = 600.0, progress: Callable[[dict], None] | None = None) -> bool:
        """Wait until every application received the end of every stream (or ``timeout`` s)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self._feed_error is not None:
                raise RuntimeError(f"feeding the sources failed: {self._feed_error}") from self._feed_error
            self.poll()
            if progress is not None:
                progress({n: len(self._outputs[n]) and sum(len(b) for b in self._outputs[n])
                          for n in self.query.sinks})
            if all(p == END for p in self._punct.values()):
                return True
            time.sleep(0.05)
        return False

    def on_output(self, app: str, callback: Callable[[np.ndarray], None]) -> None:
        """Call ``callback(batch)`` in the driver with every new batch application ``app`` receives.

        Callbacks run while :meth:`run`/:meth:`wait` wait, or on each :meth:`poll`.

        >>> dep.on_output("alerts", lambda batch: print(len(batch), "new alerts"))  # doctest: +SKIP
        """
        if app not in self._callbacks:
            raise ValueError(f"{app!r} is not an application of query {self.query.name!r}; "
                             f"applications: {self.query.sinks}")
        self._callbacks[app].append(callback)

    def poll(self) -> None:
        """Fetch newly delivered tuples from the applications (and run output callbacks)."""
        with self._poll_lock:
            for node, h in list(self.sinks.items()):  # add_operator may add applications meanwhile
                if not self.alive.get(node):
                    continue
                data, arr, count, punct = ray.get(h.fetch.remote(self._fetched[node]))
                if len(data):
                    self._outputs[node].append(data)
                    self._arrivals[node].append(arr)
                    self._fetched[node] += len(data)
                    for cb in self._callbacks[node]:
                        cb(data)
                self._punct[node] = punct

    def results(self, app: str) -> np.ndarray:
        """Tuples the application ``app`` received so far (in arrival order)."""
        self.poll()
        parts = self._outputs[app]
        return np.concatenate(parts) if parts else self.query.schema_of(app).empty()

    def latencies_ms(self, app: str) -> tuple[np.ndarray, np.ndarray]:
        """(arrival time in s since start, end-to-end latency in ms) per delivered tuple.

        Latency = arrival time minus the tuple's timestamp mapped to wall time
        (``t0 + (ts - ts0) / (1e6 * pace)``); meaningful for paced runs.
        """
        data = self.results(app)
        arr = np.concatenate(self._arrivals[app]) if self._arrivals[app] else np.zeros(0)
        speed = self.speed or 1.0
        lat = (arr - (self.t0 + (data[TS] - self.ts0) / (1e6 * speed))) * 1000.0
        return arr - self.t0, lat

    def run(self, inputs: Mapping[str, Iterable], pace: float | None = None, timeout: float = 600.0,
            scenario=None, progress: Callable[[dict], None] | None = None) -> DeploymentResult:
        """Feed ``inputs``, apply ``scenario`` (a :class:`~replistream.scenario.Scenario`), wait, collect."""
        if scenario is not None:
            self.install_scenario(scenario)
        self.feed(inputs, pace)
        if scenario is not None:
            self._start_scenario_thread(scenario)
        ok = self.wait(timeout, progress)
        res = self.collect()
        if not ok:
            res.metrics["timed_out"] = True
        return res

    def collect(self) -> DeploymentResult:
        self.poll()
        outputs = {n: self.results(n) for n in self.query.sinks}
        arrivals = {n: (np.concatenate(self._arrivals[n]) if self._arrivals[n] else np.zeros(0))
                    for n in self.query.sinks}
        dead = []
        for i, h in enumerate(self.entries):
            if self.alive.get(f"entry#{i}"):
                try:
                    dead.extend(ray.get(h.dead_letters.remote()))
                    break  # every live entry replica holds the same dead letters
                except Exception:
                    continue
        return DeploymentResult(outputs, arrivals, dict(self._punct), dead, self.metrics())

    # -- failure injection ---------------------------------------------------------------------
    def kill(self, label: str, reason: str = "killed") -> None:
        """Kill one actor by label (``"join#1"``, ``"entry#0"``, an application name)."""
        if label not in self.handles:
            raise ValueError(f"no actor {label!r}; actors: {sorted(self.handles)}")
        if not self.alive.get(label):
            return
        ray.kill(self.handles[label], no_restart=True)
        self._mark_dead(label, reason)

    def kill_replica(self, operator: str, replica: int) -> None:
        """Kill replica ``replica`` of ``operator`` (``"entry"`` for an entry point)."""
        label = f"{operator}#{replica}"
        if label not in self.handles:
            raise ValueError(f"{operator!r} has no replica {replica}; actors: {sorted(self.handles)}")
        self.kill(label, "replica killed")

    def kill_server(self, server: str) -> list[str]:
        """Kill every actor on ``server``; on a cluster with ``Server.node`` set, remove the Ray node."""
        if server not in self.servers:
            raise ValueError(f"unknown server {server!r}; servers: {sorted(self.servers)}")
        victims = [l for l, s in self.actor_server.items() if s == server and self.alive.get(l)]
        node = self.servers[server].node
        if self.cluster is not None and node:
            for n in list(self.cluster.list_all_nodes()):
                if getattr(n, "node_id", None) == node:
                    self.cluster.remove_node(n)
            for l in victims:
                self._mark_dead(l, f"server {server} removed")
        else:
            for l in victims:
                self.kill(l, f"server {server} killed")
        return victims

    def _mark_dead(self, label: str, reason: str) -> None:
        with self._lock:
            if not self.alive.get(label):
                return
            self.alive[label] = False
            self.events.append({"t": time.time() - self.t0, "event": "dead", "actor": label, "reason": reason})
        for l, h in self.handles.items():
            if self.alive.get(l) and l != label:
                try:
                    h.drop_link.remote(label, reason)
                except Exception:
                    pass

    def _net_event(self, desc: dict) -> None:
        self.events.append({"t": time.time() - self.t0, **desc})
        self._broadcast_network()

    def slow_server(self, server: str, factor: float, duration: float | None = None) -> None:
        now = time.time() - self.t0
        self.conditions.slow_server(server, now, now + duration if duration else float("inf"), factor)
        self._net_event({"event": "slow_server", "server": server, "factor": factor})

    def delay_link(self, a: str, b: str, extra_ms: float, duration: float | None = None,
                   both_directions: bool = True) -> None:
        """Add ``extra_ms`` to the emulated link ``a -> b`` (and ``b -> a`` unless told not to)."""
        now = time.time() - self.t0
        self.conditions.add_delay(a, b, now, now + duration if duration else float("inf"), extra_ms,
                                  both_directions)
        self._net_event({"event": "delay_link", "a": a, "b": b, "extra_ms": extra_ms,
                         "both_directions": both_directions})

    def cut_link(self, a: str, b: str, duration: float | None = None) -> None:
        now = time.time() - self.t0
        self.conditions.cut(a, b, now, now + duration if duration else float("inf"))
        self._net_event({"event": "cut_link", "a": a, "b": b})

    def restore(self, a: str | None = None, b: str | None = None, server: str | None = None) -> None:
        self.conditions.restore(a=a, b=b, server=server, at=time.time() - self.t0)
        self._net_event({"event": "restore", "a": a, "b": b, "server": server})

    def _broadcast_network(self) -> None:
        calls = []
        for l, h in self.handles.items():
            if self.alive.get(l):
                calls.append(h.set_network.remote(self.conditions))
        _get_quietly(calls)

    def install_scenario(self, scenario) -> None:
        """Validate ``scenario`` against this deployment and install its network events."""
        ops = {n: self.k for n in self.query.operators}
        ops[ENTRY] = len(self.entries)
        scenario.validate(servers=list(self.servers), operators=ops)
        self._pending_kills = scenario.apply_to(self.conditions, 0.0)

    def _start_scenario_thread(self, scenario) -> None:
        kills = sorted(getattr(self, "_pending_kills", []), key=lambda e: e.at)

        def loop():
            for ev in kills:
                delay = self.t0 + ev.at - time.time()
                if delay > 0:
                    time.sleep(delay)
                try:
                    if ev.action == "kill_server":
                        self.kill_server(ev.server)
                    elif ev.action == "kill_replica":
                        self.kill_replica(ev.operator, ev.replica)
                    self.events.append({"t": time.time() - self.t0, "event": ev.action,
                                        "target": ev.server or f"{ev.operator}#{ev.replica}"})
                except Exception as e:  # recorded, not fatal
                    self.events.append({"t": time.time() - self.t0, "event": "error", "error": repr(e)})

        self._scenario_thread = threading.Thread(target=loop, daemon=True, name="replistream-scenario")
        self._scenario_thread.start()

    # -- metrics ---------------------------------------------------------------------------------
    def metrics(self) -> dict:
        """Per application: delivered tuples and latency; per actor: CPU seconds, links, drops."""
        actors = {}
        for l, h in self.handles.items():
            if not self.alive.get(l):
                actors[l] = {"label": l, "server": self.actor_server[l], "alive": False}
                continue
            try:
                s = ray.get(h.stats.remote(), timeout=10)
                s["alive"] = True
                actors[l] = s
            except Exception as e:
                actors[l] = {"label": l, "server": self.actor_server[l], "alive": False, "error": repr(e)}
        apps = {}
        for n in self.query.sinks:
            t, lat = self.latencies_ms(n)
            apps[n] = {
                "delivered": int(sum(len(b) for b in self._outputs[n])),
                "complete": self._punct[n] == END,
                "latency_ms": _percentiles(lat) if self.speed else None,
                "filter_weights": actors.get(n, {}).get("filters", [{}])[0].get("weights"),
            }
        links = [lk for a in actors.values() for lk in a.get("links", [])]
        try:
            coordinator_log = ray.get(self.coordinator.log.remote(), timeout=10)
        except Exception:
            coordinator_log = []
        return {"applications": apps, "actors": actors, "stream_replicas": links, "events": list(self.events),
                "coordinator": coordinator_log, "placement": self.plan}

    def metrics_json(self) -> str:
        return json.dumps(self.metrics(), default=_json_default)

    # -- teardown ------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Kill every actor of the deployment (Ray itself keeps running)."""
        if self.manager is not None:
            self.manager.stop()
        for l, h in list(self.handles.items()):
            if self.alive.get(l):
                try:
                    ray.kill(h, no_restart=True)
                except Exception:
                    pass
                self.alive[l] = False
        try:
            ray.kill(self.coordinator, no_restart=True)
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()


def deploy(query: Query, servers=None, k: int = 2, placement=None, network="zero", *, address: str | None = None,
           seed: int = 0, flush_ms: float = 2.0, max_batch: int = 10_000, max_inflight: int = 16,
           drop_after_s: float = 10.0, strict: bool = False, on_malformed: str = "dead_letter",
           parquet_dir: str | None = None, cluster=None, ray_init: dict | None = None,
           on_output: Mapping[str, Callable] | None = None, gc=None) -> Deployment:
    """Deploy ``query`` with ``k`` replicas of every operator on distinct servers.

    ``servers``: a count, city names, :class:`~replistream.network.Server`
    objects (``Server.node`` pins it to a Ray node: a node id, ``label:K=V``
    or ``resource:NAME``), a :class:`~replistream.placement.ServerSet` or a
    server file. ``placement``: ``"spread"`` (default), ``"min-cost"``
    (Algorithm 5, Hwang §V-A), ``"random"``, ``"non-replicated"`` (k=1), a
    :class:`~replistream.placement.PlacementPolicy` (strategy with its
    parameters, rates, source locations), a mapping ``{node: [server, ...]}``
    (``"entry"`` for the entry points), or a callable ``(query, servers, k)
    -> mapping``. Placement policies cost latencies with ``network`` (with
    ``"zero"``: the servers' network coordinates or geography). The
    coordinator actor holds the plan and its network cost
    (``dep.placement``, ``dep.coordinator.network_cost.remote()``). ``network``:
    ``"zero"`` (no emulated delay), ``"geo"`` (the built-in wide-area model),
    ``"geo-static"``, a trace CSV path, or a latency model. Starts Ray if it
    is not running (``address=`` joins an existing cluster). Applications
    deliver to memory (``Deployment.results``), to callbacks
    (``on_output={app: fn}``, run in the driver) and, with ``parquet_dir``,
    to Parquet files (``parquet_dir/<app>/*.parquet``). ``gc``: a
    :class:`~replistream.runtime.manager.GCConfig` (or a mapping of its
    fields) turns on the coordinator loop of garbage collection (Algorithm 6)
    and revival (Hwang §V-C); its decisions are in ``dep.gc_events()`` and the
    network cost over time in ``dep.network_cost_history()``. Every error in
    the request is raised before any actor starts.
    """
    query.build()
    if int(k) < 1:
        raise ValueError(f"k (the degree of replication) must be >= 1, got {k}")
    given_servers = servers
    servers = resolve_servers(servers)
    if k > len(servers):
        raise ValueError(f"k={k} replicas need at least {k} distinct servers; {len(servers)} given")
    conditions = resolve_network(network, servers, seed)
    placement_net = _placement_network(conditions, given_servers)
    plan, placed = _resolve_placement(query, servers, k, placement, placement_net)
    if placed is None:
        placed = _evaluate_plan(query, servers, plan, placement_net)
    for s in servers:
        _ray_options(s)  # a malformed Server.node fails here, before any actor starts
    if on_malformed not in ("raise", "dead_letter"):
        raise ValueError(f"on_malformed must be 'raise' or 'dead_letter', got {on_malformed!r}")
    if gc is not None:
        from .control import GCConfig

        gc = GCConfig(**gc) if isinstance(gc, Mapping) else gc
        if not isinstance(gc, GCConfig):
            raise ValueError(f"gc must be a GCConfig or a mapping of its fields, got {type(gc).__name__}")
        gc.validate()
    init_ray(address, **(ray_init or {}))
    for app in on_output or {}:
        if app not in query.sinks:
            raise ValueError(f"on_output names {app!r}, not an application of query {query.name!r}")
    channel_opts = {"max_batch": max_batch, "flush_ms": flush_ms, "max_inflight": max_inflight,
                    "drop_after_s": drop_after_s}
    dep = Deployment(query, servers, int(k), plan, conditions, seed, channel_opts, strict, on_malformed,
                     parquet_dir, cluster, gc)
    dep.placement = placed
    ray.get(dep.coordinator.set_placement.remote(query, servers, placed, dep.handles, dep.actor_server))
    for app, cb in (on_output or {}).items():
        dep.on_output(app, cb)
    return dep


# -- helpers -----------------------------------------------------------------------------------

def _placement_network(conditions, given_servers):
    """What placement policies cost latencies with: the emulated network, unless it is
    zero and the servers came with network coordinates (a ServerSet / server file)."""
    from ...network import ZeroLatency
    from ...placement.servers import ServerSet, load_servers

    if isinstance(conditions.base, ZeroLatency):
        ss = given_servers
        if isinstance(ss, str) and ss.endswith((".csv", ".toml")):
            ss = load_servers(ss)
        if isinstance(ss, ServerSet) and ss.coords is not None:
            return ss.latency()
    return conditions


def _evaluate_plan(query, servers, plan, network):
    """A plan made without a placement policy, costed with the default cost model (None if it cannot be)."""
    try:
        return PlacementPolicy().evaluate(query, servers, plan, network)
    except (ValueError, KeyError):  # e.g. a trace without samples for some pair of servers
        return None


def _percentiles(lat: np.ndarray) -> dict:
    if not len(lat):
        return {"count": 0}
    p = np.percentile(lat, [50, 90, 99])
    return {"count": int(len(lat)), "p50": float(p[0]), "p90": float(p[1]), "p99": float(p[2]),
            "max": float(lat.max()), "mean": float(lat.mean())}


def _get_quietly(refs, timeout: float = 30) -> None:
    """Wait for each of ``refs``, ignoring failures (dead actors are noticed elsewhere)."""
    for r in refs:
        try:
            ray.get(r, timeout=timeout)
        except Exception:
            pass


def _json_default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return repr(o)
