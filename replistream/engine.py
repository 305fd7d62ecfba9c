"""What every engine runs: replica cores, and the reference (ideal, non-replicated) engine.

A :class:`ReplicaCore` is one replica of one operator or application, with
no transport: per input port a :class:`~replistream.operators.dupfilter.DuplicateFilter`
over its stream replicas (Algorithm 1), then a Sorter where the query asks for
one (§IV-C), then the operator logic. The in-process harness
(:mod:`replistream.testing`), the Ray runtime and the simulator all drive
these same objects; only how items travel between them differs.

:func:`run_reference` is the *ideal non-replicated run* (Hwang §III): one copy
of every operator, no duplicate filters, sources merged in event-time order.
Every correctness check in replistream compares against it.

Hand-over (DESIGN.md decision 7, docs/handover.md): :meth:`ReplicaCore.checkpoint`
captures a replica (its duplicate filters' maximum punctuations and applied
ids, its sorters, its logic, and the output it still retains for replay) as a
:class:`ReplicaCheckpoint`; :meth:`ReplicaCore.from_checkpoint` builds a new
replica from one. :class:`OutputLog` is the retained output of a replica.
"""
from __future__ import annotations

import heapq
import pickle
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np

from .errors import DeadLetter, QueryError
from .operators import Item, OperatorLogic
from .operators.base import NO_PUNCTUATION, CheckpointError, OperatorState, bin_of
from .operators.dupfilter import DuplicateFilter, FilterState
from .operators.entry import EntryLogic
from .query import Query
from .schema import END, ID, TS, Marker, Punctuation

#: Version of :class:`ReplicaCheckpoint`; :meth:`ReplicaCore.from_checkpoint` reads only this one.
CHECKPOINT_VERSION = 1


class OutputLog:
    """What a replica emitted since the last punctuation all its live downstream replicas
    acknowledged: the replay buffer of hand-over (DESIGN.md decision 7).

    ``append(items)`` records outputs in emission order; ``trim(acked)`` forgets
    every tuple with ``ts <= acked`` and every punctuation ``<= acked`` (a tuple
    with a higher ts stays even if emitted before a punctuation ``acked``: an
    operator may emit out of timestamp order); ``items()`` is the replay, in
    emission order, which keeps each stream replica's punctuation contract.

    >>> from replistream import Schema
    >>> s = Schema({"x": "i8"})
    >>> log = OutputLog()
    >>> log.append([s.from_columns({"ts": [5, 9], "x": [0, 0]}), Punctuation(6)])
    >>> log.trim(6)
    >>> [it if isinstance(it, Punctuation) else it["ts"].tolist() for it in log.items()]
    [[9]]
    """

    def __init__(self, items: Iterable[Item] = (), acked: int = NO_PUNCTUATION):
        self._log: list[tuple[int, int, Item]] = []  # (min ts, max ts, item); a punctuation has min = max = p
        self.acked = int(acked)
        self.append(items)

    def append(self, items: Iterable[Item]) -> None:
        for it in items:
            if isinstance(it, Punctuation):
                self._log.append((it.p, it.p, it))
            elif len(it):
                ts = it[TS]
                self._log.append((int(ts.min()), int(ts.max()), it))

    def trim(self, acked: int) -> None:
        """Forget what every live downstream replica has: tuples and punctuations ``<= acked``."""
        acked = int(acked)
        if acked <= self.acked:
            return
        self.acked = acked
        kept = []
        for lo, hi, it in self._log:
            if hi <= acked:
                continue
            if lo <= acked:  # a batch straddling the acknowledgement: keep its later tuples
                it = it[it[TS] > acked]
                lo = int(it[TS].min())
            kept.append((lo, hi, it))
        self._log = kept

    def items(self) -> list[Item]:
        """The retained outputs, in emission order (what a new downstream replica is replayed)."""
        return [it for _, _, it in self._log]

    @property
    def tuples(self) -> int:
        return sum(len(it) for _, _, it in self._log if not isinstance(it, Punctuation))

    def __len__(self) -> int:
        return len(self._log)


