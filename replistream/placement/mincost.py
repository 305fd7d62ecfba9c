"""Min-cost replica deployment: Algorithm 5 (Hwang §V-A).

Start from a non-replicated placement (by default the spring relaxation of
Pietzuch et al., as the paper's experiments did, §VI-A), then run ``k - 1``
deployment phases. In each phase, for every operator ``o`` in topological
order (the entry points first), the candidates are the servers ``s`` with

* ``load(s) + load(o) < alpha * capacity(s)`` (Algorithm 5 line 6; see
  :func:`fits` for the rounding margin), and
* ``latency(s, s') > d_min`` for every server ``s'`` already holding a
  replica of ``o`` (line 7; the smaller of the two directions is used),

and not already holding a replica of ``o``. The new replica goes to the
candidate that minimises ``cost_s(in(o) and out(o))``: the network cost of the
stream replicas between it and every replica already placed upstream and
downstream (lines 8-9). Ties go to the server listed first. Applications are
not replicated (one server each). A partitioned operator (issue #41) is placed
per partition: each partition ``"op.P"`` is a node with its share of the load
and of the streams (:func:`~replistream.placement.model.problem_from_query`,
``parallelism=``), see :func:`min_cost`.

>>> from replistream.placement.model import PlacementProblem
>>> L = [[0, 40, 80], [40, 0, 50], [80, 50, 0]]
>>> p = PlacementProblem(["a", "b", "c"], L, [("src", "op", 1.0)], fixed={"src": "a"})
>>> pl = min_cost(p, k=2, d_min=45, initial="greedy")
>>> pl.replicas                       # b is 40 ms from a (<= d_min 45), c is 80 ms away
{'op': ['a', 'c']}
>>> print(pl.decisions[1].describe())
op#1 (phase 2) -> c: cost 80 (Algorithm 5)
    not a: cost 0, rejected for holds a replica
    not b: cost 40, rejected for d_min 40 ms from a <= d_min 45 ms
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .model import PlacementError, PlacementProblem
from .result import Alternative, Decision, Placement

__all__ = ["min_cost", "ALPHA", "D_MIN", "Placer", "fits"]

#: Default load threshold: a server takes a replica only while its load stays below ALPHA x capacity.
ALPHA = 0.8
#: Default minimum latency (ms) between servers holding replicas of one operator (the paper: 30-70 ms worked well).
D_MIN = 30.0


def fits(loads, load: float, alpha: float, capacity):
    """Algorithm 5's load test ``load(s) + load(o) < alpha * capacity(s)``, elementwise.

    A margin of 1e-9 (relative) is kept below the bound, so that the answer
    does not depend on the order in which loads were added up in floating
    point (0.2 + 0.1 + 0.5 and 0.2 + 0.5 + 0.1 differ in the last bit).

    >>> fits(np.array([0.2 + 0.5]), 0.1, 0.8, np.array([1.0])).tolist()   # 0.8 is not below 0.8
    [False]
    >>> fits(np.array([0.5]), 0.1, 0.8, np.array([1.0])).tolist()
    [True]
    """
    bound = alpha * np.asarray(capacity, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        margin = np.where(np.isfinite(bound), 1e-9 * np.maximum(1.0, np.abs(bound)), 0.0)
    return np.asarray(loads) + load < bound - margin


class Placer:
    """The state of a placement in progress: replicas so far and server loads.

    :meth:`choose` is one step of Algorithm 5 (lines 6-10) for one new
    replica; :meth:`add` records a replica chosen some other way. Shared by
    every strategy so that their decisions are explained and costed alike.

    >>> from replistream.placement.model import PlacementProblem
    >>> p = PlacementProblem(["a", "b"], [[0, 9], [9, 0]], [("s", "o", 1.0)], fixed={"s": "b"})
    >>> pl = Placer(p, alpha=1.0, d_min=0.0)
    >>> pl.choose("o", phase=1).server
    'b'
    """

    def __init__(self, problem: PlacementProblem, alpha: float = ALPHA, d_min: float = D_MIN, explain: int = 3):
        if not alpha > 0:
            raise ValueError(f"alpha must be a number > 0 (inf: no load test), got {alpha!r}")
        if not (d_min >= 0 and np.isfinite(d_min)):
            raise ValueError(f"d_min must be a finite number >= 0 (ms), got {d_min!r}")
        self.problem = problem
        self.alpha = float(alpha)
        self.d_min = float(d_min)
        self.explain = int(explain)
        self.where: dict[str, list[int]] = {}
        self.loads = np.array(problem.server_load, dtype=np.float64)
        self.decisions: list[Decision] = []
        lat = problem.latency
        self._sym = np.minimum(lat, lat.T)  # d_min compares the smaller direction

    def replicas(self) -> dict[str, list[str]]:
        """The replicas placed so far, as server names."""
        names = self.problem.servers
        return {x: [names[i] for i in v] for x, v in self.where.items()}

    def costs(self, node: str) -> np.ndarray:
        """Cost of a new replica of ``node`` on every server, given the replicas placed so far.

        >>> from replistream.placement.model import PlacementProblem
        >>> p = PlacementProblem(["a", "b"], [[0, 9], [9, 0]], [("s", "o", 2.0)], fixed={"s": "b"})
        >>> Placer(p).costs("o").tolist()
        [18.0, 0.0]
        """
        return self.problem.cost_vector(node, self.replicas())

    def constraints(self, node: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per server: (holds a replica of node, passes the load test, passes the d_min test).

        >>> from replistream.placement.model import PlacementProblem
        >>> p = PlacementProblem(["a", "b", "c"], [[0, 9, 50], [9, 0, 45], [50, 45, 0]], [("s", "o", 1.0)],
        ...                      fixed={"s": "a"}, load={"o": 0.5}, server_load=[0, 0, 0.6])
        >>> pl = Placer(p, alpha=1.0, d_min=30.0); _ = pl.add("o", 0, phase=1, how="given")
        >>> [c.tolist() for c in pl.constraints("o")]
        [[True, False, False], [False, True, False], [False, False, True]]
        """
        n = len(self.problem.servers)
        holds = np.zeros(n, dtype=bool)
        held = self.where.get(node, [])
        holds[held] = True
        load_ok = fits(self.loads, self.problem.load.get(node, 0.0), self.alpha, self.problem.capacity)
        if held:
            dmin_ok = self._sym[:, held].min(axis=1) > self.d_min
        else:
            dmin_ok = np.ones(n, dtype=bool)
        return holds, load_ok, dmin_ok

    def _why(self, node: str, s: int, holds, load_ok, dmin_ok, cost: np.ndarray, best: float) -> Alternative:
        p = self.problem
        name = p.servers[s]
        if holds[s]:
            return Alternative(name, float(cost[s]), "holds a replica")
        if not dmin_ok[s]:
            held = self.where[node]
            near = held[int(np.argmin(self._sym[s, held]))]
            return Alternative(name, float(cost[s]), "d_min",
                               f"{self._sym[s, near]:.3g} ms from {p.servers[near]} <= d_min {self.d_min:g} ms")
        if not load_ok[s]:
            lo = p.load.get(node, 0.0)
            return Alternative(name, float(cost[s]), "load",
                               f"load {self.loads[s]:.3g} + {lo:.3g} >= alpha {self.alpha:g} x capacity "
                               f"{p.capacity[s]:.3g}")
        return Alternative(name, float(cost[s]), "cost", f"+{cost[s] - best:.6g}")

    def alternatives(self, node: str, chosen: int, cost: np.ndarray, feasible: np.ndarray | None = None,
                     reason_cheaper: str | None = None) -> tuple[Alternative, ...]:
        """The ``explain`` cheapest servers other than ``chosen`` with why they were not taken,
        plus the cheapest feasible runner-up if it is not among them."""
        if self.explain <= 0:
            return ()
        holds, load_ok, dmin_ok = self.constraints(node)
        holds = holds.copy()
        holds[chosen] = False
        ok = ~holds & load_ok & dmin_ok if feasible is None else feasible
        order = [int(i) for i in np.lexsort((np.arange(len(cost)), cost)) if i != chosen]
        picked = order[: self.explain]
        runner = next((i for i in order if ok[i]), None)
        if runner is not None and runner not in picked:
            picked.append(runner)
        best = float(cost[chosen])
        out = []
        for s in picked:
            alt = self._why(node, s, holds, load_ok, dmin_ok, cost, best)
            if alt.reason == "cost" and cost[s] < best and reason_cheaper:
                alt = Alternative(alt.server, alt.cost, reason_cheaper[0], reason_cheaper[1])
            out.append(alt)
        return tuple(out)

    def choose(self, node: str, phase: int) -> Decision:
        """Place one more replica of ``node`` on the cheapest candidate server (Algorithm 5, lines 6-10)."""
        p = self.problem
        holds, load_ok, dmin_ok = self.constraints(node)
        feasible = ~holds & load_ok & dmin_ok
        cost = self.costs(node)
        replica = len(self.where.get(node, []))
        if not feasible.any():
            raise PlacementError(self._infeasible(node, replica, holds, load_ok, dmin_ok))
        c = np.where(feasible, cost, np.inf)
        m = float(c.min())
        tol = 1e-9 * max(1.0, abs(m))
        s = int(np.flatnonzero(c <= m + tol)[0])
        alts = self.alternatives(node, s, cost)
        return self.add(node, s, phase, "Algorithm 5", alts, cost=float(cost[s]))

    def add(self, node: str, server: int, phase: int, how: str, alternatives=(), cost: float | None = None) -> Decision:
        """Record a replica of ``node`` on server index ``server`` (chosen some other way).

        >>> from replistream.placement.model import PlacementProblem
        >>> p = PlacementProblem(["a", "b"], [[0, 9], [9, 0]], [("s", "o", 2.0)], fixed={"s": "a"})
        >>> Placer(p).add("o", 1, phase=1, how="given")
        Decision(node='o', replica=0, phase=1, server='b', cost=18.0, how='given', alternatives=())
        """
        if cost is None:
            cost = float(self.costs(node)[server])
        where = self.where.setdefault(node, [])
        if server in where:
            raise PlacementError(f"{node!r} already has a replica on {self.problem.servers[server]!r}")
        d = Decision(node, len(where), phase, self.problem.servers[server], cost, how, tuple(alternatives))
        where.append(server)
        self.loads[server] += self.problem.load.get(node, 0.0)
        self.decisions.append(d)
        return d

    def _infeasible(self, node, replica, holds, load_ok, dmin_ok) -> str:
        p = self.problem
        n = len(p.servers)
        free = ~holds
        lo = p.load.get(node, 0.0)
        parts = [f"no server can host replica {replica + 1} of {node!r}: of {n} servers"]
        if holds.any():
            parts.append(f"{int(holds.sum())} already hold a replica of {node!r}")
        bad_d = free & ~dmin_ok
        if bad_d.any():
            s = int(np.flatnonzero(bad_d)[0])
            held = self.where[node]
            near = held[int(np.argmin(self._sym[s, held]))]
            parts.append(f"{int(bad_d.sum())} fail the d_min constraint (latency to every replica of {node!r} "
                         f"> d_min={self.d_min:g} ms; e.g. {p.servers[s]} is {self._sym[s, near]:.3g} ms from "
                         f"{p.servers[near]})")
        bad_l = free & ~load_ok
        if bad_l.any():
            s = int(np.flatnonzero(bad_l)[0])
            parts.append(f"{int(bad_l.sum())} fail the load constraint load(s) + load({node})={lo:g} < "
                         f"alpha={self.alpha:g} x capacity(s) (e.g. {p.servers[s]}: load {self.loads[s]:.3g}, "
                         f"capacity {p.capacity[s]:.3g})")
        return ", ".join(parts[:2]) + ("; " + "; ".join(parts[2:]) if len(parts) > 2 else "") + \
            ". Lower d_min, raise alpha, or add servers."

    def placement(self, strategy: str, params: dict) -> Placement:
        """The finished :class:`Placement`."""
        return Placement(self.problem, self.replicas(), strategy, dict(params), list(self.decisions))


