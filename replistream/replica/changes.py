"""Changing a running query at a logical time (Bartnik et al. 2019, §3; docs/design.md, decision 8).

A change takes effect at a logical time ``p``: tuples with ``ts <= p`` are
processed as before, tuples with ``ts > p`` as after. Because the rule depends
only on timestamps, every replica applies it identically whatever order its
input arrives in, and the result equals a *reference run of the changed query*:
the query in which the change is written in from the start
(:meth:`Change.apply_query`). That query is what
``Deployment.query`` holds after the change, so checking a reconfigured run is
``run_reference(dep.query, inputs)``.

What makes ``p`` safe to apply on a running deployment is the **marker**
(:class:`~replistream.schema.Marker`). The feeder puts it into every open source
stream after everything it has sent so far, with ``p`` = the largest timestamp
sent (so every tuple before the marker has ``ts <= p``). Every replica forwards
the first copy of a marker it receives before anything it emits later, so on
every stream replica the marker precedes every tuple and punctuation above
``p`` (an output above ``p`` needs an input above ``p``, which came after the
marker on its channel). A replica applies the change when the first copy
arrives, so it never processes a tuple above ``p`` without it. Into a
partitioned operator, each sender cuts a stream into one share per partition
and gives the marker to every share, in place
(:meth:`~replistream.partition.Router.route`), so the argument holds per
partition: every replica of every partition applies the change at ``p``.

The changes:

* :class:`ReplaceFunction`: a Filter, Map or FlatMap gets a new function for
  tuples above ``p`` (a :class:`TimeSwitch` keeps every version).
* :class:`AddOperator`: new operators (and their applications) downstream of
  an existing stream; the new operators see the tuples of that stream above
  ``p`` (:class:`CutSpec` with ``lower=p``). The replicas that produce the
  stream connect to the new replicas when the marker passes them, so the new
  links carry exactly what follows the marker.
* :class:`RemoveOperator`: the operator sees the tuples up to ``p``; at the
  first punctuation ``>= p`` on an input it closes that input (``END``), so its
  windows flush and its applications complete (:class:`CutSpec` with
  ``upper=p``). The deployment then retires its replicas.

Moving a replica and changing an operator's degree of replication need no
marker: they are hand-overs (``Deployment.move_replica``, ``add_replica``,
``set_replication``).

>>> import numpy as np
>>> from replistream import Query, run_reference
>>> q = Query(); s = q.source("s", {"x": "i8"})
>>> _ = s.filter(lambda b: b["x"] > 0, name="f").sink("out"); q = q.build()
>>> change = ReplaceFunction("f", lambda b: b["x"] > 5)
>>> q2 = change.apply_query(q, p=3)
>>> run_reference(q2, {"s": [{"ts": t, "x": t} for t in range(1, 9)]}).outputs["out"]["x"].tolist()
[1, 2, 3, 6, 7, 8]
"""
from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from ..errors import QueryError
from ..query import FilterSpec, FlatMapSpec, MapSpec, Query, Spec, Stream
from ..schema import END, TS, Marker, Punctuation

_ids = itertools.count(1)

#: ``CutSpec.lower`` of an operator added at run time before the feeder has chosen ``p``.
PENDING = "pending"


# -- a function that changes at logical times -------------------------------------------

