"""The in-process replicated engine: every operator as ``k`` replicas in one process.

:class:`InProcessEngine` runs a query's physical plan
(:class:`~replistream.plan.PhysicalPlan`) without Ray and without a clock:
every operator and entry point runs as ``k`` replicas, every upstream replica
feeds every downstream replica through its own FIFO channel (one per
:class:`~replistream.plan.StreamEdge`), and each replica merges its inputs with
duplicate filters (Hwang §IV-B, Algorithm 1). A seeded scheduler delivers
channel heads in random order with per-channel speeds (so replicas see
different interleavings and delays), splits batches at random, re-sends
copies, and can crash up to ``k - 1`` replicas of every operator and entry
point at random steps. A failing seed reproduces exactly.

Sentinels in the inputs script events at a point of a source's stream:
:class:`~replistream.sources.KillReplica`, :class:`~replistream.sources.KillServer`
(every replica the plan puts on that server), :class:`~replistream.sources.StopReplica`
(a replica never scheduled again, which neither crashes nor answers), and hand-over of stateful
replicas (docs/handover.md, docs/migration.md):
:class:`~replistream.sources.Revive` and :class:`~replistream.sources.AddReplica`
build a replica from a live peer's checkpoint mid-stream, with upstream
replay (Hwang §V-C; staged transfers after Megaphone §3.3); :class:`~replistream.sources.Rescale`
changes a partitioned operator's number of partitions mid-stream (:mod:`.inprocess_rescale`).
:class:`~replistream.sources.Pause` is a no-op (there is no clock to pause);
:class:`~replistream.sources.Call` needs a deployment and is refused before
the run starts. ``audit=True`` checks that every replica emits exactly what
the ideal run's copy of its operator emits.

An application named in ``parallelism`` runs as ``p`` partitions x ``k`` replicas (``out.P#R``),
its input routed by tuple id like a stateless operator's; the run's output is the union of the
partitions' (the first copy of each tuple from any replica of its partition), and with
``sinks={app: ParquetSink(...)}`` every application replica writes the folder itself
(:mod:`replistream.sinks`: each partition its own files).

:func:`run_replicated` is the one-call form: ``InProcessEngine(query, ...).run(inputs)``.

>>> from replistream import Query
>>> from replistream.testing import assert_same_output, chunked
>>> q = Query(); s = q.source("s", {"x": "i8"}, punctuate_every=4)
>>> _ = s.window(size=4, aggs={"n": "count"}).sink("counts")
>>> data = {"s": chunked([{"ts": t, "x": t} for t in range(12)], 5)}
>>> rep = run_replicated(q, data, k=3, seed=1, crash=True)
>>> assert_same_output(run_reference(q.build(), data).outputs["counts"], rep.outputs["counts"])
>>> rep.complete
True
"""
from __future__ import annotations

import random
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import QueryError, merge_dead_letters
from ..operators import Item
from ..operators.base import NO_PUNCTUATION, OperatorState
from ..operators.entry import partition_streams
from ..partition import BinMap, entry_parallelism, parse_partition_label
from ..plan import ENTRY, PhysicalPlan
from ..query import Query
from ..replica.checkpoint import ReplicaCheckpoint
from ..replica.core import ReplayLog, ReplicaCore
from ..replica.transfer import StagedReplica, plan_transfer, splittable
from ..schema import END, Punctuation
from ..sources import (AddReplica, Call, KillReplica, KillServer, Pause, Rescale, Revive, Sentinel, StopReplica,
                       iter_chunks, source_streams)
from .inprocess_rescale import Rescaler, StateMessage, TrackedRouter, check_rescales
from .reference import run_reference, run_reference_on_streams  # noqa: F401 (run_reference: the doctests)
from .result import Collector, RunResult, as_multiset

__all__ = ["InProcessEngine", "run_replicated", "default_placement", "HarnessStats", "ReplicaDivergence",
           "PartitionCollector"]


class ReplicaDivergence(AssertionError):
    """Raised by :func:`run_replicated` with ``audit=True`` when some replica emitted a tuple
    the ideal run's copy of its operator does not emit (or emitted one twice), or a replica
    that completed did not emit all of them: a broken hand-over or a replica-inconsistent operator.

    >>> issubclass(ReplicaDivergence, AssertionError)
    True
    """


@dataclass
class HarnessStats:
    """What the engine did: steps, crashed replicas, stopped replicas (``stopped``,
    :class:`~replistream.sources.StopReplica`), batches split and re-sent, kills and stops
    skipped to keep a working replica (``spared``), and one record per hand-over
    (``handovers``: node, new replica, peer, the checkpoint's punctuations and those of
    the other working replicas, applied ids, state rows, tuples replayed, bytes) and per
    staged transfer (``transfers``) and rescale (``rescales``, :mod:`.inprocess_rescale`).

    >>> HarnessStats().crashed
    []
    """

    steps: int = 0
    crashed: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    splits: int = 0
    resent: int = 0
    spared: list[str] = field(default_factory=list)
    handovers: list[dict] = field(default_factory=list)
    transfers: list[dict] = field(default_factory=list)
    rescales: list[dict] = field(default_factory=list)


def default_placement(query: Query, k: int) -> dict[str, list[str]]:
    """The placement :class:`InProcessEngine` uses without one: replica ``i`` of every
    operator and of the entry points on server ``"s{i}"``, every application on ``"s0"``.

    >>> from replistream import Query
    >>> q = Query(); s = q.source("s", {"x": "i8"}); _ = s.filter(lambda b: b["x"] > 0, name="f").sink("app")
    >>> default_placement(q.build(), 2)
    {'entry': ['s0', 's1'], 'f': ['s0', 's1'], 'app': ['s0']}
    """
    servers = [f"s{i}" for i in range(k)]
    return {ENTRY: list(servers), **{n: list(servers) for n in query.operators}, **{n: ["s0"] for n in query.sinks}}


# -- the engine's pieces -------------------------------------------------------------------

