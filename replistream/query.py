"""The query builder: a fluent Python API over a networkx DiGraph.

A query is a DAG of *sources*, *operators* and *applications* (sinks). Each
node holds a frozen, picklable spec (``...Spec``) that the engines turn into
running logic with ``spec.build(name, in_schemas)``; edges carry the input
port of the downstream node. :meth:`Query.build` validates the whole graph
(acyclic, arities, parameters, schemas, every operator reaching an
application) and decides where Sorters go (Hwang §IV-C): only in front of
order-sensitive operators and applications.

>>> from replistream import Query, seconds
>>> q = Query("fig1")
>>> load = q.source("load", {"server": "i8", "cpu": "f8"})
>>> ping = q.source("ping", {"src": "i8", "dst": "i8", "ms": "f8"})
>>> hot = load.join(ping, window=seconds(10), left_key="server", right_key="src").filter(lambda b: b["cpu"] > 0.5)
>>> hot.sink("alerts")
'alerts'
>>> q.build().describe().splitlines()[0]
"query 'fig1': 2 source(s), 2 operator(s), 1 application(s)"
"""
from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from .errors import QueryError, SchemaError
from .operators import FilterLogic, FlatMapLogic, MapLogic, OperatorLogic, UnionLogic
from .operators.aggregate import CountWindowAggregateLogic, TimeWindowAggregateLogic
from .operators.entry import EntryLogic
from .operators.join import JoinLogic
from .operators.sorter import SorterLogic
from .schema import Schema

# -- specs ------------------------------------------------------------------


class Spec:
    """A node's configuration: frozen, picklable, builds the running logic."""

    kind = "operator"
    arity: tuple[int, int | None] = (1, 1)  # (min inputs, max inputs or None)
    order_sensitive = False

    def build(self, name: str, in_schemas: list[Schema], strict: bool = False) -> OperatorLogic:
        raise NotImplementedError


@dataclass(frozen=True)
class SourceSpec(Spec):
    """A source stream: its schema and punctuation policy (see :class:`~replistream.operators.entry.EntryLogic`)."""

    schema: Schema
    punctuate_every: int | None = None
    max_disorder: int = 0
    kind = "source"
    arity = (0, 0)

    def build_entry(self, name: str, strict: bool = False, on_malformed: str = "dead_letter",
                    window_grid: int | None = None) -> EntryLogic:
        """The entry-point logic; ``window_grid`` adds punctuations at window expiry times (§IV-F)."""
        every = self.punctuate_every
        if window_grid is not None:
            every = window_grid if every is None else math.gcd(int(every), int(window_grid))
        return EntryLogic(name, self.schema, every, self.max_disorder, strict, on_malformed)


@dataclass(frozen=True)
class SinkSpec(Spec):
    """An application: receives the stream; ``ordered=True`` gets it sorted by (ts, id)."""

    ordered: bool = False
    kind = "sink"

    @property
    def order_sensitive(self):  # type: ignore[override]
        return self.ordered

    def build(self, name, in_schemas, strict=False):
        return ApplicationLogic(name, in_schemas, strict)


@dataclass(frozen=True)
class FilterSpec(Spec):
    predicate: Callable

    def build(self, name, in_schemas, strict=False):
        return FilterLogic(name, in_schemas, self.predicate, strict)


@dataclass(frozen=True)
class MapSpec(Spec):
    fn: Callable
    schema: Schema | None = None

    def build(self, name, in_schemas, strict=False):
        return MapLogic(name, in_schemas, self.fn, self.schema or in_schemas[0], strict)


@dataclass(frozen=True)
class FlatMapSpec(Spec):
    fn: Callable
    schema: Schema | None = None

    def build(self, name, in_schemas, strict=False):
        return FlatMapLogic(name, in_schemas, self.fn, self.schema or in_schemas[0], strict)


@dataclass(frozen=True)
class UnionSpec(Spec):
    arity = (1, None)

    def build(self, name, in_schemas, strict=False):
        first = in_schemas[0]
        for i, s in enumerate(in_schemas[1:], 1):
            if s != first:
                raise SchemaError(f"union {name!r}: input {i} has schema {s!r}, input 0 has {first!r}")
        return UnionLogic(name, in_schemas, strict)


@dataclass(frozen=True)
class JoinSpec(Spec):
    window: int
    left_key: Any = None
    right_key: Any = None
    predicate: Callable | None = None
    suffixes: tuple[str, str] = ("_l", "_r")
    arity = (2, 2)

    def build(self, name, in_schemas, strict=False):
        return JoinLogic(name, in_schemas, self.window, self.left_key, self.right_key, self.predicate,
                         self.suffixes, strict)