@dataclass
class ReplicaCheckpoint:
    """A replica's hand-over checkpoint (DESIGN.md decision 7; docs/handover.md).

    * ``filters``: per input port, a :class:`~replistream.operators.dupfilter.FilterState`:
      the peer's maximum punctuation ``p`` and the ids (with ts) of the tuples with
      ``ts > p`` it has already applied;
    * ``sorters``: the sorters' states where the query sorts this node's inputs;
    * ``logic``: the operator's :class:`~replistream.operators.base.OperatorState`
      (keyed state in bins by key hash, Megaphone §3.4);
    * ``output``, ``output_acked``: the peer's retained output since the last
      punctuation all its live downstream replicas acknowledged; the new replica
      adopts it as its own replay buffer, so it is as good an upstream replica as
      the peer was.

    Plain data (numpy arrays, ints, strings, Punctuation): ``to_bytes`` pickles it.

    >>> from replistream import Query, Punctuation
    >>> q = Query(); s = q.source("s", {"k": "i8"})
    >>> _ = s.window(size=10, by="k", name="window").sink("out"); q = q.build()
    >>> core = ReplicaCore(q, "window", channels=[2], retain=True)
    >>> b = q.schema_of("s").from_columns({"ts": [3, 4], "k": [1, 2]}, ids=[1, 2])
    >>> _ = core.process(0, 0, Punctuation(2)); _ = core.process(0, 0, b)
    >>> ck = core.checkpoint()
    >>> ck.punctuation, ck.filters[0].applied, ck.logic.rows("windows")
    ((2,), 2, 2)
    >>> ReplicaCheckpoint.from_bytes(ck.to_bytes()).node
    'window'
    """

    node: str
    filters: tuple
    sorters: tuple | None
    logic: OperatorState
    output: list = field(default_factory=list)
    output_acked: int = NO_PUNCTUATION
    version: int = CHECKPOINT_VERSION

    @property
    def punctuation(self) -> tuple[int, ...]:
        """The peer's maximum punctuation ``p`` on each input port."""
        return tuple(f.max_punct for f in self.filters)

    def nbytes(self) -> int:
        """Bytes of array data in the checkpoint (the pickle adds a little framing)."""
        n = self.logic.nbytes() + sum(f.nbytes() for f in self.filters)
        n += sum(s.nbytes() for s in self.sorters or ())
        return n + sum(it.nbytes for it in self.output if not isinstance(it, Punctuation))

    def to_bytes(self) -> bytes:
        """The checkpoint as bytes (pickle protocol 5: each array one contiguous buffer)."""
        return pickle.dumps(self, protocol=5)

    @staticmethod
    def from_bytes(data: bytes) -> "ReplicaCheckpoint":
        ck = pickle.loads(data)
        if not isinstance(ck, ReplicaCheckpoint):
            raise CheckpointError(f"not a ReplicaCheckpoint: {type(ck).__name__}")
        return ck

    def summary(self) -> dict:
        """Sizes for logs and benchmarks."""
        return {"node": self.node, "punctuation": list(self.punctuation),
                "applied": sum(f.applied for f in self.filters), "state_rows": self.logic.rows(),
                "sorted_rows": sum(s.rows() for s in self.sorters or ()),
                "output_items": len(self.output), "bytes": self.nbytes()}