@dataclass
class HarnessReplica:
    """One replica as the engine runs it.

    An *entry copy* replays one source's entry-point output (``items``, from
    ``cursor``) and logs what it emitted (``entry_log``); the engine keeps one
    copy per source and entry replica, so ``KillReplica("entry", i)`` stops
    copy ``i`` of every source. An *operator replica* or *application* runs a
    :class:`ReplicaCore`. A replica being built by hand-over has ``event`` set
    and no core yet: it counts its new input channels (``chan_counts``) until
    its checkpoint is installed, or receives its state in steps (``staged``,
    ``transfer``). ``server``: where the plan puts it (None for a replica
    :class:`AddReplica` created, which the plan does not place). ``stopped``: a
    :class:`~replistream.sources.StopReplica` stopped it: still alive, never scheduled again.

    >>> r = HarnessReplica("agg", 1, None, "s0", partition=2)
    >>> r.label, r.group
    ('agg.2#1', 'agg.2')
    """

    node: str
    index: int
    core: ReplicaCore | None
    server: str | None = None
    items: list[Item] | None = None
    cursor: int = 0
    alive: bool = True
    stopped: bool = False
    out: list["HarnessChannel"] = field(default_factory=list)
    entry_log: ReplayLog | None = None
    generation: int = 0
    history: list | None = None  # audit: batches emitted (inherited from the peer at hand-over)
    chan_counts: list[int] | None = None
    ready_at: int = 0
    event: Any = None
    replayed: int = 0
    staged: StagedReplica | None = None
    transfer: "_Transfer | None" = None
    inherited: Counter | None = None  # audit: union of the peers' emissions at each step
    partition: int | None = None  # the partition of a partitioned operator's replica

    @property
    def group(self) -> str:
        """The replicas that are copies of this one: its node, or ``"node.P"`` for a partition."""
        return self.node if self.partition is None else f"{self.node}.{self.partition}"

    @property
    def label(self) -> str:
        """``"node#index"`` (``"node.P#index"`` in partition ``P``), with a prime per generation of
        revival (``"w#0'"``)."""
        return f"{self.group}#{self.index}" + "'" * self.generation

    @property
    def ready(self) -> bool:
        """Alive, not stopped, and working (an entry copy, or a replica with its state installed)."""
        return self.alive and not self.stopped and (self.items is not None or self.core is not None)

    @property
    def scheduled(self) -> bool:
        """The scheduler may still run it: alive and not stopped."""
        return self.alive and not self.stopped

    @property
    def receiving(self) -> bool:
        """Takes deliveries: installed, or receiving its state in steps."""
        return self.core is not None or self.staged is not None

    @property
    def log(self) -> ReplayLog | None:
        """What it retains for replay: an entry copy's log, or its core's output log."""
        return self.entry_log if self.items is not None else (self.core.output_log if self.core else None)


@dataclass
class HarnessChannel:
    """One stream replica in flight: ``sender``'s output into ``receiver``'s input ``port``,
    as its ``index``-th channel there; ``speed`` weighs how often the scheduler picks it.

    >>> up, down = HarnessReplica("f", 0, None), HarnessReplica("agg", 1, None)
    >>> HarnessChannel(up, down, port=0, index=0, speed=1.0).receiver.label
    'agg#1'
    """

    sender: HarnessReplica
    receiver: HarnessReplica
    port: int
    index: int
    speed: float
    queue: deque = field(default_factory=deque)
    delivered: int = 0
    partition: int | None = None  # the receiver's partition: the channel carries that share only


@dataclass
class _Transfer:
    """A staged transfer in progress (Megaphone §3.3): the steps' bins, the next step,
    the current peer, and what each step cost."""

    steps: list
    peer: HarnessReplica
    bits: int
    started: int
    next: int = 0
    restarts: int = 0
    peers: list[str] = field(default_factory=list)
    bytes: list[int] = field(default_factory=list)

    @property
    def remaining(self) -> bool:
        """Steps are left to take."""
        return self.next < len(self.steps)