def min_cost(problem: PlacementProblem, k: int, alpha: float = ALPHA, d_min: float = D_MIN,
             initial: str | Mapping[str, str] | Placement = "spring", explain: int = 3, **spring) -> Placement:
    """Replica deployment by Algorithm 5 (Hwang §V-A): ``k`` replicas of every node, minimum added cost per phase.

    ``initial`` is the first replica of every node: ``"spring"`` (the spring
    relaxation in latency space of Pietzuch et al., the paper's reference
    [18]; ``spring`` keyword arguments go to
    :func:`~replistream.placement.spring.spring_relaxation`), ``"greedy"``
    (phase 1 by Algorithm 5 itself, with no replica yet to keep d_min from),
    or a given ``{node: server}`` / :class:`Placement` with one replica per node.
    Phases 2..k then add one replica of every replicated node each. Raises
    :class:`~replistream.placement.model.PlacementError` naming the node and
    the constraint when a replica has no candidate server.

    >>> from replistream.placement.model import PlacementProblem
    >>> L = np.array([[0, 10, 50, 90], [10, 0, 45, 85], [50, 45, 0, 40], [90, 85, 40, 0]])
    >>> p = PlacementProblem(list("abcd"), L, [("src", "op", 2.0), ("op", "app", 1.0)], fixed={"src": "a", "app": "b"})
    >>> min_cost(p, k=3, d_min=30).replicas["op"]
    ['a', 'c', 'd']
    >>> min_cost(p, k=4, d_min=30)
    Traceback (most recent call last):
    ...
    replistream.placement.model.PlacementError: no server can host replica 4 of 'op': of 4 servers, 3 already hold a replica of 'op'; 1 fail the d_min constraint (latency to every replica of 'op' > d_min=30 ms; e.g. b is 10 ms from a). Lower d_min, raise alpha, or add servers.

    Algorithm 5, Hwang §V-A, per partition (issue #41): in a problem made with
    ``problem_from_query(..., parallelism={op: p})`` each partition ``"op.P"``
    is a node of its own, with ``1/p`` of the operator's load and its share of
    the streams, so its ``k`` replicas go on distinct servers and the load test
    counts the partition's own load. An operator too heavy for any one server
    (load 1.2 against ``alpha`` 0.8 x capacity 1) cannot be placed whole, but
    its halves (0.6 each) can, one per server:

    >>> from replistream import Query
    >>> from replistream.placement.model import QueryStats, problem_from_query
    >>> q = Query("q"); s = q.source("s", {"k": "i8"}); _ = s.window(10, by="k", name="w").sink("out")
    >>> st, L = QueryStats.estimate(q, loads={"w": 1.2}), 50 * (1 - np.eye(4))   # 50 ms apart
    >>> min_cost(problem_from_query(q, list("abcd"), L, st), k=2, d_min=30, initial="greedy")
    Traceback (most recent call last):
    ...
    replistream.placement.model.PlacementError: no server can host replica 1 of 'w': of 4 servers, 4 fail the load constraint load(s) + load(w)=1.2 < alpha=0.8 x capacity(s) (e.g. a: load 0, capacity 1). Lower d_min, raise alpha, or add servers.
    >>> halves = problem_from_query(q, list("abcd"), L, st, parallelism={"w": 2})
    >>> min_cost(halves, k=2, d_min=30, initial="greedy").plan()
    {'entry': ['a', 'b'], 'w.0': ['a', 'c'], 'w.1': ['b', 'd'], 'out': ['a']}
    """
    k = check_k(problem, k)
    placer = Placer(problem, alpha, d_min, explain)
    params = {"k": k, "alpha": alpha, "d_min": d_min,
              "initial": initial if isinstance(initial, str) else "given", **spring}
    _initial(placer, initial, spring)
    for phase in range(2, k + 1):
        for node in problem.nodes:
            if node not in problem.single:
                placer.choose(node, phase)
    return placer.placement("min-cost", params)