class ReplicaCore:
    """One replica of ``node``: duplicate filters -> optional sorters -> logic.

    ``channels`` gives the number of stream replicas feeding each input port;
    ``None`` means "no duplicate filter" (the reference engine).

    >>> from replistream import Query, Punctuation
    >>> q = Query(); s = q.source("s", {"x": "i8"})
    >>> _ = s.filter(lambda b: b["x"] > 0, name="f").sink("out"); q = q.build()
    >>> core = ReplicaCore(q, "f", channels=[2])
    >>> core.process(0, 1, Punctuation(3))
    [Punctuation(3)]

    ``retain=True`` keeps the outputs in :attr:`output_log` until
    :meth:`trim_output` says every live downstream replica has them, for replay
    to a new downstream replica; :meth:`checkpoint` and :meth:`from_checkpoint`
    hand a replica over (DESIGN.md decision 7).
    """

    def __init__(self, query: Query, node: str, channels: list[int] | None = None, strict: bool = False,
                 retain: bool = False):
        self.node = node
        self.output_log: OutputLog | None = OutputLog() if retain else None
        self.logic: OperatorLogic = query.build_logic(node, strict)
        n = self.logic.n_inputs
        if channels is not None and len(channels) != n:
            raise ValueError(f"{node!r} has {n} input(s); got channel counts for {len(channels)}")
        schemas = query.in_schemas(node)
        self.filters = None if channels is None else [
            DuplicateFilter(c, schemas[i], f"{node}.dupfilter[{i}]", strict) for i, c in enumerate(channels)]
        self.sorters = [query.build_sorter(node, i, strict) for i in range(n)] if query.sorted_inputs(node) else None

    def process(self, port: int, channel: int, item: Item) -> list[Item]:
        """Deliver ``item`` from stream replica ``channel`` of input ``port``; returns the outputs.

        A :class:`~replistream.schema.Marker` (a change at a logical time,
        :mod:`replistream.reconfig`) is applied on its first copy and returned
        to be forwarded; later copies return nothing."""
        if isinstance(item, Marker):
            from .reconfig import on_marker

            return [item] if on_marker(self, item) else []
        if not 0 <= port < self.logic.n_inputs:
            raise ValueError(f"{self.node!r} has {self.logic.n_inputs} input(s); got input {port}")
        if self.filters is not None and not 0 <= channel < self.filters[port].n_channels:
            raise ValueError(f"{self.node!r} input {port} has {self.filters[port].n_channels} stream "
                             f"replica(s); got channel {channel}")
        items = [item] if self.filters is None else self.filters[port].process(channel, item)
        if self.sorters is not None:
            sorted_items: list[Item] = []
            for it in items:
                sorted_items.extend(self.sorters[port].process(0, it))
            items = sorted_items
        out: list[Item] = []
        for it in items:
            out.extend(self.logic.process(port, it))
        if self.output_log is not None and out:
            self.output_log.append(out)
        return out

    def add_channel(self, port: int) -> int:
        """A new upstream replica feeds ``port``: returns the index of its stream replica."""
        if self.filters is None:
            raise ValueError(f"{self.node!r} has no duplicate filters (a reference core)")
        return self.filters[port].add_channel()

    def trim_output(self, acked: int) -> None:
        """Every live downstream replica has acknowledged punctuation ``acked``: forget what it covers."""
        if self.output_log is not None:
            self.output_log.trim(acked)

    def checkpoint(self, bits: int = 0, bins: Iterable[int] | None = None) -> ReplicaCheckpoint:
        """This replica's state for a new or revived peer (DESIGN.md decision 7).

        Take it between two :meth:`process` calls. ``bits`` splits keyed state
        into ``2**bits`` bins (Megaphone); 0 keeps one bin and costs nothing extra.
        ``bins`` restricts the logic's state to those bins: one step of a binned
        transfer (Megaphone §3.3, :class:`StagedReplica`); filters, sorters and
        retained output are shipped whole at every step.
        """
        if self.filters is None:
            raise CheckpointError(f"{self.node!r}: a core without duplicate filters has no applied-id "
                                  f"bookkeeping to hand over")
        log = self.output_log
        return ReplicaCheckpoint(
            node=self.node,
            filters=tuple(f.checkpoint() for f in self.filters),
            sorters=None if self.sorters is None else tuple(s.checkpoint() for s in self.sorters),
            logic=self.logic.checkpoint(bits) if bins is None else self.logic.checkpoint(bits, bins),
            output=log.items() if log is not None else [],
            output_acked=log.acked if log is not None else NO_PUNCTUATION,
        )

    @classmethod
    def from_checkpoint(cls, query: Query, checkpoint: ReplicaCheckpoint, channels: list[int],
                        strict: bool = False, retain: bool = True) -> "ReplicaCore":
        """A new replica of ``checkpoint.node`` in the state of the peer that took ``checkpoint``.

        ``channels`` counts its own input stream replicas per port (one per live
        upstream replica it subscribed to). It then drops every tuple with
        ``ts <= p`` and every id the checkpoint already applied, so replayed and
        later tuples change it only where the checkpoint did not reflect them.

        >>> from replistream import Query, Punctuation
        >>> q = Query(); s = q.source("s", {"k": "i8"})
        >>> _ = s.window(size=10, by="k", name="window").sink("out"); q = q.build()
        >>> old = ReplicaCore(q, "window", channels=[1])
        >>> b = q.schema_of("s").from_columns({"ts": [3, 4], "k": [1, 1]}, ids=[1, 2])
        >>> _ = old.process(0, 0, b)
        >>> new = ReplicaCore.from_checkpoint(q, old.checkpoint(), channels=[2])
        >>> new.process(0, 1, b)  # a replay of what the checkpoint holds changes nothing
        []
        >>> new.process(0, 1, Punctuation(9))[0][["window_start", "count"]].tolist()
        [(0, 2)]
        """
        if not isinstance(checkpoint, ReplicaCheckpoint):
            raise CheckpointError(f"expected a ReplicaCheckpoint, got {type(checkpoint).__name__}")
        if checkpoint.version != CHECKPOINT_VERSION:
            raise CheckpointError(f"checkpoint version {checkpoint.version}, this replistream reads "
                                  f"version {CHECKPOINT_VERSION}")
        node = checkpoint.node
        core = cls(query, node, channels, strict, retain)
        if len(checkpoint.filters) != len(core.filters):
            raise CheckpointError(f"{node!r}: checkpoint has {len(checkpoint.filters)} input(s), "
                                  f"the query gives {len(core.filters)}")
        if (checkpoint.sorters is None) != (core.sorters is None):
            raise CheckpointError(f"{node!r}: checkpoint and query disagree on sorted inputs")
        for f, st in zip(core.filters, checkpoint.filters):
            f.restore(st)
        for s, st in zip(core.sorters or (), checkpoint.sorters or ()):
            s.restore(st)
        core.logic.restore(checkpoint.logic)
        if core.output_log is not None:
            core.output_log = OutputLog(checkpoint.output, checkpoint.output_acked)
        return core

    def delta_checkpoint(self, since: int) -> tuple[ReplicaCheckpoint, np.ndarray, int]:
        """An incremental checkpoint (Del Monte 2017): like :meth:`checkpoint`, but the logic's state is
        only the bins changed after state version ``since`` (plus its pending work); returns
        (checkpoint, those bins, the state's version now). The logic must keep versioned bins
        (:class:`~replistream.operators.keyed.KeyedOperatorLogic`)."""
        if self.filters is None:
            raise CheckpointError(f"{self.node!r}: a core without duplicate filters cannot hand over")
        if not hasattr(self.logic, "delta"):
            raise CheckpointError(f"{self.node!r}: {type(self.logic).__name__} keeps no versioned bins; "
                                  f"incremental checkpoints need a KeyedOperatorLogic")
        delta, bins = self.logic.delta(since)
        log = self.output_log
        ck = ReplicaCheckpoint(node=self.node, filters=tuple(f.checkpoint() for f in self.filters),
                               sorters=None if self.sorters is None else tuple(s.checkpoint() for s in self.sorters),
                               logic=delta, output=log.items() if log is not None else [],
                               output_acked=log.acked if log is not None else NO_PUNCTUATION)
        return ck, bins, self.logic.version()

    def dead_letters(self) -> list[DeadLetter]:
        dl = list(self.logic.dead_letters)
        for f in self.filters or ():
            dl.extend(f.dead_letters)
        for s in self.sorters or ():
            dl.extend(s.dead_letters)
        return dl

    def stats(self) -> dict:
        return {"logic": self.logic.stats(), "filters": [f.stats() for f in self.filters or ()]}


