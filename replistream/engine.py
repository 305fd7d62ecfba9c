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
from .operators.base import NO_PUNCTUATION, CheckpointError, OperatorState
from .operators.dupfilter import DuplicateFilter, FilterState
from .operators.entry import EntryLogic
from .query import Query
from .schema import END, TS, Punctuation

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
        """Deliver ``item`` from stream replica ``channel`` of input ``port``; returns the outputs."""
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

    def checkpoint(self, bits: int = 0) -> ReplicaCheckpoint:
        """This replica's state for a new or revived peer (DESIGN.md decision 7).

        Take it between two :meth:`process` calls. ``bits`` splits keyed state
        into ``2**bits`` bins (Megaphone); 0 keeps one bin and costs nothing extra.
        """
        if self.filters is None:
            raise CheckpointError(f"{self.node!r}: a core without duplicate filters has no applied-id "
                                  f"bookkeeping to hand over")
        log = self.output_log
        return ReplicaCheckpoint(
            node=self.node,
            filters=tuple(f.checkpoint() for f in self.filters),
            sorters=None if self.sorters is None else tuple(s.checkpoint() for s in self.sorters),
            logic=self.logic.checkpoint(bits),
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

    def dead_letters(self) -> list[DeadLetter]:
        dl = list(self.logic.dead_letters)
        for f in self.filters or ():
            dl.extend(f.dead_letters)
        for s in self.sorters or ():
            dl.extend(s.dead_letters)
        return dl

    def stats(self) -> dict:
        return {"logic": self.logic.stats(), "filters": [f.stats() for f in self.filters or ()]}


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
