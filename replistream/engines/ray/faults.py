"""Failure injection and emulated network conditions of a deployment.

Kill a replica or a server, stop and resume a process (SIGSTOP/SIGCONT), delay, cut or slow the
emulated links and servers, and play a :class:`~replistream.scenario.Scenario`'s events.

>>> plane.faults.kill_replica("join", 0)     # doctest: +SKIP
"""
from __future__ import annotations

import threading
import time

import ray

from ...partition import parse_partition_label, partition_label
from ...plan import ENTRY
from ...query import resolve_operator  # (#44) kill_replica("join", 0) for join_1
from .common import signal_process

__all__ = ["Faults"]


class Faults:
    """Failure injection and emulated network conditions of a deployment.

    >>> plane.faults.kill_replica("join", 0)     # doctest: +SKIP
    """

    def __init__(self, plane):
        self.plane = plane  # the :class:`~.plane.ControlPlane` this part belongs to
        self._pending_kills: list = []
        self._scenario_thread: threading.Thread | None = None

    def stop_replica(self, operator: str, replica: int) -> int:
        """Stop replica ``replica`` of ``operator`` (``"entry"`` for an entry point, an application's
        label for an application replica) with SIGSTOP, as a suspended VM or a frozen host would: it
        does not crash, it stops answering. Failure injection; the failure detector masks it
        (docs/reliability.md). Returns its process id (local replicas only; -1 if it no longer
        runs: nothing is signalled).

        >>> pid = dep.stop_replica("join", 0)    # doctest: +SKIP
        """
        return self._signal(operator, replica, 19)

    def resume_replica(self, operator: str, replica: int) -> int:
        """Resume a replica stopped by :meth:`stop_replica` (SIGCONT). One declared failed meanwhile
        was killed: nothing is resumed then."""
        return self._signal(operator, replica, 18)

    def _signal(self, operator: str, replica, sig: int) -> int:
        label = str(operator) if str(operator) in self.plane.topology and f"{operator}#{replica}" \
            not in self.plane.topology else self.label_of(operator, replica)  # (an application's name itself)
        if label not in self.plane.topology or self.plane.topology.handle(label) is None:
            raise ValueError(f"no replica {label!r}; actors: {sorted(self.plane.handles)}")
        if not self.plane.topology.is_running(label):  # dead, retired or declared failed: nothing to signal
            self.plane.events.append({"t": self.plane.now(), "event": "not_signalled", "actor": label, "signal": sig})
            return -1
        pid, node, start = (*self.plane.monitor._pids.get(label, (None, None)), None)[:3]
        if pid is None or start is None:
            ans = ray.get(self.plane.topology.handle(label).probe.remote(), timeout=30)
            pid, node, start = int(ans["pid"]), ans.get("node"), ans.get("start")
            self.plane.monitor._pids[label] = (pid, node, start, ans.get("actor"))
        if node is not None and node != ray.get_runtime_context().get_node_id():
            raise ValueError(f"{label} runs on another Ray node: stop_replica signals local processes only")
        signal_process(pid, start, sig)  # (nothing if it was killed meanwhile: declared failed)
        self.plane.events.append({"t": self.plane.now(), "event": "stopped" if sig == 19 else "resumed", "actor": label})
        return pid

    # -- failure injection ---------------------------------------------------------------------
    def kill(self, label: str, reason: str = "killed") -> None:
        """Kill one actor by label (``"join#1"``, ``"entry#0"``, an application name)."""
        h = self.plane.topology.handle(label)
        if h is None:
            raise ValueError(f"no actor {label!r}; actors: {sorted(self.plane.handles)}")
        if not self.plane.topology.is_running(label):
            return
        ray.kill(h, no_restart=True)
        self.plane.repairer.mark_failed(label, reason)

    def kill_replica(self, operator: str, replica: int) -> None:
        """Kill replica ``replica`` of ``operator`` (``"entry"`` for an entry point; ``"agg.1"`` for
        partition 1 of a partitioned operator)."""
        label = self.label_of(operator, replica)
        if self.plane.topology.handle(label) is None:
            raise ValueError(f"{operator!r} has no replica {replica}; actors: {sorted(self.plane.handles)}")
        self.kill(label, "replica killed")

    def label_of(self, operator: str, replica) -> str:
        """The label of replica ``replica`` of ``operator``: ``"join#1"``; ``operator`` may be a
        name the query resolves (``"join"`` for ``join_1``) and, for a partitioned operator, must
        name a partition (``"agg.1"``, ``"window.1"`` for ``window_3.1``): a ``ValueError`` names
        the partitions otherwise.

        >>> plane.faults.label_of("window.1", 0)     # doctest: +SKIP
        'window_3.1#0'
        """
        label = f"{operator}#{replica}"
        if label in self.plane.topology:
            return label
        base, part = parse_partition_label(str(operator))
        if base == ENTRY:  # the entry points: one group, or partitions "entry.P" (parallelism={"entry": p})
            parts = int(self.plane.channel_opts.get("entry_partitions") or 1)
            if parts > 1 and part is None:
                raise ValueError(f"the entry points run as {parts} partitions; name one of them: "
                                 f"{', '.join(partition_label(ENTRY, i) for i in range(parts))}")
            if part is not None and parts == 1:
                raise ValueError(f"the entry points are not partitioned; name them {ENTRY!r}")
            return label
        node = resolve_operator(self.plane.query, base)  # "join" for join_1, or a QueryError saying what to write
        parts = (self.plane.channel_opts.get("partitions") or {}).get(node)
        if parts and part is None:
            raise ValueError(f"{node!r} runs as {parts} partitions; name one of them: "
                             f"{', '.join(partition_label(node, i) for i in range(parts))}")
        if part is not None and not parts:
            raise ValueError(f"{node!r} is not partitioned; name it {node!r}")
        return f"{node if part is None else partition_label(node, part)}#{replica}"

    def kill_server(self, server: str) -> list[str]:
        """Kill every actor on ``server``; on a cluster with ``Server.node`` set, remove the Ray node."""
        if server not in self.plane.servers:
            raise ValueError(f"unknown server {server!r}; servers: {sorted(self.plane.servers)}")
        victims = [label for label, _ in self.plane.topology.running() if self.plane.topology.server(label) == server]
        self.plane.repairer._lost_servers.add(server)
        node = self.plane.servers[server].node
        if self.plane.cluster is not None and node:
            for n in list(self.plane.cluster.list_all_nodes()):
                if getattr(n, "node_id", None) == node:
                    self.plane.cluster.remove_node(n)
            for label in victims:
                self.plane.repairer.mark_failed(label, f"server {server} removed")
        else:
            for label in victims:
                self.kill(label, f"server {server} killed")
        return victims

    # -- network conditions -------------------------------------------------------------------
    def _net_event(self, desc: dict) -> None:
        self.plane.events.append({"t": self.plane.now(), **desc})
        self._broadcast_network()

    def slow_server(self, server: str, factor: float, duration: float | None = None) -> None:
        """Stretch processing on ``server`` by ``factor`` (for ``duration`` s, or until restored)."""
        now = self.plane.now()
        self.plane.conditions.slow_server(server, now, now + duration if duration else float("inf"), factor)
        self._net_event({"event": "slow_server", "server": server, "factor": factor})

    def delay_link(self, a: str, b: str, extra_ms: float, duration: float | None = None,
                   both_directions: bool = True) -> None:
        """Add ``extra_ms`` to the emulated link ``a -> b`` (and ``b -> a`` unless told not to)."""
        now = self.plane.now()
        self.plane.conditions.add_delay(a, b, now, now + duration if duration else float("inf"), extra_ms,
                                        both_directions)
        self._net_event({"event": "delay_link", "a": a, "b": b, "extra_ms": extra_ms,
                         "both_directions": both_directions})

    def cut_link(self, a: str, b: str, duration: float | None = None) -> None:
        """Cut the emulated link between ``a`` and ``b`` (for ``duration`` s, or until restored)."""
        now = self.plane.now()
        self.plane.conditions.cut(a, b, now, now + duration if duration else float("inf"))
        self._net_event({"event": "cut_link", "a": a, "b": b})

    def restore(self, a: str | None = None, b: str | None = None, server: str | None = None) -> None:
        """End the delays, cuts and slow-downs on a link or a server."""
        self.plane.conditions.restore(a=a, b=b, server=server, at=self.plane.now())
        self._net_event({"event": "restore", "a": a, "b": b, "server": server})

    def _broadcast_network(self) -> None:
        self.plane.tell({label: h.set_network.remote(self.plane.conditions) for label, h in self.plane.topology.running()})

    def install_scenario(self, scenario) -> None:
        """Validate ``scenario`` against this deployment and install its network events."""
        ops = {n: self.plane.k for n in self.plane.query.operators}
        ops[ENTRY] = len(self.plane.topology.replicas(ENTRY))
        scenario.validate(servers=list(self.plane.servers), operators=ops)
        self._pending_kills = scenario.apply_to(self.plane.conditions, 0.0)

    def _start_scenario_thread(self, scenario) -> None:
        kills = sorted(self._pending_kills, key=lambda e: e.at)

        def loop():
            for ev in kills:
                delay = self.plane.t0 + ev.at - time.time()
                if delay > 0:
                    time.sleep(delay)
                try:
                    if ev.action == "kill_server":
                        self.kill_server(ev.server)
                    elif ev.action == "kill_replica":
                        self.kill_replica(ev.operator, ev.replica)
                    self.plane.events.append({"t": self.plane.now(), "event": ev.action,
                                              "target": ev.server or f"{ev.operator}#{ev.replica}"})
                except Exception as e:  # recorded, not fatal
                    self.plane.events.append({"t": self.plane.now(), "event": "error", "error": repr(e)})

        self._scenario_thread = threading.Thread(target=loop, daemon=True, name="replistream-scenario")
        self._scenario_thread.start()
