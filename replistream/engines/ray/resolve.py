"""What ``deploy()`` was given, resolved and checked before any actor starts: servers,
placement, the emulated network (Hwang §II-B, §V-A; docs/design.md, decisions 5-6).

* :func:`resolve_servers`: a count, city names, :class:`~replistream.network.Server`
  objects, a :class:`~replistream.placement.ServerSet` or a server file;
* :func:`spread_placement` and :data:`PLACEMENTS`, the strategies ``deploy(placement=name)``
  knows; :func:`resolve_placement` turns a name, mapping, policy or callable into the
  plan ``{node: [server, ...]}``, checked by :class:`~replistream.plan.PhysicalPlan`;
* :func:`resolve_network`: the emulated network's
  :class:`~replistream.network.NetworkConditions`; :func:`placement_network`: what
  placement policies cost latencies with; :func:`evaluate_plan`: the cost of a plan
  no policy made.

>>> from replistream.workloads import fig1_query
>>> servers = resolve_servers(3)
>>> resolve_placement(fig1_query(2), servers, 2, "spread")["alerts"]
['boston']
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Callable

from ...network import (CITIES, GeoLatencyModel, LatencyModel, NetworkConditions, Server, TraceLatencyModel,
                        ZeroLatency, default_servers)
from ...placement.policy import STRATEGIES, PlacementPolicy
from ...placement.servers import ServerSet, load_servers
from ...plan import ENTRY, PhysicalPlan
from ...query import Query

__all__ = ["PLACEMENTS", "evaluate_plan", "placement_network", "resolve_network", "resolve_placement",
           "resolve_placement_with_cost", "resolve_servers", "spread_placement"]


def resolve_servers(servers) -> list:
    """Servers from a count, names of known cities, :class:`~replistream.network.Server` objects,
    a :class:`~replistream.placement.ServerSet`, or the path of a server file (``.csv``/``.toml``).

    >>> [s.name for s in resolve_servers(["tokyo", "boston"])], len(resolve_servers(3))
    (['tokyo', 'boston'], 3)
    """
    if servers is None:
        return default_servers(6)
    if isinstance(servers, (str, os.PathLike)):
        if not str(servers).endswith((".csv", ".toml")):
            raise ValueError(f"servers={servers!r}: give a count, a list of servers or city names, or the path "
                             f"of a .csv/.toml server file")
        servers = load_servers(servers)
    if isinstance(servers, ServerSet):
        return list(servers.servers)
    if isinstance(servers, int):
        if servers < 1:
            raise ValueError(f"servers must be >= 1, got {servers}")
        return default_servers(servers)
    out = []
    known = {c[0] if isinstance(c, tuple) else c.name: c for c in CITIES}
    for s in servers:
        if isinstance(s, Server):
            out.append(s)
        elif isinstance(s, str):
            c = known.get(s)
            if c is None:
                raise ValueError(f"unknown server {s!r}: give a Server(name, lat, lon) or one of the built-in "
                                 f"cities, e.g. {sorted(known)[:5]}")
            out.append(c if isinstance(c, Server) else Server(*c))
        else:
            raise ValueError(f"servers must be Server objects or city names, got {type(s).__name__}")
    names = [s.name for s in out]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"server names must be unique; repeated: {sorted(dup)}")
    return out


def spread_placement(query: Query, servers: list, k: int) -> dict[str, list[str]]:
    """A simple deterministic spread: replicas of each operator on ``k`` distinct servers,
    rotating the starting server per operator so load spreads evenly.

    Every strategy has this signature: ``(query, servers, k) -> {node: [server
    names]}``; the placement strategies (``"min-cost"``, ``"random"``,
    ``"non-replicated"``) are :class:`~replistream.placement.PlacementPolicy`
    objects, which also take the deployment's network.

    >>> from replistream.workloads import fig1_query
    >>> from replistream.network import default_servers
    >>> spread_placement(fig1_query(2), default_servers(3), 2)["entry"]
    ['boston', 'london']
    """
    names = [s.name for s in servers]
    out: dict[str, list[str]] = {}
    nodes = [ENTRY] + query.operators
    for i, node in enumerate(nodes):
        out[node] = [names[(i + j) % len(names)] for j in range(k)]
    for node in query.sinks:
        out[node] = [names[0]]
    return out


#: Placement strategies ``deploy(..., placement=name)`` knows: ``"spread"`` and those of
#: :data:`replistream.placement.STRATEGIES` (``"min-cost"`` is Algorithm 5, Hwang §V-A).
PLACEMENTS: dict[str, Callable] = {"spread": spread_placement,
                                   **{name: PlacementPolicy(name) for name in STRATEGIES}}


def resolve_placement(query: Query, servers: list, k: int, placement, network=None) -> dict[str, list[str]]:
    """The validated plan ``{node: [server, ...]}`` of ``placement`` (a name, mapping or callable).

    ``network`` (a latency model or matrix) is what placement policies cost
    latencies with. Checked by :class:`~replistream.plan.PhysicalPlan`.

    >>> from replistream.workloads import fig1_query
    >>> from replistream.network import default_servers
    >>> resolve_placement(fig1_query(2), default_servers(3), 2, {"hot": ["boston", "boston"]})
    Traceback (most recent call last):
    ...
    ValueError: placement puts two replicas of 'hot' on one server: ['boston', 'boston'] (a node's replicas need distinct servers)
    """
    return resolve_placement_with_cost(query, servers, k, placement, network)[0]


def resolve_placement_with_cost(query: Query, servers: list, k: int, placement, network=None,
                                parallelism: Mapping[str, int] | None = None, bits: int | None = None):
    """(validated plan, the :class:`~replistream.placement.Placement` when a placement policy made it).

    With ``parallelism``, a placement policy (``"min-cost"``, ``"random"``, ``"non-replicated"``
    or a :class:`~replistream.placement.PlacementPolicy`) places every partition as a node of its
    own (for min-cost: Algorithm 5, Hwang §V-A, per partition; issue #41), so the plan has a key
    ``"op.P"`` per partition; ``"spread"`` and other callables place the operator, and
    :func:`spread_partitions` the partitions; a mapping places them as it says (``"op.P"`` keys, or
    ``"op"`` for every partition).

    >>> from replistream.network import default_servers
    >>> from replistream.workloads import fig1_query
    >>> plan, placed = resolve_placement_with_cost(fig1_query(2), default_servers(3), 2, "spread")
    >>> plan["entry"], placed is None
    (['boston', 'london'], True)
    >>> plan, placed = resolve_placement_with_cost(fig1_query(2), default_servers(4), 2, "min-cost",
    ...                                            parallelism={"correlate": 2})
    >>> sorted(n for n in plan if n.startswith("correlate")), placed.plan() == plan
    (['correlate.0', 'correlate.1'], True)
    """
    placed = None
    apps = {n: p for n, p in (parallelism or {}).items() if n in query.sinks}  # partitioned applications
    given_parallelism, parallelism = parallelism, operators_only(query, parallelism)
    if placement is None:
        placement = "spread"
    if isinstance(placement, str):
        if placement not in PLACEMENTS:
            raise ValueError(f"unknown placement strategy {placement!r}; known: {sorted(PLACEMENTS)}")
        placement = PLACEMENTS[placement]
    if isinstance(placement, PlacementPolicy):
        placed = placement.placement(query, servers, k, network, parallelism=parallelism, bits=bits)
        plan = placed.plan()
    elif callable(placement):
        plan = placement(query, servers, k)
    elif isinstance(placement, Mapping):
        plan = dict(spread_placement(query, servers, k))
        plan.update({n: list(v) for n, v in placement.items()})
    else:
        raise ValueError(f"placement must be a strategy name, a mapping or a callable, got {type(placement).__name__}")
    if not isinstance(plan, Mapping):
        raise ValueError("a placement strategy must return a mapping {node: [server, ...]}")
    plan = {n: list(v) for n, v in plan.items()}
    if parallelism and not isinstance(placement, (Mapping, PlacementPolicy)):
        plan.update(spread_partitions(plan, [s.name for s in servers], k, parallelism))
    if apps:  # a partitioned application: k replicas per partition, spread from its server (issue #41)
        names = [s.name for s in servers]
        for app, p in apps.items():
            if all(f"{app}.{i}" in plan for i in range(p)):
                continue
            base = list(plan[app])
            start = names.index(base[0]) if base and base[0] in names else 0
            plan[app] = base if len(base) == k else [names[(start + j) % len(names)] for j in range(k)]
            plan.update({n: v for n, v in spread_partitions(plan, names, k, {app: p}).items() if n not in plan})
    # the one plan checks it (every node placed, k distinct known servers, one per application)
    PhysicalPlan(query, plan, k=k, servers=[s.name for s in servers], parallelism=given_parallelism, keep_single=True,
                 applications=True, **({} if bits is None else {"bits": bits}))
    return plan, placed


def operators_only(query: Query, parallelism: Mapping[str, int] | None) -> dict[str, int]:
    """``parallelism`` without the applications it names: what the placement model partitions (it
    places an application's replicas where the plan says; its partitions are spread like an
    operator's, :func:`spread_partitions`).

    >>> from replistream.workloads import fig1_query
    >>> operators_only(fig1_query(1), {"correlate": 2, "alerts": 3})
    {'correlate': 2}
    """
    return {n: p for n, p in (parallelism or {}).items() if n not in query.sinks}


def spread_partitions(plan: Mapping[str, list], servers: list[str], k: int,
                      parallelism: Mapping[str, int]) -> dict[str, list[str]]:
    """Where each partition of a partitioned operator runs when ``"spread"`` (or another callable
    that knows no partitions) placed the operator: partition 0 on the operator's servers, partition ``P`` on the ``k`` servers ``P * k``
    further in ``servers`` (in order, wrapping), so that with at least ``p * k`` servers the
    partitions run on distinct servers (distinct Ray nodes when servers are pinned to nodes).

    >>> spread_partitions({"w": ["a", "b"]}, ["a", "b", "c", "d"], 2, {"w": 2})
    {'w.0': ['a', 'b'], 'w.1': ['c', 'd']}
    """
    out = {}
    n = len(servers)
    for node, p in parallelism.items():
        base = list(plan[node])
        start = servers.index(base[0])
        out[f"{node}.0"] = base
        for i in range(1, int(p)):
            out[f"{node}.{i}"] = [servers[(start + i * k + j) % n] for j in range(k)]
    return out


def resolve_network(network, servers: list, seed: int) -> NetworkConditions:
    """The emulated network of ``deploy(network=...)``: ``"zero"``, ``"geo"``, ``"geo-static"``, a trace
    CSV path, a latency model or :class:`~replistream.network.NetworkConditions` (docs/design.md, decision 5).

    >>> from replistream.network import default_servers
    >>> type(resolve_network("geo", default_servers(2), seed=0).base).__name__
    'GeoLatencyModel'
    """
    if network is None or network == "zero":
        base = ZeroLatency([s.name for s in servers])
    elif network == "geo":
        base = GeoLatencyModel(servers, seed=seed)
    elif network == "geo-static":
        base = GeoLatencyModel(servers, seed=seed, static=True)
    elif isinstance(network, str) and network.endswith(".csv"):
        base = TraceLatencyModel.from_csv(network)
    elif isinstance(network, (LatencyModel, NetworkConditions)):
        base = network
    else:
        raise ValueError(f"network must be 'zero', 'geo', 'geo-static', a trace .csv path or a LatencyModel, "
                         f"got {network!r}")
    return base if isinstance(base, NetworkConditions) else NetworkConditions(base)


def placement_network(conditions, given_servers):
    """What placement policies cost latencies with: the emulated network, unless it is
    zero and the servers came with network coordinates (a ServerSet / server file).

    >>> from replistream.network import default_servers
    >>> net = resolve_network("zero", default_servers(2), 0)
    >>> placement_network(net, 2) is net
    True
    """
    if isinstance(conditions.base, ZeroLatency):
        ss = given_servers
        if isinstance(ss, str) and ss.endswith((".csv", ".toml")):
            ss = load_servers(ss)
        if isinstance(ss, ServerSet) and ss.coords is not None:
            return ss.latency()
    return conditions


def evaluate_plan(query, servers, plan, network, parallelism: Mapping[str, int] | None = None,
                  bits: int | None = None):
    """A plan made without a placement policy, costed with the default cost model (None if it cannot be:
    e.g. a trace without samples for some pair of servers). With ``parallelism``, each partition
    is costed where the plan puts it (``"op.P"``, else ``"op"``;
    :meth:`~replistream.placement.PlacementPolicy.evaluate`).

    >>> from replistream.network import default_servers
    >>> from replistream.workloads import fig1_query
    >>> q, servers = fig1_query(1), default_servers(3)
    >>> evaluate_plan(q, servers, resolve_placement(q, servers, 2, "spread"), None).network_cost > 0
    True
    """
    try:
        return PlacementPolicy().evaluate(query, servers, plan, network, parallelism, bits)
    except (ValueError, KeyError):  # e.g. a trace without samples for some pair of servers
        return None