class DormantReplica:
    """A dormant copy of a replica's keyed state, kept fresh by incremental checkpoints (Del Monte 2017).

    It holds an operator logic restored from one full checkpoint of an active
    replica and, at each :meth:`refresh`, replaces the bins changed since its
    version (:meth:`ReplicaCore.delta_checkpoint`). It processes no input.
    :meth:`revive` turns it into a running replica from one last delta: that
    delta's filter state, pending work and changed bins, the rest already held,
    then the usual replay (docs/handover.md), so reviving ships only what
    changed since the last refresh.

    >>> from replistream import Query, Punctuation
    >>> from replistream.operators.keyed import KeyedCount
    >>> q = Query(); s = q.source("s", {"k": "i8"})
    >>> _ = s.apply(KeyedCount(by="k", bits=4), name="c").sink("out"); q = q.build()
    >>> live = ReplicaCore(q, "c", channels=[1], retain=True)
    >>> b = q.schema_of("s").from_columns({"ts": [1, 2], "k": [1, 2]}, ids=[1, 2])
    >>> _ = live.process(0, 0, b); _ = live.process(0, 0, Punctuation(2))
    >>> dormant = DormantReplica(q, live.checkpoint(4), live.logic.version())
    >>> _ = live.process(0, 0, q.schema_of("s").from_columns({"ts": [3], "k": [1]}, ids=[3]))
    >>> _ = live.process(0, 0, Punctuation(3))
    >>> ck, bins, v = live.delta_checkpoint(dormant.version); len(bins), ck.logic.rows("state")
    (1, 1)
    >>> core = dormant.revive(ck, bins, v, channels=[1])
    >>> sorted(core.logic.checkpoint().tables["state"]["count"].tolist())
    [1, 2]
    """

    def __init__(self, query: Query, checkpoint: ReplicaCheckpoint, version: int, strict: bool = False):
        self.query, self.node, self.strict = query, checkpoint.node, strict
        self.logic = query.build_logic(self.node, strict).restore(checkpoint.logic)
        if not hasattr(self.logic, "apply_delta"):
            raise CheckpointError(f"{self.node!r}: {type(self.logic).__name__} cannot take incremental deltas")
        self.version = int(version)
        self.refreshes = 0

    def refresh(self, delta: ReplicaCheckpoint, bins: Iterable[int], version: int) -> None:
        """Apply an incremental checkpoint taken since :attr:`version` (its filters and output are not kept)."""
        self.logic.apply_delta(delta.logic, bins)
        self.version = int(version)
        self.refreshes += 1

    def revive(self, delta: ReplicaCheckpoint, bins: Iterable[int], version: int, channels: list[int],
               retain: bool = True) -> ReplicaCore:
        """A running replica from the last delta: its filters (p and applied ids), sorters, retained
        output and changed bins, on top of the state this copy holds."""
        self.refresh(delta, bins, version)
        core = ReplicaCore(self.query, self.node, channels, self.strict, retain)
        for f, st in zip(core.filters, delta.filters):
            f.restore(st)
        for srt, st in zip(core.sorters or (), delta.sorters or ()):
            srt.restore(st)
        core.logic = self.logic
        if core.output_log is not None:
            core.output_log = OutputLog(delta.output, delta.output_acked)
        return core


