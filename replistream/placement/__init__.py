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
* :class:`PlacementPolicy`: what ``replistream.deploy(..., placement=...)`` calls.

>>> from replistream.network import default_servers
>>> from replistream.workloads import fig1_query
>>> servers = default_servers(30)
>>> problem = problem_from_query(fig1_query(30), servers, sources=fig1_sources(fig1_query(30), servers))
>>> best = place(problem, 3, "min-cost", d_min=30)
>>> rand = place(problem, 3, "random", seed=0)
>>> best.network_cost < rand.network_cost
True
"""
from .baselines import non_replicated, random_placement
from .coords import coordinate_latency, embedding_error, network_coordinates
from .mincost import ALPHA, D_MIN, Placer, min_cost
from .model import ENTRY, Flow, PlacementError, PlacementProblem, QueryStats, latency_matrix, problem_from_query, with_stats
from .nodes import cluster_servers, ray_options, servers_on_nodes
from .policy import STRATEGIES, PlacementPolicy, fig1_sources, place
from .result import Alternative, Decision, Placement
from .servers import ServerSet, load_servers, servers_from_rows
from .spring import relaxed_positions, spring_relaxation

__all__ = [
    "ENTRY", "Flow", "PlacementError", "PlacementProblem", "QueryStats", "latency_matrix", "problem_from_query", "with_stats",
    "network_coordinates", "coordinate_latency", "embedding_error", "relaxed_positions", "spring_relaxation",
    "ALPHA", "D_MIN", "Placer", "min_cost", "random_placement", "non_replicated", "STRATEGIES", "place",
    "PlacementPolicy", "fig1_sources", "Alternative", "Decision", "Placement", "ServerSet", "load_servers",
    "servers_from_rows", "ray_options", "servers_on_nodes", "cluster_servers",
]