class TimeSwitch:
    """A Filter predicate or a (Flat)Map function replaced at logical times (Bartnik §3).

    ``versions[0]`` applies to tuples with ``ts <= after[0]``, ``versions[i]`` to
    ``after[i-1] < ts <= after[i]``, the last to everything above. Each call
    splits the batch by timestamp and calls each version on its part, so the
    result equals what the version in force at each tuple's time gives.

    >>> import numpy as np
    >>> from replistream import Schema
    >>> s = Schema({"x": "i8"})
    >>> f = TimeSwitch("filter", [lambda b: b["x"] > 0, lambda b: b["x"] > 5], after=[3])
    >>> f(s.from_columns({"ts": [1, 2, 4, 9], "x": [1, 6, 1, 6]})).tolist()
    [True, True, False, True]
    """

    KINDS = ("filter", "map", "flat_map")

    def __init__(self, kind: str, versions: list[Callable], after: list[int]):
        if kind not in self.KINDS:
            raise QueryError(f"TimeSwitch kind must be one of {self.KINDS}, got {kind!r}")
        if len(versions) != len(after) + 1:
            raise ValueError("TimeSwitch needs one more version than switch times")
        if list(after) != sorted(after):
            raise ValueError(f"TimeSwitch switch times must not decrease, got {after}")
        self.kind = kind
        self.versions = list(versions)
        self.after = np.asarray(after, dtype=np.int64)

    @classmethod
    def extend(cls, kind: str, current: Callable, fn: Callable, p: int) -> "TimeSwitch":
        """``current`` (a function or a TimeSwitch) up to ``p``, ``fn`` above it."""
        if isinstance(current, TimeSwitch):
            keep = int(np.searchsorted(current.after, p, side="left"))  # versions whose range starts <= p
            return cls(kind, current.versions[:keep + 1] + [fn], list(current.after[:keep]) + [int(p)])
        return cls(kind, [current, fn], [int(p)])

    def __repr__(self) -> str:
        return f"TimeSwitch({self.kind!r}, {len(self.versions)} versions, after={self.after.tolist()})"

    def __call__(self, batch: np.ndarray):
        seg = np.searchsorted(self.after, batch[TS], side="left")
        if len(batch) == 0 or seg.min() == seg.max():
            return self.versions[int(seg[0]) if len(batch) else -1](batch)
        parts = [(int(v), np.flatnonzero(seg == v)) for v in np.unique(seg)]
        results = [(ix, self.versions[v](batch[ix])) for v, ix in parts]
        n = len(batch)
        if self.kind == "filter":
            mask = np.zeros(n, dtype=np.bool_)
            for ix, m in results:
                mask[ix] = np.asarray(m)
            return mask
        if self.kind == "map":
            out: dict[str, np.ndarray] = {}
            for ix, res in results:
                cols = {k: res[k] for k in res.dtype.names} if isinstance(res, np.ndarray) else dict(res)
                for k, v in cols.items():
                    v = np.asarray(v)
                    if k not in out:
                        out[k] = np.zeros(n, dtype=v.dtype)
                    out[k][ix] = v
            return out
        parents, columns = [], []
        for ix, (parent, cols) in results:
            parents.append(ix[np.asarray(parent, dtype=np.int64)])
            columns.append({k: cols[k] for k in cols.dtype.names} if isinstance(cols, np.ndarray) else dict(cols))
        names = list(columns[0])
        return np.concatenate(parents), {k: np.concatenate([np.asarray(c[k]) for c in columns]) for k in names}


# -- cutting an operator's input at a logical time --------------------------------------------