def splittable(query: Query, node: str) -> bool:
    """Whether ``node``'s state can move in several steps: its logic names the key of every
    input tuple (:meth:`~replistream.operators.base.OperatorLogic.bin_keys`) and no Sorter
    (whose buffer is not keyed) sits in front of it.

    >>> from replistream import Query
    >>> q = Query(); s = q.source("s", {"k": "i8"})
    >>> _ = s.window(size=10, by="k", name="w").sink("out"); q = q.build()
    >>> splittable(q, "w")
    True
    """
    if query.sorted_inputs(node):
        return False
    logic = query.build_logic(node)
    return all(logic.bin_keys(i, sch.empty()) is not None for i, sch in enumerate(query.in_schemas(node)))


@dataclass
class _Part:
    """One partial core of a :class:`StagedReplica`: the bins it holds and, per port, the
    largest ts among the applied ids its checkpoint brought (ids of other bins among them
    are forgotten once its filter's punctuation passes that ts)."""

    core: ReplicaCore
    bins: np.ndarray
    bound: list[int]
    steps: int = 1


class StagedReplica:
    """A new replica receiving its state in steps, from live peers, while it runs (Megaphone §3.3
    fluid and batched migration, on top of the hand-over of DESIGN.md decision 7).

    Each step brings a :class:`ReplicaCheckpoint` of some bins, taken by a live
    peer at its own logical time: its duplicate filters' ``p`` and applied ids,
    and its logic restricted to those bins. The receiver builds one *partial
    core* per step from it and routes every input tuple, by the bin of its key
    (:meth:`~replistream.operators.base.OperatorLogic.bin_keys`), to the core
    holding that bin; tuples of bins not yet received wait in a buffer with the
    punctuations between them and are replayed, in arrival order, to the core
    of the step that brings their bin. Punctuations go to every core. So each
    core is, for its bins, exactly a replica built by single-step hand-over at
    its step (docs/handover.md, A-C), whatever the logical time of the other
    steps.

    Cores merge (:meth:`OperatorState.merge`, filters' applied ids united) once
    they agree on their filters' punctuation on every port and that punctuation
    has passed every applied id their checkpoints brought, so a merged filter
    never holds the id of a tuple of another core's bin that this core has not
    applied. Before completion the receiver emits no punctuation and sends
    nothing (its outputs wait in :attr:`early`); it is :attr:`complete` once it
    holds every bin in one core whose watermark has reached the largest
    watermark ``Q`` of the steps' checkpoints. Its output log
    (:meth:`final_output`) is then the union of the peers' retained outputs
    at the steps (deduplicated by id), its own outputs above ``Q``, and a
    punctuation at its watermark: every ideal output up to that is in it or was
    acknowledged by every live downstream replica (docs/migration.md).

    >>> from replistream import Query, Punctuation
    >>> q = Query(); s = q.source("s", {"k": "i8"})
    >>> _ = s.window(size=10, by="k", name="w").sink("out"); q = q.build()
    >>> peer = ReplicaCore(q, "w", channels=[1], retain=True)
    >>> b = q.schema_of("s").from_columns({"ts": [1, 2, 3], "k": [1, 2, 3]}, ids=[1, 2, 3])
    >>> _ = peer.process(0, 0, b)
    >>> new = StagedReplica(q, "w", channels=[1], bits=1)
    >>> new.install_step(peer.checkpoint(1, [0]), [0]); new.install_step(peer.checkpoint(1, [1]), [1])
    >>> _ = new.process(0, 0, b); _ = new.process(0, 0, Punctuation(10))
    >>> new.complete, sorted(new.core.checkpoint().logic.tables["windows"]["count"].tolist())
    (True, [])
    >>> sorted(np.concatenate(new.early)[["k", "count"]].tolist())  # the peer's ids were not re-applied
    [(1, 1), (2, 1), (3, 1)]
    """

    def __init__(self, query: Query, node: str, channels: list[int], bits: int, strict: bool = False,
                 max_parts: int = 8):
        self.query, self.node, self.bits, self.strict = query, node, int(bits), strict
        self.channels = list(channels)
        self._probe = query.build_logic(node, strict)
        self.max_parts = int(max_parts)
        self.owner = np.full(1 << self.bits, -1, dtype=np.int64)  # bin -> index in parts (-1: not yet)
        self.parts: list[_Part | None] = []
        # input of bins not yet received: per (port, channel) its tuples (with their bins) in arrival
        # order, its latest punctuation, and markers in order
        self.wait_rows: dict[tuple[int, int], list[tuple[np.ndarray, np.ndarray]]] = {}
        self.wait_punct: dict[tuple[int, int], Item] = {}
        self.wait_other: list[tuple[int, int, Item]] = []
        self.logs: list[list[Item]] = []  # the peers' retained output at each step
        self.acked = NO_PUNCTUATION
        self.top = NO_PUNCTUATION  # Q: the largest watermark of the steps' checkpoints
        self.early: list[np.ndarray] = []  # tuples the cores emitted before completion
        self.steps = 0
        self.merges = 0
        self.core: ReplicaCore | None = None

    # -- input -----------------------------------------------------------------------
    def add_channel(self, port: int) -> int:
        self.channels[port] += 1
        for part in self._live():
            part.core.add_channel(port)
        return self.channels[port] - 1

    def _live(self) -> list[_Part]:
        return [p for p in self.parts if p is not None]

    def _bins(self, port: int, batch: np.ndarray) -> np.ndarray:
        keys = self._probe.bin_keys(port, batch)
        return np.zeros(len(batch), dtype=np.int64) if keys is None else bin_of(keys, self.bits)

    def process(self, port: int, channel: int, item: Item) -> list[Item]:
        """Deliver an input item; returns outputs only once complete (before, they wait in :attr:`early`)."""
        if self.core is not None:
            return self.core.process(port, channel, item)
        if not isinstance(item, np.ndarray):  # a punctuation (or a marker): every core sees it
            if (self.owner < 0).any():
                if isinstance(item, Punctuation):
                    self.wait_punct[(port, channel)] = item  # only the latest matters (see install_step)
                else:
                    self.wait_other.append((port, channel, item))
            for part in self._live():
                self._collect(part.core.process(port, channel, item))
        elif len(item):
            bins = self._bins(port, item)
            own = self.owner[bins]
            lost = own < 0
            if lost.any():
                self.wait_rows.setdefault((port, channel), []).append((item[lost], bins[lost]))
            for idx in np.unique(own[~lost]).tolist():
                self._collect(self.parts[idx].core.process(port, channel, item[own == idx]))
        self._settle()
        return []

    def _collect(self, out: list[Item]) -> None:
        self.early.extend(it for it in out if isinstance(it, np.ndarray) and len(it))

    # -- steps -----------------------------------------------------------------------
    @property
    def missing(self) -> np.ndarray:
        """Bins not received yet."""
        return np.flatnonzero(self.owner < 0)

    def install_step(self, checkpoint: ReplicaCheckpoint, bins: Iterable[int]) -> None:
        """Install one step: ``checkpoint`` (a live peer's, with its logic restricted to at least
        ``bins`` at this receiver's ``bits``); bins already held are ignored (a re-sent step)."""
        if self.core is not None:
            return
        bins = np.unique(np.asarray(list(bins), dtype=np.int64))
        bins = bins[self.owner[bins] < 0]
        if not len(bins):
            return
        if checkpoint.logic.bits != self.bits:
            raise CheckpointError(f"{self.node!r}: step has {checkpoint.logic.bits} bits, receiver {self.bits}")
        ck = ReplicaCheckpoint(checkpoint.node, checkpoint.filters, checkpoint.sorters,
                               checkpoint.logic.select(bins), [], checkpoint.output_acked)
        core = ReplicaCore.from_checkpoint(self.query, ck, self.channels, self.strict, retain=False)
        bound = [int(f.applied_ts.max()) if len(f.applied_ts) else NO_PUNCTUATION for f in checkpoint.filters]
        idx = len(self.parts)
        self.parts.append(_Part(core, bins, bound))
        self.owner[bins] = idx
        self.logs.append(list(checkpoint.output))
        self.acked = max(self.acked, int(checkpoint.output_acked))
        self.top = max(self.top, int(checkpoint.logic.watermark))
        self.steps += 1
        # Replay what waited for these bins: markers, then per channel its tuples of these bins in
        # arrival order, then its latest punctuation. Delivering a channel's punctuations after its
        # tuples, and only the latest, is an execution the channel could have produced (a
        # punctuation held back until the next one): every operator here is correct under it.
        # One vectorised pass over the waiting rows per step, whatever their number.
        done = not (self.owner < 0).any()
        for port, channel, it in self.wait_other:
            self._collect(core.process(port, channel, it))
        for key, chunks in list(self.wait_rows.items()):
            rows = chunks[0][0] if len(chunks) == 1 else np.concatenate([c[0] for c in chunks])
            bins_ = chunks[0][1] if len(chunks) == 1 else np.concatenate([c[1] for c in chunks])
            mine = self.owner[bins_] == idx
            if mine.any():
                self._collect(core.process(key[0], key[1], rows[mine]))
            if done or mine.all():
                del self.wait_rows[key]
            else:
                self.wait_rows[key] = [(rows[~mine], bins_[~mine])]
        for (port, channel), it in self.wait_punct.items():
            self._collect(core.process(port, channel, it))
        if done:
            self.wait_punct, self.wait_other = {}, []
        self._settle()

    # -- merging -----------------------------------------------------------------------
    def _key(self, part: _Part):
        """Parts with equal keys may merge; None while a part still holds foreign applied ids."""
        ps = tuple(f.max_punct for f in part.core.filters)
        if any(p < b for p, b in zip(ps, part.bound)):
            return None
        return ps, part.core.logic.watermark

    def _settle(self) -> None:
        live = self._live()
        done = not (self.owner < 0).any()
        groups: dict = {}
        for part in live:
            k = self._key(part)
            if k is not None:
                groups.setdefault(k, []).append(part)
        for members in groups.values():
            if len(members) < 2:
                continue
            if done or len(live) > self.max_parts:
                self._merge(members)
                continue
            # binary-counter merging: a part merges with one at most twice its size, so the
            # parts stay few and each bin is copied O(log steps) times
            members.sort(key=lambda p: p.steps)
            while len(members) >= 2 and members[1].steps <= 2 * members[0].steps:
                merged = self._merge(members[:2])
                members = sorted([merged] + members[2:], key=lambda p: p.steps)
        live = self._live()
        if done and len(live) == 1 and self._key(live[0]) is not None and \
                live[0].core.logic.watermark >= self.top:
            self.core = live[0].core

    def _merge(self, members: list[_Part]) -> _Part:
        ports = len(self.channels)
        filters = []
        for i in range(ports):
            sts = [m.core.filters[i].checkpoint() for m in members]
            ts = np.concatenate([s.applied_ts for s in sts])
            ids = np.concatenate([s.applied_ids for s in sts])
            ids, first = np.unique(ids, return_index=True)
            filters.append(FilterState(sts[0].max_punct, ts[first], ids))
        logic = OperatorState.merge([m.core.logic.checkpoint(self.bits) for m in members])
        ck = ReplicaCheckpoint(self.node, tuple(filters), None, logic, [], NO_PUNCTUATION)
        core = ReplicaCore.from_checkpoint(self.query, ck, self.channels, self.strict, retain=False)
        part = _Part(core, np.concatenate([m.bins for m in members]),
                     [max(m.bound[i] for m in members) for i in range(ports)], sum(m.steps for m in members))
        idx = len(self.parts)
        self.parts.append(part)
        for m in members:
            self.parts[self.parts.index(m)] = None
        self.owner[part.bins] = idx
        self.merges += 1
        return part

    @property
    def complete(self) -> bool:
        """Every bin received, merged into one core caught up with every step's watermark."""
        return self.core is not None

    def final_output(self) -> tuple[list[Item], int]:
        """(log, acked) the completed replica adopts as its retained output: the peers' retained
        outputs at the steps (each tuple once), its own outputs above ``Q``, a punctuation at its
        watermark."""
        if self.core is None:
            raise RuntimeError(f"{self.node!r}: the staged transfer is not complete")
        batches = [it for log in self.logs for it in log if isinstance(it, np.ndarray) and len(it)]
        out: list[Item] = []
        if batches:
            allrows = np.concatenate(batches)
            _, first = np.unique(allrows[ID], return_index=True)
            out.append(allrows[np.sort(first)])
        own = [b[b[TS] > self.top] for b in self.early]
        out.extend(b for b in own if len(b))
        wm = self.core.logic.watermark
        if wm != NO_PUNCTUATION:
            out.append(Punctuation(wm))
        return out, self.acked

    def stats(self) -> dict:
        return {"steps": self.steps, "merges": self.merges, "parts": len(self._live()),
                "missing_bins": int((self.owner < 0).sum()),
                "waiting_tuples": sum(len(c[0]) for cs in self.wait_rows.values() for c in cs),
                "early_tuples": sum(len(b) for b in self.early), "complete": self.complete}


