"""The placement problem as plain data, and the network cost model (Hwang §V-A).

A *stream replica* is one copy of a stream from one replica of its producer to
one replica of its consumer. Its network cost is the bandwidth-delay product
``cost(S) = rate(S) * latency(S)``; the cost of a set of stream replicas is the
sum. Every replica of a producer sends its whole output to every replica of
each consumer, so a logical stream ``u -> v`` with ``k_u`` and ``k_v`` replicas
costs ``rate(u->v) * sum(latency(a, b) for a in S(u) for b in S(v))``.

:class:`PlacementProblem` holds everything a placement decision reads, as
plain data and with no Ray inside: server names, a latency matrix (one way,
ms), server capacities and current loads, the nodes to place with the
expected load of one replica, the *fixed* endpoints (sources at their servers,
pinned applications) and the *flows* between them with their rates.
:func:`problem_from_query` builds one from a :class:`~replistream.Query`;
:class:`QueryStats` carries the rates and loads, estimated or measured in a
test run (as the paper does, §VI-A).

>>> p = PlacementProblem(["a", "b", "c"], [[0, 10, 40], [10, 0, 30], [40, 30, 0]],
...                      [("src", "op", 2.0), ("op", "app", 1.0)], fixed={"src": "a", "app": "c"})
>>> p.nodes
('op',)
>>> p.network_cost({"op": ["b"]})        # 2 * 10 + 1 * 30
50.0
>>> p.cost_vector("op", {}).tolist()     # cost of one replica of op on a, b, c
[40.0, 50.0, 80.0]
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from ..errors import ReplistreamError
from ..plan import ENTRY, group_of
from ..network import GeoLatencyModel, LatencyModel, NetworkConditions, Server, TraceLatencyModel, ZeroLatency

__all__ = ["ENTRY", "PlacementError", "Flow", "PlacementProblem", "QueryStats", "problem_from_query",
           "latency_matrix", "with_stats"]



class PlacementError(ReplistreamError, ValueError):
    """A placement request cannot be met; the message names the node and the constraint.

    >>> raise PlacementError("no server can host replica 2 of 'join': ...")
    Traceback (most recent call last):
    ...
    replistream.placement.model.PlacementError: no server can host replica 2 of 'join': ...
    """


@dataclass(frozen=True)
class Flow:
    """A logical stream from ``src`` to ``dst`` carrying ``rate`` (bytes/s by default).

    >>> Flow("loads", "join", 120.0)
    Flow(src='loads', dst='join', rate=120.0)
    """

    src: str
    dst: str
    rate: float


def _server_names(servers: Sequence) -> list[str]:
    names = [s.name if isinstance(s, Server) else s for s in servers]
    for n in names:
        if not isinstance(n, str) or not n:
            raise ValueError(f"servers must be Server objects or non-empty names, got {n!r}")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"server names must be unique; repeated: {dup}")
    return names


class PlacementProblem:
    """Servers, latencies, loads and the flows between the nodes to place.

    * ``servers``: names (or :class:`~replistream.network.Server` objects,
      whose ``capacity`` is used unless ``capacity`` is given);
    * ``latency``: ``latency[i, j]`` = one-way latency in ms from server ``i``
      to server ``j`` (finite, >= 0);
    * ``flows``: ``(src, dst, rate)`` triples or :class:`Flow`; parallel flows
      between the same endpoints are summed;
    * ``nodes``: the nodes to place, in placement order (default: every flow
      endpoint that is not fixed); they are placed in a topological order of
      the flows, ties broken by this order;
    * ``fixed``: endpoints already placed, ``{name: server}`` (stream sources,
      pinned applications);
    * ``single``: nodes that get exactly one replica (applications);
    * ``load``: expected load of one replica of a node (default 0), in the
      units of ``capacity`` (default 1.0 per server) and ``server_load``
      (load already on each server, default 0);
    * ``parallelism``: ``{operator: p}`` when the nodes ``"op.0"`` .. ``"op.{p-1}"``
      are the partitions of a partitioned operator (:func:`problem_from_query` sets
      it; ``bits``: its bins, :mod:`replistream.partition`); carried, not read, by
      the strategies, which place a partition like any node.

    >>> p = PlacementProblem(["x", "y"], np.zeros((2, 2)), [("s", "f", 1.0)], fixed={"s": "x"},
    ...                      load={"f": 0.5}, capacity=[1.0, 2.0])
    >>> p.nodes, p.load, p.capacity.tolist()
    (('f',), {'f': 0.5}, [1.0, 2.0])
    """

    def __init__(self, servers: Sequence, latency, flows: Iterable, nodes: Sequence[str] | None = None, *,
                 fixed: Mapping[str, str] | None = None, single: Iterable[str] = (),
                 load: Mapping[str, float] | None = None, capacity=None, server_load=None,
                 parallelism: Mapping[str, int] | None = None, bits: int | None = None):
        #: ``{operator: p}`` of the operators whose partitions are nodes here (issue #41)
        self.parallelism: dict[str, int] = dict(parallelism or {})
        #: the bins of the partitioned operators' key space (2**bits), None when not given
        self.bits = None if bits is None else int(bits)
        self.servers: tuple[str, ...] = tuple(_server_names(servers))
        n = len(self.servers)
        if n == 0:
            raise ValueError("a placement needs at least one server")
        self.index = {s: i for i, s in enumerate(self.servers)}
        lat = np.array(latency, dtype=np.float64)
        if lat.shape != (n, n):
            raise ValueError(f"latency must be a {n}x{n} matrix (one row per server), got shape {lat.shape}")
        if not np.all(np.isfinite(lat)) or np.any(lat < 0):
            i, j = np.argwhere(~(np.isfinite(lat) & (lat >= 0)))[0]
            raise ValueError(f"latency from {self.servers[i]!r} to {self.servers[j]!r} must be finite and >= 0, "
                             f"got {lat[i, j]!r}")
        lat.setflags(write=False)
        self.latency = lat
        if capacity is None:
            capacity = [s.capacity if isinstance(s, Server) else 1.0 for s in servers]
        self.capacity = self._per_server(capacity, "capacity", positive=True)
        self.server_load = self._per_server(np.zeros(n) if server_load is None else server_load, "server_load")

        self.fixed: dict[str, int] = {}
        for name, srv in (fixed or {}).items():
            if srv not in self.index:
                raise ValueError(f"{name!r} is fixed on unknown server {srv!r}")
            self.fixed[name] = self.index[srv]

        merged: dict[tuple[str, str], float] = {}
        for f in flows:
            src, dst, rate = (f.src, f.dst, f.rate) if isinstance(f, Flow) else f
            rate = float(rate)
            if not (math.isfinite(rate) and rate >= 0):
                raise ValueError(f"rate of flow {src!r} -> {dst!r} must be finite and >= 0, got {rate!r}")
            if src == dst:
                raise ValueError(f"flow from {src!r} to itself")
            merged[(src, dst)] = merged.get((src, dst), 0.0) + rate
        self.flows: tuple[Flow, ...] = tuple(Flow(s, d, r) for (s, d), r in merged.items())

        endpoints = list(dict.fromkeys(x for f in self.flows for x in (f.src, f.dst)))
        given = list(nodes) if nodes is not None else [x for x in endpoints if x not in self.fixed]
        if len(set(given)) != len(given):
            raise ValueError(f"nodes are repeated: {sorted({x for x in given if given.count(x) > 1})}")
        both = [x for x in given if x in self.fixed]
        if both:
            raise ValueError(f"{both} are both fixed and to be placed")
        unknown = [x for x in endpoints if x not in self.fixed and x not in set(given)]
        if unknown:
            raise ValueError(f"flows name {unknown}, which are neither nodes to place nor fixed endpoints")
        import networkx as nx  # on first use: the Ray engine imports this module at start (issue #42)

        g = nx.DiGraph()
        g.add_nodes_from(given)
        g.add_edges_from((f.src, f.dst) for f in self.flows if f.src in g and f.dst in g)
        if not nx.is_directed_acyclic_graph(g):
            cyc = " -> ".join(e[0] for e in nx.find_cycle(g))
            raise ValueError(f"the flows between nodes to place have a cycle: {cyc}")
        pos = {x: i for i, x in enumerate(given)}
        self.nodes: tuple[str, ...] = tuple(nx.lexicographical_topological_sort(g, key=pos.__getitem__))
        self.single = frozenset(single)
        bad = sorted(self.single - set(self.nodes))
        if bad:
            raise ValueError(f"single-replica nodes {bad} are not nodes to place")
        self.load: dict[str, float] = {}
        for x, v in (load or {}).items():
            if x not in pos:
                continue  # loads of fixed or unknown nodes do not matter here
            v = float(v)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"load of {x!r} must be finite and >= 0, got {v!r}")
            self.load[x] = v
        self.inputs: dict[str, list[tuple[str, float]]] = {x: [] for x in self.nodes}
        self.outputs: dict[str, list[tuple[str, float]]] = {x: [] for x in self.nodes}
        for f in self.flows:
            if f.dst in self.inputs:
                self.inputs[f.dst].append((f.src, f.rate))
            if f.src in self.outputs:
                self.outputs[f.src].append((f.dst, f.rate))

    def _per_server(self, values, what: str, positive: bool = False) -> np.ndarray:
        n = len(self.servers)
        if isinstance(values, Mapping):
            unknown = sorted(set(values) - set(self.index))
            if unknown:
                raise ValueError(f"{what} names unknown servers {unknown}")
            arr = np.array([float(values.get(s, 1.0 if positive else 0.0)) for s in self.servers])
        else:
            arr = np.array(values, dtype=np.float64).reshape(-1)
            if arr.shape != (n,):
                raise ValueError(f"{what} needs one value per server ({n}), got {arr.shape[0]}")
        ok = np.isfinite(arr) & ((arr > 0) if positive else (arr >= 0))
        if not ok.all():
            i = int(np.argmin(ok))
            raise ValueError(f"{what} of server {self.servers[i]!r} must be {'> 0' if positive else '>= 0'}, "
                             f"got {arr[i]!r}")
        arr.setflags(write=False)
        return arr

    def __repr__(self) -> str:
        return (f"PlacementProblem({len(self.servers)} servers, {len(self.nodes)} nodes, "
                f"{len(self.fixed)} fixed, {len(self.flows)} flows)")

    # -- evaluation ------------------------------------------------------------------
    def _where(self, replicas: Mapping[str, Sequence[str]], x: str) -> list[int]:
        if x in self.fixed:
            return [self.fixed[x]]
        return [self.index[s] for s in replicas.get(x, ())]

    def _check_replicas(self, replicas: Mapping[str, Sequence[str]]) -> None:
        for x, where in replicas.items():
            for s in where:
                if s not in self.index:
                    raise ValueError(f"{x!r} is placed on unknown server {s!r}")

    def cost_vector(self, node: str, replicas: Mapping[str, Sequence[str]]) -> np.ndarray:
        """Network cost of the stream replicas a new replica of ``node`` would add, for every server.

        ``cost_s(in(o) and out(o))`` of Algorithm 5 line 9 (Hwang §V-A): the sum
        of ``rate * latency(upstream replica, s)`` over the replicas already
        placed upstream plus ``rate * latency(s, downstream replica)`` over those
        placed downstream.

        >>> p = PlacementProblem(["a", "b"], [[0, 5], [5, 0]], [("s", "o", 3.0)], fixed={"s": "a"})
        >>> p.cost_vector("o", {}).tolist()
        [0.0, 15.0]
        """
        self._check_replicas(replicas)
        n = len(self.servers)
        w_in = np.zeros(n)
        w_out = np.zeros(n)
        for src, rate in self.inputs[node]:
            for i in self._where(replicas, src):
                w_in[i] += rate
        for dst, rate in self.outputs[node]:
            for j in self._where(replicas, dst):
                w_out[j] += rate
        return w_in @ self.latency + self.latency @ w_out

    def stream_replicas(self, replicas: Mapping[str, Sequence[str]]) -> list[dict]:
        """Every stream replica between placed endpoints, with its rate, latency and cost.

        >>> p = PlacementProblem(["a", "b"], [[0, 5], [5, 0]], [("s", "o", 3.0)], fixed={"s": "a"})
        >>> p.stream_replicas({"o": ["a", "b"]})[1]
        {'src': 's', 'src_replica': 0, 'src_server': 'a', 'dst': 'o', 'dst_replica': 1, 'dst_server': 'b', 'rate': 3.0, 'latency_ms': 5.0, 'cost': 15.0}
        """
        self._check_replicas(replicas)
        out = []
        for f in self.flows:
            for a_i, a in enumerate(self._where(replicas, f.src)):
                for b_i, b in enumerate(self._where(replicas, f.dst)):
                    lat = float(self.latency[a, b])
                    out.append({"src": f.src, "src_replica": a_i, "src_server": self.servers[a],
                                "dst": f.dst, "dst_replica": b_i, "dst_server": self.servers[b],
                                "rate": f.rate, "latency_ms": lat, "cost": f.rate * lat})
        return out

    def network_cost(self, replicas: Mapping[str, Sequence[str]]) -> float:
        """Sum of ``rate * latency`` over all stream replicas (Hwang §V-A).

        >>> p = PlacementProblem(["a", "b"], [[0, 5], [5, 0]], [("s", "o", 3.0)], fixed={"s": "a"})
        >>> p.network_cost({"o": ["a", "b"]})
        15.0
        """
        self._check_replicas(replicas)
        total = 0.0
        for f in self.flows:
            a = self._where(replicas, f.src)
            b = self._where(replicas, f.dst)
            if a and b:
                total += f.rate * float(self.latency[np.ix_(a, b)].sum())
        return total

    def bandwidth(self, replicas: Mapping[str, Sequence[str]], remote_only: bool = False) -> float:
        """Sum of the rates of all stream replicas (the paper's bandwidth usage, Hwang §VI-E).

        With ``remote_only``, only stream replicas between two different servers count.

        >>> p = PlacementProblem(["a", "b"], [[0, 5], [5, 0]], [("s", "o", 3.0)], fixed={"s": "a"})
        >>> p.bandwidth({"o": ["a", "b"]}), p.bandwidth({"o": ["a", "b"]}, remote_only=True)
        (6.0, 3.0)
        """
        self._check_replicas(replicas)
        total = 0.0
        for f in self.flows:
            a = self._where(replicas, f.src)
            b = self._where(replicas, f.dst)
            if remote_only:
                total += f.rate * sum(1 for i in a for j in b if i != j)
            else:
                total += f.rate * len(a) * len(b)
        return total

    def server_loads(self, replicas: Mapping[str, Sequence[str]]) -> np.ndarray:
        """Load of every server with ``replicas`` placed on top of ``server_load``.

        >>> p = PlacementProblem(["a", "b"], np.zeros((2, 2)), [("s", "o", 1.0)], fixed={"s": "a"}, load={"o": 0.25})
        >>> p.server_loads({"o": ["a", "b"]}).tolist()
        [0.25, 0.25]
        """
        self._check_replicas(replicas)
        out = np.array(self.server_load, dtype=np.float64)
        for x, where in replicas.items():
            for s in where:
                out[self.index[s]] += self.load.get(x, 0.0)
        return out


# -- rates and loads ------------------------------------------------------------------

def _row_bytes(query, node: str) -> int:
    return int(query.schema_of(node).dtype.itemsize)


@dataclass(frozen=True)
class QueryStats:
    """Stream rates and operator loads of a query, the inputs of the cost model.

    ``rates[node]``: output rate of a source or operator (bytes/s unless said
    otherwise in ``unit``); ``loads[node]``: expected load of one replica of an
    operator, of the entry points (``"entry"``) or of an application, in the
    units of server capacity (e.g. fraction of a CPU). Build them from
    estimates (:meth:`estimate`), from a test run (:meth:`from_run`, as the
    paper does), or from a deployment's metrics (:meth:`from_metrics`).

    >>> from replistream import Query
    >>> q = Query(); s = q.source("s", {"x": "f8"}); _ = s.filter(lambda b: b["x"] > 0, name="f").sink("app")
    >>> QueryStats.estimate(q.build(), source_rate=10.0).rates   # 10 tuples/s of 24-byte rows
    {'s': 240.0, 'f': 240.0}
    """

    rates: Mapping[str, float]
    loads: Mapping[str, float] = field(default_factory=dict)
    unit: str = "bytes/s"

    @classmethod
    def estimate(cls, query, source_rate: float | Mapping[str, float] = 1.0,
                 selectivity: Mapping[str, float] | None = None, loads: Mapping[str, float] | None = None,
                 row_bytes: bool = True) -> "QueryStats":
        """Rates from declared source rates (tuples/s) and selectivities (output/input tuples, default 1).

        An operator's output rate is its selectivity times the sum of its input
        rates; with ``row_bytes`` rates are converted to bytes/s with each
        stream's row size.

        >>> from replistream.workloads import fig1_query
        >>> st = QueryStats.estimate(fig1_query(2), source_rate=0.1, selectivity={"correlate": 0.5})
        >>> round(st.rates["pings"] / st.rates["loads"], 3), st.unit
        (1.143, 'bytes/s')
        """
        selectivity = dict(selectivity or {})
        tuples: dict[str, float] = {}
        for node in query.topological():
            kind = query.spec(node).kind
            if kind == "source":
                r = source_rate.get(node, 0.0) if isinstance(source_rate, Mapping) else source_rate
                tuples[node] = float(r)
            elif kind == "operator":
                tuples[node] = float(selectivity.get(node, 1.0)) * sum(tuples[u] for u in query.inputs_of(node))
        if row_bytes:
            rates = {x: t * _row_bytes(query, x) for x, t in tuples.items()}
        else:
            rates = tuples
        return cls(rates, dict(loads or {}), "bytes/s" if row_bytes else "tuples/s")

    @classmethod
    def from_counts(cls, query, counts: Mapping[str, float], duration_s: float,
                    loads: Mapping[str, float] | None = None, row_bytes: bool = True) -> "QueryStats":
        """Rates from tuple counts per source and operator over ``duration_s`` seconds.

        >>> from replistream.workloads import fig1_query
        >>> QueryStats.from_counts(fig1_query(1), {"load_0": 6, "ping_0": 6, "loads": 6, "pings": 6,
        ...                        "correlate": 6, "hot": 6}, 60.0, row_bytes=False).rates["hot"]
        0.1
        """
        if not duration_s > 0:
            raise ValueError(f"duration_s must be > 0, got {duration_s!r}")
        rates = {}
        for node in query.topological():
            if query.spec(node).kind == "sink":
                continue
            if node not in counts:
                raise ValueError(f"no tuple count for {node!r}")
            r = float(counts[node]) / duration_s
            rates[node] = r * _row_bytes(query, node) if row_bytes else r
        return cls(rates, dict(loads or {}), "bytes/s" if row_bytes else "tuples/s")

    @classmethod
    def from_run(cls, query, result, duration_s: float, loads: Mapping[str, float] | None = None,
                 row_bytes: bool = True) -> "QueryStats":
        """Rates measured in a test run: a :class:`~replistream.RunResult` of ``run_reference``.

        >>> from replistream import run_reference
        >>> from replistream.workloads import fig1_inputs, fig1_query
        >>> q = fig1_query(2); r = run_reference(q, fig1_inputs(2, duration_s=60, period_s=10))
        >>> QueryStats.from_run(q, r, 60.0, row_bytes=False).rates["load_0"]
        0.1
        """
        counts = {s: st["tuples_out"] for s, st in result.stats["entries"].items()}
        counts.update({n: st["logic"]["tuples_out"] for n, st in result.stats["operators"].items()
                       if query.spec(n).kind == "operator"})
        return cls.from_counts(query, counts, duration_s, loads, row_bytes)

    @classmethod
    def from_metrics(cls, query, metrics: Mapping[str, Any], duration_s: float,
                     row_bytes: bool = True) -> "QueryStats":
        """Rates and loads measured on Ray: from ``Deployment.metrics()`` of a run of ``duration_s``.

        A node's rate is the most tuples any one of its stream replicas carried
        (every stream replica of a stream carries the whole stream), per second;
        a replica's load is its busy time (time in operator logic) per second,
        averaged over the node's live replicas. A partitioned operator's replicas
        (labelled ``"op.P#R"``, issue #41) each carry a share: its rate adds up
        the partitions' shares (and a stream into a partitioned operator adds up
        what each partition received), and its load is the whole operator's, the
        sum over its partitions of their replicas' mean load
        (:func:`problem_from_query` divides it by the partitions again).

        >>> from replistream.workloads import fig1_query
        >>> m = {"actors": {"entry#0": {"links": [{"to": "loads#0", "port": 0, "tuples": 30}], "busy_seconds": 0.0},
        ...                 "loads#0": {"links": [{"to": "correlate#0", "port": 0, "tuples": 30}], "busy_seconds": 3.0}}}
        >>> st = QueryStats.from_metrics(fig1_query(1), m, 10.0, row_bytes=False)
        >>> st.rates["load_0"], st.rates["loads"], st.loads["loads"]
        (3.0, 3.0, 0.3)
        >>> m = {"actors": {"entry#0": {"links": [{"to": "loads.0#0", "port": 0, "tuples": 10},
        ...                                       {"to": "loads.1#0", "port": 0, "tuples": 20}]},
        ...                 "loads.0#0": {"links": [{"to": "correlate#0", "port": 0, "tuples": 10}], "busy_seconds": 1.0},
        ...                 "loads.1#0": {"links": [{"to": "correlate#0", "port": 0, "tuples": 20}], "busy_seconds": 2.0}}}
        >>> st = QueryStats.from_metrics(fig1_query(1), m, 10.0, row_bytes=False)
        >>> st.rates["load_0"], st.rates["loads"], round(st.loads["loads"], 6)   # 0.1 + 0.2
        (3.0, 3.0, 0.3)
        """
        from ..partition import parse_partition_label
        from ..plan import label_group

        if not duration_s > 0:
            raise ValueError(f"duration_s must be > 0, got {duration_s!r}")
        # most tuples on one stream replica from partition i of u into partition j of v (None: unpartitioned)
        most: dict[tuple, float] = {}
        busy: dict[tuple[str, int | None], list[float]] = {}
        for label, a in metrics.get("actors", {}).items():
            node, part = parse_partition_label(label_group(label))
            if "busy_seconds" in a and a.get("alive", True):
                busy.setdefault((node, part), []).append(float(a["busy_seconds"]) / duration_s)
            for lk in a.get("links", []):
                dst, dpart = parse_partition_label(label_group(lk["to"]))
                if node == ENTRY:
                    ins = query.inputs_of(dst) if query.has_node(dst) else []
                    if lk["port"] >= len(ins):
                        continue
                    key = (ins[lk["port"]], part, dst, dpart)  # (part: an entry partition's share, summed below)
                elif query.has_node(node):
                    key = (node, part, dst, dpart)
                else:
                    continue
                most[key] = max(most.get(key, 0.0), float(lk["tuples"]))
        # per (u, i, v): the sum over v's partitions; per (u, i): the most over consumers; per u: the sum over i
        into: dict[tuple, float] = {}
        for (u, i, v, _j), t in most.items():
            into[(u, i, v)] = into.get((u, i, v), 0.0) + t
        per_part: dict[tuple, float] = {}
        for (u, i, _v), t in into.items():
            per_part[(u, i)] = max(per_part.get((u, i), 0.0), t)
        counts: dict[str, float] = {n: 0.0 for n in query.topological() if query.spec(n).kind != "sink"}
        for (u, _i), t in per_part.items():
            if u in counts:
                counts[u] += t
        loads: dict[str, float] = {}
        for (n, _part), v in busy.items():
            loads[n] = loads.get(n, 0.0) + float(np.mean(v))
        return cls.from_counts(query, counts, duration_s, loads, row_bytes)


# -- latencies --------------------------------------------------------------------------

def latency_matrix(model, names: Sequence[str], times: Sequence[float] | None = None) -> np.ndarray:
    """The latency matrix placement uses: one-way ms between ``names``, finite.

    ``model`` is a matrix, or a latency model. For a model, with ``times``
    given, the median of ``model.matrix(names, t)`` over those times ("network
    delays obtained through a test run", Hwang §VI-A), ignoring outages
    (``inf``); without ``times``: the static part of a
    :class:`~replistream.network.GeoLatencyModel`, the median over (at most 64
    of) the sample times of a :class:`~replistream.network.TraceLatencyModel`,
    zeros for :class:`~replistream.network.ZeroLatency`. A
    :class:`~replistream.network.NetworkConditions` is read through its base
    model (scripted failures are not the typical network).

    >>> m = GeoLatencyModel(["boston", "london"], seed=0)
    >>> latency_matrix(m, ["boston", "london"]).round(1).tolist() == m.base_matrix().round(1).tolist()
    True
    >>> latency_matrix(np.array([[0, 3], [3, 0]]), ["a", "b"]).tolist()
    [[0.0, 3.0], [3.0, 0.0]]
    """
    names = list(names)
    if not isinstance(model, LatencyModel):
        m = np.array(model, dtype=np.float64)
        if m.shape != (len(names), len(names)):
            raise ValueError(f"latency matrix must be {len(names)}x{len(names)}, got shape {m.shape}")
        return m
    if times is None:
        if isinstance(model, NetworkConditions):
            return latency_matrix(model.base, names)
        if isinstance(model, GeoLatencyModel):
            return model.base_matrix(names)
        if isinstance(model, ZeroLatency):
            return np.zeros((len(names), len(names)))
        if isinstance(model, TraceLatencyModel):
            ts = sorted({t for a, b in model.pairs for t in model.sample_times(a, b)})
            if len(ts) > 64:
                ts = [ts[int(i)] for i in np.linspace(0, len(ts) - 1, 64).round()]
            times = ts or [0.0]
        else:
            times = [0.0]
    stack = np.stack([np.asarray(model.matrix(names, float(t)), dtype=np.float64) for t in times])
    stack = np.where(np.isfinite(stack), stack, np.nan)
    bad = np.all(np.isnan(stack), axis=0)
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise ValueError(f"no finite latency from {names[i]!r} to {names[j]!r} at any of {len(times)} sample times")
    return np.nanmedian(stack, axis=0)


def with_stats(problem: PlacementProblem, query, stats: QueryStats) -> PlacementProblem:
    """``problem`` (made by :func:`problem_from_query` for ``query``) with new rates and loads.

    Servers, latencies, capacities, server loads, source locations, pinned
    applications and partitions (``problem.parallelism``) stay as they were.

    >>> from replistream.workloads import fig1_query
    >>> q = fig1_query(1)
    >>> p = problem_from_query(q, ["a", "b"], np.zeros((2, 2)), sources={"load_0": "a"})
    >>> p2 = with_stats(p, q, QueryStats.estimate(q, source_rate=5.0))
    >>> [f.rate for f in p2.flows if f.src == "load_0"] == [5 * f.rate for f in p.flows if f.src == "load_0"]
    True
    """
    names = problem.servers
    sources = {x: names[i] for x, i in problem.fixed.items() if x in query.sources}
    apps = {x: names[i] for x, i in problem.fixed.items() if x in query.sinks}
    return problem_from_query(query, list(names), problem.latency, stats, sources=sources, apps=apps,
                              server_load=problem.server_load, capacity=problem.capacity,
                              parallelism=problem.parallelism, bits=problem.bits)


def _geo_or_zero(servers: Sequence) -> np.ndarray:
    located = [s for s in servers if isinstance(s, Server) and s.located]
    if len(located) == len(servers) and servers:
        return GeoLatencyModel(servers, static=True).base_matrix()
    return np.zeros((len(servers), len(servers)))


def problem_from_query(query, servers: Sequence, latency=None, stats: QueryStats | None = None, *,
                       sources: Mapping[str, str] | None = None, apps: Mapping[str, str] | None = None,
                       server_load=None, capacity=None, parallelism: Mapping[str, int] | None = None,
                       bits: int | None = None) -> PlacementProblem:
    """The placement problem of a query: what Algorithm 5 and the baselines read.

    Nodes to place: the entry points (``"entry"``: one replica group hosts the
    entry points of every source, as in the runtime), every operator, and every
    application not pinned in ``apps``. ``sources`` gives the server where a
    source's stream originates (a source without one costs nothing to reach
    the entry points); each source's stream flows to the entry points and from
    them to the source's consumers. ``latency``: a matrix, a latency model
    (see :func:`latency_matrix`), or None for the static geographic model of
    located servers (zeros otherwise). ``stats`` defaults to
    :meth:`QueryStats.estimate`.

    >>> from replistream.network import default_servers
    >>> from replistream.workloads import fig1_query
    >>> p = problem_from_query(fig1_query(2), default_servers(4), sources={"load_0": "boston", "ping_0": "boston"})
    >>> p.nodes
    ('entry', 'loads', 'pings', 'correlate', 'hot', 'alerts')
    >>> sorted(p.fixed), sorted(p.single)
    (['load_0', 'ping_0'], ['alerts'])

    ``parallelism``: ``{operator: p}`` (issue #41; checked by
    :func:`~replistream.partition.check_parallelism` against ``2**bits`` bins,
    ``p == 1`` meaning the operator as it is) makes each partitioned operator
    ``p`` nodes, named as its partitions are everywhere
    (:func:`~replistream.partition.partition_label`: ``"op.0"`` ..
    ``"op.{p-1}"``), so that Algorithm 5 places each partition's replicas
    (Hwang §V-A, per partition). A partition's load is the operator's divided
    by ``p``; every upstream node sends to every partition and every partition
    to every downstream node, each flow carrying its share of the stream (the
    rate divided by the partitions at both ends), so the flows of a stream add
    up to its rate, as the loads add up to the operator's.

    >>> p2 = problem_from_query(fig1_query(2), default_servers(4), sources={"load_0": "boston", "ping_0": "boston"},
    ...                         parallelism={"correlate": 2})
    >>> p2.nodes, p2.parallelism
    (('entry', 'loads', 'pings', 'correlate.0', 'correlate.1', 'hot', 'alerts'), {'correlate': 2})
    >>> [(f.src, f.dst) for f in p2.flows if "correlate" in f.src]
    [('correlate.0', 'hot'), ('correlate.1', 'hot')]
    """
    from ..partition import DEFAULT_BITS, check_parallelism, partition_label

    query.build()
    bits = DEFAULT_BITS if bits is None else int(bits)
    parts = check_parallelism(query, parallelism, bits)  # p >= 2 only: one partition is the operator itself

    def split(x: str) -> list[str]:
        return [partition_label(x, i) for i in range(parts[x])] if x in parts else [x]

    names = _server_names(servers)
    if latency is None:
        lat = _geo_or_zero(list(servers))
    else:
        lat = latency_matrix(latency, names)
    stats = stats or QueryStats.estimate(query)
    sources = dict(sources or {})
    apps = dict(apps or {})
    topo = query.topological()
    kind = {x: query.spec(x).kind for x in topo}
    q_sources = [x for x in topo if kind[x] == "source"]
    q_operators = [x for x in topo if kind[x] == "operator"]
    q_sinks = [x for x in topo if kind[x] == "sink"]
    for s in sources:
        if s not in q_sources:
            raise ValueError(f"sources names {s!r}, not a source of query {query.name!r} (sources: {q_sources})")
    for a in apps:
        if a not in q_sinks:
            raise ValueError(f"apps names {a!r}, not an application of query {query.name!r} (apps: {q_sinks})")
    missing = [x for x in q_sources + q_operators if x not in stats.rates]
    if missing:
        raise ValueError(f"stats have no rate for {missing}")
    flows = []
    for s in q_sources:
        if s in sources:
            flows.append((s, ENTRY, stats.rates[s]))
    for u in topo:
        if kind[u] == "sink":
            continue
        ups = split(group_of(query, u))
        for v, _port in query.outputs_of(u):
            downs = split(v)
            share = stats.rates[u] / (len(ups) * len(downs))
            flows.extend((a, b, share) for a in ups for b in downs)
    single = [a for a in q_sinks if a not in apps]
    nodes = [ENTRY] + [x for op in q_operators for x in split(op)] + single
    fixed = {**{s: sources[s] for s in sources}, **apps}
    load = {x: stats.loads.get(x, 0.0) for x in [ENTRY, *q_operators, *single]}
    for op, p in parts.items():
        whole = load.pop(op)
        load.update({x: whole / p for x in split(op)})
    if capacity is None and all(isinstance(s, Server) for s in servers):
        capacity = [s.capacity for s in servers]
    return PlacementProblem(names, lat, flows, nodes, fixed=fixed, single=single, load=load, capacity=capacity,
                            server_load=server_load, parallelism=parts, bits=bits)
