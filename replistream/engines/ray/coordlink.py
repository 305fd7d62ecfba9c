"""The control plane's link to its coordinator actor (:mod:`.coordinator`).

Asks it with a deadline, replaces it from the state it kept in Ray's key-value store when it is
lost (a warm standby takes over without a process start), and points every replica at the new one.

>>> plane.coord.ask_coordinator("network_cost")   # doctest: +SKIP
0.042
"""
from __future__ import annotations

import threading
import time

import ray

from ...errors import RunFailed
from . import pool
from .common import is_actor_death, is_unavailable, ray_node_down, signal_process
from .coordinator import CoordinatorActor

__all__ = ["CoordinatorLink"]


class CoordinatorLink:
    """The control plane's link to its coordinator actor (:mod:`.coordinator`).

    >>> plane.coord.ask_coordinator("network_cost")   # doctest: +SKIP
    0.042
    """

    def __init__(self, plane):
        self.plane = plane  # the :class:`~.plane.ControlPlane` this part belongs to
        self._coordinator_lock = threading.Lock()
        self._coordinator_pid: int | None = None  # known once it answers (deploy() asks)
        self._coordinator_start: int | None = None  # when that process started (the fence checks it)
        self._standby = None  # a warm coordinator that takes over if this one is lost (start_standby)

    def ask_coordinator(self, method: str, *args, timeout: float = 30.0):
        """Call the coordinator's ``method`` and return the answer. A coordinator that crashed is
        restarted by Ray and the call retried; one lost for good (killed without restart, its node
        gone) is replaced by a new one that takes up the state it kept in Ray's key-value store
        (:meth:`replace_coordinator`), and the call is asked again. Raises :class:`RunFailed`
        naming the coordinator if no answer comes within ``timeout`` s or it cannot be replaced.

        >>> dep.ask_coordinator("network_cost")   # doctest: +SKIP
        0.042
        """
        for attempt in range(3):
            h = self.plane.coordinator
            try:
                return ray.get(getattr(h, method).remote(*args), timeout=timeout)
            except Exception as e:
                lost, silent = is_actor_death(e), isinstance(e, ray.exceptions.GetTimeoutError)
                if not (lost or silent):
                    raise
                what = f"{type(e).__name__} on {method!r}" + (f" (no answer in {timeout:g} s)" if silent else "")
                down = self.node_down(what)
                if down is not None:  # nothing can start there: no replacement to wait for
                    raise down from e
                if attempt == 2:
                    raise RunFailed(f"the deployment's coordinator was lost three times during one call (it and the "
                                    f"two that replaced it; the last: {what}): it holds the "
                                    f"plan and the failure reports, so the run cannot go on; nothing after the "
                                    f"last results fetched is known to be delivered", operator="coordinator") from e
                self.replace_coordinator(h, what, fence=silent or is_unavailable(e))

    def replace_coordinator(self, lost, reason: str, fence: bool = False) -> None:
        """Start a new coordinator in place of ``lost`` (if it is still the current one), from the
        state the lost one kept in Ray's key-value store (plan, actors, reports log), and point every
        running replica at it; each sends its reports again (logged once each, by id). ``fence``:
        the lost one only stopped answering; it is killed first (SIGKILL by pid, which also ends
        a stopped process), so that one coordinator runs. Logged as a ``coordinator_replaced``
        event with the seconds it took."""
        with self._coordinator_lock:
            if self.plane.coordinator is not lost or self.plane.shut_down:
                return
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            started = time.time()
            if fence:
                try:
                    ray.kill(lost, no_restart=True)
                except Exception as e:  # logged: it may be gone already
                    self.plane.events.append({"t": self.plane.now(), "event": "kill_failed", "actor": "coordinator",
                                              "error": repr(e)})
                if self._coordinator_pid is not None:  # it runs on this process's node; the same process only
                    signal_process(self._coordinator_pid, getattr(self, "_coordinator_start", None), 9)
            new, self._standby = self._standby, None
            info = None
            if new is not None:  # the warm standby takes the state up (no process start, no imports)
                try:
                    ray.get(new.reinit.remote(self.plane.t0, self.plane.coordinator_key), timeout=30)
                    info = ray.get(new.ping.remote(), timeout=30)
                except Exception as e:  # logged; a new process instead
                    self.plane.events.append({"t": self.plane.now(), "event": "standby_failed", "error": repr(e)})
            if info is None:
                here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
                new = CoordinatorActor.options(scheduling_strategy=here, **self.plane._lifetime()).remote(
                    self.plane.t0, self.plane.coordinator_key)
                self.plane._register(new)
                try:
                    info = ray.get(new.ping.remote(), timeout=60)
                except Exception as e:
                    reached = self.plane.output.reached()
                    raise self.node_down(reason) or RunFailed(
                        f"the deployment's coordinator was lost ({reason}) and a new one did not answer within 60 s "
                        f"({type(e).__name__}): it holds the plan and the failure reports, so the run cannot go on; "
                        f"{self._complete_to(reached)}", operator="coordinator", logical_time=reached) from e
            restored = info["restored"]
            self.plane.coordinator, self._coordinator_pid = new, info["pid"]
            self._coordinator_start = info.get("start")
            self.start_standby()
            for _, h in self.plane.topology.running():  # sent, not awaited: a replica that does not answer is the detector's
                h.set_coordinator.remote(new)
            if getattr(self.plane, "_host_actor", None) is not None:  # a detached deployment's host: watched by it from now on
                new.watch_host.remote(self.plane._host_actor, self.plane.detached_as, self.plane.detector.fail_after_s,
                                      getattr(self.plane, "_host_process", None))
            self.plane.events.append({"t": self.plane.now(), "event": "coordinator_replaced", "reason": reason,
                                      "restored": restored, "seconds": round(time.time() - started, 3)})

    def node_down(self, what: str) -> RunFailed | None:
        """The error to end the run with if this process's Ray node is down
        (:func:`~.common.ray_node_down`: its raylet died, and with it the coordinator and every
        actor of the deployment on that node, all of them when Ray runs on one machine), else None.
        ``what``: how the coordinator was found lost.

        >>> dep.coord.node_down("ActorDiedError on 'failures'")   # doctest: +SKIP
        """
        down = ray_node_down()
        if down is None:
            return None
        reached = self.plane.output.reached()
        return RunFailed(f"{down}; the deployment's coordinator ({what}) and every actor of the deployment on "
                         f"that node are lost with it, and none can start there again: "
                         f"{self._complete_to(reached)}", operator="coordinator", logical_time=reached)

    @staticmethod
    def _complete_to(reached: int | None) -> str:
        if reached is None:
            return "no application had received a punctuation, so no output is known to be complete"
        return (f"every application's output is complete up to logical time {reached} (the smallest last "
                f"punctuation they received); nothing after it is known to be delivered")

    def start_standby(self) -> None:
        """Start a warm standby coordinator on the driver's node (not waited for): it holds nothing
        until :meth:`replace_coordinator` hands it the lost coordinator's key, so taking over costs
        no process start and no imports (about 1.3 s of imports here)."""
        if self._standby is not None or self.plane.shut_down:
            return
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
        kept = pool.take("CoordinatorActor")  # one an earlier deployment left (pool.py): no new process
        if kept is not None:
            kept.reinit.remote(self.plane.t0, None)  # not awaited: replace_coordinator's call waits behind it
            self._standby = kept
        else:
            self._standby = CoordinatorActor.options(scheduling_strategy=here, **self.plane._lifetime()).remote(self.plane.t0, None)
        self.plane._register(self._standby)