@dataclass
class RunResult:
    """What an engine run delivered: per application, its tuples in arrival order.

    ``outputs[app]`` is one structured array; ``punctuation[app]`` the last
    punctuation it received (``END`` when the run completed);
    ``dead_letters`` every set-aside tuple, with where and why.
    """

    outputs: dict[str, np.ndarray]
    punctuation: dict[str, int] = field(default_factory=dict)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """True when every application received the final punctuation."""
        return all(p == END for p in self.punctuation.values())

    def dead_letter_count(self) -> int:
        return sum(d.count for d in self.dead_letters)


class _Collector:
    def __init__(self, schema):
        self.schema = schema
        self.batches: list[np.ndarray] = []
        self.punctuation = int(np.iinfo(np.int64).min)

    def add(self, items: Iterable[Item]) -> None:
        for it in items:
            if isinstance(it, Punctuation):
                self.punctuation = max(self.punctuation, it.p)
            elif len(it):
                self.batches.append(it)

    def result(self) -> np.ndarray:
        return np.concatenate(self.batches) if self.batches else self.schema.empty()


def source_streams(query: Query, inputs: Mapping[str, Any], strict: bool = False,
                   on_malformed: str = "raise", events: list | None = None
                   ) -> tuple[dict[str, list[Item]], dict[str, EntryLogic]]:
    """Run each source's entry logic over its input; returns the item lists and the entries.

    ``inputs[source]`` is an iterable of chunks (record lists, column mappings,
    structured arrays, Punctuations) or a single structured array / column
    mapping. Sources missing from ``inputs`` are empty. Sentinels are skipped;
    given a list ``events``, each is appended to it as ``(source, position,
    sentinel)``, ``position`` being the number of the source's items before it.
    """
    unknown = set(inputs) - set(query.sources)
    if unknown:
        raise QueryError(f"inputs given for unknown source(s) {sorted(unknown)}; sources are {query.sources}")
    from .testing import Sentinel

    streams, entries = {}, {}
    for src in query.sources:
        entry = query.build_entry(src, strict, on_malformed)
        items: list[Item] = []
        for chunk in iter_chunks(inputs.get(src, ())):
            if isinstance(chunk, Sentinel):
                if events is not None:
                    events.append((src, len(items), chunk))
                continue  # scripted events only mean something to a deployment or the harness
            items.extend(entry.push(chunk))
        items.extend(entry.close())
        streams[src], entries[src] = items, entry
    return streams, entries


