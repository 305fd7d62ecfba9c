"""The minimum-network-cost non-replicated placement: spring relaxation in latency space.

Pietzuch et al. (ICDE 2006, Hwang's reference [18]) place operators in a
Euclidean *latency space* (network coordinates, here by classical MDS from the
latency matrix, :mod:`replistream.placement.coords`). Every stream is a spring
between its endpoints with spring constant = its rate; sources and pinned
applications are fixed at their servers' coordinates; the operators move to
where the springs' energy ``sum(rate * distance**2)`` is least. That energy is
quadratic, so the relaxed positions solve one linear system (a weighted graph
Laplacian; scipy's Cholesky solver).

Two steps go beyond the original, both documented here:

1. **Re-weighting** (``iterations``, default 20): the cost the paper defines
   is ``sum(rate * latency)``, not ``rate * latency**2``. Re-weighting each
   spring by ``1 / length`` and solving again (Weiszfeld's iteration for the
   multi-facility Weber problem) moves the relaxed positions towards the
   minimum of ``sum(rate * distance)``. ``iterations=0`` keeps the pure
   spring energy.
2. **Refinement** (``refine=True``): after each node is mapped to the
   nearest eligible server in latency space (Pietzuch's physical mapping),
   nodes are moved, one at a time, to the server that minimises the cost of
   their streams under the *measured* latency matrix, until no move helps.
   Coordinates distort latencies (the triangle inequality does not hold on the
   Internet), so this only ever lowers the cost.

>>> from replistream.placement.model import PlacementProblem
>>> L = np.array([[0, 10, 20], [10, 0, 10], [20, 10, 0]], dtype=float)   # servers on a line
>>> p = PlacementProblem(["w", "m", "e"], L, [("s1", "op", 1.0), ("s2", "op", 1.0), ("op", "app", 3.0)],
...                      fixed={"s1": "w", "s2": "e", "app": "m"})
>>> spring_relaxation(p).replicas
{'op': ['m']}
"""
from __future__ import annotations

import numpy as np
import scipy.linalg

from .coords import network_coordinates
from .model import PlacementError, PlacementProblem
from .result import Placement

__all__ = ["spring_relaxation", "relaxed_positions"]


def relaxed_positions(problem: PlacementProblem, coords: np.ndarray, iterations: int = 20) -> np.ndarray:
    """Positions (one row per node to place, in ``problem.nodes`` order) where the springs rest.

    A node with no stream to anything fixed rests at the centroid of the
    servers (a tiny spring to it keeps the system well posed).

    >>> from replistream.placement.model import PlacementProblem
    >>> p = PlacementProblem(["a", "b"], [[0, 4], [4, 0]], [("s", "o", 1.0), ("o", "t", 3.0)], fixed={"s": "a", "t": "b"})
    >>> X = np.array([[0.0], [4.0]])
    >>> relaxed_positions(p, X, iterations=0).round(3).tolist()    # energy minimum: 3/4 of the way
    [[3.0]]
    >>> relaxed_positions(p, X, iterations=50).round(2).tolist()   # cost minimum: at the heavier end
    [[4.0]]
    """
    nodes = problem.nodes
    m, d = len(nodes), coords.shape[1]
    if m == 0:
        return np.zeros((0, d))
    pos = {x: i for i, x in enumerate(nodes)}
    center = coords.mean(axis=0)
    fixed_xy = {x: coords[i] for x, i in problem.fixed.items()}
    edges = [(f.src, f.dst, f.rate) for f in problem.flows if f.rate > 0]
    rates = np.array([r for _, _, r in edges]) if edges else np.zeros(0)
    scale = float(rates.mean()) if rates.size else 1.0
    reg = 1e-9 * scale
    spread = float(np.ptp(coords, axis=0).max()) if len(coords) > 1 else 1.0
    eps = 1e-6 * max(spread, 1e-9)

    def solve(weights: np.ndarray) -> np.ndarray:
        A = np.eye(m) * reg
        b = np.tile(center * reg, (m, 1))
        for (u, v, _), w in zip(edges, weights):
            iu, iv = pos.get(u), pos.get(v)
            if iu is not None and iv is not None:
                A[iu, iu] += w
                A[iv, iv] += w
                A[iu, iv] -= w
                A[iv, iu] -= w
            elif iu is not None:
                A[iu, iu] += w
                b[iu] += w * fixed_xy[v]
            elif iv is not None:
                A[iv, iv] += w
                b[iv] += w * fixed_xy[u]
        return scipy.linalg.solve(A, b, assume_a="pos")

    P = solve(rates)
    for _ in range(int(iterations)):
        lengths = np.empty(len(edges))
        for e, (u, v, _) in enumerate(edges):
            pu = P[pos[u]] if u in pos else fixed_xy[u]
            pv = P[pos[v]] if v in pos else fixed_xy[v]
            lengths[e] = np.linalg.norm(pu - pv)
        P_new = solve(rates / np.maximum(lengths, eps))
        if np.allclose(P_new, P, atol=1e-9 * max(spread, 1.0), rtol=0):
            P = P_new
            break
        P = P_new
    return P