@dataclass(frozen=True)
class TimeWindowSpec(Spec):
    size: int
    slide: int | None = None
    by: tuple[str, ...] = ()
    aggs: Mapping[str, Any] = field(default_factory=lambda: {"count": "count"})

    def build(self, name, in_schemas, strict=False):
        return TimeWindowAggregateLogic(name, in_schemas, self.size, self.slide, self.by, dict(self.aggs), strict)


@dataclass(frozen=True)
class CountWindowSpec(Spec):
    size: int
    slide: int | None = None
    by: tuple[str, ...] = ()
    aggs: Mapping[str, Any] = field(default_factory=lambda: {"count": "count"})

    def build(self, name, in_schemas, strict=False):
        return CountWindowAggregateLogic(name, in_schemas, self.size, self.slide, self.by, dict(self.aggs), strict)


@dataclass(frozen=True)
class CustomSpec(Spec):
    """A user-defined operator: ``factory(name, in_schemas, strict) -> OperatorLogic``.

    It must be replica consistent (Hwang §III, Definition 2). Declare
    ``order_sensitive=True`` if its output depends on input order: the builder
    then sorts each of its inputs by (ts, id) up to each punctuation.
    """

    factory: Callable
    n_inputs: int = 1
    order_sensitive: bool = False

    @property
    def arity(self):  # type: ignore[override]
        return (self.n_inputs, self.n_inputs)

    def build(self, name, in_schemas, strict=False):
        logic = self.factory(name, in_schemas, strict)
        if not isinstance(logic, OperatorLogic):
            raise QueryError(f"operator {name!r}: factory must return an OperatorLogic, got {type(logic).__name__}")
        return logic


class ApplicationLogic(OperatorLogic):
    """An application's input: passes its (merged, possibly sorted) stream through unchanged."""

    def __init__(self, name, in_schemas, strict=False):
        super().__init__(name, in_schemas, in_schemas[0], strict)

    def _on_batch(self, port, batch):
        return [batch]


# -- the builder --------------------------------------------------------------