def iter_chunks(data: Any, chunk_size: int = 10_000):
    """The chunks of one source's input, lazily (generators are not materialised).

    ``data`` is a structured array, a column mapping, a list of records, or an
    iterable of such chunks, :class:`~replistream.schema.Punctuation` objects,
    :class:`~replistream.testing.Sentinel` events and single records
    (consecutive records are grouped into chunks of at most ``chunk_size``).

    >>> [len(c) for c in iter_chunks([{"ts": i} for i in range(5)], 2)]
    [2, 2, 1]
    """
    if isinstance(data, np.ndarray) or isinstance(data, Mapping):
        yield data
        return
    group: list = []
    for item in data:
        if isinstance(item, Mapping) and not any(isinstance(v, (np.ndarray, list, tuple)) for v in item.values()):
            group.append(item)
            if len(group) >= chunk_size:
                yield group
                group = []
            continue
        if group:
            yield group
            group = []
        yield item
    if group:
        yield group


def _item_time(item: Item) -> int:
    if isinstance(item, Punctuation):
        return item.p
    return int(item[TS].min()) if len(item) else int(np.iinfo(np.int64).min)


def run_reference(query: Query, inputs: Mapping[str, Any], strict: bool = False,
                  on_malformed: str = "raise") -> RunResult:
    """The ideal, non-replicated, failure-free run of ``query`` over ``inputs`` (Hwang §III).

    >>> from replistream import Query
    >>> q = Query(); s = q.source("s", {"x": "i8"})
    >>> _ = s.filter(lambda b: b["x"] % 2 == 0).sink("even")
    >>> r = run_reference(q.build(), {"s": [{"ts": t, "x": t} for t in range(6)]})
    >>> r.outputs["even"]["x"].tolist(), r.complete
    ([0, 2, 4], True)
    """
    query.build()
    streams, entries = source_streams(query, inputs, strict, on_malformed)
    return _reference_run(query, streams, entries, strict)


