"""Where entry partitions and application partitions run, once a strategy placed the nodes
(issue #41; docs/design.md, "Entry partitions" and "Application partitions").

The placement model places the entry points and each application as one node (Algorithm 5 per
partition applies to operators only). ``replistream.deploy`` then lays their partitions out by rule,
and these functions follow the same rules, so ``replistream place`` shows what a deployment runs:

* entry partitions (``parallelism={"entry": p}``, labels ``entry.P#R``): every partition on the
  entry points' servers (a deployment's plan cannot place them elsewhere). Each chunk of a source
  goes to one partition, all ``k`` replicas of it, on those same servers, and each partition sends
  its share on to every downstream replica, so the links, their rates summed per pair of servers,
  and the network cost are those of the unpartitioned entry points: :func:`entry_partition_layout`.
* application partitions (``parallelism={app: p}``, labels ``app.P#R``): ``k`` replicas per
  partition, partition 0 on the ``k`` servers from the application's (in the servers' order,
  wrapping), partition ``P`` on the ``k`` servers ``P * k`` further (``"spread"`` in
  ``deploy``): :func:`application_partition_layout`. The application's input is split by tuple id,
  so each upstream replica sends ``1/p`` of the stream to every replica of every partition:
  :func:`cost_with_application_partitions` costs the placement with the partitions where they run.

>>> entry_partition_layout({"entry": ["a", "b"], "w": ["b", "c"]}, 2)
{'entry.0': ['a', 'b'], 'entry.1': ['a', 'b']}
>>> application_partition_layout({"out": ["b"]}, ["a", "b", "c", "d"], 2, {"out": 2})
{'out.0': ['b', 'c'], 'out.1': ['d', 'a']}
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from .model import ENTRY, Flow, PlacementProblem

__all__ = ["application_partition_layout", "cost_with_application_partitions", "entry_partition_layout"]


def entry_partition_layout(plan: Mapping[str, Sequence[str]], partitions: int) -> dict[str, list[str]]:
    """``{"entry.P": servers}`` for ``partitions`` entry partitions: each on the entry points'
    servers (``plan["entry"]``), as a deployment runs them; ``{}`` for one partition.

    >>> entry_partition_layout({"entry": ["a"]}, 1)
    {}
    """
    if int(partitions) < 1:
        raise ValueError(f"entry partitions must be >= 1, got {partitions}")
    if int(partitions) == 1:
        return {}
    return {f"{ENTRY}.{i}": list(plan[ENTRY]) for i in range(int(partitions))}


def application_partition_layout(plan: Mapping[str, Sequence[str]], servers: Sequence[str], k: int,
                                 apps: Mapping[str, int]) -> dict[str, list[str]]:
    """``{"app.P": servers}`` for each partitioned application of ``apps`` (``{app: p}``, p >= 2):
    ``k`` servers per partition, partition ``P`` on the ``k`` servers ``P * k`` past the first server
    of ``plan[app]`` in ``servers`` (wrapping), as ``deploy()`` spreads them. ``k`` must not exceed
    the servers (a partition's replicas need distinct servers).

    >>> application_partition_layout({"out": ["c"]}, ["a", "b", "c"], 1, {"out": 3})
    {'out.0': ['c'], 'out.1': ['a'], 'out.2': ['b']}
    >>> application_partition_layout({"out": ["c"]}, ["a", "b"], 3, {"out": 2})
    Traceback (most recent call last):
    ...
    ValueError: 'out' runs 2 partitions of k=3 replicas on distinct servers, but there are 2 servers; lower k or add servers
    """
    names = list(servers)
    n, k = len(names), int(k)
    out: dict[str, list[str]] = {}
    for app, p in apps.items():
        if k > n:
            raise ValueError(f"{app!r} runs {p} partitions of k={k} replicas on distinct servers, but there are "
                             f"{n} servers; lower k or add servers")
        where = list(plan[app])
        start = names.index(where[0]) if where and where[0] in names else 0
        for i in range(int(p)):
            out[f"{app}.{i}"] = [names[(start + i * k + j) % n] for j in range(k)]
    return out


def cost_with_application_partitions(problem: PlacementProblem, replicas: Mapping[str, Sequence[str]],
                                     layout: Mapping[str, Sequence[str]], apps: Mapping[str, int]
                                     ) -> tuple[float, float]:
    """``(network cost, bandwidth)`` of ``replicas`` (a :class:`~replistream.placement.Placement`'s,
    every application one node) with each application of ``apps`` run as its partitions where
    ``layout`` puts them (``"app.P"``): a flow of rate ``r`` into the application becomes ``p``
    flows of ``r / p``, one into each partition, reaching each of its replicas.

    >>> p = PlacementProblem(["a", "b"], [[0, 5], [5, 0]], [("s", "o", 2.0), ("o", "out", 4.0)],
    ...                      fixed={"s": "a"}, single=["out"])
    >>> cost_with_application_partitions(p, {"o": ["a"], "out": ["a"]}, {"out.0": ["a"], "out.1": ["b"]}, {"out": 2})
    (10.0, 6.0)
    """
    flows, nodes = [], []
    for f in problem.flows:
        if f.dst in apps:
            flows += [Flow(f.src, f"{f.dst}.{i}", f.rate / apps[f.dst]) for i in range(apps[f.dst])]
        else:
            flows.append(f)
    for x in problem.nodes:
        nodes += [f"{x}.{i}" for i in range(apps[x])] if x in apps else [x]
    split = PlacementProblem(problem.servers, problem.latency, flows, nodes,
                             fixed={x: problem.servers[i] for x, i in problem.fixed.items()},
                             single=[x for x in problem.single if x not in apps])
    where = {x: list(v) for x, v in replicas.items() if x not in apps}
    where.update({x: list(v) for x, v in layout.items() if x.rpartition(".")[0] in apps})
    return split.network_cost(where), split.bandwidth(where)