def check_k(problem: PlacementProblem, k) -> int:
    """``k`` as an int, checked: an integer >= 1 and no more than the problem's servers.

    >>> check_k(PlacementProblem(["a", "b"], [[0, 1], [1, 0]], []), 2)
    2
    """
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k (replicas per operator) must be an integer >= 1, got {k!r}")
    if k > len(problem.servers):
        raise PlacementError(f"k={k} replicas per operator need at least {k} servers; {len(problem.servers)} given")
    return int(k)


def _initial(placer: Placer, initial, spring: dict) -> None:
    problem = placer.problem
    if isinstance(initial, Placement):
        initial = {n: v[0] for n, v in initial.replicas.items()}
    if isinstance(initial, Mapping):
        missing = [n for n in problem.nodes if n not in initial]
        if missing:
            raise ValueError(f"the initial placement has no server for {missing}")
        for node in problem.nodes:
            srv = initial[node]
            if srv not in problem.index:
                raise ValueError(f"the initial placement puts {node!r} on unknown server {srv!r}")
            placer.add(node, problem.index[srv], 1, "given")
    elif initial == "greedy":
        for node in problem.nodes:
            placer.choose(node, 1)
    elif initial == "spring":
        from .spring import spring_relaxation

        spring_relaxation(problem, alpha=placer.alpha, placer=placer, **spring)
    else:
        raise ValueError(f"initial must be 'spring', 'greedy', or a {{node: server}} mapping, got {initial!r}")