def _reference_run(query: Query, streams: dict, entries: dict, strict: bool = False,
                   record_nodes: bool = False) -> RunResult:
    """The reference run over entry-point output ``streams``; ``record_nodes`` also
    keeps every operator's output (``stats["node_outputs"]``, for the harness's audit)."""
    cores = {n: ReplicaCore(query, n, None, strict) for n in query.operators + query.sinks}
    sinks = {n: _Collector(query.schema_of(n)) for n in query.sinks}
    nodes = {n: _Collector(query.schema_of(n)) for n in query.operators} if record_nodes else {}

    def deliver(node: str, port: int, item: Item) -> None:
        out = cores[node].process(port, 0, item)
        if node in nodes:
            nodes[node].add(out)
        if node in sinks:
            sinks[node].add(out)
            return
        for it in out:
            for v, p in query.outputs_of(node):
                deliver(v, p, it)

    # Merge the sources in event-time order, as the ideal run would see them.
    heap = [(_item_time(items[0]), i, 0, src) for i, (src, items) in enumerate(streams.items()) if items]
    heapq.heapify(heap)
    while heap:
        _, i, pos, src = heapq.heappop(heap)
        item = streams[src][pos]
        for v, p in query.outputs_of(src):
            deliver(v, p, item)
        if pos + 1 < len(streams[src]):
            heapq.heappush(heap, (_item_time(streams[src][pos + 1]), i, pos + 1, src))

    dead = [d for e in entries.values() for d in e.dead_letters]
    for c in cores.values():
        dead.extend(c.dead_letters())
    return RunResult(
        outputs={n: c.result() for n, c in sinks.items()},
        punctuation={n: c.punctuation for n, c in sinks.items()},
        dead_letters=dead,
        stats={"entries": {s: e.stats() for s, e in entries.items()},
               "operators": {n: c.stats() for n, c in cores.items()},
               **({"node_outputs": {n: c.result() for n, c in nodes.items()}} if record_nodes else {})},
    )
