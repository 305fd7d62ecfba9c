"""The control plane of a deployment: one object, in the process that runs the deployment (the
driver's, or a detached deployment's host actor), split by responsibility.

:class:`ControlPlane` holds what its parts share: the query and the plan, the
:class:`~.topology.Topology` (the one live view of replicas and stream replicas), the run clock,
the events, the :class:`~.feeder.Feeder`, the control loop (:class:`~.control.ReplicaManager`)
and the coordinator's handle; it starts, registers and stops the deployment's actors. Its parts:

================  =====================================================================
``monitor``       :class:`~.monitor.Monitor`: probes, failure detector, reports, dropped links
``repairer``      :class:`~.repair.Repairer`: crashes and their repair
``coord``         :class:`~.coordlink.CoordinatorLink`: the coordinator, its standby and replacement
``output``        :class:`~.results.Results`: results fetched, wait, collect, metrics
``faults``        :class:`~.faults.Faults`: failure injection and network conditions
``ingest``        :class:`~.ingest.Ingest`: feed, the run clock, a feed resumed after a restore
``reconfig``      :class:`~.changes.Changes`: revive, add, move replicas; change the running query
================  =====================================================================

A user never holds it: :func:`~.deployment.deploy` returns a :class:`~.deployment.Deployment`,
a thin client that forwards each public name to the part that answers it (:data:`API`).

>>> plane = ControlPlane(query, servers, 2, plan, conditions, 0, opts, False, "dead_letter", None)  # doctest: +SKIP
>>> plane.output.wait(60)                                                                           # doctest: +SKIP
"""
from __future__ import annotations

import contextvars
import threading
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from contextlib import contextmanager, nullcontext
from typing import Any, Iterable

import ray

from ...placement.nodes import ray_options
from ...partition import parse_partition_label
from ...plan import ENTRY, PhysicalPlan, ReplicaId, label_group, replica_index
from ...query import Query
from . import pool
from .actors import EntryActor, ReplicaActor, SinkActor
from .common import READY_S, inside, is_actor_death, wait_quietly
from .control import GCConfig, ReplicaManager
from .coordinator import CoordinatorActor
from .detector import DEFAULT_FAIL_AFTER_S, DEFAULT_SUSPECT_AFTER_S, FailureDetector
from .feeder import Feeder
from .changes import Changes
from .coordlink import CoordinatorLink
from .faults import Faults
from .ingest import Ingest
from .monitor import Monitor
from .repair import Repairer
from .results import Delivered, Results
from .topology import Topology


__all__ = ["ControlPlane", "PARTS", "DETACHED_AS", "owner_of", "resolve"]

#: Set by a detached deployment's host (host.py) while it deploys: the deployment's name. The
#: deployment's actors are then detached and its state persisted (:mod:`.lifecycle`).
DETACHED_AS: contextvars.ContextVar[str | None] = contextvars.ContextVar("replistream_detached_as", default=None)


#: The parts of a control plane (attributes of :class:`ControlPlane`), in the order a name is looked up.
PARTS = ("monitor", "repairer", "coord", "output", "faults", "ingest", "reconfig")


def owner_of(plane: "ControlPlane", name: str):
    """What answers ``name`` for ``plane``: the plane itself (the state its parts share) or the part
    that implements it. Raises ``AttributeError`` naming it if none does.

    >>> type(owner_of(plane, "kill_replica")).__name__     # doctest: +SKIP
    'Faults'
    """
    if name in vars(plane) or hasattr(type(plane), name):
        return plane
    for part in PARTS:
        obj = getattr(plane, part)
        if name in vars(obj) or hasattr(type(obj), name):
            return obj
    raise AttributeError(f"a deployment has no attribute {name!r}")


def resolve(plane: "ControlPlane", name: str):
    """``name`` of ``plane`` (a value, or a bound method of the part that implements it).

    >>> resolve(plane, "fault_tolerance")()["fault_tolerance"]     # doctest: +SKIP
    1
    """
    return getattr(owner_of(plane, name), name)