class CutLogic:
    """An operator logic that sees only the input above ``lower`` and up to ``upper``.

    ``lower`` (an operator added at ``p``): tuples with ``ts <= p`` are dropped;
    ``upper`` (an operator removed at ``p``): tuples with ``ts > p`` are dropped
    and the first punctuation ``>= p`` on an input closes it (``END``), so
    windows flush as they would at the end of a stream cut at ``p``. Dropped
    tuples are counted in ``stats()["cut"]``: they are outside the operator's
    lifetime, not bad input. Everything else is the wrapped logic's.

    >>> from replistream import Schema
    >>> from replistream.operators import FilterLogic
    >>> s = Schema({"x": "i8"})
    >>> f = CutLogic(FilterLogic("f", [s], lambda b: b["x"] >= 0), upper=5)
    >>> f.process(0, s.from_columns({"ts": [4, 6], "x": [1, 1]}))[0]["ts"].tolist()
    [4]
    >>> f.process(0, Punctuation(7)), f.stats()["cut"]
    ([Punctuation(END)], 1)
    """

    def __init__(self, inner, lower: int | str | None = None, upper: int | None = None):
        self.inner = inner
        self.lower = lower
        self.upper = upper
        self.cut = 0
        self.closed: set[int] = set()

    def __getattr__(self, name: str):
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def process(self, port: int, item):
        if port in self.closed:
            if not isinstance(item, Punctuation):
                self.cut += len(item)
            return []
        if isinstance(item, Punctuation):
            if self.upper is not None and item.p >= self.upper:
                self.closed.add(port)
                return self.inner.process(port, Punctuation(END))
            return self.inner.process(port, item)
        if self.lower == PENDING:
            raise RuntimeError(f"{self.inner.name!r}: a tuple arrived before the marker that says when this "
                               f"operator starts (replistream bug: links to an added operator start with it)")
        keep = np.ones(len(item), dtype=np.bool_)
        if self.lower is not None:
            keep &= item[TS] > self.lower
        if self.upper is not None:
            keep &= item[TS] <= self.upper
        if not keep.all():
            self.cut += int((~keep).sum())
            item = item[keep]
            if not len(item):
                return []
        return self.inner.process(port, item)

    def stats(self) -> dict:
        return {**self.inner.stats(), "cut": self.cut, "cut_lower": self.lower, "cut_upper": self.upper}


@dataclass(frozen=True)
class CutSpec(Spec):
    """The spec of an operator that exists only above ``lower`` and/or up to ``upper``
    (added or removed at run time); builds a :class:`CutLogic` around ``inner``'s logic.

    >>> CutSpec(FilterSpec(lambda b: b["x"] > 0), upper=10).kind
    'operator'
    """

    inner: Spec
    lower: Any = None
    upper: Any = None

    @property
    def kind(self):  # type: ignore[override]
        return self.inner.kind

    @property
    def arity(self):  # type: ignore[override]
        return self.inner.arity

    @property
    def order_sensitive(self):  # type: ignore[override]
        return self.inner.order_sensitive

    def build(self, name, in_schemas, strict=False):
        return CutLogic(self.inner.build(name, in_schemas, strict), self.lower, self.upper)


def base_spec(spec: Spec) -> Spec:
    """``spec`` without its cuts (the operator as the user wrote it)."""
    while isinstance(spec, CutSpec):
        spec = spec.inner
    return spec


def set_spec(query: Query, node: str, spec: Spec) -> None:
    """Replace ``node``'s spec in ``query`` (its output schema is derived again).

    >>> from replistream import Query
    >>> q = Query(); s = q.source("s", {"x": "i8"}); _ = s.filter(lambda b: b["x"] > 0, name="f").sink("o")
    >>> set_spec(q, "f", CutSpec(q.spec("f"), 5, None)); type(q.spec("f")).__name__
    'CutSpec'
    """
    query.graph.nodes[node]["spec"] = spec
    query.graph.nodes[node].pop("schema", None)


# -- the changes ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Change:
    """A change to a running query, applied at logical time ``p`` (see the module doc)."""

    def apply_query(self, query: Query, p: int) -> Query:
        """A copy of ``query`` with this change written in at ``p`` (the reference's query)."""
        raise NotImplementedError

    def apply_logic(self, node: str, logic, p: int):
        """The logic replica of ``node`` runs once the marker reached it (may be ``logic`` itself)."""
        return logic

    def links_from(self, label: str) -> list[tuple]:
        """Stream replicas the actor ``label`` opens when the marker passes it:
        ``(stream, label, server, handle, port, channel)``."""
        return []

    def describe(self) -> str:
        return type(self).__name__