class Stream:
    """A stream in a query under construction: the output of one node.

    Methods add an operator reading this stream and return its output stream.

    >>> q = Query(); s = q.source("s", {"x": "i8"})
    >>> s.filter(lambda b: b["x"] > 0, name="pos").map(lambda b: {"y": b["x"] * 2.0}, {"y": "f8"}, name="dbl")
    Stream('dbl': ts, y)
    """

    def __init__(self, query: "Query", node: str):
        self.query = query
        self.node = node

    def __repr__(self) -> str:
        try:
            names = ", ".join(["ts", *self.schema.names])
        except Exception:  # a node whose schema cannot be derived yet: the repr must not raise
            return f"Stream({self.node!r})"
        return f"Stream({self.node!r}: {names})"

    @property
    def schema(self) -> Schema:
        return self.query.schema_of(self.node)

    def filter(self, predicate: Callable, name: str | None = None, on_error: str | None = None) -> "Stream":
        """Keep tuples where ``predicate(batch)`` (a boolean array) is true (Hwang §IV-D).

        ``on_error`` says what happens to rows on which ``predicate`` raises: ``"dead_letter"``
        (set them aside with the exception, go on) or ``"fail"`` (end the run with
        :class:`~replistream.errors.UserFunctionError`); default: the query's (:class:`Query`)."""
        return self.query._add(name, "filter", FilterSpec(predicate), [self], on_error=on_error)

    def map(self, fn: Callable, schema: Mapping | Schema | None = None, name: str | None = None,
            on_error: str | None = None) -> "Stream":
        """Convert tuples with vectorised ``fn(batch) -> {field: array}`` into ``schema`` (default: same).
        ``on_error``: as for :meth:`filter`."""
        return self.query._add(name, "map", MapSpec(fn, _schema(schema)), [self], on_error=on_error)

    def flat_map(self, fn: Callable, schema: Mapping | Schema | None = None, name: str | None = None,
                 on_error: str | None = None) -> "Stream":
        """``fn(batch) -> (parent_index, {field: array})``: zero or more outputs per input.
        ``on_error``: as for :meth:`filter`."""
        return self.query._add(name, "flat_map", FlatMapSpec(fn, _schema(schema)), [self], on_error=on_error)

    def union(self, *others: "Stream", name: str | None = None) -> "Stream":
        """Merge this stream with ``others`` (equal schemas) (Hwang §IV-D)."""
        return self.query.union(self, *others, name=name)

    def join(self, other: "Stream", window: int, on: str | Sequence[str] | None = None,
             left_key: str | Sequence[str] | None = None, right_key: str | Sequence[str] | None = None,
             predicate: Callable | None = None, suffixes: tuple[str, str] = ("_l", "_r"),
             name: str | None = None, on_error: str | None = None) -> "Stream":
        """Windowed join with ``other`` (Algorithm 2, Hwang §IV-E); ``on`` sets both keys.
        ``on_error``: what happens to pairs on which ``predicate`` raises (as for :meth:`filter`;
        a dead-lettered pair is the joined tuple it would have made)."""
        if on is not None:
            left_key = right_key = on
        return self.query._add(name, "join", JoinSpec(window, left_key, right_key, predicate, suffixes),
                               [self, other], on_error=on_error)

    def window(self, size: int, slide: int | None = None, by: str | Sequence[str] | None = None,
               aggs: Mapping[str, Any] | None = None, name: str | None = None) -> "Stream":
        """Time-window aggregate (Algorithm 3, Hwang §IV-F): ``size``/``slide`` in timestamp units."""
        return self.query._add(name, "window", TimeWindowSpec(size, slide, _fields(by), dict(aggs or {"count": "count"})),
                               [self])

    def count_window(self, size: int, slide: int | None = None, by: str | Sequence[str] | None = None,
                     aggs: Mapping[str, Any] | None = None, name: str | None = None) -> "Stream":
        """Count-window aggregate (Algorithm 4, Hwang §IV-F): ``size``/``slide`` in tuples."""
        return self.query._add(name, "count_window",
                               CountWindowSpec(size, slide, _fields(by), dict(aggs or {"count": "count"})), [self])

    def apply(self, factory: Callable, *others: "Stream", order_sensitive: bool = False,
              name: str | None = None) -> "Stream":
        """A user-defined operator over this stream (and ``others``): see :class:`CustomSpec`."""
        return self.query._add(name, "custom", CustomSpec(factory, 1 + len(others), order_sensitive),
                               [self, *others])

    def sink(self, name: str, ordered: bool = False) -> str:
        """An application reading this stream; ``ordered=True`` delivers it sorted by (ts, id)."""
        self.query._add(name, "sink", SinkSpec(ordered), [self], explicit=True)
        return name


