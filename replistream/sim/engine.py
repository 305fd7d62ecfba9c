"""The discrete-event engine: the runtime's operator objects over virtual links (Hwang §VI-A).

"Our prototype and simulator use the same source code except for the
communication component" (§VI-A). Here too: every operator replica is a
:class:`~replistream.replica.ReplicaCore` (duplicate filters, sorter, logic),
every source runs an :class:`~replistream.operators.entry.EntryLogic`, and
placements and GC decisions come from :mod:`replistream.placement` and
:mod:`replistream.gc`. Only communication differs: virtual time, and one FIFO
virtual link per stream replica that delivers a packet sent at ``t`` no
earlier than :func:`~replistream.network.delivery_time` (latency of the model
at ``t``, outages waited out as TCP would), never overtaking an earlier packet.

What happens, in virtual seconds (``t = (ts - ts0) / 1e6``, ``ts0`` the
earliest first timestamp over the sources, as the runtime's paced feeder does):

* a source chunk is released at its first timestamp and reaches every live
  entry-point replica after the latency from the source's server (no delay
  when ``sources`` gives no location: the runtime's feeder hands chunks to the
  entry replicas directly). The entry points of all sources form one replica
  group (``"entry"`` in the plan), as ``EntryActor`` does. The k entry replicas
  run identical, deterministic entry logic on identical chunks, so the engine
  runs one :class:`EntryLogic` per source and gives its output to every entry
  replica (each replica's server still pays the CPU). With entry partitions
  (``parallelism={"entry": p}``, issue #41) the feeder cuts each source's chunks
  between them (:class:`~replistream.operators.entry.EntrySplit`), and the engine
  runs one entry logic per source and partition, given to that partition's replicas;
* a packet delivered to a replica is processed by its ``ReplicaCore`` in
  arrival order; its server's CPU (:class:`~replistream.sim.cpu.CpuModel`) is
  busy for the packet's cost, and the outputs leave when the CPU is done, as one
  packet per downstream stream replica;
* scenario events (:class:`~replistream.scenario.Scenario`) use the runtime's
  format: ``kill_server``/``kill_replica`` at their times (what a dead replica
  had queued or in flight is lost; nothing is delivered to it), and
  ``delay_link``/``cut_link``/``slow_server``/``restore`` through
  :class:`~replistream.network.NetworkConditions`;
* sentinels among a source's input (:class:`~replistream.sources.KillReplica`,
  :class:`~replistream.sources.KillServer`) are the same kills, at the virtual
  time the feeder reaches them: the release time of the source's preceding
  chunk (0 before the first), once that chunk has been handed to the entry
  points. A :class:`~replistream.sources.Rescale` among a source's input fires then too, and
  ``rescales=[(at_s, Rescale(...))]`` schedules one at a virtual time: a partitioned operator's
  live rescaling (:mod:`replistream.sim.rescale`). The other sentinels (``Pause``, ``Call``,
  ``Revive``, ``AddReplica``) need a deployment: the run stops with a ``QueryError`` naming them;
* the replicas and stream replicas are those of the
  :class:`~replistream.plan.PhysicalPlan` of ``(query, plan)``; a run returns
  the engines' one result type, :class:`~replistream.engines.result.RunResult`.

Modes (Fig. 2 compares them; all produce exactly the reference output):

* ``"replication"`` (this system): every upstream replica feeds every
  downstream replica; the duplicate filter takes the first copy.
* ``"synchronization"``: primary/backup with determinants (Hwang [9]). Each
  replica consumes only from one upstream replica (the primary, replica 0, or
  after a failure the next live one, chosen ``detect_s`` after the failure);
  a primary holds its outputs until every live backup has acknowledged the
  order of its inputs: one round trip to the farthest backup.
* ``"deterministic"``: replicas fed in identical sorted order (Hwang [12]):
  the same failover subscription, and each replica merges all its inputs in
  (ts, id) order up to the minimum punctuation over its inputs before
  processing them (§IV-C), so it waits for the slowest input.

>>> from replistream.workloads import fig1_query, fig1_inputs
>>> from replistream.network import GeoLatencyModel, default_servers
>>> from replistream.engines import run_reference
>>> q = fig1_query(2, window_s=10)
>>> data = fig1_inputs(2, duration_s=60, period_s=10, seed=1)
>>> servers = [s.name for s in default_servers(4)]
>>> plan = {n: servers[:2] for n in ["entry", *q.operators]} | {"alerts": [servers[3]]}
>>> sim = Simulator(q, plan, GeoLatencyModel(default_servers(4), seed=0))
>>> res = sim.run(data)
>>> res.complete, len(res.outputs["alerts"]) == len(run_reference(q, data).outputs["alerts"])
(True, True)
>>> 0 < float(np.median(res.latencies("alerts")[1])) < 1.0
True
"""
from __future__ import annotations

import heapq
import math
from array import array
from itertools import chain
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from replistream.engines.result import RunResult, latency_s
from replistream.errors import QueryError, merge_dead_letters
from replistream.network import LatencyModel, NetworkConditions, ZeroLatency, delivery_time
from replistream.operators.entry import EntrySplit
from replistream.operators.sorter import canonical_order
from replistream.partition import BinMap, entry_parallelism, parse_partition_label, partition_label
from replistream.plan import ENTRY, PhysicalPlan, ReplicaId, StreamEdge
from replistream.query import Query
from replistream.replica import ReplayLog, ReplicaCore
from replistream.scenario import Event, Scenario
from replistream.schema import TS, Punctuation
from replistream.engines.inprocess_rescale import TrackedRouter, check_rescales
from replistream.sources import KillReplica, KillServer, Rescale, Sentinel, chunk_time, iter_chunks

from .cpu import CpuModel, operator_kind

__all__ = ["Simulator", "MODES", "ENTRY", "sentinel_kill", "RunProgress"]

MODES = ("replication", "synchronization", "deterministic")
_NO_P = int(np.iinfo(np.int64).min)
_RESCALE_BESIDE_ENTRY = ("Rescale: the simulator does not rescale beside entry partitions (yet), as the in-process "
                         "engine does not; drop parallelism['entry'], or rescale without it")

# event kinds (heap entries are (time, seq, kind, payload))
_FEED, _ENTRY_IN, _ARRIVE, _EMIT, _KILL, _FAILOVER, _CALL, _RESCALE, _STATE = range(9)


class _Replica:
    __slots__ = ("label", "node", "index", "server", "core", "kind", "alive", "out", "is_sink", "merger",
                 "active", "buffers", "recorder", "sent_tuples", "cpu_s", "last_in", "lag", "partition")

    def __init__(self, label, node, index, server, core, kind, is_sink=False, partition=None):
        self.label, self.node, self.index, self.server = label, node, index, server
        self.partition = partition  # the partition of a partitioned operator's replica (issue #41)
        self.core, self.kind, self.is_sink = core, kind, is_sink
        self.alive = True
        self.out: list[_Link] = []
        self.merger = None
        self.active: list[int] | None = None  # failover modes: per port, the upstream replica consumed
        self.buffers: dict[tuple[int, int], list] = {}  # failover modes: packets of inactive channels
        self.recorder = None
        self.sent_tuples = 0
        self.cpu_s = 0.0
        self.last_in: list[float] = []  # per port: virtual time a new (first-copy) tuple last arrived
        self.lag: list[float] = []  # per port: the largest input latency seen since the last reset


class _Link:
    __slots__ = ("sender", "receiver", "port", "channel", "last", "live", "tuples", "packets", "partition")

    def __init__(self, sender, receiver, port, channel):
        self.sender, self.receiver, self.port, self.channel = sender, receiver, port, channel
        self.partition = receiver.partition  # carries that partition's share of the stream only
        self.last = -math.inf
        self.live = True
        self.tuples = 0
        self.packets = 0

    @property
    def id(self) -> str:
        return f"{self.sender.label}->{self.receiver.label}:{self.port}"