@dataclass(frozen=True)
class ReplaceFunction(Change):
    """Replace the function of Filter/Map/FlatMap ``operator`` for tuples with ``ts > p``.

    >>> from replistream import Query
    >>> q = Query(); s = q.source("s", {"x": "i8"})
    >>> _ = s.filter(lambda b: b["x"] > 0, name="f").sink("out"); q = q.build()
    >>> ReplaceFunction("f", lambda b: b["x"] > 5).apply_query(q, 10).spec("f").predicate
    TimeSwitch('filter', 2 versions, after=[10])
    """

    operator: str
    fn: Callable
    switch: Any = None  # the TimeSwitch in force after p, set by the deployment

    def check(self, query: Query) -> str:
        spec = base_spec(query.spec(self.operator))
        kinds = {FilterSpec: "filter", MapSpec: "map", FlatMapSpec: "flat_map"}
        kind = kinds.get(type(spec))
        if kind is None:
            raise QueryError(f"replace_function: {self.operator!r} is a {type(spec).__name__[:-4] or 'node'}; "
                             f"only Filter, Map and FlatMap functions can be replaced")
        if not callable(self.fn):
            raise QueryError(f"replace_function: the new function of {self.operator!r} is not callable")
        return kind

    def resolve(self, query: Query, p: int) -> "ReplaceFunction":
        """This change with the TimeSwitch that ``query``'s function becomes at ``p``."""
        kind = self.check(query)
        spec = base_spec(query.spec(self.operator))
        current = spec.predicate if kind == "filter" else spec.fn
        return ReplaceFunction(self.operator, self.fn, TimeSwitch.extend(kind, current, self.fn, p))

    def apply_query(self, query, p):
        ch = self if self.switch is not None else self.resolve(query, p)
        q = copy.deepcopy(query)
        set_spec(q, self.operator, _rewrap(q.spec(self.operator), ch._new_spec))
        return q

    def _new_spec(self, spec):
        if isinstance(spec, FilterSpec):
            return FilterSpec(self.switch)
        return type(spec)(self.switch, spec.schema)

    def apply_logic(self, node, logic, p):
        if node == self.operator:
            inner = logic.inner if isinstance(logic, CutLogic) else logic
            if hasattr(inner, "predicate"):
                inner.predicate = self.switch
            else:
                inner.fn = self.switch
        return logic

    def describe(self):
        return f"replace the function of {self.operator!r}"


def _rewrap(spec: Spec, fn: Callable[[Spec], Spec]) -> Spec:
    if isinstance(spec, CutSpec):
        return CutSpec(_rewrap(spec.inner, fn), spec.lower, spec.upper)
    return fn(spec)


@dataclass(frozen=True)
class RemoveOperator(Change):
    """Remove ``operator``: it sees its input up to ``p`` and then closes (its applications
    get everything up to there, then ``END``).

    >>> from replistream import Query, run_reference
    >>> q = Query(); s = q.source("s", {"x": "i8"})
    >>> _ = s.filter(lambda b: b["x"] > 0, name="f").sink("out"); q = q.build()
    >>> q2 = RemoveOperator("f").apply_query(q, 3)
    >>> run_reference(q2, {"s": [{"ts": t, "x": t} for t in range(1, 9)]}).outputs["out"]["x"].tolist()
    [1, 2, 3]
    """

    operator: str

    def check(self, query: Query) -> list[str]:
        """The nodes removed with ``operator`` (its exclusive downstream part), in topological order."""
        if not query.has_node(self.operator) or query.spec(self.operator).kind != "operator":
            raise QueryError(f"remove_operator: {self.operator!r} is not an operator of query {query.name!r}")
        import networkx as nx

        down = nx.descendants(query.graph, self.operator)
        gone = {self.operator} | down
        for d in down:
            outside = [u for u in query.inputs_of(d) if u not in gone]
            if outside:
                raise QueryError(f"remove_operator: {d!r} (downstream of {self.operator!r}) also reads "
                                 f"{outside}; remove an operator whose downstream part reads nothing else")
        return [n for n in query.topological() if n in gone]

    def apply_query(self, query, p):
        self.check(query)
        q = copy.deepcopy(query)
        spec = q.spec(self.operator)
        set_spec(q, self.operator, CutSpec(spec, None, int(p)) if not isinstance(spec, CutSpec)
                  else CutSpec(spec.inner, spec.lower, int(p)))
        return q

    def apply_logic(self, node, logic, p):
        if node != self.operator:
            return logic
        if isinstance(logic, CutLogic):
            logic.upper = int(p)
            return logic
        return CutLogic(logic, None, int(p))

    def describe(self):
        return f"remove {self.operator!r}"