class Query:
    """A streaming query: build it with :meth:`source` and :class:`Stream` methods, then :meth:`build`.

    >>> q = Query()
    >>> s = q.source("numbers", {"x": "i8"}, punctuate_every=10)
    >>> s.filter(lambda b: b["x"] > 0).sink("positive")
    'positive'
    >>> q.build().operators
    ['filter_1']
    """

    def __init__(self, name: str = "query", on_error: str = "dead_letter"):
        self.name = name
        self.on_error = check_on_error(on_error, f"query {name!r}")
        import networkx as nx  # on first use, not at `import replistream` (issue #42: ~0.2 s of the import)

        self._graph = nx.MultiDiGraph()
        self._plain: _PlainGraph | None = None
        self._counter = 0
        self._built = False

    # -- the graph, and the plain copy a worker process reads -------------------
    @property
    def graph(self):
        """The query's graph (a ``networkx.MultiDiGraph``: a node per source, operator and
        application, with its ``spec``; an edge per input, with its ``port``). A query unpickled in
        another process answers :meth:`spec`, :meth:`inputs_of` and the rest from a plain copy
        and builds this graph only when it is asked for (issue #42: a replica's actor then never
        imports networkx, 50 ms of CPU per actor at start-up).

        >>> q = Query(); _ = q.source("s", {"x": "i8"}).sink("out")
        >>> sorted(q.graph.nodes)
        ['out', 's']
        """
        g = self._graph
        if g is None:  # (the plain copy stays: another thread may be reading it; unread from now on)
            g = self._graph = self._plain.to_networkx()
        return g

    @graph.setter
    def graph(self, g) -> None:
        self._graph, self._plain = g, None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        if state["_graph"] is not None:
            state["_plain"], state["_graph"] = _PlainGraph.of(state["_graph"]), None
        return state

    def __setstate__(self, state: dict) -> None:
        if "graph" in state:  # pickled before the plain copy existed
            state["_graph"], state["_plain"] = state.pop("graph"), None
        self.__dict__.update(state)

    def _node(self, node: str) -> dict:
        """The attributes of ``node`` (its ``spec``, ``on_error``, cached ``schema``); ``KeyError``
        if the query has no such node."""
        return self._plain.nodes[node] if self._graph is None else self._graph.nodes[node]

    def has_node(self, name: str) -> bool:
        """Whether ``name`` is a source, operator or application of this query.

        >>> q = Query(); _ = q.source("s", {"x": "i8"}).sink("out")
        >>> q.has_node("s"), q.has_node("t")
        (True, False)
        """
        return name in (self._plain.nodes if self._graph is None else self._graph)

    def descendants(self, node: str) -> set[str]:
        """Every node downstream of ``node``.

        >>> q = Query(); s = q.source("s", {"x": "i8"})
        >>> s.filter(lambda b: b["x"] > 0, name="f").sink("out")
        'out'
        >>> sorted(q.descendants("s"))
        ['f', 'out']
        """
        if self._graph is None and node in self._plain.nodes:
            return self._plain.descendants(node)
        import networkx as nx

        return nx.descendants(self.graph, node)

    # -- construction -----------------------------------------------------
    def source(self, name: str, schema: Mapping | Schema | Sequence, punctuate_every: int | None = None,
               max_disorder: int = 0) -> Stream:
        """Declare a source stream with its schema and punctuation policy."""
        spec = SourceSpec(Schema(schema), punctuate_every, max_disorder)
        if punctuate_every is not None and int(punctuate_every) <= 0:
            raise ValueError(f"source {name!r}: punctuate_every must be > 0, got {punctuate_every}")
        if int(max_disorder) < 0:
            raise ValueError(f"source {name!r}: max_disorder must be >= 0, got {max_disorder}")
        return self._add(name, "source", spec, [], explicit=True)

    def union(self, *streams: Stream, name: str | None = None) -> Stream:
        """Merge ``streams`` (equal schemas) into one (Hwang §IV-D)."""
        if not streams:
            raise QueryError("union needs at least one input stream")
        return self._add(name, "union", UnionSpec(), list(streams))

    def _add(self, name: str | None, prefix: str, spec: Spec, inputs: list[Stream], explicit: bool = False,
             on_error: str | None = None):
        if on_error is not None:
            check_on_error(on_error, f"{prefix} {name!r}" if name else prefix)
        self._built = False
        if name is None:
            self._counter += 1
            name = f"{prefix}_{self._counter}"
            while name in self.graph:
                self._counter += 1
                name = f"{prefix}_{self._counter}"
        check_name(name)
        if name in self.graph:
            raise QueryError(f"a node named {name!r} already exists in query {self.name!r}")
        self._check_fields(name, prefix, spec, inputs)
        for s in inputs:
            if not isinstance(s, Stream):
                raise QueryError(f"{name!r}: inputs must be Streams of this query, got {type(s).__name__}")
            if s.query is not self:
                raise QueryError(f"{name!r}: input {s.node!r} belongs to another query")
            if self.graph.nodes[s.node]["spec"].kind == "sink":
                raise QueryError(f"{name!r}: cannot read from application {s.node!r}")
        self.graph.add_node(name, spec=spec, on_error=on_error)
        for port, s in enumerate(inputs):
            self.graph.add_edge(s.node, name, port=port)
        return Stream(self, name) if spec.kind != "sink" else name

    def _check_fields(self, name: str, method: str, spec: Spec, inputs: list) -> None:
        """The field names a :meth:`Stream.window`, :meth:`Stream.count_window` or :meth:`Stream.join`
        call names are fields of its input, checked as it is called: a ``QueryError`` names the call
        as the user wrote it, the operator's name, the input's fields and the nearest one (#44)."""
        named: list[tuple[str, tuple, int]] = []
        if isinstance(spec, (TimeWindowSpec, CountWindowSpec)):
            named = [("by", tuple(spec.by), 0)]
        elif isinstance(spec, JoinSpec):
            named = [("left_key", _fields(spec.left_key), 0), ("right_key", _fields(spec.right_key), 1)]
        for arg, fields, port in named:
            if port >= len(inputs) or not isinstance(inputs[port], Stream) or inputs[port].query is not self:
                continue
            try:
                schema = self.schema_of(inputs[port].node)
            except Exception:  # an input that cannot be derived: build() says why
                continue
            for f in fields:
                if f not in schema:
                    have = ["ts", *schema.names]
                    raise QueryError(f"{method}(..., {arg}={f!r}) named {name!r}: {f!r} is not a field of its "
                                     f"input {inputs[port].node!r} (fields: {', '.join(have)})"
                                     f"{did_you_mean(f, have)}")

    def operator(self, name: str) -> str:
        """The operator ``name`` stands for: an operator's name (chosen with ``name=`` or given by the
        query: ``join_1``, ``window_3``), or the method that made it (``"join"``, ``"window"``) when the
        query has one operator made by it. Anything else: ``QueryError`` saying exactly what to write.

        >>> q = Query(); s = q.source("s", {"k": "i8"})
        >>> _ = s.filter(lambda b: b["k"] > 0).window(10, by="k").sink("out")
        >>> q.operator("window"), q.operator("filter_1")
        ('window_2', 'filter_1')
        >>> q.operator("windw")
        Traceback (most recent call last):
        ...
        replistream.errors.QueryError: query 'query' has no operator 'windw' (operators: filter_1, window_2); did you mean 'window_2'?
        """
        return resolve_operator(self, name)

    # -- inspection ---------------------------------------------------------
    def spec(self, node: str) -> Spec:
        try:
            return self._node(node)["spec"]
        except KeyError:
            raise QueryError(f"query {self.name!r} has no node {node!r}") from None

    def inputs_of(self, node: str) -> list[str]:
        """Upstream nodes of ``node``, ordered by input port."""
        if self._graph is None and node in self._plain.nodes:
            return list(self._plain.inputs[node])
        edges = sorted(self.graph.in_edges(node, data="port"), key=lambda e: e[2])
        return [u for u, _, _ in edges]

    def outputs_of(self, node: str) -> list[tuple[str, int]]:
        """(downstream node, input port) pairs fed by ``node``."""
        if self._graph is None and node in self._plain.nodes:
            return list(self._plain.outputs[node])
        return sorted((v, p) for _, v, p in self.graph.out_edges(node, data="port"))

    def __repr__(self) -> str:
        """The query's name, sources, operator count and applications.

        >>> q = Query("q"); _ = q.source("s", {"x": "i8"}).filter(lambda b: b["x"] > 0).sink("out")
        >>> q
        Query('q': sources s; 1 operator; applications out)
        """
        try:
            ops = len(self.operators)
            return (f"Query({self.name!r}: sources {', '.join(self.sources) or 'none'}; "
                    f"{ops} operator{'' if ops == 1 else 's'}; applications {', '.join(self.sinks) or 'none'})")
        except Exception:  # a graph that cannot be ordered yet (a cycle): the repr must not raise
            return f"Query({self.name!r})"

    @property
    def sources(self) -> list[str]:
        return [n for n in self.topological() if self.spec(n).kind == "source"]

    @property
    def sinks(self) -> list[str]:
        return [n for n in self.topological() if self.spec(n).kind == "sink"]

    @property
    def operators(self) -> list[str]:
        return [n for n in self.topological() if self.spec(n).kind == "operator"]

    def topological(self) -> list[str]:
        if self._graph is None and self._plain.order is not None:
            return list(self._plain.order)
        import networkx as nx

        return list(nx.lexicographical_topological_sort(self.graph))

    def schema_of(self, node: str) -> Schema:
        """Output schema of ``node`` (for a sink: its input's schema)."""
        cache = self._node(node).get("schema")
        if cache is not None:
            return cache
        spec = self.spec(node)
        if spec.kind == "source":
            schema = spec.schema
        else:
            ins = [self.schema_of(u) for u in self.inputs_of(node)]
            schema = spec.build(node, ins).out_schema
        self._node(node)["schema"] = schema
        return schema

    def in_schemas(self, node: str) -> list[Schema]:
        return [self.schema_of(u) for u in self.inputs_of(node)]

    def sorted_inputs(self, node: str) -> bool:
        """True where the builder puts a Sorter in front of ``node`` (Hwang §IV-C)."""
        return bool(self.spec(node).order_sensitive)

    @property
    def sorters(self) -> list[str]:
        """Nodes whose inputs are sorted: the only places sorting is paid for."""
        return [n for n in self.topological() if self.sorted_inputs(n)]

    def window_grid(self, source: str) -> int | None:
        """Spacing of the expiry times of the time windows downstream of ``source``.

        A window ``[start, start + size)`` with ``start`` a multiple of ``slide``
        expires at ``start + size - 1``; every such time is one less than a
        multiple of ``gcd(size, slide)``. Entry points punctuate on that grid so
        that aggregates close windows as soon as they can (Hwang §IV-F). None when
        no time window is downstream.

        >>> q = Query(); s = q.source("s", {"x": "i8"})
        >>> s.window(size=10, slide=4).sink("a")
        'a'
        >>> q.build().window_grid("s")
        2
        """
        grid = None
        for n in self.descendants(source):
            spec = self.spec(n)
            if isinstance(spec, TimeWindowSpec):
                g = math.gcd(int(spec.size), int(spec.slide if spec.slide is not None else spec.size))
                grid = g if grid is None else math.gcd(grid, g)
        return grid

    def release_grid(self, source: str) -> int | None:
        """Spacing of the punctuations of ``source`` that release output downstream: the time
        windows' grid (:meth:`window_grid`) and, when an operator downstream acts on every
        punctuation (a user operator, a count window, an order-sensitive input sorted up to each
        punctuation, an ordered application), the source's ``punctuate_every`` too (their gcd, as
        its entry point punctuates). A paced replay ends a piece at each row that raises such a
        punctuation (:func:`~replistream.sources.window_close_rule`), so batching never holds a
        result back. None when nothing downstream waits on a punctuation (or none is declared).

        >>> from replistream.operators.keyed import KeyedCount
        >>> q = Query(); s = q.source("s", {"k": "i8"}, punctuate_every=20)
        >>> s.window(size=100).sink("a")
        'a'
        >>> s.apply(KeyedCount(by="k")).sink("b")
        'b'
        >>> q.build().release_grid("s")
        20
        """
        grid = self.window_grid(source)
        every = self.spec(source).punctuate_every
        if every is None:
            return grid
        for n in self.descendants(source):
            spec = self.spec(n)
            if isinstance(spec, (CustomSpec, CountWindowSpec)) or spec.order_sensitive:
                return int(every) if grid is None else math.gcd(int(every), int(grid))
        return grid

    def build_entry(self, source: str, strict: bool = False, on_malformed: str = "dead_letter") -> EntryLogic:
        """The entry-point logic of ``source``: its declared punctuation policy, plus
        punctuations at the expiry times of downstream time windows. ``on_malformed``:
        ``"dead_letter"`` (the default on every engine) sets a record it cannot read aside with
        its reason; ``"raise"`` refuses the chunk with a :class:`~replistream.errors.SchemaError`.

        >>> q = Query(); _ = q.source("s", {"x": "i8"}).sink("o")
        >>> e = q.build().build_entry("s")
        >>> len(e.push([{"ts": 1}, {"ts": 2, "x": 2}])[0]), e.dead_letters[0].reason
        (1, "malformed: source 's': record 0 is missing field 'x'")
        """
        return self.spec(source).build_entry(source, strict, on_malformed, self.window_grid(source))

    def build_logic(self, node: str, strict: bool = False) -> OperatorLogic:
        """The running logic of ``node``, with its ``on_error`` policy (its own, else the query's)."""
        logic = self.spec(node).build(node, self.in_schemas(node), strict)
        logic.on_error = self.on_error_of(node)
        return logic

    def on_error_of(self, node: str) -> str:
        """What ``node`` does with rows on which a user function raises: ``"dead_letter"`` or ``"fail"``.

        >>> q = Query(on_error="fail"); s = q.source("s", {"x": "i8"})
        >>> s.filter(lambda b: b["x"] > 0, name="f", on_error="dead_letter").map(lambda b: {"x": b["x"]}, name="m").sink("out")
        'out'
        >>> q.on_error_of("f"), q.on_error_of("m")
        ('dead_letter', 'fail')
        """
        self.spec(node)
        own = self._node(node).get("on_error")
        return own if own is not None else self.on_error

    def with_on_error(self, on_error: str) -> "Query":
        """A copy of this query whose default ``on_error`` policy is ``on_error`` (operators given
        their own keep it): what ``deploy(..., on_error=)`` and ``run_reference(..., on_error=)`` run.

        >>> q = Query(); s = q.source("s", {"x": "i8"}); _ = s.filter(lambda b: b["x"] > 0, name="f").sink("out")
        >>> q.build().with_on_error("fail").on_error_of("f"), q.on_error_of("f")
        ('fail', 'dead_letter')
        """
        check_on_error(on_error, f"query {self.name!r}")
        other = copy.copy(self)
        other.graph = self.graph.copy()
        other.on_error = on_error
        return other

    def build_sorter(self, node: str, port: int, strict: bool = False) -> SorterLogic:
        return SorterLogic(f"{node}.sort[{port}]", [self.in_schemas(node)[port]], strict)

    # -- validation ------------------------------------------------------------
    def build(self) -> "Query":
        """Validate the query; returns it. Raises :class:`QueryError` (or ``ValueError``) naming the problem."""
        import networkx as nx

        g = self.graph
        if not nx.is_directed_acyclic_graph(g):
            cycle = nx.find_cycle(g)
            raise QueryError(f"query {self.name!r} has a cycle: {' -> '.join(str(e[0]) for e in cycle)}")
        if not self.sources:
            raise QueryError(f"query {self.name!r} has no source")
        if not self.sinks:
            raise QueryError(f"query {self.name!r} has no application: add .sink(name) to a stream")
        for n in g.nodes:
            spec = self.spec(n)
            ports = [p for _, _, p in g.in_edges(n, data="port")]
            lo, hi = spec.arity
            if len(ports) < lo or (hi is not None and len(ports) > hi):
                want = f"{lo}" if lo == hi else f"{lo}..{hi if hi is not None else 'n'}"
                raise QueryError(f"{spec.kind} {n!r} takes {want} input(s), has {len(ports)}")
            if sorted(ports) != list(range(len(ports))):
                raise QueryError(f"{spec.kind} {n!r}: input ports {sorted(ports)} are not 0..{len(ports) - 1}")
            if spec.kind != "sink" and not any(self.spec(d).kind == "sink" for d in nx.descendants(g, n)):
                raise QueryError(f"{spec.kind} {n!r} feeds no application; add .sink(name) downstream or remove it")
        for n in self.topological():
            g.nodes[n].pop("schema", None)
        for n in self.topological():
            try:
                self.schema_of(n)
            except (QueryError, SchemaError, ValueError) as e:
                raise type(e)(str(e)) from None
        self._built = True
        return self

    def describe(self) -> str:
        """A human-readable outline of the query."""
        lines = [f"query {self.name!r}: {len(self.sources)} source(s), {len(self.operators)} operator(s), "
                 f"{len(self.sinks)} application(s)"]
        for n in self.topological():
            spec = self.spec(n)
            ins = ", ".join(self.inputs_of(n))
            sort = " [sorted inputs]" if self.sorted_inputs(n) else ""
            lines.append(f"  {spec.kind:<8} {n:<16} {type(spec).__name__:<16} <- {ins or '-'}{sort}")
        return "\n".join(lines)


