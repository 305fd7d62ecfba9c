"""Strategies by name, and placement policies ready for ``replistream.deploy``.

:data:`STRATEGIES` maps a name to a pure function ``(problem, k, **params) ->
Placement``, so experiments swap strategies by name (:func:`place`).
:class:`PlacementPolicy` binds a strategy to the statistics and locations it
needs and is the callable ``(query, servers, k) -> {node: [server, ...]}``
that ``deploy(..., placement=...)`` takes; ``deploy(..., placement="min-cost")``
uses one with default settings.

>>> from replistream.network import default_servers
>>> from replistream.workloads import fig1_query
>>> q = fig1_query(4)
>>> policy = PlacementPolicy("min-cost", d_min=30, sources=fig1_sources)
>>> plan = policy(q, default_servers(8), 2)
>>> sorted(plan), len(plan["correlate"]), len(plan["alerts"])
(['alerts', 'correlate', 'entry', 'hot', 'loads', 'pings'], 2, 1)
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..network import NetworkConditions, ZeroLatency
from .baselines import non_replicated, random_placement
from .mincost import min_cost
from .model import PlacementProblem, QueryStats, problem_from_query
from .result import Placement

__all__ = ["STRATEGIES", "place", "PlacementPolicy", "fig1_sources"]

#: Placement strategies by name: ``(problem, k, **params) -> Placement``.
STRATEGIES: dict[str, Callable[..., Placement]] = {
    "min-cost": min_cost,
    "random": random_placement,
    "non-replicated": non_replicated,
}


def place(problem: PlacementProblem, k: int, strategy: str = "min-cost", **params) -> Placement:
    """Run the strategy named ``strategy`` (see :data:`STRATEGIES`).

    >>> from replistream.placement.model import PlacementProblem
    >>> p = PlacementProblem(["a", "b"], [[0, 50], [50, 0]], [("s", "o", 1.0)], fixed={"s": "a"})
    >>> place(p, 2, "min-cost", d_min=30).replicas, place(p, 1, "non-replicated").replicas
    ({'o': ['a', 'b']}, {'o': ['a']})
    >>> place(p, 1, "best")
    Traceback (most recent call last):
    ...
    ValueError: unknown placement strategy 'best'; known: ['min-cost', 'non-replicated', 'random']
    """
    fn = STRATEGIES.get(strategy)
    if fn is None:
        raise ValueError(f"unknown placement strategy {strategy!r}; known: {sorted(STRATEGIES)}")
    return fn(problem, k, **params)


def fig1_sources(query, servers) -> dict[str, str]:
    """Where the Fig. 1 query's sources originate: ``load_i`` and ``ping_i`` on server ``i``
    (modulo the number of servers), as in the paper, where every server ran both sources.

    >>> from replistream.network import default_servers
    >>> from replistream.workloads import fig1_query
    >>> fig1_sources(fig1_query(3), default_servers(2))
    {'load_0': 'boston', 'load_1': 'london', 'load_2': 'boston', 'ping_0': 'boston', 'ping_1': 'london', 'ping_2': 'boston'}
    """
    names = [getattr(s, "name", s) for s in servers]
    out = {}
    for src in query.sources:
        prefix, _, num = src.rpartition("_")
        if prefix not in ("load", "ping") or not num.isdigit():
            raise ValueError(f"{src!r} is not a Fig. 1 source (load_i / ping_i)")
        out[src] = names[int(num) % len(names)]
    return out


class PlacementPolicy:
    """A strategy plus what it needs to know; call it as ``policy(query, servers, k)``.

    * ``strategy``: a name in :data:`STRATEGIES`; ``params`` go to it
      (``alpha``, ``d_min``, ``initial`` for min-cost; ``seed`` for random);
    * ``stats``: a :class:`~replistream.placement.model.QueryStats` (default:
      estimated, 1 tuple/s per source, selectivity 1);
    * ``sources``: ``{source: server}`` or a callable ``(query, servers) ->
      mapping`` (e.g. :func:`fig1_sources`); ``apps``: ``{application: server}``;
    * ``latency``: a matrix or latency model; by default the deployment's
      emulated network (``deploy`` passes it), else the geographic model of
      the servers' coordinates (zeros for servers without coordinates);
    * ``server_load``: load already on each server (sequence or mapping).

    >>> from replistream.network import default_servers
    >>> from replistream.workloads import fig1_query
    >>> pl = PlacementPolicy("random", seed=3).placement(fig1_query(2), default_servers(5), 3)
    >>> pl.strategy, pl.k, pl.params["seed"]
    ('random', 3, 3)
    """

    def __init__(self, strategy: str = "min-cost", *, stats: QueryStats | None = None,
                 sources: Mapping[str, str] | Callable | None = None, apps: Mapping[str, str] | None = None,
                 latency: Any = None, server_load=None, **params):
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown placement strategy {strategy!r}; known: {sorted(STRATEGIES)}")
        self.strategy = strategy
        self.params = params
        self.stats = stats
        self.sources = sources
        self.apps = apps
        self.latency = latency
        self.server_load = server_load

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in self.params.items())
        return f"PlacementPolicy({self.strategy!r}{extra})"

    def problem(self, query, servers, network=None, parallelism=None, bits: int | None = None) -> PlacementProblem:
        """The placement problem for ``query`` on ``servers`` (``network``: the deployment's model;
        ``parallelism``/``bits``: partitioned operators, one node per partition, see
        :func:`~replistream.placement.model.problem_from_query`).

        >>> from replistream.network import default_servers
        >>> from replistream.workloads import fig1_query
        >>> PlacementPolicy(sources=fig1_sources).problem(fig1_query(2), default_servers(3))
        PlacementProblem(3 servers, 6 nodes, 4 fixed, 10 flows)
        >>> PlacementPolicy(sources=fig1_sources).problem(fig1_query(2), default_servers(3), parallelism={"hot": 3})
        PlacementProblem(3 servers, 8 nodes, 4 fixed, 14 flows)
        """
        latency = self.latency
        if latency is None and network is not None:
            base = network.base if isinstance(network, NetworkConditions) else network
            if not isinstance(base, ZeroLatency):
                latency = network
        sources = self.sources(query, servers) if callable(self.sources) else self.sources
        return problem_from_query(query, servers, latency, self.stats, sources=sources, apps=self.apps,
                                  server_load=self.server_load, parallelism=parallelism, bits=bits)

    def placement(self, query, servers, k: int, network=None, parallelism=None, bits: int | None = None) -> Placement:
        """The full :class:`~replistream.placement.result.Placement`, with its explanation. With
        ``parallelism={op: p}`` every partition is placed as a node of its own (Algorithm 5, Hwang
        §V-A, per partition, for ``"min-cost"``; issue #41): the plan has keys ``"op.0"`` ..
        ``"op.{p-1}"`` instead of ``"op"``, which :class:`~replistream.plan.PhysicalPlan` and
        ``deploy(..., parallelism=)`` take.

        >>> from replistream.network import default_servers
        >>> from replistream.workloads import fig1_query
        >>> pl = PlacementPolicy("min-cost", d_min=30, sources=fig1_sources).placement(
        ...     fig1_query(4), default_servers(8), 2, parallelism={"correlate": 2})
        >>> [n for n in pl.plan() if n.startswith("correlate")], len(pl.plan()["correlate.1"])
        (['correlate.0', 'correlate.1'], 2)
        """
        return place(self.problem(query, servers, network, parallelism, bits), k, self.strategy, **self.params)

    def __call__(self, query, servers, k: int, network=None, parallelism=None, bits: int | None = None
                 ) -> dict[str, list[str]]:
        return self.placement(query, servers, k, network, parallelism, bits).plan()

    def evaluate(self, query, servers, plan: Mapping[str, list[str]], network=None, parallelism=None,
                 bits: int | None = None) -> Placement:
        """A plan made some other way (``"spread"``, a mapping, a callable), costed under this policy's model.

        With ``parallelism``, each partition ``"op.P"`` is costed where the plan puts it:
        ``plan["op.P"]``, else ``plan["op"]`` (every partition on the operator's servers, as
        :class:`~replistream.plan.PhysicalPlan` reads such a plan).

        >>> from replistream.network import default_servers
        >>> from replistream.workloads import fig1_query
        >>> q, servers = fig1_query(1), default_servers(2)
        >>> plan = {"entry": ["boston"], "loads": ["boston"], "pings": ["boston"], "correlate": ["london"],
        ...         "hot": ["london"], "alerts": ["london"]}
        >>> pl = PlacementPolicy().evaluate(q, servers, plan)
        >>> pl.strategy, pl.network_cost > 0
        ('given', True)
        >>> split = PlacementPolicy().evaluate(q, servers, {**plan, "correlate.1": ["boston"]}, parallelism={"correlate": 2})
        >>> split.replicas["correlate.0"], split.replicas["correlate.1"]
        (['london'], ['boston'])
        """
        from ..partition import parse_partition_label, partition_label

        problem = self.problem(query, servers, network, parallelism, bits)

        def where(n: str):
            if n in plan:
                return plan[n]
            base, part = parse_partition_label(n)
            if part is not None and base in problem.parallelism:
                return plan.get(base)
            return plan.get(partition_label(n, 0))  # an operator deployed as one partition, "op.0"

        missing = [n for n in problem.nodes if where(n) is None]
        if missing:
            raise ValueError(f"plan has no servers for {missing}")
        return Placement(problem, {n: list(where(n)) for n in problem.nodes}, "given")
