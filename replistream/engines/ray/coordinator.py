"""The coordinator actor of a deployment: the placement plan, statistics, the reports log.

One per deployment (Hwang §II-B, §V). It owns the plan the deployment was
started with and the :class:`~replistream.placement.Placement` behind it,
computes new placements with :mod:`replistream.placement` under measured
statistics, and keeps the log of what actors report (dropped stream replicas,
garbage-collection and revival decisions). It lives apart from the data-path
actors (:mod:`.actors`) because it needs the placement library (scipy), which
only this actor's process imports.

Its loss does not end the run. Everything it holds (the plan, the actors it was
given, the reports log) is written to Ray's internal key-value store under the
deployment's key as it changes, so the coordinator the deployment puts in its
place (a warm standby, re-initialised with the key) picks the state up where it
was. Reports carry an id (``rid``), and one already logged is not logged again:
replicas send their reports again to a new coordinator.

>>> coordinator = CoordinatorActor.remote(time.time(), "replistream/coordinator/demo")  # doctest: +SKIP
>>> ray.get(coordinator.network_cost.remote())                    # doctest: +SKIP
"""
from __future__ import annotations

import os
import time
from typing import Any

import ray
from ray import cloudpickle
from ray.experimental import internal_kv

from . import lockorder
from .common import is_actor_death

# The placement library (scipy) is imported where a placement is computed, not here: every replica
# deserialises the coordinator's handle, which imports this module in its process (py-spy: 1-2 s of
# a warm actor's re-initialisation went to importing scipy that way).

__all__ = ["CoordinatorActor", "KV_NAMESPACE"]

