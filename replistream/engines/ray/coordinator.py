"""The coordinator actor of a deployment: the placement plan, statistics, the reports log.

One per deployment (Hwang §II-B, §V). It owns the plan the deployment was
started with and the :class:`~replistream.placement.Placement` behind it,
computes new placements with :mod:`replistream.placement` under measured
statistics, and keeps the log of what actors report (dropped stream replicas,
garbage-collection and revival decisions). It lives apart from the data-path
actors (:mod:`.actors`) because it needs the placement library (scipy), which
only this actor's process imports.

>>> coordinator = CoordinatorActor.remote(time.time())             # doctest: +SKIP
>>> ray.get(coordinator.network_cost.remote())                    # doctest: +SKIP
"""
from __future__ import annotations

import time
from typing import Any

import ray

from ...placement.model import QueryStats, with_stats
from ...placement.policy import place
from ...placement.result import Placement

__all__ = ["CoordinatorActor"]


@ray.remote(num_cpus=0, max_restarts=0)
class CoordinatorActor:
    """The deployment's coordinator (Hwang §II-B, §V): owns the placement plan.

    It holds the plan the deployment was started with and the
    :class:`~replistream.placement.Placement` behind it (its network cost and
    why each replica went where it did), collects statistics from the
    replicas (stream rates, per-replica load), computes placements with the
    pure functions of :mod:`replistream.placement` under the measured
    statistics (Algorithm 5 by default), and keeps the event log of reports
    (dropped channels, failures) that the metrics expose. The deployment
    applies the initial plan when it starts the actors; moving running
    replicas to a new plan is left to the revival and state-transfer work.
    """

    def __init__(self, t0: float):
        self.t0 = t0
        self.events: list[dict] = []
        self.query = None
        self.servers: list = []
        self._placement = None  # the Placement of the running plan (None if it could not be costed)
        self._plan: dict[str, list[str]] = {}
        self.handles: dict[str, Any] = {}
        self.actor_server: dict[str, str] = {}
        self.stats = None  # QueryStats from the last collect_stats()
        self.proposed = None  # the last Placement computed by place()

    # -- reuse by a later deployment (pool.py): it holds no thread and sends nothing -------------
    def stop_sending(self) -> bool:
        return True

    def settled(self) -> tuple[bool, bool]:
        return True, True

    def reinit(self, t0: float) -> bool:
        """Become the coordinator of another deployment (every attribute dropped, ``__init__`` again)."""
        for name in [n for n in self.__dict__ if not n.startswith("_ray")]:
            del self.__dict__[name]
        self.__init__(t0)
        return True

    def report(self, kind: str, info: dict) -> None:
        self.events.append({"kind": kind, **info})

    def log(self) -> list[dict]:
        return list(self.events)

    def reports_since(self, n: int) -> list[dict]:
        """The reports logged after the first ``n`` (the driver's monitor reads them in turn)."""
        return list(self.events[int(n):])

    def failures(self) -> list[dict]:
        """The run's failures: replicas whose own code raised (``"fatal"`` reports), and links a sender
        dropped because its receiver raised (a receiver that could not report it itself); then
        ``"died"`` entries, receivers a sender found dead (a crash, not a failure of the run)."""
        fatal = [e for e in self.events if e["kind"] == "fatal"]
        raised = [{"kind": "raised", "replica": e["to"], "operator": e["to"].rpartition("#")[0], "logical_time": None,
                   "user_function": False, "error": "RayTaskError",
                   "message": f"{e['reason']} (reported by its sender {e['from']})", "row": None, "cause": None}
                  for e in self.events
                  if e["kind"] == "channel_dropped" and str(e.get("reason", "")).startswith("receiver raised")]
        died = [{"kind": "died", "replica": e["to"], "reason": f"{e['reason']} (reported by its sender {e['from']})"}
                for e in self.events
                if e["kind"] == "channel_dropped" and str(e.get("reason", "")).startswith("receiver died")]
        return fatal + raised + died  # a replica's own report names more (its logical time, the row)

    # -- the plan ------------------------------------------------------------------------------
    def set_placement(self, query, servers: list, placement, handles: dict | None = None,
                      actor_server: dict | None = None) -> bool:
        """Take ownership of the running plan (``placement``: a Placement, or None) and the actors."""
        self.query = query
        self.servers = list(servers)
        self._placement = placement
        if placement is not None:
            self._plan = placement.plan()
        self.handles = dict(handles or {})
        self.actor_server = dict(actor_server or {})
        if not self._plan and self.actor_server:
            plan: dict[str, list[str]] = {}
            for label, srv in sorted(self.actor_server.items()):
                plan.setdefault(label.rsplit("#", 1)[0], []).append(srv)
            self._plan = plan
        self.events.append({"kind": "placement", "t": time.time() - self.t0,
                            "strategy": getattr(placement, "strategy", None),
                            "network_cost": self.network_cost()})
        return True

    def plan(self) -> dict[str, list[str]]:
        """``{node: [server, ...]}`` of the running deployment."""
        return {n: list(v) for n, v in self._plan.items()}

    def placement(self):
        """The :class:`~replistream.placement.Placement` of the running plan (None if not costed)."""
        return self._placement

    def network_cost(self) -> float | None:
        """Network cost (sum of rate x latency over stream replicas) of the running plan."""
        return None if self._placement is None else float(self._placement.network_cost)

    def explain(self) -> str:
        """Why every replica runs where it does."""
        return "no placement" if self._placement is None else self._placement.explain()

    # -- statistics and new placements ----------------------------------------------------------
    def collect_stats(self, duration_s: float | None = None):
        """Ask every live actor for its statistics; returns and keeps the resulting QueryStats.

        Rates: tuples each stream replica carried per second of ``duration_s``
        (default: since the coordinator started), in bytes/s; loads: busy
        time per second of each replica, averaged per operator.
        """
        if self.query is None:
            raise RuntimeError("the coordinator has no deployment yet (set_placement was not called)")
        duration = float(duration_s) if duration_s else max(time.time() - self.t0, 1e-3)
        refs = {label: h.stats.remote() for label, h in self.handles.items()}
        actors = {}
        for label, ref in refs.items():
            try:
                actors[label] = ray.get(ref, timeout=10)
            except Exception:
                continue  # dead or unreachable: no statistics from it
        self.stats = QueryStats.from_metrics(self.query, {"actors": actors}, duration)
        self.events.append({"kind": "stats", "t": time.time() - self.t0, "actors": len(actors)})
        return self.stats

    def place(self, k: int | None = None, strategy: str = "min-cost", **params) -> dict:
        """Compute a placement for the deployment's query with the latest statistics.

        Returns ``{"strategy", "plan", "network_cost", "current_network_cost"}``,
        both costs under the same (latest) statistics; the Placement is kept
        as ``proposed``. Nothing is moved.
        """
        if self._placement is None:
            raise RuntimeError("the running plan has no cost model (it could not be costed at deploy time)")
        problem = self._placement.problem
        if self.stats is not None:
            problem = with_stats(problem, self.query, self.stats)
        k = k or self._placement.k
        self.proposed = place(problem, k, strategy, **params)
        current = Placement(problem, {n: self._placement.replicas[n] for n in problem.nodes}, "current")
        return {"strategy": strategy, "plan": self.proposed.plan(), "network_cost": self.proposed.network_cost,
                "current_network_cost": current.network_cost}