class _Merger:
    """Deterministic mode: releases tuples from every input in (ts, id) order up to the minimum
    punctuation over all inputs (Hwang §IV-C applied to all inputs of a replica)."""

    def __init__(self, n_ports: int):
        self.buf: list[list] = [[] for _ in range(n_ports)]
        self.punct = [_NO_P] * n_ports
        self.released = _NO_P

    def push(self, port: int, item) -> list[tuple[int, Any]]:
        if isinstance(item, Punctuation):
            if item.p <= self.punct[port]:
                return []
            self.punct[port] = item.p
            wm = min(self.punct)
            if wm <= self.released:
                return []
            self.released = wm
            out = []
            parts = []
            for p, b in enumerate(self.buf):
                if not b:
                    continue
                batch = b[0] if len(b) == 1 else np.concatenate(b)
                ready = batch[TS] <= wm
                if ready.any():
                    r = batch[ready]
                    parts.append((p, r))
                self.buf[p] = [batch[~ready]] if not ready.all() else []
            if parts:  # one (ts, id) order over all ports
                keys = np.concatenate([np.stack([r[TS].astype(np.int64), r["id"].astype(np.int64), np.full(len(r), p)])
                                       for p, r in parts], axis=1)
                order = np.lexsort((keys[2], keys[1], keys[0]))
                ports = keys[2][order]
                # deliver maximal runs of one port, in order
                bounds = np.flatnonzero(np.diff(ports)) + 1
                offsets = {p: 0 for p, _ in parts}
                rows = {p: r[canonical_order(r)] for p, r in parts}
                for seg in np.split(np.arange(len(ports)), bounds):
                    p = int(ports[seg[0]])
                    out.append((p, rows[p][offsets[p]:offsets[p] + len(seg)]))
                    offsets[p] += len(seg)
            for p in range(len(self.punct)):  # only wm: a port's own punctuation may pass tuples still held
                out.append((p, Punctuation(wm)))
            return out
        if len(item):
            self.buf[port].append(item)
        return []


class _Recorder:
    def __init__(self, schema, keep: bool = True):
        self.schema = schema
        self.keep = keep
        self.batches, self.times = [], []
        self.ts = array("q")  # keep=False: only timestamps and arrival times
        self.at = array("d")
        self.punct = _NO_P

    def add(self, items, t):
        for it in items:
            if isinstance(it, Punctuation):
                self.punct = max(self.punct, it.p)
            elif len(it):
                if self.keep:
                    self.batches.append(it)
                    self.times.append(np.full(len(it), t))
                else:
                    self.ts.extend(it[TS].tolist())
                    self.at.extend([t] * len(it))

    def add_rows(self, rows: np.ndarray, times: np.ndarray) -> None:
        """Tuples ``rows`` arriving at ``times`` (one per row): the batched engine's path."""
        if self.keep:
            self.batches.append(rows)
            self.times.append(times)
        else:
            self.ts.frombytes(np.ascontiguousarray(rows[TS], dtype=np.int64).tobytes())
            self.at.frombytes(np.ascontiguousarray(times, dtype=np.float64).tobytes())

    def latencies_since(self, i: int, ts0: int) -> tuple[np.ndarray, int]:
        """Latencies (s) of the tuples recorded after the first ``i`` recordings (batches when
        ``keep``, tuples otherwise), and the count to pass next time: what arrived since."""
        if self.keep:
            got = [latency_s(t, rows[TS], ts0) for rows, t in zip(self.batches[i:], self.times[i:])]
            return (np.concatenate(got) if got else np.zeros(0)), len(self.batches)
        ts = np.frombuffer(self.ts, dtype=np.int64)[i:]
        return latency_s(np.frombuffer(self.at, dtype=np.float64)[i:], ts, ts0), len(self.ts)

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.keep:
            out = np.zeros(len(self.ts), dtype=[(TS, "i8")])
            out[TS] = np.frombuffer(self.ts, dtype=np.int64) if len(self.ts) else 0
            return out, np.frombuffer(self.at, dtype=np.float64).copy() if len(self.at) else np.zeros(0)
        out = np.concatenate(self.batches) if self.batches else self.schema.empty()
        return out, (np.concatenate(self.times) if self.times else np.zeros(0))


class _PartitionRecorder:
    """A partitioned application's output (issue #41), as the in-process engine's
    :class:`~replistream.engines.inprocess.PartitionCollector` gathers it: from every replica of
    every partition, the first copy of each tuple (by id; a partition's ``k`` replicas deliver the
    same share, the partitions disjoint ones), at the virtual time the first replica to process it
    was done; its punctuation is the smallest over the partitions of the largest any replica of
    the partition reached. Each replica records through :meth:`replica` (its partition's view).

    >>> from replistream import Schema
    >>> s = Schema({"x": "i8"}); rec = _PartitionRecorder(s, 2)
    >>> b = s.from_columns({"ts": [1], "x": [2]}, ids=[7])
    >>> rec.replica(0).add([b, Punctuation(5)], 1.0); rec.replica(0).add([b], 2.0)
    >>> rec.replica(1).add([Punctuation(3)], 2.5)
    >>> out, at = rec.result(); len(out), at.tolist(), rec.punct
    (1, [1.0], 3)
    """

    def __init__(self, schema, partitions: int, keep: bool = True):
        self.inner = _Recorder(schema, keep)
        self.seen: set = set()
        self.puncts = [_NO_P] * int(partitions)

    @property
    def punct(self) -> int:
        """The punctuation every partition reached."""
        return min(self.puncts)

    def add(self, items, t, partition: int) -> None:
        """Items a replica of ``partition`` delivered at ``t``: the tuples not delivered before are kept."""
        fresh = []
        for it in items:
            if isinstance(it, Punctuation):
                if it.p > self.puncts[partition]:
                    self.puncts[partition] = int(it.p)
            elif len(it):
                ids = it["id"].tolist()
                new = np.fromiter((i not in self.seen for i in ids), dtype=bool, count=len(ids))
                self.seen.update(ids)
                if new.all():
                    fresh.append(it)
                elif new.any():
                    fresh.append(it[new])
        if fresh:
            self.inner.add(fresh, t)

    def replica(self, partition: int) -> "_PartitionView":
        """What one replica of ``partition`` records through."""
        return _PartitionView(self, partition)

    def latencies_since(self, i: int, ts0: int):
        return self.inner.latencies_since(i, ts0)

    def result(self):
        return self.inner.result()


class _PartitionView:
    """One partitioned application replica's recorder: its partition's entry to the shared
    :class:`_PartitionRecorder` (``result``, ``punct`` and ``latencies_since`` are the application's)."""

    __slots__ = ("shared", "partition")

    def __init__(self, shared: _PartitionRecorder, partition: int):
        self.shared, self.partition = shared, int(partition)

    def add(self, items, t) -> None:
        self.shared.add(items, t, self.partition)

    @property
    def punct(self) -> int:
        return self.shared.punct

    def latencies_since(self, i: int, ts0: int):
        return self.shared.latencies_since(i, ts0)

    def result(self):
        return self.shared.result()


def _entry_key(r) -> int | str:
    """An entry replica's key in ``entry_links`` and ``entry_logs``: its index, or with entry
    partitions its label (``entry.P#R``: indexes repeat across partitions)."""
    return r.index if r.partition is None else r.label


def _entry_plan(plan: Mapping[str, list[str]], partitions: int) -> dict[str, list[str]]:
    """``plan`` without its ``"entry.P"`` entries (``replistream place`` lays entry partitions out
    as ``{"entry.P": plan["entry"]}``, placement/layout.py), checked: every entry partition runs on
    the entry points' servers, as a deployment runs them; a one-line ``ValueError`` otherwise.

    >>> _entry_plan({"entry": ["a", "b"], "entry.0": ["a", "b"], "entry.1": ["a", "b"], "w": ["a"]}, 2)
    {'entry': ['a', 'b'], 'w': ['a']}
    >>> _entry_plan({"entry.0": ["a"], "entry.1": ["b"], "w": ["a"]}, 2)
    Traceback (most recent call last):
    ...
    ValueError: placement puts entry.1 on ['b'], entry.0 on ['a']: every entry partition runs on the entry points' servers; give plan['entry'] once (or the same servers to every 'entry.P')
    """
    out = {n: list(v) for n, v in plan.items() if parse_partition_label(n)[0] != ENTRY or n == ENTRY}
    parts = {n: list(v) for n, v in plan.items() if n != ENTRY and parse_partition_label(n)[0] == ENTRY
             and parse_partition_label(n)[1] is not None}
    if not parts:
        return out
    for n in parts:
        part = parse_partition_label(n)[1]
        if part >= partitions:
            raise ValueError(f"placement names {n!r}, but the entry points run as {partitions} partition(s) "
                             f"(parallelism={{'entry': {partitions}}}); name entry.0 to entry.{partitions - 1}, or none")
    base = out.get(ENTRY)
    first_name, first = (ENTRY, base) if base is not None else next(iter(sorted(parts.items())))
    for n, where in sorted(parts.items()):
        if where != first:
            raise ValueError(f"placement puts {n} on {where}, {first_name} on {first}: every entry partition runs "
                             f"on the entry points' servers; give plan['entry'] once (or the same servers to every "
                             f"'entry.P')")
    out[ENTRY] = list(first)
    return out