#: The policies for rows on which a user function raises (see :meth:`Stream.filter`).
ON_ERROR = ("dead_letter", "fail")

_NAME = re.compile(r"[A-Za-z0-9_-]+")


class _PlainGraph:
    """A query's graph as plain dicts and lists: what a pickled :class:`Query` carries, so that the
    process that unpickles it (every replica's actor) reads nodes, inputs, outputs and the
    topological order without importing networkx. Read-only: a query asked for its
    :attr:`Query.graph` builds the ``networkx.MultiDiGraph`` from it and reads that from then on.

    >>> q = Query(); s = q.source("s", {"x": "i8"}); _ = s.union(s, name="u").sink("out")
    >>> p = _PlainGraph.of(q.graph)
    >>> p.inputs["u"], p.outputs["s"], p.order
    (['s', 's'], [('u', 0), ('u', 1)], ['s', 'u', 'out'])
    >>> sorted(p.to_networkx().edges(data="port")) == sorted(q.graph.edges(data="port"))
    True
    """

    def __init__(self, nodes: dict[str, dict], edges: list[tuple[str, str, int]], order: list[str] | None):
        self.nodes = nodes  # name -> its attributes (spec, on_error, the cached schema)
        self.edges = edges  # (upstream, downstream, input port), in the graph's order
        self.order = order  # lexicographical topological order; None for a graph with a cycle
        self.inputs: dict[str, list[str]] = {n: [] for n in nodes}
        self.outputs: dict[str, list[tuple[str, int]]] = {n: [] for n in nodes}
        for u, v, port in sorted(edges, key=lambda e: e[2]):
            self.inputs[v].append(u)
            self.outputs[u].append((v, port))
        for outs in self.outputs.values():
            outs.sort()

    @classmethod
    def of(cls, g) -> "_PlainGraph":
        import networkx as nx

        try:
            order = list(nx.lexicographical_topological_sort(g))
        except nx.NetworkXUnfeasible:
            order = None
        return cls({n: dict(d) for n, d in g.nodes(data=True)}, list(g.edges(data="port")), order)

    def __getstate__(self) -> tuple:
        return self.nodes, self.edges, self.order

    def __setstate__(self, state: tuple) -> None:
        self.__init__(*state)

    def to_networkx(self):
        import networkx as nx

        g = nx.MultiDiGraph()
        for n, attrs in self.nodes.items():
            g.add_node(n, **attrs)
        for u, v, port in self.edges:
            g.add_edge(u, v, port=port)
        return g

    def descendants(self, node: str) -> set[str]:
        seen: set[str] = set()
        todo = [v for v, _ in self.outputs[node]]
        while todo:
            v = todo.pop()
            if v not in seen:
                seen.add(v)
                todo.extend(w for w, _ in self.outputs[v])
        return seen


