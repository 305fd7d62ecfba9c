"""The reference engine: the ideal, non-replicated, failure-free run (Hwang §III).

One copy of every operator, no duplicate filters, the sources merged in
event-time order as the ideal run would see them. Every correctness check in
replistream compares another engine's output with this one's.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..errors import merge_dead_letters
from ..operators import Item
from ..query import Query
from ..replica.core import ReplicaCore
from ..sources import TimeMerge, source_streams
from .result import Collector, RunResult

__all__ = ["run_reference", "run_reference_on_streams"]


def run_reference(query: Query, inputs: Mapping[str, Any], strict: bool = False,
                  on_malformed: str = "dead_letter") -> RunResult:
    """The ideal, non-replicated, failure-free run of ``query`` over ``inputs`` (Hwang §III).

    A record an entry point cannot read is set aside as a dead letter with its reason
    (``on_malformed="dead_letter"``, the default, as on every engine); ``on_malformed="raise"``
    stops the run with a :class:`~replistream.errors.SchemaError` naming the record instead.

    >>> from replistream import Query
    >>> q = Query(); s = q.source("s", {"x": "i8"})
    >>> _ = s.filter(lambda b: b["x"] % 2 == 0).sink("even")
    >>> r = run_reference(q.build(), {"s": [{"ts": t, "x": t} for t in range(6)]})
    >>> r.outputs["even"]["x"].tolist(), r.complete
    ([0, 2, 4], True)
    >>> r = run_reference(q, {"s": [{"ts": 0, "x": 0}, {"ts": 1}]})
    >>> r.outputs["even"]["x"].tolist(), r.dead_letters[0].reason
    ([0], "malformed: source 's': record 0 is missing field 'x'")
    >>> run_reference(q, {"s": [{"ts": 1}]}, on_malformed="raise")
    Traceback (most recent call last):
    ...
    replistream.errors.SchemaError: source 's': record 0 is missing field 'x' (on_malformed='dead_letter' ...)
    """
    query.build()
    streams, entries = source_streams(query, inputs, strict, on_malformed)
    return run_reference_on_streams(query, streams, entries, strict)


def run_reference_on_streams(query: Query, streams: Mapping[str, list[Item]], entries: Mapping[str, Any],
                             strict: bool = False, record_nodes: bool = False) -> RunResult:
    """The reference run over the entry points' output ``streams`` (:func:`~replistream.sources.source_streams`);
    ``record_nodes`` also keeps every operator's output (``stats["node_outputs"]``: what the
    in-process engine's audit compares each replica with).

    >>> from replistream import Query
    >>> from replistream.sources import source_streams
    >>> q = Query(); s = q.source("s", {"x": "i8"}); _ = s.filter(lambda b: b["x"] > 0, name="m").sink("o")
    >>> streams, entries = source_streams(q.build(), {"s": [{"ts": 1, "x": 2}]})
    >>> len(run_reference_on_streams(q, streams, entries, record_nodes=True).stats["node_outputs"]["m"])
    1
    """
    cores = {n: ReplicaCore(query, n, None, strict) for n in query.operators + query.sinks}
    sinks = {n: Collector(query.schema_of(n)) for n in query.sinks}
    nodes = {n: Collector(query.schema_of(n)) for n in query.operators} if record_nodes else {}

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

    # the sources in event-time order, as the ideal run would see them
    for _, src, item in TimeMerge({s: iter(items) for s, items in streams.items()}, monotone=False):
        if item is None:
            continue
        for v, p in query.outputs_of(src):
            deliver(v, p, item)

    dead = [d for e in entries.values() for d in e.dead_letters]
    for c in cores.values():
        dead.extend(c.dead_letters())
    return RunResult(
        outputs={n: c.result() for n, c in sinks.items()},
        punctuation={n: c.punctuation for n, c in sinks.items()},
        dead_letters=merge_dead_letters(dead),
        pace=None,
        stats={"entries": {s: e.stats() for s, e in entries.items()},
               "operators": {n: c.stats() for n, c in cores.items()},
               **({"node_outputs": {n: c.result() for n, c in nodes.items()}} if record_nodes else {})},
    )
