"""Replica placement (imported as ``replistream.placement``; Hwang §V-A).

Pure functions over plain data, shared by the Ray runtime, the CLI and the
simulator:

* the cost model: :class:`PlacementProblem` (servers, latency matrix,
  capacities and loads, the flows of a query with their rates),
  :func:`problem_from_query`, :class:`QueryStats`; cost = rate x latency
  summed over stream replicas;
* strategies, by name in :data:`STRATEGIES`: ``"min-cost"``
  (:func:`min_cost`, Algorithm 5 after a spring-relaxation start),
  ``"random"`` (:func:`random_placement`), ``"non-replicated"``
  (:func:`non_replicated`, spring relaxation, Pietzuch et al. ICDE 2006);
* results that explain themselves: :class:`Placement`, :class:`Decision`;
* servers from files (:func:`load_servers`) and on Ray nodes
  (:func:`ray_options`, :func:`servers_on_nodes`, :func:`cluster_servers`);
* :class:`PlacementPolicy`: what ``replistream.deploy(..., placement=...)`` calls;
* where entry and application partitions run once their node is placed, as ``deploy()`` lays them
  out, and the cost with them there (:mod:`~replistream.placement.layout`).

>>> from replistream.network import default_servers
>>> from replistream.placement import fig1_sources, place, problem_from_query
>>> from replistream.workloads import fig1_query
>>> servers = default_servers(30)
>>> problem = problem_from_query(fig1_query(30), servers, sources=fig1_sources(fig1_query(30), servers))
>>> best = place(problem, 3, "min-cost", d_min=30)
>>> rand = place(problem, 3, "random", seed=0)
>>> best.network_cost < rand.network_cost
True
"""
import importlib

# Every name is loaded on first use (PEP 562), from the module that defines it, so that importing one
# part (the Ray engine imports ``placement.nodes`` and ``placement.policy``) does not import SciPy
# (``coords``, ``spring``) nor the rest (issue #42, point 4: start-up).
_LAZY = {
    **dict.fromkeys(["non_replicated", "random_placement"], ".baselines"),
    **dict.fromkeys(["coordinate_latency", "embedding_error", "network_coordinates"], ".coords"),
    **dict.fromkeys(["ALPHA", "D_MIN", "Placer", "min_cost"], ".mincost"),
    **dict.fromkeys(["ENTRY", "Flow", "PlacementError", "PlacementProblem", "QueryStats", "latency_matrix",
                     "problem_from_query", "with_stats"], ".model"),
    **dict.fromkeys(["application_partition_layout", "cost_with_application_partitions", "entry_partition_layout"],
                    ".layout"),
    **dict.fromkeys(["cluster_servers", "ray_options", "servers_on_nodes"], ".nodes"),
    **dict.fromkeys(["STRATEGIES", "PlacementPolicy", "fig1_sources", "place"], ".policy"),
    **dict.fromkeys(["Alternative", "Decision", "Placement"], ".result"),
    **dict.fromkeys(["ServerSet", "load_servers", "servers_from_rows"], ".servers"),
    **dict.fromkeys(["relaxed_positions", "spring_relaxation"], ".spring"),
}


def __getattr__(name):
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'replistream.placement' has no attribute {name!r}")
    return getattr(importlib.import_module(where, __name__), name)


def __dir__() -> list[str]:
    """The package's names, those loaded on first use included (tab completion, ``help()``).

    >>> import replistream.placement as pl
    >>> {"place", "PlacementPolicy", "network_coordinates"} <= set(dir(pl))
    True
    """
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "ENTRY", "Flow", "PlacementError", "PlacementProblem", "QueryStats", "latency_matrix", "problem_from_query", "with_stats",
    "network_coordinates", "coordinate_latency", "embedding_error", "relaxed_positions", "spring_relaxation",
    "ALPHA", "D_MIN", "Placer", "min_cost", "random_placement", "non_replicated", "STRATEGIES", "place",
    "PlacementPolicy", "fig1_sources", "Alternative", "Decision", "Placement", "ServerSet", "load_servers",
    "servers_from_rows", "ray_options", "servers_on_nodes", "cluster_servers",
    "entry_partition_layout", "application_partition_layout", "cost_with_application_partitions",
]