def check_on_error(on_error, where: str) -> str:
    """``on_error`` if it is one of :data:`ON_ERROR`; otherwise a ValueError naming ``where``.

    >>> check_on_error("fail", "query 'q'")
    'fail'
    """
    if on_error not in ON_ERROR:
        raise ValueError(f"{where}: on_error must be 'dead_letter' or 'fail', got {on_error!r}")
    return on_error


def check_name(name) -> str:
    """A query node name: letters, digits, ``_`` and ``-`` only (names become file names and labels).

    >>> check_name("load_2")
    'load_2'
    >>> check_name("../escape")
    Traceback (most recent call last):
    ...
    replistream.errors.QueryError: node name '../escape' may contain only letters, digits, '_' and '-'
    """
    if not isinstance(name, str) or not name:
        raise QueryError(f"node names must be non-empty strings, got {name!r}")
    if not _NAME.fullmatch(name):
        raise QueryError(f"node name {name!r} may contain only letters, digits, '_' and '-'")
    return name


def did_you_mean(word: str, choices, prefix: str = "; ") -> str:
    """``"; did you mean 'x'?"`` for the choice nearest ``word`` (difflib), or ``""`` when none is near.

    >>> did_you_mean("sever", ["ts", "server", "cpu"])
    "; did you mean 'server'?"
    >>> did_you_mean("zzz", ["ts", "server"])
    ''
    """
    import difflib

    near = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f"{prefix}did you mean {near[0]!r}?" if near else ""