def sentinel_kill(sentinel: Sentinel, at: float, source: str) -> Event:
    """The scenario event a sentinel among ``source``'s input stands for, at virtual time ``at``:
    :class:`~replistream.sources.KillReplica` is a ``kill_replica``,
    :class:`~replistream.sources.KillServer` a ``kill_server``. The other sentinels need a
    deployment (a feeder to pause, a deployment to call, hand-over by the runtime): a
    ``QueryError`` names them.

    >>> sentinel_kill(KillServer("tokyo"), 12.5, "pings").to_dict()
    {'at': 12.5, 'action': 'kill_server', 'server': 'tokyo'}
    >>> from replistream.sources import Pause
    >>> sentinel_kill(Pause(1.0), 0.0, "pings")
    Traceback (most recent call last):
    ...
    replistream.errors.QueryError: Pause in the input of source 'pings': the simulator cannot run this sentinel; it runs KillReplica, KillServer and Rescale (script other events with a Scenario or a coordinator)
    """
    if isinstance(sentinel, KillReplica):
        return Event(float(at), "kill_replica", operator=sentinel.operator, replica=sentinel.replica)
    if isinstance(sentinel, KillServer):
        return Event(float(at), "kill_server", server=sentinel.server)
    raise QueryError(f"{type(sentinel).__name__} in the input of source {source!r}: the simulator cannot run this "
                     f"sentinel; it runs KillReplica, KillServer and Rescale (script other events with a Scenario or a "
                     f"coordinator)")


def _later_partitions(plan: Mapping[str, list[str]], parallelism: Mapping[str, int] | None) -> dict[str, list[str]]:
    """The entries ``"op.P"`` of ``plan`` that place a partition ``P >= p`` of a partitioned
    operator (``parallelism[op] == p``): partitions a rescale may start.

    >>> _later_partitions({"w": ["a"], "w.0": ["a"], "w.2": ["b"]}, {"w": 1})
    {'w.2': ['b']}
    """
    out = {}
    for key, servers in plan.items():
        base, part = parse_partition_label(key)
        p = (parallelism or {}).get(base)
        if part is not None and isinstance(p, (int, np.integer)) and not isinstance(p, bool) and part >= p:
            out[key] = list(servers)
    return out


def _check_scheduled_rescales(query: Query, parallelism: Mapping[str, int], bits: int,
                              rescales) -> list[tuple[float, Rescale]]:
    """``rescales`` as ``[(at_s, Rescale)]`` sorted by time (stable), checked: a one-line error
    names a mistake and the fix."""
    out = []
    for item in rescales or ():
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], Rescale)):
            raise ValueError(f"rescales: each entry must be (at_s, Rescale(...)), got {item!r}")
        at, ev = item
        if isinstance(at, bool) or not isinstance(at, (int, float)) or not (at >= 0 and math.isfinite(at)):
            raise ValueError(f"rescales: the time of {ev!r} must be virtual seconds >= 0, got {at!r}")
        if ev.operator in query.operators and ev.operator not in parallelism:
            raise QueryError(f"Rescale: {ev.operator!r} is not partitioned; run it with "
                             f"parallelism={{{ev.operator!r}: 1}} (or more) to rescale it while it runs")
        out.append((float(at), ev))
    return sorted(out, key=lambda x: x[0])


class RunProgress:
    """One labelled progress line per simulated run, on stderr (stdout carries the results): on a
    terminal a ``rich`` bar over virtual time; off a terminal one plain line when the run ends.
    ``update(task, completed=t)`` and ``tasks[0].total`` as for a ``rich`` Progress, which the
    engines drive.

    >>> import io
    >>> line = RunProgress("fig4 min-cost kmax=3", 1800.0, stream=io.StringIO())
    >>> line.update(0, completed=900.0); line.stop()
    >>> line.stream.getvalue().startswith("fig4 min-cost kmax=3: 1,800 simulated s in ")
    True
    """

    def __init__(self, label: str, total: float, stream=None):
        import sys
        import time
        from types import SimpleNamespace

        self.label, self.total = label, float(total)
        self.stream = sys.stderr if stream is None else stream
        self.tasks = [SimpleNamespace(total=self.total)]
        self._t0 = time.perf_counter()
        self._bar = None
        if getattr(self.stream, "isatty", lambda: False)():
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn(label.replace("[", "\\[")), BarColumn(),
                                 TextColumn("{task.completed:,.0f}/{task.total:,.0f} simulated s"),
                                 TimeElapsedColumn(), transient=False, console=Console(file=self.stream),
                                 redirect_stdout=False, redirect_stderr=False)
            self._task = self._bar.add_task(label, total=self.total)
            self._bar.start()

    def update(self, task, completed: float) -> None:
        """Virtual time ``completed`` reached."""
        if self._bar is not None:
            self._bar.update(self._task, completed=completed)

    def stop(self) -> None:
        """The run ended: the bar stays as it is; off a terminal, the one line is written."""
        import time

        if self._bar is not None:
            self._bar.stop()
        else:
            print(f"{self.label}: {self.total:,.0f} simulated s in {time.perf_counter() - self._t0:.1f} s",
                  file=self.stream, flush=True)