class InProcessEngine:
    """Run ``query`` with every operator and entry point replicated ``k`` times, in process.

    Options (as :func:`run_replicated`): ``crash=True`` kills up to ``k - 1``
    replicas of every operator and of every source's entry copies at random
    steps (fail-stop: what they had in flight is lost); ``split`` cuts batches
    at random; ``resend_prob`` re-sends a batch on the same channel right
    after the first copy (a retransmission); ``speed_spread`` is the sigma of
    the lognormal per-channel speeds; ``strict``/``on_malformed`` as for
    :func:`run_reference`; ``audit`` compares every replica's emissions with
    the ideal run; ``checkpoint_bits`` ships checkpoints in ``2**bits`` bins
    reassembled in random order. ``placement`` (``{node: [server, ...]}``,
    :data:`~replistream.plan.ENTRY` for the entry points; default
    :func:`default_placement`) places the replicas for
    :class:`~replistream.sources.KillServer`; it must give every operator and
    the entry points ``k`` distinct servers. ``parallelism`` may name applications too (``p``
    partitions x ``k`` replicas each); ``sinks``: ``{application: ParquetSink}``, written by every
    replica of the application (``writers``, by label).

    :meth:`run` may be called more than once: each run starts from the seed.

    Attributes of the engine: ``query``, ``k``, ``seed``, the options, and
    ``plan`` (the :class:`~replistream.plan.PhysicalPlan`). Attributes of the
    current run (set by :meth:`run`):

    * ``rng`` (the schedule, splits, re-sends, channel speeds, crashes) and
      ``erng`` (hand-over choices; a separate stream so a run without events
      keeps the schedule it had before events existed);
    * ``streams``, ``entries``: each source's entry-point output and logic;
    * ``groups``: ``{node: [replica, ...]}``, keyed by source name for the
      entry copies, and by operator and application name; ``retired``: the
      replicas a hand-over replaced;
    * ``channels``: every stream replica; ``collectors``: each application's output;
    * ``stats``: a :class:`HarnessStats`; ``crashes``: the random kills still
      to come, as ``(step, replica)``;
    * ``pending``: replicas subscribed and waiting for their checkpoint;
      ``transferring``: replicas receiving their state in steps;
      ``due``: per source, the sentinels still to run, as ``(position, sentinel)``.

    >>> from replistream import Query
    >>> from replistream.testing import assert_same_output
    >>> q = Query(); s = q.source("s", {"k": "i8"}, punctuate_every=4)
    >>> _ = s.window(size=8, by="k", name="w").sink("out")
    >>> recs = [{"ts": t, "k": t % 3} for t in range(40)]
    >>> eng = InProcessEngine(q, k=2, seed=3, placement={"entry": ["a", "b"], "w": ["b", "c"], "out": ["a"]})
    >>> rep = eng.run({"s": recs[:20] + [KillServer("b")] + recs[20:]})
    >>> sorted(rep.stats["harness"].crashed), rep.complete
    (['s#1', 'w#0'], True)
    >>> assert_same_output(run_reference(q, {"s": recs}).outputs["out"], rep.outputs["out"])
    """

    def __init__(self, query: Query, k: int = 2, seed: int = 0, *, crash: bool = False, split: bool = True,
                 resend_prob: float = 0.05, speed_spread: float = 1.0, strict: bool = False,
                 on_malformed: str = "dead_letter", audit: bool = False, checkpoint_bits: int = 0,
                 placement: Mapping[str, Sequence[str]] | None = None,
                 parallelism: Mapping[str, int] | None = None, bits: int | None = None,
                 sinks: Mapping[str, Any] | None = None):
        if int(k) < 1:
            raise ValueError(f"k (the degree of replication) must be >= 1, got {k}")
        query.build()
        self.query = query
        self.k = k
        self.seed = seed
        self.crash = crash
        self.split = split
        self.resend_prob = resend_prob
        self.speed_spread = speed_spread
        self.strict = strict
        self.on_malformed = on_malformed
        self.audit = audit
        self.checkpoint_bits = checkpoint_bits
        #: the entry points' partitions (``parallelism={"entry": p}``): each source's chunks are cut
        #: between them as the Ray feeder cuts them (:class:`~replistream.operators.entry.EntrySplit`)
        self.entry_partitions, parallelism = entry_parallelism(parallelism)
        if placement is None:
            placement = default_placement(query, k)
            for app in query.sinks:  # a partitioned application: k replicas per partition, like an operator
                if app in (parallelism or {}):
                    placement[app] = [f"s{i}" for i in range(k)]
        self.plan = PhysicalPlan(query, placement, k=k, parallelism=parallelism, bits=bits, keep_single=True,
                                 entry_partitions=self.entry_partitions, applications=True)
        self.plan.require_one_replica_per_application("the in-process engine")
        self.servers = sorted({self.plan.server(r) for r in self.plan.replicas()})
        #: ``{operator: p}`` of the partitioned operators, as checked by the plan (an operator named
        #: with ``p = 1`` runs as one partition ``op.0``, which a :class:`~replistream.sources.Rescale` can
        #: rescale); a run's rescales change it
        self.parallelism = dict(self.plan.parallelism)
        from ..sinks import ParquetSink

        #: ``{application: ParquetSink}``: every replica of the application writes the folder (:mod:`replistream.sinks`)
        self.sinks = dict(sinks or {})
        for app, sink in self.sinks.items():
            if app not in query.sinks:
                raise ValueError(f"sinks names {app!r}, not an application of query {query.name!r}; "
                                 f"applications: {query.sinks}")
            if not isinstance(sink, ParquetSink):
                raise ValueError(f"sinks[{app!r}] must be a replistream.ParquetSink, got {type(sink).__name__}")

    # -- a run -------------------------------------------------------------------------------
    def run(self, inputs: Mapping[str, Any]) -> RunResult:
        """Run the query over ``inputs`` (``{source: chunks}``, as for :func:`run_reference`,
        sentinels included) to the end; the result's ``stats["harness"]`` is a
        :class:`HarnessStats`, ``stats["weights"]`` the duplicate-filter contribution
        weights at each application. Raises :class:`ReplicaDivergence` when auditing finds one."""
        self._start(inputs)
        for src in self.query.sources:
            for part in range(self.entry_partitions):
                self._fire(src, 0, part)
        while self._step():
            pass
        return self._result()

    def _start(self, inputs: Mapping[str, Any]) -> None:
        """Set up a run: the entry-point streams, the replicas and channels of the plan, the crash schedule."""
        q = self.query
        self.rng = random.Random(self.seed)
        self.erng = random.Random(self.seed * 1_000_003 + 17)
        events: list = []
        self.streams, self.entries = source_streams(q, inputs, self.strict, self.on_malformed, events=events)
        self._check_events([ev for _, _, ev in events])
        #: with entry partitions: per source, each partition's stream and entry logic (``self.streams``
        #: and ``self.entries`` stay the unpartitioned run's: the audit's ideal), and how far each
        #: partition's copies got (``reached``: a scripted event runs once every partition passed it)
        self.part_streams: dict[str, list[list[Item]]] = {}
        self.part_entries: dict[str, list] = {}
        self.reached: dict[str, list[int]] = {}
        if self.entry_partitions > 1:
            events = []
            for i, src in enumerate(q.sources):
                items, logics, marks = partition_streams(
                    lambda: q.build_entry(src, self.strict, self.on_malformed),
                    iter_chunks(inputs.get(src, ())), self.entry_partitions, offset=i)
                self.part_streams[src], self.part_entries[src] = items, logics
                self.reached[src] = [0] * self.entry_partitions
                events += [(src, pos, ev) for pos, ev in marks]
        self.groups: dict[str, list[HarnessReplica]] = {}
        for src in q.sources:
            self.groups[src] = [HarnessReplica(src, r.index, None, self.plan.server(r),
                                               items=self.part_streams[src][r.partition] if r.partition is not None
                                               else self.streams[src],
                                               entry_log=ReplayLog(), partition=r.partition)
                                for r in self.plan.replicas(ENTRY)]
        for node in q.operators:
            chans, groups = self.plan.channels(node), self.plan.channel_groups(node)
            self.groups[node] = [HarnessReplica(node, r.index, ReplicaCore(q, node, chans, self.strict, retain=True,
                                                                     groups=groups),
                                          self.plan.server(r), history=[] if self.audit else None,
                                          partition=r.partition)
                                 for r in self.plan.replicas(node)]
        self.collectors: dict[str, Collector] = {}
        #: per application replica (by label) with a ParquetSink, the writer it runs
        self.writers: dict[str, Any] = {}
        for sink in self.sinks.values():
            sink.prepare()  # a used folder refused (or an earlier run's files replaced) before anything runs
        for node in q.sinks:
            self.groups[node] = [HarnessReplica(node, r.index, ReplicaCore(q, node, self.plan.channels(node), self.strict,
                                                                     groups=self.plan.channel_groups(node)),
                                          self.plan.server(r), partition=r.partition) for r in self.plan.replicas(node)]
            p = self.plan.parallelism.get(node)
            self.collectors[node] = Collector(q.schema_of(node)) if p is None else \
                PartitionCollector(q.schema_of(node), p)
            if node in self.sinks:
                from ..sinks import SinkWriter

                for r in self.groups[node]:
                    self.writers[r.label] = SinkWriter(self.sinks[node], node, r.label, r.partition, p)
        self.retired: list[HarnessReplica] = []
        self.channels: list[HarnessChannel] = []
        #: per partitioned operator, the router every upstream replica sends its input through
        self.routers = {node: TrackedRouter(q, node, BinMap.even(p, self.plan.bits))
                        for node, p in self.plan.parallelism.items()}
        for e in self.plan.streams():
            sender = self.groups[e.stream][e.channel]  # for an entry replica: that source's copy
            ch = HarnessChannel(sender, self.groups[e.dst.node][self.plan.position(e.dst)], e.port, e.channel,
                          self.rng.lognormvariate(0.0, self.speed_spread), partition=e.dst.partition)
            sender.out.append(ch)
            self.channels.append(ch)
        self.stats = HarnessStats()
        self.crashes = self._crash_schedule()
        self.pending: list[HarnessReplica] = []
        self.transferring: list[HarnessReplica] = []
        self.due: dict[str, deque] = {src: deque() for src in q.sources}
        for src, pos, ev in (sorted(events, key=lambda e: e[1]) if self.entry_partitions == 1 else events):
            self.due[src].append((pos, ev))
        self.rescaler = Rescaler(self) if any(isinstance(ev, Rescale) for _, _, ev in events) else None

    def _check_events(self, events: list[Sentinel]) -> None:
        """Refuse, before anything runs, a sentinel this engine cannot run or one naming
        something the query or plan does not have (a replica number is checked when the
        kill runs: hand-overs may add replicas)."""
        q = self.query
        self.parallelism = dict(self.plan.parallelism)  # (a run's rescales change it)
        most = check_rescales(q, self.parallelism, self.plan.bits, [ev for ev in events if isinstance(ev, Rescale)])
        for ev in events:
            if self.entry_partitions > 1 and isinstance(ev, (Revive, AddReplica, Rescale)):
                raise QueryError(f"{type(ev).__name__}: the in-process engine does not run it beside entry partitions "
                                 f"(yet); drop parallelism['entry'], or kill replicas instead")
            if isinstance(ev, (Revive, AddReplica)) and ev.operator not in q.operators:
                raise QueryError(f"{type(ev).__name__}: {ev.operator!r} is not an operator of query {q.name!r}")
            if isinstance(ev, (Revive, AddReplica)) and self.parallelism:
                near = [n for n in [ev.operator, *q.inputs_of(ev.operator), *(v for v, _ in q.outputs_of(ev.operator))]
                        if n in self.parallelism]
                if near:
                    raise QueryError(f"{type(ev).__name__}: {ev.operator!r} is or neighbours the partitioned operator "
                                     f"{near[0]!r}; the in-process engine hands over replicas of unpartitioned "
                                     f"neighbourhoods only (yet): kill replicas instead, or drop parallelism")
            if isinstance(ev, StopReplica) or (isinstance(ev, KillReplica) and (
                    ev.operator in self.parallelism or parse_partition_label(ev.operator)[1] is not None
                    or (ev.operator == ENTRY and self.entry_partitions > 1))):
                self._group_name(ev, most)
            if isinstance(ev, KillServer) and ev.server not in self.servers:
                raise QueryError(f"KillServer: no server {ev.server!r} in the plan; servers: {self.servers}")
            if isinstance(ev, Call):
                raise QueryError("Call: the in-process engine has no deployment to call; run the query with "
                                 "replistream.deploy, or script the event as a KillReplica, StopReplica, "
                                 "KillServer, Revive or AddReplica sentinel")
            if not isinstance(ev, (KillReplica, StopReplica, KillServer, Pause, Revive, AddReplica, Rescale)):
                raise QueryError(f"{type(ev).__name__}: the in-process engine cannot run this sentinel")

    def _crash_schedule(self) -> list[tuple[int, HarnessReplica]]:
        """With ``crash``: up to ``k - 1`` victims among every source's entry copies and every
        operator's replicas, each at a random step below a horizon that grows with the input."""
        crashes: list[tuple[int, HarnessReplica]] = []
        if self.crash and self.k > 1:
            q, rng = self.query, self.rng
            horizon = max(1, sum(len(s) for s in self.streams.values()) * self.k * max(1, len(q.operators)))
            for node in q.sources + q.operators:
                for peers in self._partitions_of(node):  # up to k - 1 per partition: each keeps one
                    victims = rng.sample(peers, rng.randint(0, self.k - 1))
                    crashes.extend((rng.randrange(horizon), v) for v in victims)
            crashes.sort(key=lambda c: c[0])
        return crashes

    def _partitions_of(self, node: str) -> list[list[HarnessReplica]]:
        """The replicas of ``node`` (a source: its entry copies), one list per partition (one list when
        it is not partitioned)."""
        group = self.groups[node]
        if node in self.query.sources and self.entry_partitions > 1:
            return [[r for r in group if r.partition == p] for p in range(self.entry_partitions)]
        if node not in self.parallelism:
            return [group]
        return [[r for r in group if r.partition == p] for p in range(self.parallelism[node])]

    def _peers(self, r: HarnessReplica) -> list[HarnessReplica]:
        """The replicas that are copies of ``r`` (its node's, or its partition's), ``r`` included."""
        return [x for x in self.groups[r.node] if x.partition == r.partition]

    def _group_name(self, ev, partitions: Mapping[str, int] | None = None) -> tuple[str, int | None]:
        """``(node, partition)`` of the replicas a :class:`KillReplica` or :class:`StopReplica`
        names: ``"op"``, one partition ``"op.P"`` of a partitioned operator (of ``partitions``,
        default those it has now), or ``"entry"``; a ``QueryError`` says what to write instead."""
        q, name = self.query, ev.operator
        kind = type(ev).__name__
        base, part = parse_partition_label(name)
        partitions = self.parallelism if partitions is None else partitions
        if base == ENTRY and self.entry_partitions > 1:
            partitions = {ENTRY: self.entry_partitions}
        elif base == ENTRY and part is not None:
            raise QueryError(f"{kind}: the entry points are not partitioned; name them {ENTRY!r}")
        if base in partitions:
            p = partitions[base]
            if part is None or part >= p:
                raise QueryError(f"{kind}: {base!r} runs as {p} partitions; name one of them: "
                                 f"{', '.join(f'{base}.{i}' for i in range(p))}")
            return base, part
        if part is not None and base in q.operators:
            raise QueryError(f"{kind}: {base!r} is not partitioned; name it {base!r}")
        if name != ENTRY and name not in q.operators + q.sinks:
            raise QueryError(f"{kind}: {name!r} is not an operator, application or {ENTRY!r} of query {q.name!r}")
        return name, None

    def _step(self) -> bool:
        """One scheduler step: run due crashes, install checkpoints that are due, restart
        transfers whose peer died, then deliver one item picked at random (an entry copy's
        next item, or a channel's head, weighted by the channel's speed). When nothing can
        move, wait for pending replicas, take stalled transfer steps, or run sentinels placed
        after a source's last item. False when the run is over."""
        while self.crashes and self.crashes[0][0] <= self.stats.steps:
            self._kill(self.crashes.pop(0)[1])
        for new in [p for p in self.pending if p.ready_at <= self.stats.steps]:
            self.pending.remove(new)
            self._install(new)
        for new in list(self.transferring):
            self._check_peer(new)
        cands: list = [e for src in self.query.sources for e in self.groups[src]
                       if e.scheduled and e.cursor < len(e.items)]
        weights = [1.0] * len(cands)
        for ch in self.channels:
            if ch.queue and ch.receiver.scheduled and ch.receiver.receiving:
                cands.append(ch)
                weights.append(ch.speed)
        if self.rescaler is not None:  # bins' state on its way (a rescale)
            moving = self.rescaler.candidates()
            cands += moving
            weights += [1.0] * len(moving)
        if not cands:
            return self._idle()
        pick = self.rng.choices(cands, weights)[0]
        self.stats.steps += 1
        if isinstance(pick, HarnessReplica):
            self._emit(pick, [pick.items[pick.cursor]])
            pick.cursor += 1
            self._fire(pick.node, pick.cursor, pick.partition)
        elif isinstance(pick, StateMessage):
            self.rescaler.deliver(pick)
        else:
            self._deliver(pick)
        return True

    def _idle(self) -> bool:
        """Nothing to deliver: let time pass for pending replicas, take the remaining steps of
        stalled transfers, or run the sentinels left at the end of a source. False: done."""
        if self.pending:  # nothing moves until the waiting replicas install their checkpoints
            self.stats.steps = min(p.ready_at for p in self.pending)
            return True
        stalled = [t for t in self.transferring if t.transfer.remaining]
        if stalled:  # no punctuation will come: the peers take their remaining steps now
            for t in stalled:
                self._take_step(t)
            return True
        if any(self.due.values()):  # events placed after the last item of a source
            for src in self.query.sources:
                if self.entry_partitions > 1:
                    for part, items in enumerate(self.part_streams[src]):
                        self._fire(src, len(items), part)
                else:
                    self._fire(src, len(self.streams[src]))
            return True
        return False

    def _deliver(self, ch: HarnessChannel) -> None:
        """Deliver ``ch``'s head to its receiver; forward what the receiver emits (or collect it,
        at an application), and let staged transfers from the receiver take a step at its
        punctuation."""
        item = ch.queue.popleft()
        ch.delivered += 1
        recv = ch.receiver
        if recv.core is None:  # receiving its state in steps: outputs wait until it completes
            recv.staged.process(ch.port, ch.index, item)
            if recv.staged.complete:
                self._finish_transfer(recv)
            return
        out = recv.core.process(ch.port, ch.index, item)
        if recv.node in self.collectors:
            col = self.collectors[recv.node]
            if isinstance(col, PartitionCollector):
                col.add(recv.partition, out)
            else:
                col.add(out)
            writer = self.writers.get(recv.label)
            for it in out if writer is not None else ():
                if isinstance(it, Punctuation):
                    writer.punctuate(it.p)  # commits the cells it closes (and the marker at the end)
                else:
                    writer.add(it)
            return
        if self.rescaler is not None and recv.node in self.rescaler.ever:
            out = self.rescaler.after(recv, out)  # bins to send, a partition to close
        self._emit(recv, out)
        if self.transferring and any(isinstance(it, Punctuation) for it in out):
            for t in list(self.transferring):  # a step at the peer's logical time (its punctuation)
                if t.transfer.peer is recv and t.transfer.remaining:
                    self._take_step(t)

    def _result(self) -> RunResult:
        """The run's :class:`RunResult`, after checking every staged transfer completed (and the audit).

        Its dead letters are those of the entry points and of the replicas still working at the end
        (what a deployment can still ask), merged: dead letters are state (docs/design.md, decision 9),
        so a working replica built by hand-over holds what its peers set aside before the checkpoint.
        Every letter of a replica killed, stopped or retired must be among them, or the run raises
        :class:`ReplicaDivergence` naming it: a hand-over that dropped letters is a loss, never quiet."""
        q = self.query
        if self.transferring:
            raise RuntimeError(f"staged transfers did not complete: "
                               f"{[(t.label, t.staged.stats()) for t in self.transferring]}")
        undone = self.rescaler.problems() if self.rescaler is not None else []
        if undone:
            raise RuntimeError("rescales did not complete:\n  " + "\n  ".join(undone[:10]))
        everyone = [i for node in q.operators + q.sinks for i in self.groups[node]] + self.retired
        entries = list(self.entries.values()) if self.entry_partitions == 1 else \
            [e for logics in self.part_entries.values() for e in logics]  # each partition's letters, once
        dead = [d for e in entries for d in e.dead_letters]
        for i in everyone:
            if i.ready:
                dead.extend(i.core.dead_letters())
        weights = {n: [f.weights.tolist() for f in self.groups[n][0].core.filters] for n in q.sinks}
        keep = {n: n not in self.sinks or self.sinks[n].keep for n in q.sinks}  # a sink's tuples stay in its files
        result = RunResult(
            outputs={n: c.result() if keep[n] else q.schema_of(n).empty() for n, c in self.collectors.items()},
            punctuation={n: c.punctuation for n, c in self.collectors.items()},
            dead_letters=merge_dead_letters(dead),
            stats={"harness": self.stats, "weights": weights,
                   "entries": {s: e.stats() for s, e in self.entries.items()},
                   **({"entry_partitions": {s: [e.stats() for e in logics] for s, logics in self.part_entries.items()}}
                      if self.part_entries else {})},
        )
        if self.sinks:  # what each ParquetSink holds (its marker's manifest once complete)
            result.stats["sinks"] = {app: {"path": sink.path, "complete": sink.complete(),
                                           **({k: v for k, v in sink.manifest().items() if k != "files"}
                                              if sink.complete() else {})}
                                     for app, sink in self.sinks.items()}
        if self.audit:
            closed = self.rescaler.is_closed if self.rescaler is not None else (lambda r: False)
            problems = _audit(q, self.streams, self.entries, self.strict,
                              [i for i in everyone if i.history is not None],
                              self.rescaler.ever if self.rescaler is not None else self.parallelism, closed)
            result.stats["audit"] = problems
            if problems:
                raise ReplicaDivergence("replicas diverge from the ideal run:\n  " + "\n  ".join(problems[:10]))
        lost = _letters_not_held(everyone)
        if lost:
            raise ReplicaDivergence("dead letters set aside by replicas that no longer work are held by no working "
                                    "replica (a hand-over lost them):\n  " + "\n  ".join(lost[:10]))
        return result

    # -- channels, acknowledgements, retention ---------------------------------------------------
    def _push(self, ch: HarnessChannel, item: Item) -> None:
        """Queue ``item`` on ``ch``: with ``split``, a batch is sometimes cut in 2-4 pieces;
        with ``resend_prob``, a piece is sometimes queued twice (a retransmission)."""
        rng = self.rng
        pieces = [item]
        if self.split and not isinstance(item, Punctuation) and len(item) > 1 and rng.random() < 0.3:
            cuts = sorted(rng.sample(range(1, len(item)), min(len(item) - 1, rng.randint(1, 3))))
            pieces = np.split(item, cuts)
            self.stats.splits += 1
        for piece in pieces:
            ch.queue.append(piece)
            if self.resend_prob and not isinstance(piece, Punctuation) and rng.random() < self.resend_prob:
                ch.queue.append(piece)
                self.stats.resent += 1

    @staticmethod
    def _ack(ch: HarnessChannel) -> int:
        """The receiver's acknowledgement: its duplicate filter's maximum punctuation
        (a receiver still waiting for its checkpoint pins everything)."""
        r = ch.receiver
        return r.core.filters[ch.port].max_punct if r.core is not None else NO_PUNCTUATION

    def _trim(self, sender: HarnessReplica) -> None:
        """Trim ``sender``'s log to the smallest acknowledgement of its live receivers
        (docs/design.md, decision 7: the most aggressive trimming)."""
        acks = [self._ack(ch) for ch in sender.out if ch.receiver.alive]
        if acks and sender.log is not None:
            sender.log.trim(min(acks))

    def _emit(self, sender: HarnessReplica, items: list[Item]) -> None:
        """``sender`` emits ``items`` on every channel to a live receiver, records them (the
        audit's history, an entry copy's log), and trims its log at a punctuation."""
        for it in items:
            shares: dict = {}  # (partitioned receiver's node, port) -> the batch cut by partition
            for ch in sender.out:
                if not ch.receiver.alive:
                    continue
                if ch.partition is None or not isinstance(it, np.ndarray):
                    self._push(ch, it)  # an unpartitioned receiver, or a punctuation: every partition
                    continue
                key = (ch.receiver.node, ch.port)
                parts = shares.get(key)
                if parts is None:
                    parts = shares[key] = self.routers[ch.receiver.node].split(ch.port, it)
                if len(parts[ch.partition]):
                    self._push(ch, parts[ch.partition])
        if sender.history is not None:
            sender.history.extend(it for it in items if not isinstance(it, Punctuation) and len(it))
        if sender.entry_log is not None:
            sender.entry_log.append(items)
        if any(isinstance(it, Punctuation) for it in items):
            self._trim(sender)

    def _connect(self, up: HarnessReplica, down: HarnessReplica, port: int) -> HarnessChannel:
        """A new stream replica ``up -> down`` on ``port``: a new duplicate-filter channel at the receiver."""
        if down.core is not None:
            idx = down.core.add_channel(port)
        elif down.staged is not None:
            idx = down.staged.add_channel(port)
        else:
            idx = down.chan_counts[port]
            down.chan_counts[port] += 1
        ch = HarnessChannel(up, down, port, idx, self.erng.lognormvariate(0.0, self.speed_spread))
        up.out.append(ch)
        self.channels.append(ch)
        return ch

    def _replay(self, up: HarnessReplica, new_channels: list[HarnessChannel]) -> None:
        """Replay up's retained output on its new stream replicas, once every new receiver
        counts among the acknowledgements that trim it."""
        self._trim(up)
        items = up.log.items()
        for ch in new_channels:
            for it in items:
                self._push(ch, it)
                if not isinstance(it, Punctuation):
                    ch.receiver.replayed += len(it)

    def _connect_downstream(self, new: HarnessReplica) -> None:
        """Connect a replica that just took its place to every live downstream replica (those
        still being built included) and replay its log on those links."""
        q = self.query
        building = self.pending + self.transferring
        self._replay(new, [self._connect(new, down, port) for v, port in q.outputs_of(new.node)
                           for down in self.groups[v] + [p for p in building if p.node == v] if down.alive])

    # -- failures --------------------------------------------------------------------------------
    def _kill(self, victim: HarnessReplica, force: bool = False) -> None:
        """Fail-stop ``victim``: what it had in flight is lost. Without ``force``, a kill that
        would leave its node without a working replica is skipped and listed in ``stats.spared``."""
        if not victim.alive:
            return
        if not force and victim.ready and sum(r.ready for r in self._peers(victim)) <= 1:
            self.stats.spared.append(victim.label)  # never leave an operator without a working replica
            return
        victim.alive = False
        self.stats.crashed.append(victim.label)
        for ch in victim.out:
            ch.queue.clear()

    def _stop(self, victim: HarnessReplica) -> None:
        """Stop ``victim`` (:class:`~replistream.sources.StopReplica`): it stays alive, keeps what it
        holds and what is queued for it, and is never scheduled again. A stop that would leave its
        node without a working replica is skipped and listed in ``stats.spared``."""
        if not victim.scheduled:
            return
        if victim.ready and sum(r.ready for r in self._peers(victim)) <= 1:
            self.stats.spared.append(victim.label)
            return
        victim.stopped = True
        self.stats.stopped.append(victim.label)

    def _kill_server(self, server: str) -> None:
        """Kill every replica the plan puts on ``server`` (entry copies, operator replicas and
        a revived replica in its predecessor's place), one :meth:`_kill` each, in plan order:
        a kill that would leave a node without a working replica is spared. Replicas still
        being built by hand-over are not on a server yet."""
        q = self.query
        for node in q.sources + q.operators + q.sinks:
            for r in list(self.groups[node]):
                if r.server == server:
                    self._kill(r)

    def _run_event(self, ev: Sentinel) -> None:
        """Run one sentinel (checked by :meth:`_check_events` before the run)."""
        q = self.query
        if isinstance(ev, (KillReplica, StopReplica)):
            entry = parse_partition_label(ev.operator)[0] == ENTRY
            nodes = q.sources if entry else [ev.operator]
            for n in nodes:
                group = self.groups.get(n, [])
                if entry and self.entry_partitions > 1:
                    group = [r for r in group if r.partition == self._group_name(ev)[1]]
                if n not in q.sources and (n in self.parallelism or parse_partition_label(n)[1] is not None):
                    # (a partition a rescale retires may still be killed: it is closing, or closed and idle)
                    base, part = self._group_name(ev, self.rescaler.ever if self.rescaler is not None else None)
                    group = [r for r in self.groups[base] if r.partition == part]
                if not 0 <= ev.replica < len(group):
                    raise QueryError(f"{type(ev).__name__}: no replica {ev.replica} of {n!r}")
                if isinstance(ev, KillReplica):
                    self._kill(group[ev.replica])
                else:
                    self._stop(group[ev.replica])
        elif isinstance(ev, KillServer):
            self._kill_server(ev.server)
        elif isinstance(ev, (Revive, AddReplica)):
            self._subscribe(ev)
        elif isinstance(ev, Rescale):
            self.rescaler.begin(ev)
        elif isinstance(ev, Pause):
            pass  # documented no-op: the engine has no clock, a pause changes no schedule
        else:  # _check_events refused it before the run
            raise QueryError(f"{type(ev).__name__}: the in-process engine cannot run this sentinel")

    def _fire(self, src: str, cursor: int, partition: int | None = None) -> None:
        """Run the sentinels of ``src`` placed before its item ``cursor`` (with entry partitions:
        a copy of ``partition`` reached ``cursor``; a sentinel runs once a copy of every partition
        passed its place there)."""
        q = self.due[src]
        if self.entry_partitions > 1:
            reached = self.reached[src]
            reached[partition] = max(reached[partition], cursor)
            while q and all(r >= pos for r, pos in zip(reached, q[0][0])):
                self._run_event(q.popleft()[1])
            return
        while q and q[0][0] <= cursor:
            self._run_event(q.popleft()[1])

    # -- hand-over (docs/handover.md; Hwang §V-C) -------------------------------------------------
    def _subscribe(self, ev: Revive | AddReplica) -> None:
        """Start building a replica for ``ev``: it subscribes to every working upstream
        replica, which replays its retained output; its checkpoint is installed
        ``ev.delay`` steps later (:meth:`_install`)."""
        q = self.query
        node = ev.operator
        group = self.groups[node]
        if isinstance(ev, Revive):
            if not 0 <= ev.replica < len(group):
                raise QueryError(f"Revive: {node!r} has replicas 0..{len(group) - 1}, got {ev.replica}")
            if any(p.alive and p.node == node and p.index == ev.replica for p in self.pending):
                return  # that replica is already being revived
            slot, gen, server = ev.replica, group[ev.replica].generation + 1, group[ev.replica].server
        else:
            slot, gen, server = None, 0, None
        new = HarnessReplica(node, -1 if slot is None else slot, None, server, generation=gen,
                       chan_counts=[0] * len(q.inputs_of(node)),
                       ready_at=self.stats.steps + max(0, int(ev.delay)), event=ev)
        for port, u_node in enumerate(q.inputs_of(node)):
            for up in self.groups[u_node]:
                if up.ready:  # a replica still waiting for its checkpoint connects when installed
                    self._replay(up, [self._connect(up, new, port)])
        self.pending.append(new)

    def _choose_peer(self, new: HarnessReplica, wanted: int | None) -> HarnessReplica | None:
        """The working replica ``new`` takes its state from: replica ``wanted`` if it works,
        else one at random other than the one ``new`` replaces (that one only when no other works)."""
        group = self.groups[new.node]
        old = group[new.index] if isinstance(new.event, Revive) else None
        workers = [r for r in group if r.ready]
        chosen = group[wanted] if wanted is not None and 0 <= wanted < len(group) else None
        if chosen is None or not chosen.ready:
            others = [r for r in workers if r is not old]
            chosen = self.erng.choice(others) if others else (old if old is not None and old.ready else None)
        return chosen

    def _take_place(self, new: HarnessReplica) -> HarnessReplica | None:
        """``new`` takes its place in its group: the slot of the replica it revives (killed if
        still running, then retired), or a new slot at the end. Returns the replaced replica."""
        group = self.groups[new.node]
        old = group[new.index] if isinstance(new.event, Revive) else None
        if old is not None:
            self._kill(old, force=True)  # replaced (a no-op when it had crashed)
            self.retired.append(old)
            group[new.index] = new
        else:
            new.index = len(group)
            group.append(new)
        return old

    def _install(self, new: HarnessReplica) -> None:
        """Install a checkpoint of a working peer in ``new`` (through ``to_bytes``/``from_bytes``,
        and with ``checkpoint_bits`` reassembled from its bins in random order), put it in
        place and connect it downstream; with a strategy, start a staged transfer instead."""
        ev, node = new.event, new.node
        group = self.groups[node]
        workers = [r for r in group if r.ready]
        chosen = self._choose_peer(new, ev.peer)
        if chosen is None:
            raise RuntimeError(f"hand-over of {new.label}: no working replica of {node!r} to take a checkpoint from")
        if ev.strategy is not None:
            self._start_transfer(new, chosen)
            return
        ck = chosen.core.checkpoint(self.checkpoint_bits)
        size = len(ck.to_bytes())
        ck = ReplicaCheckpoint.from_bytes(ck.to_bytes())
        if self.checkpoint_bits:
            ck.logic = _shuffled_bins(ck.logic, self.erng)
            if ck.sorters is not None:
                ck.sorters = tuple(_shuffled_bins(st, self.erng) for st in ck.sorters)
        if ev.tamper is not None:
            ck = ev.tamper(ck)
        old = self._take_place(new)
        new.core = ReplicaCore.from_checkpoint(self.query, ck, new.chan_counts, self.strict, retain=True)
        new.chan_counts = None
        if self.audit:
            new.history = list(chosen.history)
            if chosen.inherited is not None:
                new.inherited = Counter(chosen.inherited)
        self.stats.handovers.append({
            "node": node, "replica": new.label, "peer": chosen.label,
            "replaced": old.label if old is not None else None,
            "punctuation": list(ck.punctuation),
            "others": {r.label: [f.max_punct for f in r.core.filters] for r in workers if r is not chosen},
            "applied": sum(f.applied for f in ck.filters), "state_rows": ck.logic.rows(),
            "replayed": new.replayed, "inherited_output": len(ck.output), "bytes": size,
            "subscribed_for": self.stats.steps - (new.ready_at - max(0, int(ev.delay))),
        })
        self._connect_downstream(new)

    # -- staged transfers (Megaphone §3.3; docs/migration.md) --------------------------------------
    def _start_transfer(self, new: HarnessReplica, peer: HarnessReplica) -> None:
        """Begin a staged transfer: the steps are taken at the peer's punctuations."""
        ev = new.event
        bits = ev.bits if ev.bits is not None else (self.checkpoint_bits or 3)
        steps = plan_transfer(ev.strategy, bits, ev.bins_per_step, splittable(self.query, new.node))
        new.staged = StagedReplica(self.query, new.node, new.chan_counts, bits, self.strict)
        new.chan_counts = None
        new.transfer = _Transfer(steps, peer, bits, started=self.stats.steps)
        if self.audit:
            new.inherited = Counter()
        self.transferring.append(new)
        self._take_steps_if_peer_ended(new)

    def _take_steps_if_peer_ended(self, new: HarnessReplica) -> None:
        """A peer past its final punctuation will not reach another: take every remaining step now."""
        if new.transfer.peer.core.logic.watermark == END:
            while new.transfer is not None and new.transfer.remaining:
                self._take_step(new)

    def _take_step(self, new: HarnessReplica) -> None:
        """The current peer takes the next step's checkpoint now; the receiver installs it."""
        tr = new.transfer
        peer = tr.peer
        bins = tr.steps[tr.next]
        ck = peer.core.checkpoint(tr.bits, bins)
        data = ck.to_bytes()
        ck = ReplicaCheckpoint.from_bytes(data)
        if new.event.tamper is not None:
            ck = new.event.tamper(ck)
        new.staged.install_step(ck, bins)
        tr.next += 1
        tr.peers.append(peer.label)
        tr.bytes.append(len(data))
        if self.audit:
            emitted = np.concatenate(peer.history) if peer.history else self.query.schema_of(new.node).empty()
            new.inherited |= as_multiset(emitted)
            if peer.inherited is not None:  # the peer was itself built by a staged transfer
                new.inherited |= peer.inherited
        if new.staged.complete:
            self._finish_transfer(new)

    def _check_peer(self, new: HarnessReplica) -> None:
        """A transfer whose peer died restarts its remaining steps from another working replica."""
        tr = new.transfer
        if tr is None or not tr.remaining or tr.peer.ready:
            return
        peer = self._choose_peer(new, None)
        if peer is None:
            raise RuntimeError(f"transfer to {new.label}: no working replica of {new.node!r} left")
        tr.restarts += 1
        tr.peer = peer
        self._take_steps_if_peer_ended(new)

    def _finish_transfer(self, new: HarnessReplica) -> None:
        """The staged replica holds every bin in one core: it takes its place and feeds downstream."""
        ev, tr, staged = new.event, new.transfer, new.staged
        core = staged.core
        items, acked = staged.final_output()
        core.output_log = ReplayLog(items, acked)
        old = self._take_place(new)
        new.core = core
        new.staged = None
        new.transfer = None
        self.transferring.remove(new)
        if self.audit:
            new.history = list(staged.early)
        self.stats.transfers.append({
            "node": new.node, "replica": new.label, "strategy": ev.strategy, "bits": tr.bits,
            "steps": len(tr.steps), "peers": tr.peers, "restarts": tr.restarts,
            "bytes": tr.bytes, "merges": staged.merges, "early_tuples": sum(len(b) for b in staged.early),
            "replaced": old.label if old is not None else None, "replayed": new.replayed,
            "harness_steps": self.stats.steps - tr.started})
        self._connect_downstream(new)


