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
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np

from .errors import DeadLetter, QueryError
from .operators import Item, OperatorLogic
from .operators.dupfilter import DuplicateFilter
from .operators.entry import EntryLogic
from .query import Query
from .schema import END, TS, Punctuation


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
    """

    def __init__(self, query: Query, node: str, channels: list[int] | None = None, strict: bool = False):
        self.node = node
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
        return out

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
                   on_malformed: str = "raise") -> tuple[dict[str, list[Item]], dict[str, EntryLogic]]:
    """Run each source's entry logic over its input; returns the item lists and the entries.

    ``inputs[source]`` is an iterable of chunks (record lists, column mappings,
    structured arrays, Punctuations) or a single structured array / column
    mapping. Sources missing from ``inputs`` are empty.
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
                continue  # scripted events only mean something to a deployment
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
    cores = {n: ReplicaCore(query, n, None, strict) for n in query.operators + query.sinks}
    sinks = {n: _Collector(query.schema_of(n)) for n in query.sinks}

    def deliver(node: str, port: int, item: Item) -> None:
        out = cores[node].process(port, 0, item)
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
               "operators": {n: c.stats() for n, c in cores.items()}},
    )