class Simulator:
    """A replicated query over a simulated wide-area network (see the module docs).

    ``plan``: ``{node: [server, ...]}`` like ``deploy``'s plan (key ``"entry"``
    for the entry points; one server per application); replica counts may
    differ between nodes. It is checked, and the replicas and stream replicas
    built, by :class:`~replistream.plan.PhysicalPlan` (``physical``). ``network``: any
    :class:`~replistream.network.LatencyModel` (a ``NetworkConditions`` is
    copied before the scenario is installed, so the caller's stays as it
    was). ``sources``: optional ``{source: server}`` where each source's
    stream originates. ``cpu``: a :class:`CpuModel` (None: the measured
    defaults; ``CpuModel(scale=0)``: no CPU delays). ``mode``: one of
    :data:`MODES`. ``detect_s``: failure detection delay of the failover modes.
    ``coordinator``: optional ``(period_s, fn)``; ``fn(sim, t)`` runs every
    ``period_s`` virtual seconds (the GC/revival experiments use it). Batched runs take
    ``(period_s, fn, ahead)``: at a call time ``t``, ``ahead(sim, t)`` may return a later
    time ``h`` up to which the engine runs without stopping, then replays the calls up to
    ``h`` with what each would have observed (``input_delays``); every call but the last
    must change nothing, else :class:`~replistream.sim.batch.LookaheadMiss` (the results are
    those of a run stopped at every call; docs/experiments.md, Fig. 5, "Revival inside the
    batched engine").
    ``on_malformed``: what the entry points do with a record they cannot read, as in a
    deployment: ``"dead_letter"`` (the default; set aside with its reason) or ``"raise"`` (the
    run stops with the :class:`~replistream.errors.SchemaError` naming it).
    ``keep_outputs=False`` keeps only each output's timestamp and arrival time
    (``RunResult.outputs`` then has just a ``ts`` column): for month-long runs.
    ``retain=True`` keeps every replica's output since the last punctuation its live
    receivers acknowledged, replayed to stream replicas :meth:`apply_snapshot` revives.
    ``batch_s``: run in epochs of ``batch_s`` virtual seconds, many packets per operator
    call, every tuple keeping its own time (:mod:`replistream.sim.batch`; the same outputs,
    latencies equal to the per-packet engine's except for CPU contention between replicas
    sharing a server; replication mode only). None: one event per packet.
    ``parallelism``: ``{operator: p}`` runs those operators as ``p`` key partitions (issue #41;
    per-packet engine, replication mode); ``plan["op.P"]`` places partition ``P``'s replicas, and a
    plan that gives only ``plan["op"]`` puts every partition on the operator's servers. A
    per-partition placement (Algorithm 5 per partition) is the plan of
    ``PlacementPolicy(...).placement(query, servers, k, parallelism=...)``, or of a strategy run on
    ``fig1_setting(..., parallelism=...).problem`` (:mod:`replistream.sim.experiments`).
    Entry partitions (``parallelism={"entry": p}``) run as the in-process engine runs them: the
    feeder cuts each source's chunks between ``p`` entry partitions
    (:class:`~replistream.operators.entry.EntrySplit`, each chunk to one partition with the position
    an unpartitioned entry point would be in, progress notes to the others); each partition runs its
    own entry logic, given to its ``k`` replicas (``entry.P#R``, all on ``plan["entry"]``'s servers; a
    plan from ``replistream place`` may name them ``"entry.P"`` too, with those same servers), and
    the readers' duplicate filters merge the partitions' streams per partition. A partitioned
    application (``parallelism={app: p}``) runs ``k`` replicas per partition (``plan["app.P"]``, or
    ``plan["app"]``'s servers for every partition), its input routed by tuple id; its output is the
    first copy of each tuple from any replica of its partition, at the time the first replica to
    process it was done, and its punctuation the smallest over the partitions.
    ``kill_replica`` names ``"entry.P"`` (``"entry"`` alone is refused, naming the partitions) and
    ``"app.P"``. Beside entry partitions the simulator neither rescales nor adds replicas (a one-line
    error, as the in-process engine).
    ``rescales``: ``[(at_s, Rescale(...)), ...]``, live rescalings of partitioned operators at virtual
    times ``at_s`` (a ``Rescale`` sentinel among a source's input works too; :mod:`replistream.sim.rescale`;
    ``plan["op.P"]`` may place a partition ``P`` a rescale starts). Each one's record, with its
    simulated duration and the latency during it (outputs arriving until ``rescale_after_s`` past
    its end), is in ``RunResult.stats["rescales"]``.

    >>> from replistream.workloads import fig1_query
    >>> Simulator(fig1_query(1), {"entry": ["a"]}, ZeroLatency(["a"]))
    Traceback (most recent call last):
    ...
    ValueError: placement must give 'loads' at least one server, got None
    """

    def __init__(self, query: Query, plan: Mapping[str, list[str]], network: LatencyModel | None = None, *,
                 scenario: Scenario | None = None, cpu: CpuModel | None = None,
                 sources: Mapping[str, str] | None = None, mode: str = "replication", detect_s: float = 2.0,
                 coordinator: tuple[float, Callable] | None = None, strict: bool = False,
                 keep_outputs: bool = True, retain: bool = False, batch_s: float | None = None,
                 on_malformed: str = "dead_letter", parallelism: Mapping[str, int] | None = None,
                 bits: int | None = None, rescales: Sequence[tuple[float, Rescale]] | None = None,
                 rescale_after_s: float = 1.0):
        query.build()
        if on_malformed not in ("raise", "dead_letter"):
            raise ValueError(f"on_malformed must be 'raise' or 'dead_letter', got {on_malformed!r}")
        self.on_malformed = on_malformed
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if batch_s is not None:
            if not (isinstance(batch_s, (int, float)) and batch_s > 0 and math.isfinite(batch_s)):
                raise ValueError(f"batch_s must be a number of seconds > 0, got {batch_s!r}")
            if mode != "replication":
                raise ValueError(f"batch_s (batched execution) supports mode 'replication' only, got {mode!r}")
        #: the entry points' partitions (``parallelism={"entry": p}``; 1: unpartitioned): the feeder
        #: cuts each source's chunks between them as the in-process engine and Ray do (module docs)
        self.entry_partitions, parallelism = entry_parallelism(parallelism)
        plan = _entry_plan(plan, self.entry_partitions)
        #: ``plan["op.P"]`` of partitions a rescale may start (beyond the ``p`` the run starts with)
        self.later_plan = _later_partitions(plan, parallelism)
        plan = {n: v for n, v in plan.items() if n not in self.later_plan}
        self.physical = PhysicalPlan(query, plan, parallelism=parallelism, bits=bits, keep_single=True,
                                     entry_partitions=self.entry_partitions, applications=True)
        # (checks the plan; {op: 1}: one partition, as deploy(); applications may be partitioned)
        self.physical.require_one_replica_per_application("the simulator")
        #: ``{operator or application: p}`` of the partitioned nodes (issue #41), as the plan checked it
        self.parallelism = dict(self.physical.parallelism)
        parted = ("partitioned operators or applications (parallelism=)" if self.parallelism else
                  "entry partitions (parallelism={'entry': p})" if self.entry_partitions > 1 else None)
        if parted and mode != "replication":
            raise ValueError(f"{parted} run in mode 'replication' only, got {mode!r}")
        if parted and batch_s is not None:
            raise ValueError(f"{parted} run on the per-packet engine only: the batched engine (batch_s) does not "
                             f"route partitions yet; leave batch_s unset")
        self.routers = {n: TrackedRouter(query, n, BinMap.even(p, self.physical.bits))
                        for n, p in self.parallelism.items()}
        self.query = query
        self.plan = {n: list(v) for n, v in plan.items()}
        if not (isinstance(rescale_after_s, (int, float)) and rescale_after_s >= 0 and math.isfinite(rescale_after_s)):
            raise ValueError(f"rescale_after_s must be virtual seconds >= 0, got {rescale_after_s!r}")
        self.rescale_after_s = float(rescale_after_s)
        self.rescales = _check_scheduled_rescales(query, self.parallelism, self.physical.bits, rescales)
        if self.rescales and self.entry_partitions > 1:
            raise QueryError(_RESCALE_BESIDE_ENTRY)
        #: per partitioned operator, the most partitions its scheduled rescales give it
        self.most = check_rescales(query, self.parallelism, self.physical.bits, [ev for _, ev in self.rescales],
                                   engine="the simulator")
        used = sorted({self.physical.server(r) for r in self.physical.replicas()})
        if network is None:
            network = ZeroLatency(used)
        if isinstance(network, NetworkConditions):
            net = NetworkConditions(network.base)
            for kind, a, b, s, e, x in network.overrides():
                if kind == "slow":
                    net.slow_server(a, s, e, x)
                elif kind == "cut":
                    net.cut(a, b, s, e, both_directions=False)
                else:
                    net.add_delay(a, b, s, e, x, both_directions=False)
        else:
            net = NetworkConditions(network)
        known = set(net.names)
        if known:
            unknown = sorted((set(used) | {x for v in self.later_plan.values() for x in v}) - known)
            if unknown:
                raise ValueError(f"plan names servers the network does not know: {unknown}")
        self.net = net
        self.sources = dict(sources or {})
        for s, srv in self.sources.items():
            if s not in query.sources:
                raise ValueError(f"sources names {s!r}, not a source of query {query.name!r}")
            if known and srv not in known:
                raise ValueError(f"source {s!r} is on server {srv!r}, which the network does not know")
        self.cpu = cpu if cpu is not None else CpuModel()
        self.mode = mode
        self.detect_s = float(detect_s)
        if coordinator is not None and len(coordinator) == 3 and batch_s is None:
            raise ValueError("a coordinator's look-ahead (its third element) needs batched execution (batch_s)")
        self.coordinator = coordinator
        self.mutations = 0  # apply_snapshot and add_replica calls (a look-ahead checks its replayed calls made none)
        self.wiring = 0  # bumped whenever a stream replica's liveness or a replica's life changes
        self._fed: tuple[int, frozenset] = (-1, frozenset())
        self.strict = strict
        self.keep_outputs = keep_outputs
        self.retain = retain
        self.batch_s = None if batch_s is None else float(batch_s)
        self._batch = None
        self.now = 0.0
        self.events: list[dict] = []
        self.kills: list = []
        if scenario is not None:
            ops = {n: len(self.physical.replicas(n)) for n in query.operators if n not in self.parallelism}
            ops.update({partition_label(n, i): len(self.physical.replicas(partition_label(n, i)))
                        for n, p in self.parallelism.items() for i in range(p)})
            ops.update({partition_label(n, i): len(self.later_plan.get(partition_label(n, i),
                                                                        self.physical.replicas(partition_label(n, 0))))
                        for n, p in self.most.items() for i in range(self.parallelism[n], p)})
            ops[ENTRY] = len(self.plan[ENTRY])
            if self.entry_partitions > 1:
                ops.update({partition_label(ENTRY, i): len(self.plan[ENTRY]) for i in range(self.entry_partitions)})
            scenario.validate(servers=sorted(known) or None, operators=ops)
            self.kills = scenario.apply_to(self.net, 0.0)
        self._has_slow = any(o[0] == "slow" for o in self.net.overrides())
        # without scripted link overrides, ask the base model directly (same answers, one call less)
        self._lat = self.net if any(o[0] != "slow" for o in self.net.overrides()) else self.net.base
        self._build()
        for ev in self.kills:  # with entry partitions, "entry" alone is refused before the run
            if ev.action == "kill_replica" and self.entry_partitions > 1 and ev.operator == ENTRY:
                self._victims(ev)

    # -- construction --------------------------------------------------------------------
    def _build(self) -> None:
        plan = self.physical
        #: per partitioned application, the output its partitions' replicas record together
        self._app_recorders: dict[str, _PartitionRecorder] = {}
        self.groups: dict[str, list[_Replica]] = {
            node: [self._new_replica(r, plan.server(r), plan.channels(node) if node != ENTRY else [],
                                     plan.channel_groups(node) if node != ENTRY else None)
                   for r in plan.replicas(node)] for node in plan.nodes}
        # stream replicas, created (so ordered on each sender and in ``links``) by receiving node, port,
        # sender, receiver: the order that breaks ties between packets arriving at one instant
        rank = {n: i for i, n in enumerate(plan.nodes)}
        by_label = {r.label: r for g in self.groups.values() for r in g}
        self.entry_links: dict[str, dict[int, list[_Link]]] = {s: {} for s in self.query.sources}
        for e in sorted(plan.streams(), key=lambda e: (rank[e.dst.node], e.port, e.channel, plan.position(e.dst))):
            self._connect(e, by_label)
        self.entry_logs = {(s, _entry_key(r)): ReplayLog() for s in self.query.sources for r in self.groups[ENTRY]} \
            if self.retain else {}
        self.links = [lk for g in self.groups.values() for r in g for lk in r.out]
        self.links += [lk for d in self.entry_links.values() for ls in d.values() for lk in ls]

    def _new_replica(self, rid: ReplicaId, server: str, channels: list[int], groups: list | None = None) -> _Replica:
        """Replica ``rid`` of the plan on ``server``, fed by ``channels`` stream replicas per input port
        (``groups``: per port, each channel's upstream partition when the upstream is partitioned)."""
        q = self.query
        if rid.node == ENTRY:
            return _Replica(rid.label, ENTRY, rid.index, server, None, "entry", partition=rid.partition)
        sink = rid.application
        core = ReplicaCore(q, rid.node, channels, self.strict, retain=self.retain and not sink, groups=groups)
        r = _Replica(rid.label, rid.node, rid.index, server, core, "sink" if sink else operator_kind(q.spec(rid.node)),
                     is_sink=sink, partition=rid.partition)
        if self.mode != "replication":
            r.active = [0] * len(channels)
            if self.mode == "deterministic" and not sink:
                r.merger = _Merger(len(channels))
        if sink and rid.partition is not None:  # a partitioned application: one output, every replica's first copy
            shared = self._app_recorders.get(rid.node)
            if shared is None:
                shared = self._app_recorders[rid.node] = _PartitionRecorder(
                    q.schema_of(rid.node), self.physical.partitions(rid.node), self.keep_outputs)
            r.recorder = shared.replica(rid.partition)
        elif sink:
            r.recorder = _Recorder(q.schema_of(rid.node), self.keep_outputs)
        return r

    @staticmethod
    def _new_link(sender: _Replica, receiver: _Replica, port: int, channel: int) -> _Link:
        """A virtual link from ``sender`` to input ``port``, channel ``channel``, of ``receiver``."""
        return _Link(sender, receiver, port, channel)

    def _connect(self, e: StreamEdge, by_label: Mapping[str, _Replica]) -> _Link:
        """The virtual link of stream replica ``e``, on its sender's list of output links."""
        up = by_label[e.src.label]
        lk = _Link(up, by_label[e.dst.label], e.port, e.channel)
        if up.node == ENTRY:
            self.entry_links[e.stream].setdefault(_entry_key(up), []).append(lk)
        else:
            up.out.append(lk)
        return lk

    def replicas(self, node: str) -> list[_Replica]:
        """The replicas of ``node`` (``"entry"`` for the entry points), with ``label``, ``server``, ``alive``."""
        if node not in self.groups:
            raise KeyError(f"{node!r} is not a node of query {self.query.name!r}; nodes: {sorted(self.groups)}")
        return self.groups[node]

    def stream_replicas(self) -> list[_Link]:
        """Every stream replica (virtual link): ``sender``, ``receiver``, ``port``, ``live``, ``tuples``."""
        return self.links

    # -- the run ---------------------------------------------------------------------------
    def run(self, inputs: Mapping[str, Any], until: float | None = None, progress: bool = False,
            horizon_s: float | None = None, abort: Callable | None = None) -> RunResult:
        """Feed ``inputs`` (``{source: chunks}``, as for ``run_reference``; generators are read
        lazily) and simulate until every event has happened (or virtual time ``until``).
        ``progress`` (True, or a label such as ``"fig4 min-cost kmax=3"``) shows this run's
        :class:`RunProgress` line up to ``horizon_s`` virtual seconds (default: the last chunk's time
        when the inputs are lists).

        ``abort(sim) -> str | None`` (batched engine only) is asked after every epoch; a reason
        ends the run there: the result is incomplete and :attr:`aborted` holds the reason with
        the virtual time (an experiment stops a run that already broke its guarantee this way)."""
        q = self.query
        unknown = set(inputs) - set(q.sources)
        if unknown:
            raise QueryError(f"inputs given for unknown source(s) {sorted(unknown)}; sources are {q.sources}")
        self._heap: list = []
        self._seq = 0
        self.now = 0.0
        self.events: list[dict] = []
        self.busy: dict[str, float] = {}
        self.entries = {s: q.build_entry(s, self.strict, self.on_malformed) for s in q.sources}
        #: with entry partitions: per source, the feeder's cut (:class:`~replistream.operators.entry.EntrySplit`,
        #: offset by the source's place, as in process) and each partition's entry logic (``entries`` then
        #: runs nothing)
        self.splits: dict[str, EntrySplit] = {}
        self.part_entries: dict[str, list] = {}
        if self.entry_partitions > 1:
            for i, s in enumerate(q.sources):
                self.splits[s] = EntrySplit(q.build_entry(s, self.strict, self.on_malformed), self.entry_partitions,
                                            offset=i)
                self.part_entries[s] = [q.build_entry(s, self.strict, self.on_malformed)
                                        for _ in range(self.entry_partitions)]
        self._iters = {s: iter(iter_chunks(inputs.get(s, ()))) for s in q.sources}
        self._src_last: dict[tuple[str, int], float] = {}
        self._ended: set[str] = set()  # sources whose input is exhausted
        self._n_sources = len(q.sources)
        self._latest_ts = -math.inf  # largest source chunk time read so far
        # the first chunk of every source fixes ts0 (the runtime's feeder does the same)
        times = [t for t in (self._first_time(s) for s in q.sources) if t is not None]
        self.ts0 = min(times) if times else 0
        self._last_feed = {s: 0.0 for s in q.sources}
        self.aborted: str | None = None
        #: per source, the largest punctuation its entry logic emitted (a rescale's T0 is at least it)
        self.entry_punct: dict[str, int] = {}
        if getattr(self, "rescaler", None) is not None and self.rescaler.records:
            raise RuntimeError("this Simulator rescaled an operator in an earlier run (its replicas changed): "
                               "make a new Simulator for each run with rescales")
        if self.parallelism:
            from .rescale import SimRescaler

            self.rescaler = SimRescaler(self)
        else:
            self.rescaler = None
        if abort is not None and self.batch_s is None:
            raise ValueError("abort= needs the batched engine (Simulator(..., batch_s=...))")
        if self.batch_s is not None:
            return self._run_batched(until, progress, horizon_s, inputs, abort)
        for s in q.sources:
            self._schedule_feed(s, self._next_chunk(s))
        for ev in self.kills:
            self._push(ev.at, _KILL, ev)
        for at, ev in self.rescales:
            self._push(at, _RESCALE, ev)
        if self.coordinator is not None:
            self._push(self.coordinator[0], _CALL, None)
        bar, task = self._progress_bar(progress, until, horizon_s, inputs)
        heap = self._heap
        step = 0
        self._cut = False  # stopped at ``until`` with events left
        try:
            while heap:
                t, _, kind, payload = heapq.heappop(heap)
                if until is not None and t > until:
                    self._cut = True
                    break
                self.now = t
                if kind == _ARRIVE:
                    self._arrive(t, *payload)
                elif kind == _EMIT:
                    self._emit(t, *payload)
                elif kind == _ENTRY_IN:
                    self._entry_in(t, *payload)
                elif kind == _FEED:
                    self._feed(t, *payload)
                elif kind == _KILL:
                    self._kill(t, payload)
                elif kind == _STATE:
                    self.rescaler.arrive(t, payload)
                elif kind == _RESCALE:
                    self._rescale(t, payload)
                elif kind == _FAILOVER:
                    self._failover(t, payload)
                elif kind == _CALL:
                    self.coordinator[1](self, t)
                    if self._pending_work():
                        self._push(t + self.coordinator[0], _CALL, None)
                step += 1
                if bar is not None and step % 5000 == 0:
                    bar.update(task, completed=min(t, bar.tasks[0].total))
        finally:
            if bar is not None:
                bar.update(task, completed=bar.tasks[0].total)
                bar.stop()
        return self._result()

    def _run_batched(self, until, progress, horizon_s, inputs, abort=None) -> RunResult:
        from .batch import BatchRun

        self._batch = BatchRun(self, self.batch_s, until, link_model=self._lat, read_chunk=self._next_chunk,
                               kill=self._kill, victims=self._victims, slowdowns=self._has_slow)
        self._batch.abort = abort
        bar, task = self._progress_bar(progress, until, horizon_s, inputs)
        try:
            self._batch.run(bar, task)
            self.aborted = self._batch.aborted
        finally:
            if bar is not None:
                bar.update(task, completed=bar.tasks[0].total)
                bar.stop()
        return self._result()

    def _progress_bar(self, progress: bool | str, until, horizon_s, inputs):
        """(line, task) of this run's progress line over virtual time up to the horizon, or (None, None)."""
        if not progress:
            return None, None
        horizon = horizon_s or (until if until is not None else self._horizon_hint(inputs))
        line = RunProgress(progress if isinstance(progress, str) else "simulated", max(1.0, horizon))
        return line, 0

    def _horizon_hint(self, inputs) -> float:
        last = 0
        for s, data in inputs.items():
            if isinstance(data, list) and data:
                t = chunk_time(data[-1], punctuations=False)
                if t is not None:
                    last = max(last, t)
        return (last - self.ts0) / 1e6

    def _pending_work(self) -> bool:
        return any(k != _CALL for _, _, k, _ in self._heap)

    def _push(self, t: float, kind: int, payload) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, payload))

    # -- sources and entry points ------------------------------------------------------------
    def _first_time(self, src: str) -> int | None:
        """The first timestamp of the source's first chunk (None: a punctuation, or no input); the
        chunks read to find it (sentinels before it, and it) stay queued for the feeder."""
        head = []
        while True:
            chunk = self._next_chunk(src)
            if chunk is None:
                break
            head.append(chunk)
            if not isinstance(chunk, Sentinel):
                break
        self._iters[src] = chain(head, self._iters[src])
        return chunk_time(head[-1], punctuations=False) if head else None

    def _next_chunk(self, src: str):
        chunk = next(self._iters[src], None)
        if chunk is None:
            self._ended.add(src)
        else:
            ct = chunk_time(chunk, punctuations=False)
            if ct is not None and ct > self._latest_ts:
                self._latest_ts = ct
        return chunk

    def input_end(self) -> float:
        """Virtual time of the last source tuple once every source is exhausted, else ``inf``."""
        if len(self._ended) < self._n_sources or self._latest_ts == -math.inf:
            return math.inf
        return (self._latest_ts - self.ts0) / 1e6

    def _schedule_feed(self, src: str, chunk) -> None:
        if chunk is None:
            self._push(self._last_feed[src], _FEED, (src, None))
            return
        ct = chunk_time(chunk, punctuations=False)
        t = self._last_feed[src] if ct is None else max(self._last_feed[src], (ct - self.ts0) / 1e6)
        self._last_feed[src] = t
        self._push(t, _FEED, (src, chunk))

    def _feed(self, t: float, src: str, chunk) -> None:
        if isinstance(chunk, Rescale):  # the feeder reached it: the rescale starts now
            if self.entry_partitions > 1:
                raise QueryError(_RESCALE_BESIDE_ENTRY)
            self._rescale(t, chunk)
            shares = {}
        elif isinstance(chunk, Sentinel):  # the feeder reached it: a kill now (module docs)
            self._kill(t, sentinel_kill(chunk, t, src))
            shares = {}
        elif self.entry_partitions > 1:  # each chunk to one entry partition, progress notes to the others
            logics = self.part_entries[src]
            shares = {}
            if chunk is None:
                for part, logic in enumerate(logics):
                    shares[part] = logic.close()
            else:
                for part, item, start in self.splits[src].route(chunk):
                    shares.setdefault(part, []).extend(logics[part].push(item, start=start))
        else:
            entry = self.entries[src]
            shares = {None: entry.close() if chunk is None else entry.push(chunk)}
        for items in shares.values():
            for it in items:
                if isinstance(it, Punctuation) and it.p > self.entry_punct.get(src, _NO_P):
                    self.entry_punct[src] = int(it.p)
        where = self.sources.get(src)
        for part, items in shares.items():
            if not items:
                continue
            for e in self.groups[ENTRY]:
                if not e.alive or e.partition != part:
                    continue
                if where is None:
                    at = t
                else:
                    key = (src, _entry_key(e))
                    at = max(self._src_last.get(key, -math.inf), delivery_time(self.net, where, e.server, t))
                    if math.isinf(at):
                        continue
                    self._src_last[key] = at
                self._push(at, _ENTRY_IN, (e, src, items))
        if chunk is not None:
            self._schedule_feed(src, self._next_chunk(src))

    def _entry_in(self, t: float, e: _Replica, src: str, items: list) -> None:
        if not e.alive:
            return
        n = sum(len(it) for it in items if not isinstance(it, Punctuation))
        done = self._cpu(e, t, n)
        if done > t:
            self._push(done, _EMIT, (e, items, src))
        else:
            self._emit(t, e, items, src)

    # -- processing ------------------------------------------------------------------------
    def _cpu(self, r: _Replica, t: float, tuples: int) -> float:
        cost = self.cpu.cost(r.kind, tuples, self.net.slowdown(r.server, t) if self._has_slow else 1.0)
        if cost <= 0:
            return t
        start = max(t, self.busy.get(r.server, 0.0))
        done = start + cost
        self.busy[r.server] = done
        r.cpu_s += cost
        return done

    def _arrive(self, t: float, link: _Link, items: list) -> None:
        r = link.receiver
        if not r.alive:
            return
        if r.active is not None and r.active[link.port] != link.channel:
            buf = r.buffers.setdefault((link.port, link.channel), [])
            buf.append(items)
            if len(buf) > 64:
                self._trim_buffer(r, link.port, buf)
            return
        self._process(t, r, link.port, link.channel, items)

    def _trim_buffer(self, r: _Replica, port: int, buf: list) -> None:
        p = r.core.filters[port].max_punct
        kept = []
        for items in buf:
            its = [it for it in items if (it.p > p if isinstance(it, Punctuation) else int(it[TS].max()) > p)]
            if its:
                kept.append(its)
        buf[:] = kept

    def _process(self, t: float, r: _Replica, port: int, channel: int, items: list) -> None:
        core = r.core
        out: list = []
        n = 0
        if not r.last_in:
            r.last_in = [t] * len(core.filters)
            r.lag = [0.0] * len(core.filters)
        flt = core.filters[port]
        before = flt.passed
        for it in items:
            seen = flt.passed
            if r.merger is None:
                out.extend(core.process(port, channel, it))
            else:
                # deterministic: filter duplicates first, then merge every input in (ts, id) order
                for f in flt.process(channel, it):
                    for p2, x in r.merger.push(port, f):
                        out.extend(self._logic(core, p2, x))
            if not isinstance(it, Punctuation):
                n += len(it)
                if flt.passed > seen:  # new tuples: the input latency this replica observes (§V-C)
                    lag = t - (int(it[TS].min()) - self.ts0) / 1e6
                    if lag > r.lag[port]:
                        r.lag[port] = lag
        if flt.passed > before:
            r.last_in[port] = t
        done = self._cpu(r, t, n)
        if r.is_sink:
            r.recorder.add(out, done)
            return
        if self.rescaler is not None and r.node in self.rescaler.ever:
            out = self.rescaler.after(r, out)  # bins' state to send, a retiring partition to close
            done = self.rescaler.flush(done, r)
            self.rescaler.retry(t, r)
        if not out:
            return
        if self.mode == "synchronization":
            done = self._hold(r, done)
        if done > t:
            self._push(done, _EMIT, (r, out, None))
        else:
            self._emit(t, r, out, None)

    @staticmethod
    def _logic(core: ReplicaCore, port: int, item) -> list:
        items = [item]
        if core.sorters is not None:
            items = [y for x in items for y in core.sorters[port].process(0, x)]
        return [y for x in items for y in core.logic.process(port, x)]

    def _hold(self, r: _Replica, done: float) -> float:
        """Synchronization: a primary holds outputs until its live backups acknowledged the determinants."""
        group = self.groups[r.node]
        live = [x for x in group if x.alive]
        if len(live) < 2 or live[0] is not r:
            return done
        rtt = 0.0
        for b in live[1:]:
            there = delivery_time(self.net, r.server, b.server, done)
            back = delivery_time(self.net, b.server, r.server, there)
            rtt = max(rtt, back - done)
        return done + rtt

    def _emit_at(self, done: float, t: float, r: _Replica, out: list) -> None:
        """``r``'s outputs ``out`` leave at ``done`` (its CPU done; now is ``t``)."""
        if done > t:
            self._push(done, _EMIT, (r, out, None))
        else:
            self._emit(t, r, out, None)

    def _state_cpu(self, r: _Replica, t: float, rows: int) -> float:
        """``r``'s server's CPU takes out or installs ``rows`` rows of a rescale's state from ``t``:
        when it is done."""
        cost = self.cpu.state_cost(rows, self.net.slowdown(r.server, t) if self._has_slow else 1.0)
        if cost <= 0:
            return t
        done = max(t, self.busy.get(r.server, 0.0)) + cost
        self.busy[r.server] = done
        r.cpu_s += cost
        return done

    def _push_state(self, at: float, msg) -> None:
        self._push(at, _STATE, msg)

    def _rescale(self, t: float, ev: Rescale) -> None:
        """Start the live rescaling ``ev`` at virtual time ``t`` (:mod:`replistream.sim.rescale`)."""
        if self.rescaler is None:
            raise QueryError(f"Rescale: {ev.operator!r} is not partitioned; run it with "
                             f"parallelism={{{ev.operator!r}: 1}} (or more) to rescale it while it runs")
        check_rescales(self.query, self.parallelism, self.physical.bits, [ev], engine="the simulator")
        self.rescaler.begin(ev)

    def _emit(self, t: float, r: _Replica, items: list, src: str | None) -> None:
        if not r.alive:
            return
        links = self.entry_links[src][_entry_key(r)] if src is not None else r.out
        n = sum(len(it) for it in items if not isinstance(it, Punctuation))
        r.sent_tuples += n
        shares: dict = {}  # (partitioned receiver's node, port) -> items per partition
        for lk in links:
            if lk.live and lk.receiver.alive:
                if lk.partition is None:
                    self._send(lk, items, t, n)
                    continue
                key = (lk.receiver.node, lk.port)
                routed = shares.get(key)
                if routed is None:  # the share of each partition, punctuations to all (issue #41)
                    routed = shares[key] = [(x, sum(len(it) for it in x if not isinstance(it, Punctuation)))
                                            for x in self.routers[lk.receiver.node].route(lk.port, items)]
                share, m = routed[lk.partition]
                if share:
                    self._send(lk, share, t, m)
        if self.retain:
            log = self.entry_logs[(src, _entry_key(r))] if src is not None else r.core.output_log
            if src is not None:
                log.append(items)
            if any(isinstance(it, Punctuation) for it in items):
                acks = self.replay_acks(links)
                if acks:
                    log.trim(min(acks))

    def _fed_inputs(self) -> frozenset:
        """``{(id(replica), port), ...}``: the inputs of alive replicas that some live stream
        replica from an alive sender feeds (cached until the wiring changes)."""
        if self._fed[0] != self.wiring:
            self._fed = (self.wiring, frozenset((id(lk.receiver), lk.port) for lk in self.links
                                                if lk.live and lk.sender.alive and lk.receiver.alive))
        return self._fed[1]

    def replay_acks(self, links: list) -> list[int]:
        """The acknowledgements a sender on ``links`` may trim its retained output to: those of
        every alive receiver of ``links`` fed on that port, whether or not *this* stream
        replica is live (decision 7). A receiver that lags because its one live feeder lags
        may get this stream replica revived; the replay must then start at the receiver's
        own acknowledgement, not at that of this sender's live receivers, or the replayed
        punctuation passes the receiver's filter ahead of the tuples in between, which it
        then drops as copies. Dormant receivers (fed by nothing) are left out: a hand-over
        from a live peer brings them up to date.

        >>> from replistream.operators.base import NO_PUNCTUATION
        >>> from replistream.workloads import fig1_query
        >>> sim = Simulator(fig1_query(1), {n: ["a"] for n in ["entry", "loads", "pings", "correlate", "hot",
        ...                                                    "alerts"]}, ZeroLatency(["a"]), retain=True)
        >>> sim.replay_acks(sim.replicas("correlate")[0].out) == [NO_PUNCTUATION]   # hot#0 has nothing yet
        True
        """
        fed = self._fed_inputs()
        return [lk.receiver.core.filters[lk.port].max_punct for lk in links
                if lk.receiver.alive and (id(lk.receiver), lk.port) in fed]

    def _send(self, lk: _Link, items: list, t: float, n: int) -> None:
        net = self._lat
        a, b = lk.sender.server, lk.receiver.server
        lat = net.latency_ms(a, b, t)
        at = t + lat / 1000.0 if lat != math.inf else delivery_time(net, a, b, t)
        if at < lk.last:
            at = lk.last
        if math.isinf(at):
            lk.live = False  # unreachable for the whole horizon: the sender drops the channel
            self.wiring += 1
            self.events.append({"t": t, "event": "link dropped", "link": lk.id})
            return
        lk.last = at
        lk.tuples += n
        lk.packets += 1
        self._seq += 1
        heapq.heappush(self._heap, (at, self._seq, _ARRIVE, (lk, items)))

    # -- failures ------------------------------------------------------------------------------
    def _victims(self, ev: Event) -> list[_Replica]:
        """The replicas a ``kill_server`` / ``kill_replica`` event names (dead ones too); a
        ``QueryError`` for a server or replica this simulation does not have."""
        if ev.action == "kill_server":
            known = set(self.net.names) or {r.server for g in self.groups.values() for r in g}
            if ev.server not in known:
                raise QueryError(f"kill_server: no server {ev.server!r} in this simulation")
            return [r for g in self.groups.values() for r in g if r.server == ev.server]
        g = self.groups.get(ev.operator)
        if ev.operator == ENTRY and self.entry_partitions > 1:
            p = self.entry_partitions
            raise QueryError(f"kill_replica: the entry points run as {p} entry partitions; name one of them: "
                             f"{', '.join(partition_label(ENTRY, i) for i in range(p))}")
        if g is None and self.entry_partitions > 1 and parse_partition_label(ev.operator)[0] == ENTRY:
            part = parse_partition_label(ev.operator)[1]
            g = [r for r in self.groups[ENTRY] if r.partition == part] or None
        if g is not None and ev.operator in self.parallelism:
            p = self.parallelism[ev.operator]
            raise QueryError(f"kill_replica: {ev.operator!r} runs as {p} partitions; name one of them: "
                             f"{', '.join(partition_label(ev.operator, i) for i in range(p))}")
        if g is None and "." in str(ev.operator):  # "op.P": one partition of a partitioned operator
            base, _, part = str(ev.operator).rpartition(".")
            if base in self.parallelism and part.isdigit():
                g = [r for r in self.groups[base] if r.partition == int(part)] or None
        if g is None or not 0 <= ev.replica < len(g):
            raise QueryError(f"kill_replica: no replica {ev.replica} of {ev.operator!r}")
        return [g[ev.replica]]

    def _kill(self, t: float, ev: Event) -> None:
        victims = [v for v in self._victims(ev) if v.alive]
        for v in victims:
            v.alive = False
            self.wiring += 1
            self.events.append({"t": t, "event": "killed", "replica": v.label, "server": v.server})
        if self.mode != "replication" and victims:
            self._push(t + self.detect_s, _FAILOVER, victims)
        if victims and self.rescaler is not None and self.rescaler.open:
            self.rescaler.check()  # (the victim may have been the last replica a rescale waited for)

    def _failover(self, t: float, victims: list[_Replica]) -> None:
        """Failover modes: downstream replicas of a dead replica switch to the next live upstream one."""
        q = self.query
        for v in victims:
            for node in q.operators + q.sinks:
                for port, u in enumerate(q.inputs_of(node)):
                    ug = ENTRY if q.spec(u).kind == "source" else u
                    if ug != v.node:
                        continue
                    live = [x for x in self.groups[ug] if x.alive]
                    for d in self.groups[node]:
                        if not d.alive or d.active[port] != v.index or not live:
                            continue
                        d.active[port] = live[0].index
                        self.events.append({"t": t, "event": "failover", "replica": d.label, "port": port,
                                            "from": v.label, "to": live[0].label})
                        for items in d.buffers.pop((port, live[0].index), []):
                            self._process(t, d, port, live[0].index, items)

    # -- management (garbage collection and revival, Hwang §V-B, §V-C) ---------------------------------
    def weights(self) -> dict[str, float]:
        """The duplicate filters' weights by stream replica id (``src->dst:port``), for replica utility."""
        return {lk.id: float(lk.receiver.core.filters[lk.port].weights[lk.channel]) for lk in self.links}

    def apply_snapshot(self, snapshot) -> int:
        """Make the stream replicas live or discarded as in a :class:`replistream.gc.Snapshot`
        (same labels and ids as the runtime); returns how many are live. A revived replica of a
        stateful operator is handed over from a live peer first, and with ``retain=True`` every
        revived stream replica is first replayed what its sender retains since the last
        punctuation all its live receivers acknowledged (docs/design.md, decision 7)."""
        self.mutations += 1
        live = {st.id for st in snapshot.streams if st.live}
        known = {lk.id for lk in self.links}
        unknown = sorted(live - known)
        if unknown:
            raise ValueError(f"the snapshot has stream replicas this simulation does not: {unknown[:3]}")
        was_fed = {lk.receiver.label for lk in self.links if lk.live}
        revived = [lk for lk in self.links if not lk.live and lk.id in live]
        for lk in self.links:
            lk.live = lk.id in live
        self.wiring += 1
        for g in self.groups.values():
            for r in g:
                if r.core is None or r.is_sink or r.label in was_fed:
                    continue
                if any(lk.live and lk.receiver is r for lk in self.links):
                    self._handover(r)
        if self.retain:  # a revived stream replica first replays what its sender retains (decision 7)
            replays = []  # (link, the sender's log, its items)
            for lk in revived:
                if not (lk.sender.alive and lk.receiver.alive):
                    continue
                if lk.sender.node == ENTRY:
                    log_key = (self.query.inputs_of(lk.receiver.node)[lk.port], _entry_key(lk.sender))
                    items = self.entry_logs[log_key].items()
                else:
                    log_key = lk.sender.label
                    items = lk.sender.core.output_log.items()
                if items:
                    replays.append((lk, log_key, items))
            if self._batch is not None:
                self._batch.replay(self.now, replays)
            else:
                for lk, _, items in replays:
                    self._send(lk, items, self.now, sum(len(it) for it in items if not isinstance(it, Punctuation)))
        return len(live)

    def add_replica(self, node: str, server: str) -> str:
        """Create a new replica of ``node`` on ``server`` mid-run (§V-C: revival "creates a new
        replica on a server chosen as in Algorithm 5"); returns its label (``node#i``).

        Its stream replicas (from every upstream replica, to every downstream replica, whose
        duplicate filters get a new channel) start discarded: a following
        :meth:`apply_snapshot` that makes them live hands the replica over from a live peer
        and, with ``retain=True``, replays what the senders retain. Replication mode only.

        >>> from replistream.workloads import fig1_query
        >>> sim = Simulator(fig1_query(1), {n: ["a"] for n in ["entry", "loads", "pings", "correlate", "hot",
        ...                                                    "alerts"]}, ZeroLatency(["a", "b"]))
        >>> sim.add_replica("correlate", "b"), len(sim.replicas("correlate"))
        ('correlate#1', 2)
        """
        if self.mode != "replication":
            raise ValueError(f"add_replica needs mode 'replication', not {self.mode!r}")
        if self.entry_partitions > 1:
            raise ValueError(f"add_replica: the simulator does not add replicas beside entry partitions (yet), as "
                             f"the in-process engine does not; drop parallelism['entry'] to add {node!r} replicas")
        self.mutations += 1
        q = self.query
        if node in q.sinks or node not in self.groups:
            raise ValueError(f"add_replica: {node!r} is not an operator or 'entry' of query {q.name!r}")
        if self.net.names and server not in self.net.names:
            raise ValueError(f"add_replica: server {server!r} is not known to the network")
        near = [n for n in [node, *(q.inputs_of(node) if node != ENTRY else []),
                            *(v for s in ([node] if node != ENTRY else q.sources) for v, _ in q.outputs_of(s))]
                if n in self.parallelism]
        if near:
            raise ValueError(f"add_replica: {node!r} is or neighbours the partitioned operator {near[0]!r}; adding "
                             f"replicas next to partitions is not supported yet (issue #41)")
        group = self.groups[node]
        if any(r.server == server and r.alive for r in group):
            raise ValueError(f"add_replica: {server!r} already runs a live replica of {node!r}")
        dead = [r.label for r in group if r.server == server]
        if dead:
            raise ValueError(f"add_replica: {server!r} held {dead[0]}, a dead replica of {node!r}: a node's "
                             f"replicas, dead or alive, are on distinct servers (replistream.plan.PhysicalPlan)")
        grown = PhysicalPlan(q, {**self.plan, node: self.plan[node] + [server]})
        rid = grown.replicas(node)[-1]
        r = self._new_replica(rid, server, grown.channels(node) if node != ENTRY else [])
        by_label = {x.label: x for g in self.groups.values() for x in g}
        by_label[r.label] = r
        new_links: list[_Link] = []
        for e in ([] if node == ENTRY else grown.in_streams(rid)) + grown.out_streams(rid):
            if e.src == rid:  # every downstream duplicate filter gets a channel for it
                ch = by_label[e.dst.label].core.add_channel(e.port)
                if ch != e.channel:
                    raise RuntimeError(f"add_replica: {e.dst.label} input {e.port} gave channel {ch} to "
                                       f"{r.label}, the plan says {e.channel}")
            new_links.append(self._connect(e, by_label))
        if self.retain and node == ENTRY:
            for src in q.sources:
                self.entry_logs[(src, rid.index)] = ReplayLog()
        for lk in new_links:
            lk.live = False
        self.wiring += 1
        group.append(r)
        self.physical = grown
        self.plan[node] = self.plan[node] + [server]
        self.links.extend(new_links)
        if self._batch is not None:
            self._batch.add_replica(r, new_links)
        self.events.append({"t": self.now, "event": "created", "replica": r.label, "server": server})
        return r.label

    def _handover(self, r: _Replica) -> None:
        peers = [p for p in self.groups[r.node] if p is not r and p.alive and p.partition == r.partition and p.label in
                 {lk.receiver.label for lk in self.links if lk.live}]
        if not peers:
            return  # no live peer to copy: the replica goes on from its own state
        ck = peers[0].core.checkpoint()
        if not ck.logic.rows():
            return  # a stateless operator: nothing to hand over
        chans = [f.n_channels for f in r.core.filters]
        r.core = ReplicaCore.from_checkpoint(self.query, ck, chans, self.strict, retain=self.retain)
        if self._batch is not None:
            self._batch.handover(r)
        self.events.append({"t": self.now, "event": "handover", "replica": r.label, "peer": peers[0].label})

    def input_delays(self, t: float, reset: bool = True, silence_s: float = 60.0) -> dict[str, float]:
        """Per live replica fed by live stream replicas: the largest input latency it observed
        since the last call (s), or, for a port that received no new tuple for more than
        ``silence_s``, the silence beyond ``silence_s`` if larger: what a replica "observes"
        for revival (§V-C). Silence after the sources' last tuple (:meth:`input_end`) is the
        input's end, not a delay, and is not counted."""
        fed, end = {}, self.input_end()
        for lk in self.links:
            if lk.live and lk.sender.alive:
                fed.setdefault(lk.receiver.label, set()).add(lk.port)
        out = {}
        replay = self._batch is not None and self._batch.obs_k is not None  # a call replayed after a look-ahead
        for g in self.groups.values():
            for r in g:
                if r.core is None or not r.alive or r.label not in fed or not r.last_in:
                    continue
                lag, last_in = self._batch.observation(r) if replay else (r.lag, r.last_in)
                if any(x == -math.inf for x in last_in):
                    continue  # no input yet at that call
                quiet = max(min(t, end) - x for x in last_in) - silence_s
                out[r.label] = max(max(lag), quiet)
                if reset:
                    r.lag = [0.0] * len(r.lag)
        return out

    # -- results ---------------------------------------------------------------------------------
    def _result(self) -> RunResult:
        outputs, arrivals, punct = {}, {}, {}
        dead = []
        for node in self.query.sinks:
            rec = self.groups[node][0].recorder
            outputs[node], arrivals[node] = rec.result()
            punct[node] = rec.punct
        entries = list(self.entries.values()) if self.entry_partitions == 1 else \
            [e for logics in self.part_entries.values() for e in logics]  # each partition's letters, once
        for e in entries:
            dead.extend(e.dead_letters)
        for g in self.groups.values():  # every replica, the crashed ones too: peers set the same rows aside
            for r in g:
                if r.core is not None:
                    dead.extend(r.core.dead_letters())
        dead = merge_dead_letters(dead)
        links = [{"id": lk.id, "sender": lk.sender.label, "receiver": lk.receiver.label, "port": lk.port,
                  "from": lk.sender.server, "to": lk.receiver.server, "tuples": lk.tuples, "packets": lk.packets,
                  "live": lk.live} for lk in self.links]
        stats = {"cpu_s": {r.label: r.cpu_s for g in self.groups.values() for r in g},
                 "weights": {n: [f.weights.tolist() for f in self.groups[n][0].core.filters] for n in self.query.sinks}}
        if self.rescaler is not None and self.rescaler.records:
            if not getattr(self, "_cut", False):  # the run ended (not stopped at ``until``): every rescale must be done
                undone = self.rescaler.problems()
                if undone:
                    raise RuntimeError("rescales did not complete:\n  " + "\n  ".join(undone[:10]))
            self.rescaler.summarise(outputs, arrivals, self.ts0, self.rescale_after_s)
            stats["rescales"] = self.rescaler.records
        return RunResult(outputs, punctuation=punct, dead_letters=dead, stats=stats, arrivals=arrivals, ts0=self.ts0,
                         pace=1.0, end_time=self.now, events=self.events, links=links)