def spring_relaxation(problem: PlacementProblem, alpha: float | None = None, dim: int = 3, iterations: int = 20,
                      refine: bool = True, max_passes: int = 50, coords: np.ndarray | None = None,
                      placer=None, explain: int = 3) -> Placement:
    """One replica per node, at minimum network cost (the paper's starting point, §VI-A; [18]).

    Coordinates by classical MDS (``dim`` axes) unless ``coords`` are given;
    springs relaxed (:func:`relaxed_positions`); each node, in topological
    order, mapped to the nearest server in latency space whose load stays
    below ``alpha`` x capacity (default: the min-cost default alpha); then
    refined on the latency matrix (see the module docstring).

    >>> from replistream.placement.model import PlacementProblem
    >>> p = PlacementProblem(["a", "b", "c"], [[0, 5, 9], [5, 0, 5], [9, 5, 0]], [("s", "x", 2.0), ("x", "y", 1.0)],
    ...                      fixed={"s": "c"}, load={"x": 0.6}, capacity=[1, 1, 0.5])
    >>> spring_relaxation(p, alpha=1.0).replicas     # c lacks capacity for x (0.6 >= 0.5)
    {'x': ['b'], 'y': ['b']}
    """
    from .mincost import ALPHA, Placer, fits

    alpha = ALPHA if alpha is None else alpha
    own = placer is None
    if own:
        placer = Placer(problem, alpha=alpha, d_min=0.0, explain=explain)
    elif placer.where:
        raise ValueError("spring relaxation needs a placer with nothing placed yet")
    X = network_coordinates(problem.latency, dim) if coords is None else np.asarray(coords, dtype=np.float64)
    if X.shape[0] != len(problem.servers):
        raise ValueError(f"coords need one row per server ({len(problem.servers)}), got {X.shape[0]}")
    P = relaxed_positions(problem, X, iterations)
    loads = np.array(problem.server_load, dtype=np.float64)
    chosen: dict[str, int] = {}
    for i, node in enumerate(problem.nodes):
        lo = problem.load.get(node, 0.0)
        ok = fits(loads, lo, alpha, problem.capacity)
        if not ok.any():
            s = int(np.argmin(problem.capacity * alpha - loads))
            raise PlacementError(
                f"no server can host {node!r}: every server fails the load constraint load(s) + load({node})={lo:g}"
                f" < alpha={alpha:g} x capacity(s) (e.g. {problem.servers[s]}: load {loads[s]:.3g}, capacity "
                f"{problem.capacity[s]:.3g}). Raise alpha or add servers.")
        dist = np.where(ok, np.linalg.norm(X - P[i], axis=1), np.inf)
        s = int(np.argmin(dist))  # first of equals: deterministic
        chosen[node] = s
        loads[s] += lo
    moved = _refine(problem, chosen, loads, alpha, max_passes) if refine else set()
    how = "spring relaxation" + (", refined" if refine else "")
    for node in problem.nodes:
        s = chosen[node]
        cost = placer.costs(node)
        note = ("spring", "cheaper for the streams placed so far, but the relaxation minimises the whole query's cost")
        alts = placer.alternatives(node, s, cost, reason_cheaper=note)
        placer.add(node, s, 1, how + (" (moved)" if node in moved else ""), alts, cost=float(cost[s]))
    params = {"k": 1, "alpha": alpha, "dim": dim, "iterations": iterations, "refine": refine}
    return placer.placement("non-replicated", params)


def _refine(problem: PlacementProblem, chosen: dict[str, int], loads: np.ndarray, alpha: float,
            max_passes: int) -> set[str]:
    """Move single nodes to their cheapest eligible server until no move lowers the cost."""
    from .mincost import fits

    names = problem.servers
    moved: set[str] = set()
    for _ in range(int(max_passes)):
        changed = False
        for node in problem.nodes:
            cur = chosen[node]
            lo = problem.load.get(node, 0.0)
            loads[cur] -= lo
            others = {x: [names[s]] for x, s in chosen.items() if x != node}
            cost = problem.cost_vector(node, others)
            ok = fits(loads, lo, alpha, problem.capacity)
            ok[cur] = True  # staying is always allowed
            c = np.where(ok, cost, np.inf)
            best = int(np.argmin(c))
            tol = 1e-9 * max(1.0, abs(cost[cur]))
            if c[best] < cost[cur] - tol:
                chosen[node] = best
                moved.add(node)
                changed = True
            loads[chosen[node]] += lo
        if not changed:
            break
    return moved