#: The engine's names for parts of a deployment that are not operators of the query.
_NOT_OPERATORS = ("entry",)


def resolve_operator(query: "Query", name: str, also: tuple[str, ...] = _NOT_OPERATORS) -> str:
    """The node of ``query`` that ``name`` means, for the calls that name an operator
    (``kill_replica``, ``stop_replica``, ``resume_replica``): an operator's or application's name,
    one of ``also`` (``"entry"``), or the method that made the query's only operator of its kind
    (``"join"`` for ``join_1``, ``"window"`` for ``window_3``). ``QueryError`` otherwise, saying
    exactly what to write: the candidates of an ambiguous kind, or the nearest name.

    >>> q = Query(); a = q.source("a", {"k": "i8"}); b = q.source("b", {"k": "i8"})
    >>> _ = a.join(b, 10, on="k").join(b, 10, left_key="k_l", right_key="k", name="again").sink("out")
    >>> resolve_operator(q, "join"), resolve_operator(q, "again"), resolve_operator(q, "out")
    ('join_1', 'again', 'out')
    >>> resolve_operator(q, "entry")
    'entry'
    """
    if not isinstance(name, str):
        raise QueryError(f"an operator is named by a string, got {name!r}")
    nodes = [n for n in query.topological() if query.spec(n).kind != "source"]
    if name in nodes or name in also:
        return name
    made = [n for n in query.operators if re.fullmatch(rf"{re.escape(name)}_\d+", n)]
    if len(made) == 1:
        return made[0]
    if made:
        raise QueryError(f"query {query.name!r} has {len(made)} operators made by {name}(): {', '.join(made)}; "
                         f"name one of them (or give each a name with {name}(..., name=...))")
    ops = query.operators
    raise QueryError(f"query {query.name!r} has no operator {name!r} (operators: {', '.join(ops) or 'none'})"
                     f"{did_you_mean(name, [*nodes, *also])}")


def _schema(schema) -> Schema | None:
    return None if schema is None else Schema(schema)


def _fields(by) -> tuple[str, ...]:
    if by is None:
        return ()
    return (by,) if isinstance(by, str) else tuple(by)