def run_replicated(query: Query, inputs: Mapping[str, Any], k: int = 2, seed: int = 0, *, crash: bool = False,
                   split: bool = True, resend_prob: float = 0.05, speed_spread: float = 1.0,
                   strict: bool = False, on_malformed: str = "dead_letter", audit: bool = False,
                   checkpoint_bits: int = 0, placement: Mapping[str, Sequence[str]] | None = None,
                   parallelism: Mapping[str, int] | None = None, bits: int | None = None,
                   sinks: Mapping[str, Any] | None = None) -> RunResult:
    """Run ``query`` with every operator and entry point replicated ``k`` times, in process
    (``InProcessEngine(query, k, seed, ...).run(inputs)``).

    ``crash=True`` kills up to ``k - 1`` replicas of every operator and of every
    entry point at random steps (fail-stop: what they had in flight is lost).
    ``resend_prob`` re-sends a batch on the same channel right after the first
    copy (a retransmission). ``speed_spread`` is the sigma of the lognormal
    per-channel speeds. The result has the same shape as :func:`run_reference`;
    ``stats["harness"]`` is a :class:`HarnessStats` and ``stats["weights"]`` the
    duplicate-filter contribution weights at each application.

    Sentinels among the inputs run when the first entry-point copy of their
    source reaches them: :class:`~replistream.sources.KillReplica`,
    :class:`~replistream.sources.KillServer` (every replica ``placement`` puts on
    that server; default :func:`default_placement`), :class:`~replistream.sources.Revive`,
    :class:`~replistream.sources.AddReplica`; :class:`~replistream.sources.Pause`
    does nothing and :class:`~replistream.sources.Call` is refused (``QueryError``).
    A kill that would leave an operator without a working replica is skipped and
    listed in ``HarnessStats.spared``. Hand-over follows docs/design.md, decision 7:
    every replica keeps its output since the last punctuation all its live
    downstream replicas acknowledged (acknowledgements are the receivers'
    duplicate-filter maximum punctuations, read as soon as they change: the most
    aggressive trimming); checkpoints go through ``to_bytes``/``from_bytes``, and
    with ``checkpoint_bits > 0`` are split into bins and reassembled in random
    order. ``audit=True`` compares what every replica emitted (its peer's
    emissions before the checkpoint included) with the ideal run's output of its
    operator and raises :class:`ReplicaDivergence` on any difference. ``parallelism`` may name
    an application (``p`` partitions x ``k`` replicas, ``out.P#R``), and ``sinks={app:
    ParquetSink(...)}`` has its replicas write the folder (each partition its own files).

    >>> from replistream import Query
    >>> q = Query(); s = q.source("s", {"x": "i8"}, punctuate_every=2)
    >>> _ = s.filter(lambda b: b["x"] % 2 == 0, name="even").sink("out")
    >>> data = {"s": [[{"ts": t, "x": t} for t in range(10)], KillReplica("even", 1)]}
    >>> r = run_replicated(q, data, k=2, seed=4)
    >>> r.outputs["out"]["x"].tolist() == [0, 2, 4, 6, 8], r.stats["harness"].crashed
    (True, ['even#1'])
    """
    return InProcessEngine(query, k, seed, crash=crash, split=split, resend_prob=resend_prob,
                           speed_spread=speed_spread, strict=strict, on_malformed=on_malformed, audit=audit,
                           checkpoint_bits=checkpoint_bits, placement=placement,
                           parallelism=parallelism, bits=bits, sinks=sinks).run(inputs)