#: The id of the client's call the host runs now (:meth:`~.host.DeploymentHost.call`; None: a call of
#: this process): a change records it, so the same call sent again is made once.
CALL_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("replistream_call_id", default=None)


class ControlPlane:
    """A deployment's control plane (see the module doc); built by :func:`~.deployment.deploy`, or by
    :func:`~.lifecycle.restore` from the state a lost host kept (``restored``)."""

    def __init__(self, query: Query, servers: list, k: int, plan: dict, conditions, seed: int,
                 channel_opts: dict, strict: bool, on_malformed: str, parquet_dir: str | None, cluster=None,
                 gc: GCConfig | None = None, suspect_after_s: float = DEFAULT_SUSPECT_AFTER_S,
                 fail_after_s: float = DEFAULT_FAIL_AFTER_S, reporter=None, file_sinks: Mapping | None = None,
                 restored: dict | None = None):
        from ...progress import Reporter

        #: The name of the detached deployment this one is (None: a deployment of the script). Its
        #: actors are then detached (no process owns them: they outlive the host that started them)
        #: and its state is kept in Ray's key-value store as it changes (:mod:`.lifecycle`).
        self.detached_as: str | None = DETACHED_AS.get() if restored is None else restored["name"]
        self._registry: dict[str, Any] = {}  # actor id -> handle of every actor it started or took
        self._persister = None  # lifecycle.Persister of a detached deployment
        if self.detached_as is not None and restored is None:
            from .lifecycle import Persister

            self._persister = Persister(self)  # its thread starts once deployed (host.py)

        self.file_sinks = dict(file_sinks or {})  # {app: ParquetSink}: its replicas write the files
        rep = reporter or Reporter("deploy", enabled=False)
        self.show_progress: bool | None = None  # deploy(progress=): run() shows its phases alike
        self.query = query
        # the failure detector for slowness (detector.py), fed by the monitor thread's probes
        self.detector = FailureDetector(suspect_after_s, fail_after_s)
        # its parts, by responsibility (each keeps its own state; the state they share is here)
        self.monitor = Monitor(self)
        self.repairer = Repairer(self)
        self.coord = CoordinatorLink(self)
        self.output = Results(self)
        self.faults = Faults(self)
        self.ingest = Ingest(self)
        self.reconfig = Changes(self)
        self._retired_letters: list = []  # dead letters of replicas stopped by the deployment (retired)
        self.channel_opts = dict(channel_opts)
        self.strict = strict
        self.on_malformed = on_malformed  # a repaired entry replica reads records alike
        self.servers = {s.name: s for s in servers}
        self.k = k
        self.plan = plan
        self.conditions = conditions
        self.seed = seed
        self.cluster = cluster
        self.placement = None  # the Placement behind the plan (set by deploy)
        self.t0 = time.time()
        self.speed: float | None = None
        self.ts0 = 0.0  # timestamp replayed at t0 when paced
        self.events: list[dict] = []
        self.changes: list[dict] = []  # every change made to the running query (replistream.replica.changes)
        self.rescaling = threading.Event()  # set while a rescale runs (rescale.py): repairs wait for it
        self.rescale_done = threading.Event()  # set as a rescale ends
        physical = PhysicalPlan(query, plan, parallelism=self.channel_opts.get("partitions"),
                                bits=self.channel_opts.get("bits"), keep_single=True, applications=True,
                                entry_partitions=self.channel_opts.get("entry_partitions")) \
            if restored is None else restored["physical"]
        self._physical = physical  # the plan it started with (a warm spare's arguments)
        self.topology = Topology(physical) if restored is None else restored["topology"]
        if restored is None:
            self._start_actors(query, physical, parquet_dir, rep)
        self._init_run_state(query, gc)

    #: Seconds deploy() waits for the stream replicas to be connected.
    CONNECT_TIMEOUT_S = 120.0

    def _start_actors(self, query: Query, physical: PhysicalPlan, parquet_dir: str | None, rep) -> None:
        """Start the coordinator and every replica of ``physical``, and connect every upstream
        replica to every downstream replica (``deploy()``; a restored deployment finds them running)."""
        # the coordinator lives on the driver's own Ray node: losing another node never takes it along
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
        wanted = Counter({"CoordinatorActor": 2})  # it and its standby
        for r in physical.replicas():
            if not ray_options(self.servers[physical.server(r)]):  # a local logical server: a kept or warm actor
                wanted[self._actor_class(query, r.node).__ray_metadata__.class_name] += 1
        pool.prefetch(wanted)
        rep.phase("starting the coordinator")
        # its state in Ray's key-value store, under the deployment's epoch (the last part of the key)
        self.coordinator_key = f"replistream/coordinator/{self.channel_opts.get('epoch') or uuid.uuid4().hex}"
        self.coordinator = self._settle(*self._start(CoordinatorActor, {"scheduling_strategy": here}, self.t0,
                                                     self.coordinator_key, local=True))
        conditions, channel_opts, strict, on_malformed = (self.conditions, self.channel_opts, self.strict,
                                                          self.on_malformed)
        started = []  # every actor at once (kept ones re-initialised, see pool.py), then one wait
        for r in physical.replicas():
            server = physical.server(r)
            if r.node == ENTRY:
                started.append((r.label, self._start(EntryActor, ray_options(self.servers[server]), query, r.index,
                                                     server, conditions, self.t0, channel_opts, self.coordinator,
                                                     strict, on_malformed, partition=r.partition)))
            else:
                parquet = None if parquet_dir is None or not r.application else inside(parquet_dir, r.node)
                started.append((r.label, self._new_actor(query, r.node, r.index, server, physical.channels(r.node),
                                                         parquet_dir=parquet, partition=r.partition,
                                                         groups=physical.channel_groups(r.node))))
        rep.phase("starting replicas", total=len(started))
        for label, begun in started:
            self.topology.attach(label, self._settle(*begun))
            rep.advance()
        # every upstream replica feeds every downstream replica
        topo = self.topology
        rep.phase("connecting stream replicas", total=len(list(physical.streams())))
        calls = {topo.handle(e.src.label).connect.remote(e.stream, e.dst.label, physical.server(e.dst),
                                                         topo.handle(e.dst.label), e.port, e.channel): e
                 for e in physical.streams()}
        pending, deadline = list(calls), time.time() + self.CONNECT_TIMEOUT_S
        while pending:  # the bar advances as each connection is made (issue #44: it sat at 0% until all were)
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=0.1)
            ray.get(done, timeout=READY_S)
            rep.advance(len(done))
            if pending and time.time() > deadline:
                late = sorted(f"{calls[r].src.label}->{calls[r].dst.label}" for r in pending)
                raise RuntimeError(f"{len(late)} stream replica(s) not connected within {self.CONNECT_TIMEOUT_S:g} s "
                                   f"(their senders did not answer): {late[:5]}")

    def _init_run_state(self, query: Query, gc) -> None:
        """What a run keeps beside its actors (results fetched, repairs, the feeder, the control loop)."""
        self.delivered = Delivered([])
        for app in query.sinks:
            self.delivered.add(app, [r.label for r in self.topology.replicas(app)])
            if app in self.file_sinks and not self.file_sinks[app].keep:
                self.delivered.keep[app] = False  # its tuples stay in its files (counted, not fetched)
        self.shut_down = False
        self.feeder = Feeder(self.topology, on_start=self.ingest._feed_started, on_sentinel=self.ingest._run_sentinel,
                             on_entry_failed=self.repairer.mark_failed, suspected=self.detector.is_suspected,
                             entry_partitions=int(self.channel_opts.get("entry_partitions") or 1),
                             entry_of=lambda src: query.build_entry(src, False, "dead_letter"))
        self.manager: ReplicaManager | None = None if gc is None else ReplicaManager(self, gc)

    # -- views of the topology ------------------------------------------------------------------
    @property
    def alive(self) -> dict[str, bool]:
        """``{actor label: running}`` of every actor the deployment started, but those of removed
        operators and retired partitions (:attr:`removed`)."""
        gone = self.topology.removed()
        return {label: on for label, on in self.topology.alive().items() if label not in gone}

    @property
    def handles(self) -> dict[str, Any]:
        """``{actor label: Ray actor handle}`` of every actor the deployment started, but those of
        removed operators and retired partitions (:attr:`removed`)."""
        gone = self.topology.removed()
        return {label: h for label, h in self.topology.handles().items() if label not in gone}

    @property
    def actor_server(self) -> dict[str, str]:
        """``{actor label: server}`` of every actor the deployment started."""
        return self.topology.servers()

    @property
    def sinks(self) -> dict[str, Any]:
        """``{application: actor handle}``."""
        return {r.label: self.topology.handle(r.label) for r in self.topology.replicas()
                if r.kind == "application" and self.topology.handle(r.label) is not None}

    @property
    def removed(self) -> set[str]:
        """Replicas of operators removed from the running query, and of partitions a rescale to
        fewer partitions retired."""
        return self.topology.removed()

    @property
    def fed(self) -> list[tuple[float, str, int]]:
        """``(seconds since the start, source, chunk number)`` of every chunk the feeder sent."""
        return self.feeder.fed

    @property
    def started(self) -> bool:
        """True once :meth:`feed` started the run clock (``t0``)."""
        return self.feeder.started

    def now(self) -> float:
        """Seconds since the run started (``t0``: set again when feeding starts)."""
        return time.time() - self.t0

    # -- actors -----------------------------------------------------------------------------------
    def new_actor(self, query: Query, node: str, index: int, server: str, channels: list[int],
                  pending: bool = False, parquet_dir: str | None = None, partition: int | None = None,
                  groups: list | None = None):
        """Start an actor for replica ``index`` of operator or application ``node`` of ``query`` on
        ``server`` (``channels``: stream replicas per input port); not registered in the topology.
        ``pending``: it waits for a hand-over before processing (:class:`~.actors.ReplicaActor`).
        ``partition``: of a partitioned operator; ``groups``: per input port, the upstream
        partition of each channel (None for an unpartitioned upstream)."""
        return self._settle(*self._new_actor(query, node, index, server, channels, pending, parquet_dir,
                                             partition, groups))

    @staticmethod
    def _actor_class(query: Query, node: str):
        """The actor class a replica of ``node`` runs in: entry point, application or operator."""
        return EntryActor if node == ENTRY else SinkActor if query.spec(node).kind == "sink" else ReplicaActor

    def _new_actor(self, query: Query, node: str, index: int, server: str, channels: list[int],
                   pending: bool = False, parquet_dir: str | None = None, partition: int | None = None,
                   groups: list | None = None) -> tuple:
        opts = ray_options(self.servers[server])
        if groups is not None and all(g is None for g in groups):
            groups = None
        if self._actor_class(query, node) is SinkActor:
            return self._start(SinkActor, opts, query, node, server, channels, self.conditions, self.t0,
                               self.channel_opts, self.coordinator, self.strict, parquet_dir,
                               label=ReplicaId(node, index, application=True, partition=partition).label,
                               sink=self.file_sinks.get(node),
                               groups=groups)
        return self._start(ReplicaActor, opts, query, node, index, server, channels, self.conditions, self.t0,
                           self.channel_opts, self.coordinator, self.strict, pending, partition, groups)

    def _start(self, cls, opts: dict, *args, local: bool = False, **kwargs) -> tuple:
        """Begin starting an actor of ``cls``: one kept by an earlier deployment (:mod:`.pool`),
        re-initialised, when the server is a local logical one (no Ray options; ``local``: the
        options only pin it to the driver's node), else a new process. A detached deployment's
        actors are detached (no process owns them, :mod:`.lifecycle`). Every actor is registered
        (:meth:`_register`) before it is used. Returns what :meth:`_settle` takes."""
        h = pool.take(cls.__ray_metadata__.class_name) if local or not opts else None
        if self.detached_as is not None:
            opts = {**opts, "lifetime": "detached"}
        if h is not None:
            self._register(h)
            return h, h.reinit.remote(*args, **kwargs), cls, opts, args, kwargs
        h = cls.options(**opts).remote(*args, **kwargs)
        self._register(h)
        return h, None, cls, opts, args, kwargs

    def _settle(self, h, reinit, cls, opts, args, kwargs):
        """The actor begun by :meth:`_start`; a kept one that died while kept is replaced by a new process."""
        if reinit is None:
            return h
        try:
            ray.get(reinit, timeout=60)
            return h
        except Exception as e:
            if not is_actor_death(e):
                raise
            h = cls.options(**opts).remote(*args, **kwargs)
            self._register(h)
            return h

    def _register(self, h) -> None:
        """Record actor ``h`` as this deployment's (a detached one writes it to its persisted state at
        once: after a restore, an actor it started but never attached is found and stopped)."""
        self._registry[h._actor_id.hex()] = h
        if self._persister is not None:
            self._persister.registered(h)

    def start_spares(self, n: int) -> int:
        """Start ``n`` warm spare replica actors, kept idle in :mod:`.pool` for the replicas this
        deployment will start while it runs (not waited for: they start beside the run). Returns
        how many the pool took."""
        rep = next((r for r in self.topology.replicas() if r.kind == "operator"), None)
        if rep is None or n <= 0:
            return 0
        kept = 0
        for i in range(n):
            # given the coordinator's handle although it reports nothing: the first deserialisation of
            # an actor handle in a process costs ~0.13 s here, which a repair would otherwise pay
            h = ReplicaActor.options(**self._lifetime()).remote(self.query, rep.operator, 10_000 + i, rep.server,
                                    list(self._physical.channels(rep.operator)), self.conditions, self.t0,
                                    self.channel_opts, self.coordinator, self.strict, False)
            self._register(h)
            h.stop_sending.remote()
            kept += pool.keep_spare("ReplicaActor", h)
        return kept

    def set_clock(self, handles: Iterable, timeout: float = 120) -> None:
        """Give the actors ``handles`` the feeder's clock (``t0``, ``ts0``, pace) and wait for them."""
        ray.get([h.set_clock.remote(self.t0, self.ts0, self.speed) for h in handles], timeout=timeout)

    def start_replica(self, label: str, channels: list[int], pending: bool = True, groups: list | None = None):
        """Start the actor of the topology's replica ``label`` (a revived or new one; ``"agg.1#2"`` of
        a partition) with the current query and clock and attach it; returns its handle.
        ``groups``: per input port, the upstream partition of each channel (None: unpartitioned)."""
        rep = self.topology.replica(label)
        idx = replica_index(label)
        _, part = parse_partition_label(label_group(label))
        h = self.new_actor(self.query, rep.operator, idx if idx is not None else 0, rep.server, channels, pending,
                           partition=part, groups=groups)
        self.set_clock([h])
        self.topology.attach(label, h)
        return h

    def stop_actors(self, actors: Iterable[tuple[str, Any]], why: str) -> None:
        """``ray.kill`` each ``(label, handle)`` (no failure is reported: a retired or removed replica,
        or the end of the deployment); a kill that raises is logged as a ``kill_failed`` event."""
        for label, h in actors:
            try:
                ray.kill(h, no_restart=True)
            except Exception as e:  # logged: the actor may already be gone
                self.events.append({"t": self.now(), "event": "kill_failed", "actor": label, "why": why,
                                    "error": repr(e)})

    def retire(self, label: str) -> None:
        """Garbage collection made ``label`` dormant: the topology says so, and an operator replica's
        actor stops (not a failure: no drop broadcast); an entry replica keeps running, fed."""
        if self.topology.retire(label):
            h = self.topology.handle(label)
            try:  # its dead letters stay part of the run's (a peer may hold them too: merged by id)
                self._retired_letters.extend(ray.get(h.dead_letters.remote(), timeout=self.detector.suspect_after_s))
            except Exception as e:  # noqa: BLE001 - logged; its peers' letters stand for its own
                self.events.append({"t": self.now(), "event": "no_answer", "actor": label, "call": "dead_letters",
                                    "error": repr(e)})
            self.stop_actors([(label, h)], "retired")

    # -- the control loop: hand-over, revival, garbage collection ----------------------------------
    def control_loop(self) -> ReplicaManager:
        """The control loop (:class:`~.control.ReplicaManager`); without ``gc=``, one created on first
        use that only applies requests (no periods run unless :meth:`feed` starts it later).

        >>> dep.control_loop().handover.replace_replica("join#0", checkpoint=False)   # doctest: +SKIP
        """
        if self.manager is None:
            self.manager = ReplicaManager(self, GCConfig(gc=False))  # not started: applies requests only
        return self.manager

    @contextmanager
    def quiet(self):
        """No control action (if a control loop exists) and no chunk sent while the block runs
        (locks 1 and 2 of :mod:`replistream.engines.ray`)."""
        with (self.manager.lock if self.manager is not None else nullcontext()), self.feeder.held():
            yield

    @contextmanager
    def gated(self, lead_us: int = 0):
        """No control action while the block runs, and no chunk fed past ``T0`` (the block gets it:
        the largest timestamp fed so far plus ``lead_us``), while chunks up to ``T0`` are still fed
        (:meth:`Feeder.gated <replistream.engines.ray.feeder.Feeder.gated>`): for a change placed at
        ``T0`` that must reach every replica before any later tuple does (locks 1 and 2, the feeder's
        only while ``T0`` is taken).

        >>> with dep.gated(lead_us=250_000) as t0: ...   # doctest: +SKIP
        """
        with (self.manager.lock if self.manager is not None else nullcontext()), self.feeder.gated(lead_us) as t0:
            yield t0

    def record_change(self, rec: dict) -> dict:
        """Log a change to the running query (in :attr:`changes` and :attr:`events`); returns the record
        with ``t`` (seconds since the start) and, for a client's call to a detached deployment, the
        call's id (``call``: :data:`CALL_ID`, see :meth:`change_made`)."""
        rec = {"t": round(self.now(), 3), **rec}
        if CALL_ID.get() is not None:
            rec["call"] = CALL_ID.get()
        self.changes.append(rec)
        self.events.append({"event": "change", **rec})
        return rec

    def change_made(self) -> dict | None:
        """The change the client's call running now made already (:data:`CALL_ID`): the call was sent
        again to a new host process after the one running it was lost (Ray retries a call in flight),
        and the change had been written whole before (:meth:`~.lifecycle.Persister.held`). None: make it.

        >>> plane.change_made() is None     # doctest: +SKIP
        True
        """
        call = CALL_ID.get()
        return None if call is None else next((c for c in self.changes if c.get("call") == call), None)

    def tell(self, calls: Mapping[str, Any], timeout: float = 30.0) -> list[BaseException]:
        """Wait for calls whose failure is noticed elsewhere (``{label: ObjectRef}``: settings sent
        to every replica, disconnections), like :func:`~.common.wait_quietly`, but never on a
        replica the failure detector suspects (a stopped one gets the call when it answers again,
        calls run in order): at most ``timeout`` s in all. Returns the errors of those that failed."""
        ready = self._ask_all(calls, timeout)
        return wait_quietly([ref for ref in calls.values() if ref in ready], timeout=0)

    def _ask_all(self, asked: Mapping[str, Any], timeout: float) -> set:
        """Wait for the calls ``asked`` (``{label: ObjectRef}``, or ``{"label|anything": ...}`` for
        several calls to one actor) until every one to an actor not
        suspected by the failure detector has answered, or ``timeout`` s: nothing waits on a
        replica that stopped answering. Returns the refs that are ready."""
        refs = list(asked.values())
        if not refs:
            return set()
        deadline = time.time() + timeout
        while True:
            ready = set(ray.wait(refs, num_returns=len(refs), timeout=min(0.05, max(0.0, deadline - time.time())))[0])
            waiting = [key for key, ref in asked.items() if ref not in ready  # key: a label, or "label|..."
                       and not self.detector.is_suspected(key.split("|", 1)[0])]
            if not waiting or time.time() >= deadline:
                return ready

    #: The run's failure, once a detached deployment's monitor found one (None: none so far).
    failure: str | None = None

    def _lifetime(self) -> dict:
        """Ray options of a new actor of this deployment: detached for a detached deployment."""
        return {"lifetime": "detached"} if self.detached_as is not None else {}

    # -- teardown ------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Kill every actor of the deployment (Ray itself keeps running)."""
        self.shut_down = True
        if self.monitor._monitor_thread is not None:
            self.monitor._monitor_thread.join(10)
        if self.manager is not None:
            self.manager.stop()
        running = self.topology.stop_all()
        wait_quietly([self.coordinator.forget.remote()], timeout=5)  # its kept state goes with the deployment
        if self.repairer._repair_thread is not None:
            self.repairer._repair_thread.join(30)
        for t in list(self.monitor._reconnect_threads):
            t.join(30)
        threads = [self.feeder.thread, self.faults._scenario_thread, self.repairer._repair_thread, self.monitor._monitor_thread,
                   *self.monitor._reconnect_threads,
                   None if self.manager is None else getattr(self.manager, "_thread", None)]
        silent = self._silent_actors()
        if pool.pool_size() and self.detached_as is None and not any(t is not None and t.is_alive() for t in threads):
            # every actor stops sending and settles; local ones may be kept for the next deployment
            kinds = {"entry": "EntryActor", "application": "SinkActor"}
            # one that cannot answer (stopped by a fault and not resumed, or suspected by the
            # detector) is killed first, not kept: the pool would wait its whole deadline on it, and
            # on every actor with a call to it in flight (which its death completes), keeping none
            self.stop_actors([(label, h) for label, h in running if label in silent], "shutdown")
            running = [(label, h) for label, h in running if label not in silent]
            named = [(None if ray_options(self.servers[self.actor_server[label]]) else
                      kinds.get(self.topology.replica(label).kind, "ReplicaActor"), h) for label, h in running]
            label_of = {id(h): label for label, h in running}
            for h in [self.coordinator, self.coord._standby]:
                if h is not None:
                    named.append(("CoordinatorActor", h))
                    label_of[id(h)] = "coordinator"
            running = [(label_of[id(h)], h) for _, h in pool.recycle(named)]
        else:
            running.append(("coordinator", self.coordinator))
            if self.coord._standby is not None:
                running.append(("coordinator", self.coord._standby))
        self.stop_actors(running, "shutdown")
        self._remove_temp_files(silent)  # (a stopped process writes nothing more before its kill ends it)

    def _remove_temp_files(self, labels) -> None:
        """Remove what the sink replicas among ``labels`` (stopped ones, killed at shutdown) left
        half written in their application's folder (:meth:`~replistream.sinks.ParquetSink.remove_temp_files`).

        >>> dep._remove_temp_files({"out#1"})   # doctest: +SKIP
        """
        ops = {}
        for label in labels:
            try:
                ops[label] = self.topology.replica(label).operator
            except KeyError:  # (not a replica of the topology: nothing of it in a sink's folder)
                continue
        for app, sink in self.file_sinks.items():
            sink.remove_temp_files([label for label, op in ops.items() if op == app])

    def _silent_actors(self) -> set[str]:
        """Labels of replicas that will not answer the pool's ``stop_sending``: stopped
        (``stop_replica``, SIGSTOP) and not resumed since, or suspected by the failure detector.

        >>> dep._silent_actors()   # doctest: +SKIP
        {'per_k#0'}
        """
        stopped: dict[str, bool] = {}
        for e in list(self.events):
            if e.get("event") in ("stopped", "resumed"):
                stopped[e.get("actor")] = e["event"] == "stopped"
        return {label for label, on in stopped.items() if on} | set(self.detector.suspected())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()