#: The namespace of Ray's internal key-value store where coordinators keep their state.
KV_NAMESPACE = "replistream"


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

    ``key``: where its state lives in Ray's internal key-value store (namespace
    :data:`KV_NAMESPACE`); a coordinator started with the key of one that was
    lost resumes from that state (``restored`` says so). None keeps nothing.
    """

    def __init__(self, t0: float, key: str | None = None):
        self.t0 = t0
        self.key = key
        self._log_lock = lockorder.lock("CoordinatorActor._log_lock", 1)  # the log (its one lock: the host watcher's thread logs too)
        self.events: list[dict] = []
        self._rids: set = set()  # ids of the reports logged (a report sent twice is logged once)
        # operator, or partition "op.P" of a partitioned one -> (punctuation, replica, checkpoint): keep_dormant
        self.dormant: dict[str, tuple] = {}
        self.query = None
        self.servers: list = []
        self._placement = None  # the Placement of the running plan (None if it could not be costed)
        self._plan: dict[str, list[str]] = {}
        self.handles: dict[str, Any] = {}
        self.actor_server: dict[str, str] = {}
        self.stats = None  # QueryStats from the last collect_stats()
        self.proposed = None  # the last Placement computed by place()
        self.restored = self._restore()

    # -- state kept in Ray's key-value store ----------------------------------------------------
    def _kv(self, name: str) -> str:
        return f"{self.key}/{name}"

    def _restore(self) -> dict | None:
        """Take up the state a lost coordinator with the same key left (None if there is none)."""
        if self.key is None:
            return None
        raw = internal_kv._internal_kv_get(self._kv("plan"), namespace=KV_NAMESPACE)
        keys = sorted(internal_kv._internal_kv_list(self._kv("ev/"), namespace=KV_NAMESPACE))
        if raw is None and not keys:
            return None
        if raw is not None:
            st = cloudpickle.loads(raw)
            self.query, self.servers, self._placement = st["query"], st["servers"], st["placement"]
            self._plan, self.handles, self.actor_server = st["plan"], st["handles"], st["actor_server"]
        for k in keys:  # the log in chunks of EVENTS_PER_KEY
            for e in cloudpickle.loads(internal_kv._internal_kv_get(k, namespace=KV_NAMESPACE)):
                self.events.append(e)
                if e.get("rid") is not None:
                    self._rids.add(e["rid"])
        from .lifecycle import get_value

        for k in internal_kv._internal_kv_list(self._kv("dormant/"), namespace=KV_NAMESPACE):
            k = k.decode() if isinstance(k, bytes) else k
            if "#" not in k.rpartition("/")[2]:
                self.dormant[k.rpartition("/")[2]] = get_value(k)
        info = {"events": len(self.events), "plan": raw is not None, "dormant": sorted(self.dormant)}
        self._log({"kind": "coordinator_restored", "t": time.time() - self.t0, **info})
        return info

    #: Reports per key of the log in the key-value store (the last chunk is written again as it grows).
    EVENTS_PER_KEY = 64

    def _log(self, e: dict) -> None:
        """Append ``e`` to the reports log, and to the key-value store (before it counts as logged)."""
        with self._log_lock:
            if self.key is not None:
                c = len(self.events) // self.EVENTS_PER_KEY
                chunk = self.events[c * self.EVENTS_PER_KEY:] + [e]
                internal_kv._internal_kv_put(self._kv(f"ev/{c:09d}"), cloudpickle.dumps(chunk),
                                             namespace=KV_NAMESPACE)
            self.events.append(e)

    def _keep_plan(self) -> None:
        if self.key is not None:
            st = {"query": self.query, "servers": self.servers, "placement": self._placement, "plan": self._plan,
                  "handles": self.handles, "actor_server": self.actor_server}
            internal_kv._internal_kv_put(self._kv("plan"), cloudpickle.dumps(st), namespace=KV_NAMESPACE)

    def forget(self) -> int:
        """The deployment ended: drop the state kept in the key-value store (and stop watching its
        host). Returns the keys dropped."""
        self._unwatch()
        if self.key is None:
            return 0
        return int(internal_kv._internal_kv_del(self.key + "/", del_by_prefix=True, namespace=KV_NAMESPACE))

    def lock_order(self) -> dict:
        """This process's record of the order it took its locks in (:func:`.lockorder.report`).

        >>> ray.get(coordinator.lock_order.remote())["violations"]   # doctest: +SKIP
        []
        """
        return lockorder.report()

    def ping(self) -> dict:
        """Answers once the coordinator runs: its ``pid``, when that process started (``start``, for a
        fence that checks before it kills) and what it ``restored`` (None: it started fresh)."""
        from .common import process_start

        return {"pid": os.getpid(), "start": process_start(os.getpid()), "restored": self.restored}

    # -- watching a detached deployment's host ---------------------------------------------------
    #: Seconds between two looks at the host.
    WATCH_EVERY_S = 0.5

    def watch_host(self, host, name: str, fail_after_s: float, process: tuple | None = None) -> bool:
        """Watch detached deployment ``name``'s host actor (slow is dead, docs/reliability.md): a
        thread asks it for its process every :attr:`WATCH_EVERY_S`; a host that does not answer
        within ``fail_after_s`` (a stopped process, a frozen host) is fenced (SIGKILL of the process
        it last answered from, checked by pid and start time, on its node), so Ray restarts it and
        the new process restores the deployment (:mod:`.lifecycle`). A host Ray is restarting is
        left to Ray. Called by the host after it deployed or restored (again by each new host or
        coordinator), with its own ``process`` ``(pid, start, node)``: a host that stops before it
        ever answered the watcher is fenced too. Logged as ``host_fenced`` reports.

        >>> ray.get(coordinator.watch_host.remote(host, "monitor", 4.0))   # doctest: +SKIP
        True
        """
        import threading

        self._watch = (host, name, float(fail_after_s), None if process is None else tuple(process))
        if getattr(self, "_watcher", None) is None or not self._watcher.is_alive():
            self._watch_stop = threading.Event()
            self._watcher = threading.Thread(target=self._watch_loop, daemon=True, name="replistream-watch-host")
            self._watcher.start()
        return True

    def _watch_loop(self) -> None:
        from .common import fence_process

        seen = None  # (pid, start, node) of the host process that last answered
        last_error, watched = None, None
        while not self._watch_stop.wait(self.WATCH_EVERY_S):
            if self._watch is not watched:  # a new host process to watch: it said who it is
                watched = self._watch
                seen = watched[3] or seen
            host, name, fail_after, _ = watched
            try:
                info = ray.get(host.process.remote(), timeout=fail_after)
                seen = (info["pid"], info.get("start"), info.get("node"))
                self.host_seen = (time.time(), seen)  # (what a status or a test reads)
            except ray.exceptions.GetTimeoutError:
                if seen is not None:
                    fence_process(*seen)
                    self._log({"kind": "host_fenced", "t": time.time() - self.t0, "deployment": name,
                               "pid": seen[0], "reason": f"no answer within {fail_after:g} s"})
                seen = None
            except Exception as e:  # noqa: BLE001 - dead for good (stopped) or restarting: Ray's, not ours
                if repr(e) != last_error:  # (said once per kind of error: a restart raises several alike)
                    self._log({"kind": "host_probe_error", "t": time.time() - self.t0, "deployment": name,
                               "error": repr(e)[:300]})
                    last_error = repr(e)
                seen = None

    def _unwatch(self) -> None:
        stop = getattr(self, "_watch_stop", None)
        if stop is not None:
            stop.set()

    # -- reuse by a later deployment (pool.py): it holds no thread and sends nothing -------------
    def stop_sending(self) -> bool:
        self._unwatch()
        return True

    def settled(self) -> tuple[bool, bool]:
        return True, True

    def reinit(self, t0: float, key: str | None = None) -> bool:
        """Become the coordinator of another deployment (every attribute dropped, ``__init__`` again)."""
        self._unwatch()
        self.forget()
        for name in [n for n in self.__dict__ if not n.startswith("_ray")]:
            del self.__dict__[name]
        self.__init__(t0, key)
        return True

    def report(self, kind: str, info: dict) -> None:
        """Log a replica's report (``kind``: ``channel_dropped``, ``fatal``, ...); one whose ``rid``
        was logged already is not logged again, one of another deployment (its ``epoch`` is not
        this coordinator's key's last part) is not logged at all."""
        epoch = info.get("epoch")
        if epoch is not None and self.key is not None and epoch != self.key.rpartition("/")[2]:
            self.stale_reports = getattr(self, "stale_reports", 0) + 1  # another deployment's: not this run's
            return
        rid = info.get("rid")
        if rid is not None:
            if rid in self._rids:
                return
            self._rids.add(rid)
        self._log({"kind": kind, **info})

    def keep_dormant(self, operator: str, replica: str, punctuation: int, checkpoint) -> bool:
        """Keep ``operator``'s dormant checkpoint (Rhino's dormant replica, Del Monte 2017): sent by
        its last live replica at ``punctuation``; ``operator`` is a partition ``"op.P"`` for a
        partitioned operator (each partition has its own); the newest replaces the one before. Logged as a
        ``dormant_checkpoint`` report (the deployment then lets upstream replicas trim their output
        up to it). Kept in Ray's key-value store too (before it is logged), so a coordinator that
        replaces a lost one has it."""
        prev = self.dormant.get(operator)
        if prev is not None and prev[0] > punctuation:
            return False
        self.dormant[operator] = (int(punctuation), replica, checkpoint)
        if self.key is not None:
            from .lifecycle import put_value

            put_value(self._kv(f"dormant/{operator}"), self.dormant[operator])
        self._log({"kind": "dormant_checkpoint", "operator": operator, "replica": replica,
                   "punctuation": int(punctuation), "t": time.time() - self.t0})
        return True

    def dormant_checkpoint(self, operator: str):
        """``(punctuation, replica, checkpoint)`` of ``operator``'s (or partition ``"op.P"``'s) newest
        dormant checkpoint, or None."""
        return self.dormant.get(operator)

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
        self._keep_plan()
        self._log({"kind": "placement", "t": time.time() - self.t0, "strategy": getattr(placement, "strategy", None),
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
        ready = set(ray.wait(list(refs.values()), num_returns=len(refs), timeout=2.0)[0]) if refs else set()
        actors = {}
        for label, ref in refs.items():  # one deadline for all: the deployment fences a silent coordinator
            if ref not in ready:
                continue  # busy or stopped: no statistics from it this time
            try:
                actors[label] = ray.get(ref)
            except Exception as e:
                if not is_actor_death(e):
                    raise
                continue  # dead: no statistics from it
        from ...placement.model import QueryStats

        self.stats = QueryStats.from_metrics(self.query, {"actors": actors}, duration)
        self._log({"kind": "stats", "t": time.time() - self.t0, "actors": len(actors)})
        return self.stats

    def place(self, k: int | None = None, strategy: str = "min-cost", **params) -> dict:
        """Compute a placement for the deployment's query with the latest statistics.

        Returns ``{"strategy", "plan", "network_cost", "current_network_cost"}``,
        both costs under the same (latest) statistics; the Placement is kept
        as ``proposed``. Nothing is moved.
        """
        from ...placement.model import with_stats
        from ...placement.policy import place
        from ...placement.result import Placement

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