class PartitionCollector:
    """A partitioned application's output as the in-process engine gathers it: from every replica
    of every partition, the first copy of each tuple (by id: a partition's replicas deliver the
    same share, the partitions disjoint ones); its punctuation is the smallest over the partitions
    of the largest any replica of the partition reached.

    >>> from replistream import Schema
    >>> s = Schema({"x": "i8"}); c = PartitionCollector(s, 2)
    >>> b = s.from_columns({"ts": [1], "x": [2]}, ids=[7])
    >>> c.add(0, [b, Punctuation(5)]); c.add(0, [b]); c.add(1, [Punctuation(3)])
    >>> len(c.result()), c.punctuation
    (1, 3)
    """

    def __init__(self, schema, partitions: int):
        self.schema = schema
        self.batches: list[np.ndarray] = []
        self.seen: set = set()
        self.punctuations = [NO_PUNCTUATION] * int(partitions)

    @property
    def punctuation(self) -> int:
        """The punctuation every partition has reached."""
        return min(self.punctuations)

    def add(self, partition: int, items) -> None:
        """Items a replica of ``partition`` delivered: tuples not seen before are kept."""
        for it in items:
            if isinstance(it, Punctuation):
                self.punctuations[partition] = max(self.punctuations[partition], it.p)
            elif len(it):
                ids = it["id"].tolist()
                fresh = np.fromiter((i not in self.seen for i in ids), dtype=bool, count=len(ids))
                self.seen.update(ids)
                if fresh.any():
                    self.batches.append(it[fresh])

    def result(self) -> np.ndarray:
        return np.concatenate(self.batches) if self.batches else self.schema.empty()