@dataclass(frozen=True)
class AddOperator(Change):
    """New operators and applications reading ``upstream``, seeing its tuples above ``p``.

    ``build(stream)`` adds them to the query through the usual Stream methods;
    ``added`` lists the new nodes (set by :meth:`extend`); ``links`` maps each
    actor label producing ``upstream`` to the stream replicas it opens at the
    marker (set by the deployment).

    >>> from replistream import Query, run_reference
    >>> q = Query(); s = q.source("s", {"x": "i8"})
    >>> _ = s.filter(lambda b: b["x"] > 0, name="f").sink("out"); q = q.build()
    >>> add = AddOperator("s", lambda st: st.map(lambda b: {"y": b["x"] * 2}, {"y": "i8"}, name="m").sink("doubled"))
    >>> q2 = add.apply_query(q, 3)
    >>> run_reference(q2, {"s": [{"ts": t, "x": t} for t in range(1, 6)]}).outputs["doubled"]["y"].tolist()
    [8, 10]
    """

    upstream: str
    build: Callable
    added: tuple = ()
    links: Mapping = field(default_factory=dict)

    def extend(self, query: Query, lower: Any = PENDING) -> tuple[Query, "AddOperator"]:
        """A copy of ``query`` with the new nodes (those reading ``upstream`` cut at ``lower``)."""
        if not query.has_node(self.upstream) or query.spec(self.upstream).kind == "sink":
            raise QueryError(f"add_operator: {self.upstream!r} is not a source or operator of query {query.name!r}")
        q = copy.deepcopy(query)
        before = set(q.graph.nodes)
        self.build(Stream(q, self.upstream))
        added = tuple(n for n in q.topological() if n not in before)
        if not added:
            raise QueryError("add_operator: build(stream) added nothing to the query")
        for n in added:
            ins = q.inputs_of(n)
            outside = [u for u in ins if u not in added and u != self.upstream]
            if outside:
                raise QueryError(f"add_operator: new node {n!r} reads {outside}; new nodes may read only "
                                 f"{self.upstream!r} and each other")
            if self.upstream in ins:
                if q.spec(n).kind == "sink":
                    raise QueryError(f"add_operator: application {n!r} reads {self.upstream!r} directly; put "
                                     f"an operator between them")
                set_spec(q, n, CutSpec(q.spec(n), lower, None))
        if not any(q.spec(n).kind == "sink" for n in added):
            raise QueryError("add_operator: the new operators need an application (sink) downstream")
        q.build()
        return q, AddOperator(self.upstream, self.build, added, self.links)

    def apply_query(self, query, p):
        return self.extend(query, int(p))[0]

    def apply_logic(self, node, logic, p):
        if node in self.added and isinstance(logic, CutLogic) and logic.lower == PENDING:
            logic.lower = int(p)
        return logic

    def links_from(self, label):
        return list(self.links.get(label, ()))

    def describe(self):
        return f"add {list(self.added)} reading {self.upstream!r}"


def new_marker(p: int, change: Change) -> Marker:
    """The marker that carries ``change`` at logical time ``p`` (unique id per process)."""
    return Marker(int(p), next(_ids), change)


def on_marker(core, marker: Marker) -> bool:
    """Apply ``marker`` to a replica core once (the first copy); True if it was new.

    A core keeps the ids of markers it has seen in ``core.markers``."""
    seen = core.__dict__.setdefault("markers", set())
    if marker.id in seen:
        return False
    seen.add(marker.id)
    core.logic = marker.change.apply_logic(core.node, core.logic, marker.p)
    return True


__all__ = ["AddOperator", "Change", "CutLogic", "CutSpec", "PENDING", "RemoveOperator", "ReplaceFunction",
           "TimeSwitch", "base_spec", "new_marker", "on_marker", "set_spec"]