def _shuffled_bins(state: OperatorState, rng: random.Random) -> OperatorState:
    """Split a state into its bins and reassemble them in random order (as a binned transfer would)."""
    bins = list(range(state.n_bins))
    rng.shuffle(bins)
    return OperatorState.merge([state.select([b]) for b in bins])


def _letter_keys(letters) -> set[tuple]:
    """Each set-aside tuple as (where, reason, id); a letter without ids (a custom operator's) by its
    rows' bytes."""
    keys = set()
    for d in letters:
        rows = d.batch["id"].tolist() if "id" in (d.batch.dtype.names or ()) else [r.tobytes() for r in d.batch]
        keys.update((d.where, d.reason, r) for r in rows)
    return keys


def _letters_not_held(replicas: list[HarnessReplica]) -> list[str]:
    """The dead letters (where, reason, id) some replica in ``replicas`` set aside that no working
    replica of the same node holds, one line per (node, where, reason)."""
    held: dict[str, set] = {}
    for r in replicas:
        if r.ready:
            held.setdefault(r.group, set()).update(_letter_keys(r.core.dead_letters()))
    lost: Counter = Counter()
    for r in replicas:
        if r.core is not None and not r.ready:
            for where, reason, _ in _letter_keys(r.core.dead_letters()) - held.get(r.group, set()):
                lost[(r.label, where, reason)] += 1
    return [f"{label}: {n} tuple(s) at {where!r} ({reason})" for (label, where, reason), n in sorted(lost.items())]


def _audit(query: Query, streams: dict, entries: dict, strict: bool, instances: list[HarnessReplica],
           query_partitions: Mapping[str, int] | None = None, closed=lambda r: False) -> list[str]:
    """Each replica's emissions against the ideal run's output of its operator (as multisets of rows).
    A partition's replica emits its share of them: the replicas of one partition must emit the same,
    and the partitions together all of them (``query_partitions``: ``{operator: p}``, every partition
    it ever had; a replica whose partition a rescale retired, ``closed(replica)``, completed its share)."""
    ideal = run_reference_on_streams(query, streams, entries, strict, record_nodes=True).stats["node_outputs"]
    expected = {n: as_multiset(b) for n, b in ideal.items()}
    query_partitions = dict(query_partitions or {})
    shares: dict[str, dict[int, list]] = {}
    problems = []
    for i in instances:
        schema = query.schema_of(i.node)
        got = as_multiset(np.concatenate(i.history) if i.history else schema.empty())
        extra = got - expected[i.node]
        if i.inherited is not None:  # a staged receiver: its own emissions, and its peers' at each step
            got = got | i.inherited
        if extra:
            problems.append(f"{i.label} emitted {sum(extra.values())} tuple(s) the ideal run does not "
                            f"(or more copies than it does)")
        complete = i.alive and i.core is not None and (i.core.logic.watermark == END or closed(i))
        if complete and i.partition is not None:  # its share only: checked with its partitions' below
            shares.setdefault(i.node, {}).setdefault(i.partition, []).append((i.label, got))
        elif complete:
            missing = expected[i.node] - got
            if missing:
                problems.append(f"{i.label} completed without emitting {sum(missing.values())} tuple(s) "
                                f"of the ideal run")
    for node, parts in shares.items():
        for part, done in parts.items():  # the replicas of one partition emit one share
            for label, got in done[1:]:
                if got != done[0][1]:
                    problems.append(f"{label} emitted other tuples than {done[0][0]}, a replica of its partition")
        if len(parts) == query_partitions.get(node, 0):  # a completed replica of every partition
            union = Counter()
            for done in parts.values():
                union += done[0][1]
            missing = expected[node] - union
            if missing:
                problems.append(f"the partitions of {node!r} completed without emitting {sum(missing.values())} "
                                f"tuple(s) of the ideal run")
    return problems
