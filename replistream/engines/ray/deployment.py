"""Deploy a replicated query on Ray and run it (Hwang §II-B).

:func:`deploy` checks the request before any actor starts (servers, placement,
network, the garbage-collection settings: :mod:`.resolve`), places ``k`` replicas
of every operator on distinct servers, starts the actors (entry points, operator
replicas, applications: :mod:`.actors`; the coordinator: :mod:`.coordinator`),
connects every upstream replica to every downstream replica as the
:class:`~replistream.plan.PhysicalPlan` says, and returns a :class:`Deployment`.

A :class:`Deployment` is what a user holds. It owns

* the :class:`~.topology.Topology`, the one live view of replicas and stream replicas;
* the :class:`~.feeder.Feeder`, which hands the input to the entry replicas;
* :class:`Delivered`, what the applications delivered so far;
* the control loop (:class:`~.control.ReplicaManager`: garbage collection, revival,
  hand-over by request), when ``gc=`` is given or a hand-over is asked for;

and offers: run, feed, wait, poll, results, collect, metrics; failure injection
(kill a replica or a server) and network conditions (delay, cut, slow, restore);
and thin methods handing over to the control loop (revive, add, move replicas)
and to :mod:`.reconfigure` (changes to the running query).

>>> import replistream as rs                                  # doctest: +SKIP
>>> dep = rs.deploy(query, servers=6, k=2, network="geo")     # doctest: +SKIP
>>> result = dep.run(inputs, pace=1.0)                        # doctest: +SKIP
>>> result.outputs["alerts"][:3]                              # doctest: +SKIP
"""
from __future__ import annotations

import contextvars
import json
import os
import queue
import re
import threading
import time
import traceback
import uuid
import warnings
from collections.abc import Mapping
from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Iterable

import numpy as np
import ray

from ...errors import QueryError, RunFailed, UserFunctionError, merge_dead_letters
from ...idle import Heartbeat, idle_timeouts
from ...operators.base import NO_PUNCTUATION
from ...placement.nodes import ray_options
from ...plan import ENTRY, PhysicalPlan, ReplicaId, replica_index
from ...query import Query, check_on_error
from ...keywords import checked_keywords  # (#44) deploy(..., paralelism=2): "did you mean", every keyword
from ...query import resolve_operator  # (#44) kill_replica("join", 0) for join_1
from ...summary import WaitSummary  # (#44) what wait() returns
from ...schema import END, TS
from ...sources import Handed, Sentinel
from ..result import RunResult
from . import pool, reconfigure
from .actors import EntryActor, ReplicaActor, SinkActor
from .common import fence_process, is_actor_death, is_unavailable, json_default, signal_process, wait_quietly
from .control import GCConfig, ReplicaManager
from .coordinator import CoordinatorActor
from .detector import DEFAULT_FAIL_AFTER_S, DEFAULT_SUSPECT_AFTER_S, FailureDetector
from .feeder import Feeder
from .lifecycle import kill_actors
from .resolve import (evaluate_plan, placement_network, resolve_network, resolve_placement_with_cost,
                      resolve_servers)
from .topology import Topology

__all__ = ["RAY_SYSTEM_CONFIG", "Delivered", "Deployment", "deploy", "init_ray"]

#: Set by a detached deployment's host (host.py) while it deploys: the deployment's name. The
#: deployment's actors are then detached and its state persisted (:mod:`.lifecycle`).
DETACHED_AS: contextvars.ContextVar[str | None] = contextvars.ContextVar("replistream_detached_as", default=None)

#: Ray settings replistream starts Ray with. Packets up to this size travel inline
#: in the actor call instead of through the object store (see channels.py: a dead
#: sender's objects stall their receiver about a second each). On a cluster you
#: start yourself, pass the same ``_system_config`` to ``ray.init``/``ray start``.
RAY_SYSTEM_CONFIG = {"max_direct_call_object_size": 8 * 1024 * 1024}


def init_ray(address: str | None = None, verbose: bool = False, **kwargs) -> None:
    """Start (or join) Ray the way replistream expects, if it is not running yet.

    Without ``address`` a new local instance starts even when another Ray
    cluster runs on the machine (``address="local"``); give ``address`` to join one.
    Ray is quiet unless ``verbose``: its own log lines stay in its log files
    (``/tmp/ray/session_latest/logs``), the raylet's routine warning that it started
    more worker processes than CPUs (every replica is an actor with its own process)
    is dropped, and its other messages go to stderr, never to stdout
    (:func:`quiet_ray_messages`). ``verbose=True`` (the CLI's ``--verbose``) keeps
    Ray's defaults. Other keyword arguments go to ``ray.init``.

    >>> init_ray(num_cpus=2)  # doctest: +SKIP
    """
    if ray.is_initialized():
        return
    opts = {"include_dashboard": False}
    if not verbose:
        opts.update(logging_level="ERROR", log_to_driver=False)
        quiet_ray_messages()
    local = address is None or address == "local"
    if local:
        opts["address"] = "local"
        opts["_system_config"] = dict(RAY_SYSTEM_CONFIG)
    else:
        opts["address"] = address
    opts.update(kwargs)
    if not local:
        hostport = str(address).split("://")[-1]
        if address != "auto" and "://" not in str(address) and re.fullmatch(r"[\w.-]+:\d+", hostport):
            from .cluster import answers

            if not answers(hostport, timeout=2.0):  # ray.init would retry for minutes
                raise ConnectionError(f"no Ray cluster answers at {address} (RAY_ADDRESS or address=): start one "
                                      f"there (`replistream up`), or unset RAY_ADDRESS to run on a Ray of this "
                                      f"script's own")
        _same_auth_as_ray_start()
    loopback = local or str(address).split("://")[-1].startswith(("127.0.0.1:", "localhost:"))
    if not loopback or "_node_ip_address" in kwargs:
        ray.init(**opts)
    else:
        with _loopback():
            ray.init(**opts)
    if not local:  # a running cluster: its warm pool of actor processes serves this script's deployments
        from . import warm

        warm.use_cluster(True)


#: Messages the raylet sends every driver that are routine for replistream: each replica is an
#: actor in its own worker process, so a deployment starts more of them than there are CPUs.
RAY_ROUTINE_MESSAGES = re.compile(r"PYTHON worker processes have been started")


def _same_auth_as_ray_start() -> None:
    """Before joining a cluster: use token authentication when this machine has a Ray token
    (``~/.ray/auth_token``), as ``ray start`` (and so ``replistream up``) does unless
    ``RAY_AUTH_MODE`` says otherwise; without it, a driver is refused ("InvalidAuthToken")."""
    if os.environ.get("RAY_AUTH_MODE") is not None:
        return  # said explicitly
    try:
        from ray._private.authentication.authentication_token_setup import (AuthenticationTokenLoader,
                                                                            _enable_token_auth)
    except ImportError:  # pragma: no cover - a Ray without token authentication
        return
    if AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True):
        _enable_token_auth()  # what Ray's own helper does, without its warning on every connection


def quiet_ray_messages() -> None:
    """Route the messages Ray's raylet sends this driver (printed by Ray on stdout, prefixed
    ``(raylet)``) to stderr, dropping :data:`RAY_ROUTINE_MESSAGES`: stdout carries a command's
    verdict and table only. Others (a worker killed for memory, an actor that could not be
    scheduled) still reach the user. Idempotent; a Ray without this hook is left as it is.

    >>> quiet_ray_messages()
    >>> import ray._private.worker as w
    >>> w.print_to_stdstream({"lines": ["WARNING: 12 PYTHON worker processes have been started on node"],
    ...                       "pid": "raylet", "is_err": False}, ignore_prefix=False)   # dropped
    """
    try:
        import ray._private.worker as worker
    except ImportError:  # pragma: no cover - another Ray layout
        return
    original = getattr(worker, "print_to_stdstream", None)
    if original is None or getattr(original, "replistream_quiet", False):
        return

    def print_to_stdstream(data, ignore_prefix, *args, **kwargs):
        if data.get("pid") == "raylet":
            lines = [line for line in data.get("lines", []) if not RAY_ROUTINE_MESSAGES.search(str(line))]
            if not lines:
                return None
            data = dict(data, lines=lines, is_err=True)
        return original(data, ignore_prefix, *args, **kwargs)

    print_to_stdstream.replistream_quiet = True
    worker.print_to_stdstream = print_to_stdstream


@contextmanager
def _loopback():
    """A local Ray instance on the loopback interface only (docs/reliability.md): its node address is
    127.0.0.1, so its servers (GCS, raylet, object manager, every worker's) listen there and not on
    every interface. Ray turns a given 127.0.0.1 into the machine's address unless it runs in its
    single-machine mode (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``), which this sets while Ray starts
    (the processes it starts keep it)."""
    from ray._private import ray_constants

    name = ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR
    before_env, before = os.environ.get(name), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[name], ray_constants.ENABLE_RAY_CLUSTER = "0", False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before
        if before_env is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before_env


def inside(folder: str, name: str) -> str:
    """``folder/name``, refused (ValueError) unless it lies inside ``folder`` once resolved: every
    output path replistream writes is built this way (docs/reliability.md).

    >>> inside("/tmp/out", "alerts")
    '/tmp/out/alerts'
    >>> inside("/tmp/out/inner", "../escape")
    Traceback (most recent call last):
    ...
    ValueError: output path for '../escape' would lie outside '/tmp/out/inner'
    """
    base = os.path.realpath(folder)
    path = os.path.realpath(os.path.join(base, name))
    if os.path.commonpath([base, path]) != base or path == base:
        raise ValueError(f"output path for {name!r} would lie outside {folder!r}")
    return path


def ship_user_code(query: Query) -> list[str]:
    """Make the modules that define the query's user functions travel with them by value.

    Ray pickles a function by reference to its module, which the actor processes must then be able
    to import; a function defined in the user's own script or module (not an installed package)
    could not be, and every replica would fail to start. Such modules are registered with
    cloudpickle to be pickled by value; returns their names.

    >>> ship_user_code(Query())
    []
    """
    import dataclasses
    import sys
    import sysconfig

    from ray import cloudpickle

    installed = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib")}
    found = []
    for node in query.graph.nodes:
        spec = query.spec(node)
        values = [getattr(spec, f.name) for f in dataclasses.fields(spec)] if dataclasses.is_dataclass(spec) else []
        for v in list(values):
            if isinstance(v, Mapping):
                values.extend(v.values())
            elif isinstance(v, tuple):
                values.extend(v)
            elif hasattr(v, "fn"):
                values.append(v.fn)
        for fn in values:
            name = getattr(fn, "__module__", None) if callable(fn) else None
            mod = sys.modules.get(name) if name else None
            path = getattr(mod, "__file__", None)
            if (mod is None or path is None or name == "__main__" or name.split(".")[0] == "replistream"
                    or any(path.startswith(p) for p in installed) or name in found):
                continue
            cloudpickle.register_pickle_by_value(mod)
            found.append(name)
    return found


# -- what the applications delivered -------------------------------------------------------

class Delivered:
    """The applications' output fetched into the driver: per application its batches, their
    arrival times (wall time), the last punctuation, and the callbacks to run on new batches.
    ``lock`` (re-entrant) guards it (lock 3 of the deployment's order, :mod:`replistream.engines.ray`);
    :meth:`Deployment.poll` holds it while it fetches, so two polls never fetch the same tuples.

    An application with several replicas (``deploy(..., app_replicas=)``) keeps the first copy of
    each tuple, by id, whichever replica delivered it (its replicas' positions are kept apart).

    >>> d = Delivered(["out"]); d.add_batch("out", np.zeros(2, dtype=[("ts", "i8"), ("id", "u8")]), np.array([5.0, 6.0]))
    >>> d.count("out"), d.arrivals("out").tolist()
    (2, [5.0, 6.0])
    >>> d.add("two", ["two", "two#1"]); b = np.array([(1, 7), (2, 8)], dtype=[("ts", "i8"), ("id", "u8")])
    >>> d.add_batch("two", b, np.zeros(2), "two"); d.add_batch("two", b[::-1], np.ones(2), "two#1")
    >>> d.count("two"), d.fetched["two#1"]
    (2, 2)
    """

    def __init__(self, apps: Iterable[str]):
        self.lock = threading.RLock()
        self.fetched: dict[str, int] = {}
        self.batches: dict[str, list] = {}
        self.arrival_times: dict[str, list] = {}
        self.punctuation: dict[str, int] = {}
        self.callbacks: dict[str, list[Callable]] = {}
        self.seen: dict[str, set | None] = {}  # ids delivered, for an application with several replicas
        self.keep: dict[str, bool] = {}  # False: tuples go to the callbacks only (Deployment.on_output(keep=False))
        self.handed_off: dict[str, int] = {}  # tuples of an application not kept, handed to its callbacks
        for app in apps:
            self.add(app)

    def add(self, app: str, labels: list[str] | None = None) -> None:
        """Start tracking application ``app`` (one added at run time, too), whose replicas are
        ``labels`` (default: one, labelled ``app``)."""
        labels = [app] if labels is None else list(labels)
        with self.lock:
            self.batches[app], self.arrival_times[app] = [], []
            for label in labels:
                self.fetched[label] = 0
            self.seen[app] = set() if len(labels) > 1 else None
            self.punctuation[app], self.callbacks[app] = int(np.iinfo(np.int64).min), []
            self.keep[app], self.handed_off[app] = True, 0

    def add_batch(self, app: str, data: np.ndarray, arrivals: np.ndarray, label: str | None = None) -> None:
        """Record a batch newly fetched from replica ``label`` of ``app`` (default: its only one),
        keeping only tuples no replica delivered before, and run the callbacks on them."""
        with self.lock:
            self.fetched[label or app] += len(data)
            seen = self.seen[app]
            if seen is not None and len(data):
                ids = data["id"].tolist()
                fresh = np.fromiter((i not in seen for i in ids), dtype=bool, count=len(ids))
                seen.update(ids)
                data, arrivals = data[fresh], arrivals[fresh]
            if not len(data):
                return
            if self.keep[app]:
                self.batches[app].append(data)
                self.arrival_times[app].append(arrivals)
            else:
                self.handed_off[app] += len(data)
            for cb in self.callbacks[app]:
                cb(data)

    def complete(self) -> bool:
        """True when every application received the end of every stream."""
        with self.lock:
            return all(p == END for p in self.punctuation.values())

    def count(self, app: str) -> int:
        """Tuples fetched from ``app`` so far (those handed to callbacks only, too)."""
        with self.lock:
            return int(sum(len(b) for b in self.batches[app])) + self.handed_off[app]

    def arrivals(self, app: str) -> np.ndarray:
        """Wall times the tuples of ``app`` arrived at, in fetch order."""
        with self.lock:
            parts = list(self.arrival_times[app])
        return np.concatenate(parts) if parts else np.zeros(0)

    def tuples(self, app: str, schema) -> np.ndarray:
        """The tuples of ``app`` fetched so far, in arrival order."""
        with self.lock:
            parts = list(self.batches[app])
        return np.concatenate(parts) if parts else schema.empty()


# -- the deployment ------------------------------------------------------------------------

class Deployment:
    """A replicated query running on Ray. Created by :func:`deploy` (see the module doc).

    Read-only views of its replicas (built from :attr:`topology`): :attr:`alive`,
    :attr:`handles`, :attr:`actor_server`, :attr:`sinks`, :attr:`removed`. ``plan`` is
    the placement ``{node: [server, ...]}`` it started with (plus operators added at run
    time); ``query`` the query as changed at run time (:mod:`.reconfigure`).

    >>> with deploy(query, servers=4, k=2) as dep:      # doctest: +SKIP
    ...     res = dep.run(inputs)
    """

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
        self._probes: dict[str, Any] = {}  # label -> outstanding probe
        self._probed: dict[str, float] = {}  # label -> when it was last probed
        # label -> (pid, Ray node, process start, actor id) from its probes: who the fence may kill
        self._pids: dict[str, tuple] = {}
        self._reports_seen = 0  # coordinator reports handled by the monitor (_handle_reports)
        self._dropped_links: set[tuple[str, str]] = set()  # (sender, receiver) links dropped, not by a death
        self._link_drops: dict[tuple[str, str], dict] = {}  # per dropped link: when, why, reconnections tried
        self._reconnect_threads: list[threading.Thread] = []
        self._fetches: dict[str, tuple[Any, int]] = {}  # application replica -> outstanding fetch, from
        self._retired_letters: list = []  # dead letters of replicas stopped by the deployment (retired)
        self._monitor_thread: threading.Thread | None = None
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
        self._pending_kills: list = []
        self._scenario_thread: threading.Thread | None = None
        physical = PhysicalPlan(query, plan) if restored is None else restored["physical"]
        self._physical = physical  # the plan it started with (a warm spare's arguments)
        self.topology = Topology(physical) if restored is None else restored["topology"]
        self._coordinator_lock = threading.Lock()
        self._coordinator_pid: int | None = None  # known once it answers (deploy() asks)
        self._coordinator_start: int | None = None  # when that process started (the fence checks it)
        self._standby = None  # a warm coordinator that takes over if this one is lost (start_standby)
        self._dormant_of: dict[str, str] = {}  # operator -> its last live replica sending dormant checkpoints
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
                                                     strict, on_malformed)))
            else:
                parquet = None if parquet_dir is None or not r.application else inside(parquet_dir, r.node)
                started.append((r.label, self._new_actor(query, r.node, r.index, server, physical.channels(r.node),
                                                         parquet_dir=parquet)))
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
            ray.get(done)
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
        self._raised_since: float | None = None  # when a sender first reported that its receiver raised
        self._pings: dict[str, Any] = {}  # label -> outstanding liveness ping (_notice_deaths)
        self._pinged: dict[str, float] = {}  # label -> when it was last pinged
        self.shut_down = False
        self.repair = False  # deploy(repair=True): a crashed operator replica is replaced (_repair_loop)
        self.spares = 0
        self.repairs: list[dict] = []  # one record per repair tried (see _repair_loop)
        self._repair_queue: queue.Queue = queue.Queue()
        self._repair_thread: threading.Thread | None = None
        self._lost_servers: set[str] = set()
        self.feeder = Feeder(self.topology, on_start=self._feed_started, on_sentinel=self._run_sentinel,
                             on_entry_failed=self.mark_failed, suspected=self.detector.is_suspected)
        self.manager: ReplicaManager | None = None if gc is None else ReplicaManager(self, gc)

    # -- views of the topology ------------------------------------------------------------------
    @property
    def alive(self) -> dict[str, bool]:
        """``{actor label: running}`` of every actor the deployment started."""
        return self.topology.alive()

    @property
    def handles(self) -> dict[str, Any]:
        """``{actor label: Ray actor handle}`` of every actor the deployment started."""
        return self.topology.handles()

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
        """Replicas of operators removed from the running query."""
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
                  pending: bool = False, parquet_dir: str | None = None):
        """Start an actor for replica ``index`` of operator or application ``node`` of ``query`` on
        ``server`` (``channels``: stream replicas per input port); not registered in the topology.
        ``pending``: it waits for a hand-over before processing (:class:`~.actors.ReplicaActor`)."""
        return self._settle(*self._new_actor(query, node, index, server, channels, pending, parquet_dir))

    def _new_actor(self, query: Query, node: str, index: int, server: str, channels: list[int],
                   pending: bool = False, parquet_dir: str | None = None) -> tuple:
        opts = ray_options(self.servers[server])
        if query.spec(node).kind == "sink":
            return self._start(SinkActor, opts, query, node, server, channels, self.conditions, self.t0,
                               self.channel_opts, self.coordinator, self.strict, parquet_dir,
                               label=ReplicaId(node, index, application=True).label, sink=self.file_sinks.get(node))
        return self._start(ReplicaActor, opts, query, node, index, server, channels, self.conditions, self.t0,
                           self.channel_opts, self.coordinator, self.strict, pending)

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

    def start_replica(self, label: str, channels: list[int], pending: bool = True):
        """Start the actor of the topology's replica ``label`` (a revived or new one) with the
        current query and clock and attach it; returns its handle."""
        rep = self.topology.replica(label)
        idx = replica_index(label)
        h = self.new_actor(self.query, rep.operator, idx if idx is not None else 0, rep.server, channels, pending)
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

        >>> dep.control_loop().replace_replica("join#0", checkpoint=False)   # doctest: +SKIP
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

    def revive_replica(self, operator: str, replica: int, strategy: str | None = None,
                       bins_per_step: int | None = None, bits: int | None = None,
                       pause_ms: float = 20.0, lag_ms: float | None = None) -> dict:
        """Replace replica ``replica`` of ``operator`` (running or crashed) by a new replica on the same
        server, built by hand-over from a live peer (docs/design.md, decision 7, Hwang §V-C); returns the event.

        ``strategy`` (``"all-at-once"``, ``"batched"``, ``"fluid"``) moves the checkpoint in steps of
        ``2**bits`` bins at the peer's punctuations (Megaphone §3.3; docs/migration.md); at one
        punctuation the peer takes the next step, and more while its pause stays within
        ``pause_ms`` beyond a step's fixed cost (0: one step per punctuation), holding a step back
        while its output lags more than ``lag_ms`` above its recent minimum (see :meth:`move_replica`).

        >>> dep.revive_replica("correlate", 0)["new_replicas"][0]["label"]   # doctest: +SKIP
        'correlate#2'
        """
        return self.control_loop().replace_replica(f"{operator}#{replica}", strategy=strategy,
                                                   bins_per_step=bins_per_step, bits=bits, pause_ms=pause_ms,
                                                   lag_ms=lag_ms)

    def add_replica(self, operator: str, strategy: str | None = None, bins_per_step: int | None = None,
                    bits: int | None = None, pause_ms: float = 20.0, lag_ms: float | None = None) -> dict:
        """Add a replica of ``operator`` (on the server Algorithm 5 picks) by hand-over from a live peer
        (``strategy`` as for :meth:`revive_replica`).

        >>> dep.add_replica("correlate")["action"]   # doctest: +SKIP
        'create-replica'
        """
        first = next((r.label for r in self.topology.replicas(operator)), None)
        if first is None:
            raise ValueError(f"{operator!r} is not an operator of query {self.query.name!r}")
        return self.control_loop().replace_replica(first, add=True, strategy=strategy, bins_per_step=bins_per_step,
                                                   bits=bits, pause_ms=pause_ms, lag_ms=lag_ms)

    def move_replica(self, operator: str, replica: int, server: str, strategy: str = "all-at-once",
                     bins_per_step: int | None = None, bits: int | None = None, pause_ms: float = 20.0,
                     lag_ms: float | None = None) -> dict:
        """Move replica ``replica`` of ``operator`` to ``server`` while the query runs: a new replica
        there takes the state in steps (Megaphone §3.3: ``"all-at-once"``, ``"batched"`` with
        ``bins_per_step``, ``"fluid"``; ``2**bits`` bins, default 256) from a live peer (the
        replica itself if it is the only one) that keeps serving between steps, taking at one
        punctuation as many steps as keep its pause within ``pause_ms`` beyond a step's fixed
        cost (0: one step per punctuation), and holding a step back while its output lags more than
        ``lag_ms`` (default ``max(pause_ms, 10)``) above its recent minimum (pacing by the live path,
        docs/migration.md); then the old replica retires. Returns the logged event (``handover`` has
        the transfer's figures).

        >>> ev = dep.move_replica("counts", 0, "s3", strategy="fluid", bits=6)   # doctest: +SKIP
        >>> ev["new_replicas"][0]["server"], ev["handover"]["counts#1"]["steps"]   # doctest: +SKIP
        ('s3', 64)
        """
        label = f"{operator}#{replica}"
        if self.topology.handle(label) is None:
            raise ValueError(f"no replica {label!r}")
        if not self.topology.is_running(label):
            raise ValueError(f"{label} is not running; revive it with revive_replica")
        return self.control_loop().replace_replica(label, server=server, strategy=strategy or "all-at-once",
                                                   bins_per_step=bins_per_step, bits=bits, pause_ms=pause_ms,
                                                   lag_ms=lag_ms)

    def transfers(self) -> list[dict]:
        """Progress of every staged state transfer (strategy, steps done of all, peer, restarts, times)."""
        return [] if self.manager is None else [dict(t) for t in self.manager.transfers]

    def gc_events(self) -> list[dict]:
        """Every garbage-collection and revival decision so far, with reason and figures (JSON-ready)."""
        return [] if self.manager is None else list(self.manager.events)

    def network_cost_history(self) -> list[dict]:
        """Network cost (and theta, live stream replicas, worst input delay) per utility period."""
        return [] if self.manager is None else list(self.manager.history)

    # -- changing the running query (Bartnik §3; replistream.replica.changes) -----------------------
    def replace_function(self, operator: str, fn: Callable) -> dict:
        """Give Filter/Map/FlatMap ``operator`` a new function for every tuple with ``ts > p``,
        where ``p`` is the largest timestamp fed so far; returns the change's record (with ``p``).

        A marker carries the change through the running replicas (Bartnik §3); the
        output equals a reference run of ``dep.query``, which now holds both
        functions (:class:`~replistream.replica.changes.TimeSwitch`).

        >>> dep.replace_function("hot", lambda b: b["cpu"] > 0.9)["p"]   # doctest: +SKIP
        15000000
        """
        return reconfigure.replace_function(self, operator, fn)

    def add_operator(self, upstream: str, build: Callable, servers=None) -> dict:
        """Add operators and their application(s) reading stream ``upstream``; they see its
        tuples with ``ts > p`` (``p``: the largest timestamp fed so far). ``build(stream)``
        adds them with the usual :class:`~replistream.query.Stream` methods. Each new
        operator gets ``k`` replicas on distinct servers, by default those of ``upstream``'s
        running replicas (then other servers, in order, if they are fewer than ``k``).

        >>> dep.add_operator("load", lambda s: s.filter(lambda b: b["cpu"] > 0.9, name="very_hot")
        ...                  .sink("very_hot_alerts"))["added"]                      # doctest: +SKIP
        ['very_hot', 'very_hot_alerts']
        """
        return reconfigure.add_operator(self, upstream, build, servers)

    def remove_operator(self, operator: str) -> dict:
        """Remove ``operator`` and the part of the query only it feeds: it sees its input up to
        ``p`` (the largest timestamp fed so far), then its inputs close, its windows flush and
        its applications complete; its replicas are then stopped (``changes[-1]["retired"]``).

        >>> dep.remove_operator("load_per_minute")["removed"]      # doctest: +SKIP
        ['load_per_minute', 'load_stats']
        """
        return reconfigure.remove_operator(self, operator)

    def set_replication(self, operator: str, k: int) -> dict:
        """Run ``k`` live replicas of ``operator``: new ones by hand-over from a live peer,
        surplus ones discarded (their stream replicas first).

        >>> dep.set_replication("correlate", 3)["added"]      # doctest: +SKIP
        ['correlate#2']
        """
        return reconfigure.set_replication(self, operator, k)

    def record_change(self, rec: dict) -> dict:
        """Log a change to the running query (in :attr:`changes` and :attr:`events`); returns the record
        with ``t`` (seconds since the start)."""
        rec = {"t": round(self.now(), 3), **rec}
        self.changes.append(rec)
        self.events.append({"event": "change", **rec})
        return rec

    # -- feeding -------------------------------------------------------------------------------
    def feed(self, inputs: Mapping[str, Iterable], pace: float | None = None, chunk_size: int = 10_000,
             idle_timeout: float | Mapping[str, float] | None = None, chunk_ms: float | None = 5.0) -> None:
        """Start feeding ``inputs`` (``{source: iterable of chunks or records}``) in a background thread.

        With ``pace=s`` a tuple with timestamp ``ts`` is released at wall time
        ``t0 + (ts - ts0) / (1e6 * s)`` (``s=1``: real time), where ``ts0`` is
        the earliest first timestamp over the sources (so epoch timestamps
        replay from now); without it, as fast as the entry points take it.
        Records without ``ts`` are stamped by the feeder's clock (one clock
        for every entry replica). Inputs are cut into batches of at most
        ``chunk_size`` rows (:func:`~replistream.sources.iter_chunks`: a whole
        array or column mapping too), each one Ray call per entry replica; the
        result does not depend on it. Paced, a chunk is also cut so that it spans at most
        ``chunk_ms`` of wall time (default 5 ms; None: no cut), since a paced chunk is released
        at once at its first timestamp: every row then leaves within ``chunk_ms`` of its time,
        not up to a whole chunk early, and the batch size follows the rate
        (:func:`~replistream.sources.cut_by_time`). With k entry replicas the span is k x
        ``chunk_ms`` (each piece is a call to every entry replica, and each of those calls every
        downstream replica). While the deployment falls behind (pieces leave more than 4 spans
        late) the span doubles, up to 1 s, and it halves back once the replay keeps its schedule
        (:class:`~replistream.sources.AdaptiveCut`; ``feeder.cut.max_seen_ms`` tells how far it grew).

        An input may also be a source object with a ``bind(source, schema)``
        method, e.g. :class:`replistream.spark.SparkSource`: it is checked
        against the source's schema before anything is sent (a mismatch
        raises :class:`~replistream.errors.SchemaError` here) and then yields
        :class:`~replistream.sources.ChunkRef` s, chunks already in Ray's object
        store, which go to the entry points without passing through the driver.

        ``idle_timeout`` (seconds, for every source or ``{source: seconds}``): a source with
        nothing to send for that long no longer holds back the others (a join or a window
        behind it), and gets heartbeat punctuations while it stays quiet; a tuple it sends
        later at or below one is late and dead-lettered (:mod:`replistream.idle`). The
        heartbeats are logged (:meth:`heartbeats`); the reference of such a run is the ideal
        run over :func:`replistream.idle.with_heartbeats` of the same input.
        """
        if self.shut_down:
            raise RuntimeError("this deployment was shut down: deploy the query again to run it")
        if self.started:
            raise RuntimeError("this deployment has already been fed: a deployment runs its query once (its "
                               "replicas hold that run's state); deploy the query again for another run")
        unknown = set(inputs) - set(self.query.sources)
        if unknown:
            raise QueryError(f"inputs given for unknown source(s) {sorted(unknown)}; sources are {self.query.sources}")
        if pace is not None and pace <= 0:
            raise ValueError(f"pace must be > 0, got {pace}")
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a whole number of rows >= 1, got {chunk_size!r}")
        idle = idle_timeouts(idle_timeout, list(self.query.sources))
        if chunk_ms is not None and not (isinstance(chunk_ms, (int, float)) and not isinstance(chunk_ms, bool)
                                         and 0 < chunk_ms < float("inf")):
            raise ValueError(f"chunk_ms must be a number of milliseconds > 0 or None, got {chunk_ms!r}")
        for src, data in inputs.items():
            if hasattr(data, "bind"):
                data.bind(src, self.query.schema_of(src))
        if self._persister is not None:  # kept before the first chunk: a new host process resumes from it
            self._persister.fed({"inputs": dict(inputs), "pace": pace, "chunk_size": chunk_size, "idle": idle,
                                 "chunk_ms": chunk_ms})
        self.speed = pace
        self.t0 = time.time() + 0.05
        self.tell({label: h.set_start.remote(self.t0) for label, h in self.topology.running()})
        self._broadcast_network()
        disorder = {src: self.query.spec(src).max_disorder for src in self.query.sources}
        self.feeder.start(self.query.sources, inputs, pace, chunk_size, self.t0, idle=idle, disorder=disorder,
                          chunk_ms=chunk_ms)

    def heartbeats(self) -> list[Heartbeat]:
        """The heartbeat punctuations put on idle sources so far (:class:`replistream.idle.Heartbeat`:
        source, position, punctuation, wall time); empty unless fed with ``idle_timeout``.

        >>> dep.run(inputs, idle_timeout=0.5); hb = dep.heartbeats()              # doctest: +SKIP
        >>> run_reference(dep.query, with_heartbeats(inputs, hb, chunk_size=10_000))  # doctest: +SKIP
        """
        return self.feeder.heartbeats

    def _feed_started(self, ts0: float) -> None:
        """The feeder knows ``ts0``: the replicas get the clock they measure input delay with (Hwang
        §V-C), and the control loop, if any, starts."""
        self.ts0 = ts0
        self.t0 = self.feeder.t0  # with a pace: the replay starts when the first chunks are there
        self.tell({label: h.set_clock.remote(self.t0, self.ts0, self.speed) for label, h in self.topology.running()})
        if self.manager is not None:
            self.manager.start()

    def resume_feed(self, feed: dict | None) -> dict:
        """Go on feeding after the control plane was restored (:mod:`.lifecycle`): ``feed`` is what
        :meth:`feed` was given. Per source, the furthest entry replica's next chunk and rows taken
        are where feeding resumes (the input is read again, the rows it took skipped); an entry
        replica behind it catches up from a peer first. Returns ``{source: {"seq", "rows",
        "closed"}}`` and the replicas that catch up. Raises ``RunFailed`` if no entry replica
        answers, or the input was not kept."""
        if feed is None:
            raise RunFailed("the control plane was restored but the input given to feed() was not kept: the "
                            "feed cannot resume", operator=ENTRY)
        running = self.topology.running(ENTRY)
        asked = {label: h.entry_position.remote() for label, h in running}
        ready = self._ask_all(asked, self.detector.fail_after_s)
        positions = {}
        for label, ref in asked.items():
            if ref not in ready:
                continue  # silent: it catches up from a peer once it answers, or is declared failed
            try:
                positions[label] = ray.get(ref)
            except Exception as e:  # noqa: BLE001 - a death: noticed by the monitor
                self.events.append({"t": self.now(), "event": "no_answer", "actor": label, "call": "entry_position",
                                    "error": repr(e)})
        if not positions:
            raise RunFailed("no entry replica answered after the control plane was restored: where the input stands "
                            "is unknown", operator=ENTRY)
        at = {}
        for src in self.query.sources:
            best = max(positions.values(), key=lambda p: p[src]["expected"])[src]
            at[src] = {"seq": int(best["expected"]), "rows": int(best["rows"]), "closed": bool(best["closed"])}
        behind = {label: {src: int(p[src]["expected"]) for src in self.query.sources
                          if p[src]["expected"] < at[src]["seq"]} for label, p in positions.items()}
        behind = {label: b for label, b in behind.items() if b}
        behind.update({label: {src: 0 for src in self.query.sources} for label in asked if label not in positions})
        # a change whose marker the lost host was sending: entry replicas that lack it get it from a
        # peer (it is in their input logs) or, if none got it, from the resumed feed (finished, not half)
        markers = [(src, m) for m, seqs in getattr(self, "_markers_in_flight", []) for src, seq in seqs.items()
                   if at[src]["seq"] <= seq and not at[src]["closed"]]
        self.feeder.start(self.query.sources, feed["inputs"], feed["pace"], feed["chunk_size"], self.t0,
                          idle=feed["idle"], disorder={src: self.query.spec(src).max_disorder
                                                       for src in self.query.sources},
                          chunk_ms=feed["chunk_ms"], resume={"at": at, "behind": behind, "ts0": self.ts0,
                                                             "markers": markers})
        self._markers_in_flight = []
        return {"at": at, "behind": sorted(behind), "markers_sent": [(src, m.id) for src, m in markers]}

    def _run_sentinel(self, sentinel: Sentinel) -> None:
        if self._persister is not None:  # counted as run before it runs: a restored feed never runs it twice
            self._persister.persist_now()
        sentinel.apply(self)
        if not isinstance(sentinel, Handed):  # (one per micro-batch of a Spark stream: not an event)
            self.events.append({"t": self.now(), "event": repr(sentinel)})

    # -- waiting and results ----------------------------------------------------------------
    def wait(self, timeout: float = 600.0, progress: Callable[[dict], None] | None = None) -> WaitSummary:
        """Wait until every application received the end of every stream: returns a truthy
        :class:`~replistream.summary.WaitSummary` (outputs, dead letters, faults masked). Ends at once,
        raising, when the run can no longer complete exactly (docs/reliability.md): a replica's own
        code raised (:class:`~replistream.errors.UserFunctionError` for a user function, else
        :class:`~replistream.errors.RunFailed`), or every replica of an operator, application or of
        the entry points is lost (``RunFailed`` naming it); returns a falsy one after ``timeout`` s."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            self.poll(wait_s=0.05)
            if progress is not None:
                progress({n: self.delivered.count(n) for n in self.query.sinks})
            self.check_failures()
            if self.delivered.complete():
                if self.feeder.thread is not None:  # every chunk's call has returned (or raised)
                    self.feeder.fed_all.wait(max(0.0, deadline - time.time()))
                self.check_failures()  # a failure reported as the end arrived still ends the run in error
                return WaitSummary.of(self, True)
            time.sleep(0.05)
        return WaitSummary.of(self, False)

    def reached(self) -> int | None:
        """The logical time every application has reached: the smallest last punctuation they
        received (None before any); output up to it is complete."""
        with self.delivered.lock:
            puncts = [self.delivered.punctuation.get(n, NO_PUNCTUATION) for n in self.query.sinks]
        low = min(puncts, default=NO_PUNCTUATION)
        return None if low == NO_PUNCTUATION else int(low)

    #: Seconds :meth:`collect` and :meth:`metrics` wait for the actors' answers (all asked at once);
    #: one busy in a call that does not return is left out and said so.
    ASK_TIMEOUT_S = 15.0

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

    #: Seconds between probes of one actor (:meth:`watch_once`).
    PROBE_EVERY_S = 0.25

    #: Seconds between two rounds of the monitor thread.
    MONITOR_EVERY_S = 0.1

    #: A round whose own calls (the coordinator's reports, reconnections, dormant holds) held it up
    #: this long (a lost coordinator) did not see the replicas meanwhile: that time is not counted
    #: as their silence.
    STALL_S = 1.0

    def start_monitor(self) -> None:
        """Start the monitor thread (once): every :attr:`MONITOR_EVERY_S` it runs :meth:`watch_once`.
        It ends with the deployment."""
        if self._monitor_thread is not None and self._monitor_thread.is_alive():
            return

        def loop():
            # (Ray shut down at the script's exit without shutdown(): a call now would start Ray again)
            while not self.shut_down and ray.is_initialized():
                try:
                    self.watch_once()
                    if self.detached_as is not None:
                        self._check_unattended()
                except Exception as e:  # logged and warned: the waits' own checks still raise the run's failures
                    self.events.append({"t": self.now(), "event": "monitor_error", "error": repr(e),
                                        "traceback": traceback.format_exc(limit=8)})
                    warnings.warn(f"replistream: the failure monitor raised {e!r}; it goes on", RuntimeWarning,
                                  stacklevel=1)
                time.sleep(self.MONITOR_EVERY_S)

        self._monitor_thread = threading.Thread(target=loop, daemon=True, name="replistream-monitor")
        self._monitor_thread.start()

    #: The run's failure, once a detached deployment's monitor found one (None: none so far).
    failure: str | None = None

    #: Seconds between two checks of a detached deployment's failures when nobody waits on it.
    UNATTENDED_EVERY_S = 1.0

    def _check_unattended(self) -> None:
        """A detached deployment acts on its failures whether or not a client waits on it: every
        :attr:`UNATTENDED_EVERY_S` the monitor runs :meth:`check_failures`; the first failure is kept
        in :attr:`failure`, logged (``run_failed``), said by ``status()``, and raised by every later
        ``wait()``; the deployment keeps running for its results to be read until it is stopped."""
        now = time.time()
        if self.failure is not None or now - getattr(self, "_unattended_at", 0.0) < self.UNATTENDED_EVERY_S:
            return
        self._unattended_at = now
        try:
            self.check_failures()
        except (RunFailed, UserFunctionError) as e:
            self.failure = f"{type(e).__name__}: {e}"
            self.events.append({"t": self.now(), "event": "run_failed", "error": self.failure})

    def watch_once(self) -> None:
        """One round of the failure monitor (docs/reliability.md, "Slow is dead"):

        * every running actor has one probe outstanding (re-sent :attr:`PROBE_EVERY_S` after it
          answered); the probe runs apart from the data path, so a healthy actor answers at once;
        * a probe that fails with the actor's death marks it failed (:meth:`mark_failed`);
        * the :class:`~.detector.FailureDetector` suspects an actor that makes no progress for
          ``suspect_after_s`` while a peer does (nothing waits on it any more: the feeder, the
          result fetches, :meth:`collect`) and declares it failed after ``fail_after_s``
          (:meth:`declare_failed`: killed and fenced off, then as a crash);
        * reports that name a replica to fail (:meth:`_handle_reports`): a sender whose thread
          raised, a sender that broke its punctuation contract, a receiver starved of input by
          dropped links."""
        det = self.detector
        now = time.time()
        running = dict(self.topology.running())
        for label in [lab for lab in det.watches if lab not in running]:
            det.forget(label)
        for label in [lab for lab in self._probes if lab not in running]:
            del self._probes[label]
        for label in running:
            det.watch(label, self.topology.replica(label).operator, now)
        if self._probes:
            refs = list(self._probes.values())
            ready = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0])
            for label, ref in list(self._probes.items()):
                if ref not in ready:
                    continue
                del self._probes[label]
                try:
                    ans = ray.get(ref)
                except Exception as e:
                    if is_unavailable(e):  # unreachable for now: no answer (suspected, then declared failed and fenced)
                        continue
                    if is_actor_death(e):
                        self.mark_failed(label, f"died (noticed by the liveness probe): {type(e).__name__}")
                        running.pop(label, None)
                        det.forget(label)
                        continue
                    raise
                det.answered(label, time.time(), busy_s=ans.get("busy_s", 0.0), position=ans.get("position"),
                             pending=bool(ans.get("pending")))
                self._pids[label] = (int(ans["pid"]), ans.get("node"), ans.get("start"), ans.get("actor"))
        now = time.time()
        for label, h in running.items():
            if label not in self._probes and now - self._probed.get(label, 0.0) >= self.PROBE_EVERY_S:
                self._probes[label] = h.probe.remote()
                self._probed[label] = now
                det.asked(label, now)
        for v in det.check(time.time()):
            if v.state == "failed":
                self.declare_failed(v.label, f"no progress for {v.silent_s:.1f} s while a peer progressed "
                                             f"(fail_after_s={det.fail_after_s:g})")
            else:
                self.events.append({"t": self.now(), "event": v.state, "actor": v.label,
                                    "silent_s": round(v.silent_s, 3)})
        started = time.time()
        self._handle_reports()
        self._reconnect_dropped()
        self._move_drop_holds()
        self.protect_last_replicas()
        held = time.time() - started
        if held > self.STALL_S:  # held up by its own calls (a lost coordinator): it saw nothing meanwhile
            det.resume(time.time())
            self.events.append({"t": self.now(), "event": "monitor_stalled", "seconds": round(held, 3)})

    #: A dropped link is reconnected this long after its drop at the earliest, and at most
    #: :attr:`RECONNECT_TRIES` times (a receiver that keeps being dropped is left to its peers).
    RECONNECT_AFTER_S = 2.0
    RECONNECT_TRIES = 3

    def _reconnect_dropped(self) -> None:
        """Reconnect stream replicas whose link a sender dropped (a cut that outlasted the queue, a
        receiver blocked for ``drop_after_s``, a failed send) once both ends still run, the
        emulated link is up again and :attr:`RECONNECT_AFTER_S` have passed: the receiver gets a
        new duplicate-filter channel and the sender replays its retention log on it (as for a new
        replica, decision 7). The log may no longer reach back to the drop; the gap is covered by
        the receiver's other upstream replicas, which fed it throughout (a receiver left with none
        was declared failed instead). Each reconnection runs in a thread of its own, under the
        control loop's lock (one control action at a time), so the monitor never waits on it."""
        self._reconnect_threads = [t for t in self._reconnect_threads if t.is_alive()]
        now = time.time()
        for (src, dst), drop in list(self._link_drops.items()):
            if drop.get("busy") or drop["tries"] >= self.RECONNECT_TRIES or now - drop["wall"] < self.RECONNECT_AFTER_S:
                continue
            if not (self.topology.is_running(src) and self.topology.is_running(dst)):
                continue
            try:
                lat = self.conditions.latency_ms(self.topology.server(src), self.topology.server(dst), self.now())
            except Exception:  # noqa: BLE001 - a model that cannot tell: try the reconnection
                lat = 0.0
            if not np.isfinite(lat):
                continue  # still cut: it would overflow again
            drop["busy"] = True
            drop["tries"] += 1
            t = threading.Thread(target=self._reconnect, args=(src, dst, drop), daemon=True,
                                 name="replistream-reconnect")
            self._reconnect_threads.append(t)
            t.start()

    #: Seconds between two moves of the holds dropped links left on their senders' logs.
    DROP_HOLDS_EVERY_S = 1.0

    def _move_drop_holds(self) -> None:
        """A link dropped while its receiver lives on (too slow, cut off) leaves a hold on its
        sender's log at the receiver's last acknowledgement (:meth:`~.channels.Outbox._drop_locked`),
        so its reconnection replays from the receiver's position (decision 7). Every
        :attr:`DROP_HOLDS_EVERY_S` each hold is raised to the receiver's acknowledgement (it is fed
        by other senders meanwhile), and released once the link will not be reconnected (its tries
        are spent, or either end no longer runs). Calls are sent, not awaited, except the
        receivers' reports, asked with one short deadline (never waiting on a suspected one)."""
        now = time.time()
        if now - getattr(self, "_drop_holds_at", 0.0) < self.DROP_HOLDS_EVERY_S or not self._link_drops:
            return
        self._drop_holds_at = now
        from .channels import gone_key

        ports = {}
        for (src, dst), drop in list(self._link_drops.items()):
            if drop.get("busy") or not self.topology.is_running(src):
                continue
            for s in self.topology.streams(src=src, dst=dst):
                ports.setdefault((src, dst), set()).add(s.port)
        asked = {dst: self.topology.handle(dst).gc_report.remote() for (_, dst) in ports
                 if self.topology.is_running(dst) and not self.detector.is_suspected(dst)}
        ready = self._ask_all(asked, 0.5)
        for (src, dst), pset in ports.items():
            drop = self._link_drops[(src, dst)]
            gone = not self.topology.is_running(dst) or drop["tries"] >= self.RECONNECT_TRIES
            points = {}
            acks = []
            if not gone and asked.get(dst) in ready:
                try:
                    acks = ray.get(asked[dst]).get("acks") or []
                except Exception:  # noqa: BLE001 - a death: noticed by the probes; the hold stays
                    acks = []
            for port in pset:
                key = gone_key(dst, port)
                if gone:
                    points[key] = None
                elif port < len(acks):
                    points[key] = int(acks[port])
            if points:
                self.topology.handle(src).raise_holds.remote(points)
            if gone:
                self._link_drops.pop((src, dst), None)

    def _reconnect(self, src: str, dst: str, drop: dict) -> None:
        try:
            mgr = self.control_loop()
            with mgr.lock:
                if self.shut_down or not (self.topology.is_running(src) and self.topology.is_running(dst)):
                    return
                streams = [st for st in self.topology.streams(src=src, dst=dst) if st.live]
                replayed = sum(mgr._connect(st) for st in streams)
                self._dropped_links.discard((src, dst))
                self.events.append({"t": self.now(), "event": "link_reconnected", "from": src, "to": dst,
                                    "replayed": int(replayed), "try": drop["tries"]})
        except Exception as e:  # logged; the receiver's other links feed it, or it is declared failed
            self.events.append({"t": self.now(), "event": "reconnect_failed", "from": src, "to": dst,
                                "error": repr(e)})
        finally:
            drop["busy"] = False
            drop["wall"] = time.time()

    def _upstream_running(self, operator: str) -> list[tuple[str, Any]]:
        """The running replicas that feed ``operator`` (entry replicas for a source)."""
        q, out = self.query, []
        for up in q.inputs_of(operator):
            group = ENTRY if up in q.sources else up
            out += [(r.label, self.topology.handle(r.label)) for r in self.topology.replicas(group)
                    if self.topology.is_running(r.label)]
        return out

    def _hold_upstream(self, operator: str, p: int) -> None:
        """Every running upstream replica of ``operator`` keeps its output after punctuation ``p``
        (its dormant checkpoint's); sent, not awaited (the hold only rises)."""
        for _, h in self._upstream_running(operator):
            h.hold_retention.remote(f"dormant:{operator}", int(p))

    def protect_last_replicas(self) -> None:
        """With ``gc.dormant_every_s``: an operator down to one live replica gets a dormant
        checkpoint (Rhino, Del Monte 2017): its upstream replicas first stop trimming the output it
        may need again (awaited), then the replica sends a checkpoint every ``dormant_every_s``
        (:meth:`_hold_upstream` raises the holds as each arrives). Run by the monitor."""
        every = None if self.manager is None else self.manager.cfg.dormant_every_s
        if every is None or self.k < 2:
            return
        for op in self.query.operators:
            live = [r.label for r in self.topology.replicas(op) if r.state == "live"
                    and self.topology.is_running(r.label)]
            if len(live) != 1 or self._dormant_of.get(op) == live[0]:
                continue
            ups = self._upstream_running(op)
            self.tell({f"{label}|hold": h.hold_retention.remote(f"dormant:{op}", NO_PUNCTUATION) for label, h in ups},
                      timeout=10)
            self.tell({live[0]: self.topology.handle(live[0]).keep_dormant.remote(every)}, timeout=10)
            self._dormant_of[op] = live[0]
            self.events.append({"t": self.now(), "event": "dormant_on", "operator": op, "replica": live[0],
                                "every_s": every})

    def _revive_dormant(self, node: str) -> bool:
        """Every replica of operator ``node`` is lost: revive one from its dormant checkpoint and
        the upstream output kept since (:meth:`protect_last_replicas`). False if it has none."""
        if node not in self.query.operators or self.manager is None or \
                self.manager.cfg.dormant_every_s is None:
            return False
        if self.ask_coordinator("dormant_checkpoint", node, timeout=30) is None:
            return False
        last = self.topology.replicas(node)[-1].label
        ev = self.control_loop().replace_replica(last)
        self.events.append({"t": self.now(), "event": "revived_from_dormant", "operator": node, "replaced": last,
                            "new": ev["new_replicas"][0]["label"], "handover": ev.get("handover")})
        return True

    def _handle_reports(self) -> None:
        """Act on the coordinator's new reports that name a replica to fail: ``declare_failed`` (its
        sender thread raised), ``broken_contract`` (a tuple at or below its own punctuation, named
        with receiver, port, channel and logical time: the sender is declared failed), and dropped
        links not due to a death (a receiver left with no live upstream replica on an input is
        declared failed: it would never progress again)."""
        # a coordinator silent for fail_after_s (at least 4 s) is fenced and replaced, as a replica is
        new = self.ask_coordinator("reports_since", self._reports_seen, timeout=max(4.0, self.detector.fail_after_s))
        self._reports_seen += len(new)
        starved = set()
        for rep in new:
            kind = rep.get("kind")
            if kind == "declare_failed":
                self.declare_failed(rep["replica"], rep["reason"])
            elif kind == "broken_contract":
                sender = self.topology.sender_of(rep["receiver"], rep["port"], rep["channel"])
                what = (f"sent {rep['rows']} tuple(s) from ts={rep['ts']} at or below its own punctuation "
                        f"{rep['punctuation']} to {rep['receiver']} (input {rep['port']}, channel {rep['channel']}; "
                        f"logical time {rep['punctuation'] / 1e6:.6g} s): a broken contract")
                self.events.append({"t": self.now(), "event": "broken_contract", "sender": sender, **rep})
                if sender is None:
                    self.declare_failed(rep["receiver"], f"received a tuple below a punctuation from an unknown "
                                                         f"sender: {what}")
                else:
                    self.declare_failed(sender, what)
            elif kind == "stale_packet":  # another deployment's packet, rejected: said, with its sender
                self.events.append({"t": self.now(), "event": "stale_packet", **{k: v for k, v in rep.items()
                                                                                 if k not in ("rid", "kind")}})
            elif kind == "dormant_checkpoint":  # upstream may now trim its output up to it
                self._hold_upstream(rep["operator"], int(rep["punctuation"]))
            elif kind == "channel_dropped":
                reason = str(rep.get("reason", ""))
                if reason.startswith(("receiver died", "receiver raised")):
                    continue  # deaths and raised errors: check_failures
                self._dropped_links.add((rep["from"], rep["to"]))
                drop = self._link_drops.setdefault((rep["from"], rep["to"]), {"tries": 0})
                drop.update(wall=time.time(), reason=reason)
                self.events.append({"t": self.now(), "event": "link_failed", "from": rep["from"], "to": rep["to"],
                                    "reason": reason})
                starved.add(rep["to"])
        for label in starved:
            port = self._starved_port(label)
            node = self.topology.replica(label).operator if label in self.topology else None
            # only while a peer of its node is fed and progresses: a node whose every replica is
            # starved (or stuck) has nothing to mask with, and the run's timeout names it
            covered = node is not None and any(
                r.label != label and self.topology.is_running(r.label) and self._starved_port(r.label) is None
                and not self.detector.is_suspected(r.label) for r in self.topology.replicas(node))
            if port is not None and covered:
                self.declare_failed(label, f"no live upstream replica feeds its input {port} any more (links "
                                           f"dropped: {sorted(a for a, b in self._dropped_links if b == label)})")

    def _starved_port(self, label: str) -> int | None:
        """An input port of running ``label`` that no running upstream replica feeds over a link not
        dropped (None: every input is fed)."""
        if label not in self.topology or not self.topology.is_running(label):
            return None
        ports: dict[int, bool] = {}
        for s in self.topology.streams(dst=label):
            fed = s.live and self.topology.is_running(s.src) and (s.src, label) not in self._dropped_links
            ports[s.port] = ports.get(s.port, False) or fed
        return next((p for p, fed in sorted(ports.items()) if not fed), None)

    def declare_failed(self, label: str, reason: str) -> None:
        """Declare running ``label`` failed (the failure detector, a broken contract, a starved
        receiver): logged (``declared_failed``), killed and fenced off (its process is killed with
        SIGKILL, which also ends a stopped process: nothing it would send later arrives), then
        handled as a crash (:meth:`mark_failed`: links dropped everywhere, repaired with
        ``repair=True``)."""
        if label not in self.topology or not self.topology.is_running(label):
            return
        self.events.append({"t": self.now(), "event": "declared_failed", "actor": label, "reason": reason})
        self._fence(label)
        self.mark_failed(label, f"declared failed: {reason}")

    def _fence(self, label: str) -> None:
        """Kill ``label``'s actor and its process, whatever state the process is in (a stopped
        process does not handle Ray's kill request): SIGKILL on the node that hosts it, only after
        checking that the process is still the one the replica's probes named (its pid, its start
        time and its actor: a pid taken by another process meanwhile is left alone)."""
        h = self.topology.handle(label)
        try:
            ray.kill(h, no_restart=True)
        except Exception as e:  # logged: the actor may be gone already
            self.events.append({"t": self.now(), "event": "kill_failed", "actor": label, "error": repr(e)})
        pid, node, start, actor = (*self._pids.get(label, (None, None)), None, None)[:4]
        if pid is None:
            return
        if actor is not None and h is not None and actor != h._actor_id.hex():
            self.events.append({"t": self.now(), "event": "fence_refused", "actor": label,
                                "why": f"process {pid} answered for actor {actor}, not {label}'s"})
            return
        fence_process(pid, start, node)

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
        if f"{operator}#{replica}" not in self.topology and str(operator) not in self.topology:
            operator = resolve_operator(self.query, operator)  # "join" for join_1, or what to write
        label = f"{operator}#{replica}" if f"{operator}#{replica}" in self.topology else str(operator)
        if label not in self.topology or self.topology.handle(label) is None:
            raise ValueError(f"no replica {label!r}; actors: {sorted(self.handles)}")
        if not self.topology.is_running(label):  # dead, retired or declared failed: nothing to signal
            self.events.append({"t": self.now(), "event": "not_signalled", "actor": label, "signal": sig})
            return -1
        pid, node, start = (*self._pids.get(label, (None, None)), None)[:3]
        if pid is None or start is None:
            ans = ray.get(self.topology.handle(label).probe.remote(), timeout=30)
            pid, node, start = int(ans["pid"]), ans.get("node"), ans.get("start")
            self._pids[label] = (pid, node, start, ans.get("actor"))
        if node is not None and node != ray.get_runtime_context().get_node_id():
            raise ValueError(f"{label} runs on another Ray node: stop_replica signals local processes only")
        signal_process(pid, start, sig)  # (nothing if it was killed meanwhile: declared failed)
        self.events.append({"t": self.now(), "event": "stopped" if sig == 19 else "resumed", "actor": label})
        return pid

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
            h = self.coordinator
            try:
                return ray.get(getattr(h, method).remote(*args), timeout=timeout)
            except Exception as e:
                lost, silent = is_actor_death(e), isinstance(e, ray.exceptions.GetTimeoutError)
                if not (lost or silent):
                    raise
                what = f"{type(e).__name__} on {method!r}" + (f" (no answer in {timeout:g} s)" if silent else "")
                if attempt == 2:
                    raise RunFailed(f"the deployment's coordinator was lost twice in a row ({what}): it holds the "
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
            if self.coordinator is not lost or self.shut_down:
                return
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            started = time.time()
            if fence:
                try:
                    ray.kill(lost, no_restart=True)
                except Exception as e:  # logged: it may be gone already
                    self.events.append({"t": self.now(), "event": "kill_failed", "actor": "coordinator",
                                        "error": repr(e)})
                if self._coordinator_pid is not None:  # it runs on this process's node; the same process only
                    signal_process(self._coordinator_pid, getattr(self, "_coordinator_start", None), 9)
            new, self._standby = self._standby, None
            info = None
            if new is not None:  # the warm standby takes the state up (no process start, no imports)
                try:
                    ray.get(new.reinit.remote(self.t0, self.coordinator_key), timeout=30)
                    info = ray.get(new.ping.remote(), timeout=30)
                except Exception as e:  # logged; a new process instead
                    self.events.append({"t": self.now(), "event": "standby_failed", "error": repr(e)})
            if info is None:
                here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
                new = CoordinatorActor.options(scheduling_strategy=here, **self._lifetime()).remote(
                    self.t0, self.coordinator_key)
                self._register(new)
                info = ray.get(new.ping.remote(), timeout=60)
            restored = info["restored"]
            self.coordinator, self._coordinator_pid = new, info["pid"]
            self._coordinator_start = info.get("start")
            self.start_standby()
            for _, h in self.topology.running():  # sent, not awaited: a replica that does not answer is the detector's
                h.set_coordinator.remote(new)
            if getattr(self, "_host_actor", None) is not None:  # a detached deployment's host: watched by it from now on
                new.watch_host.remote(self._host_actor, self.detached_as, self.detector.fail_after_s)
            self.events.append({"t": self.now(), "event": "coordinator_replaced", "reason": reason,
                                "restored": restored, "seconds": round(time.time() - started, 3)})

    def start_standby(self) -> None:
        """Start a warm standby coordinator on the driver's node (not waited for): it holds nothing
        until :meth:`replace_coordinator` hands it the lost coordinator's key, so taking over costs
        no process start and no imports (about 1.3 s of imports here)."""
        if self._standby is not None or self.shut_down:
            return
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
        kept = pool.take("CoordinatorActor")  # one an earlier deployment left (pool.py): no new process
        if kept is not None:
            kept.reinit.remote(self.t0, None)  # not awaited: replace_coordinator's call waits behind it
            self._standby = kept
        else:
            self._standby = CoordinatorActor.options(scheduling_strategy=here, **self._lifetime()).remote(self.t0, None)
        self._register(self._standby)

    def _lifetime(self) -> dict:
        """Ray options of a new actor of this deployment: detached for a detached deployment."""
        return {"lifetime": "detached"} if self.detached_as is not None else {}

    def check_failures(self) -> None:
        """Raise the run's failure if it has one (see :meth:`wait`); nothing otherwise. Deaths,
        silent replicas and dropped links are noticed by the monitor thread (:meth:`watch_once`)."""
        self.start_monitor()
        failed = self.ask_coordinator("failures", timeout=30)
        for f in [f for f in failed if f["kind"] == "died"]:  # a sender found its receiver dead
            self.mark_failed(f["replica"], f"died: {f['reason']}")  # idempotent: one already known is left
        failed = [f for f in failed if f["kind"] != "died"]
        if failed and failed[0]["kind"] != "fatal":  # only a sender's report so far: give the replica's own
            self._raised_since = self._raised_since or time.time()  # report (which names more) a moment
            if time.time() - self._raised_since < 1.0:
                failed = []
        if failed:
            f = failed[0]
            t = f.get("logical_time")
            at = "" if t is None or t == NO_PUNCTUATION else f", at logical time {t / 1e6:.6g} s"
            where = f"replica {f['replica']}{at}"
            if f.get("user_function"):
                err = UserFunctionError(f["operator"], f"{f['message']} ({where})", row=f.get("row"))
                err.replica, err.logical_time, err.result = f["replica"], t, self.collect()
                raise err
            frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', f.get("traceback") or "")
            at = "" if not frames else f" at {os.path.basename(frames[-1][0])}:{frames[-1][1]} in {frames[-1][2]}"
            raise RunFailed(f"{f['operator']!r} failed ({where}): {f['error']}: {f['message']}{at}; the run cannot "
                            f"complete exactly", operator=f["operator"], replica=f["replica"], logical_time=t,
                            result=self.collect())
        for node in [ENTRY, *self.query.operators, *self.query.sinks]:
            replicas = self.topology.replicas(node)
            if not replicas or any(r.state == "live" for r in replicas):
                continue
            if self._revive_dormant(node):
                continue
            reasons = {e["actor"]: e.get("reason") for e in self.events if e.get("event") == "dead"}
            lost = ", ".join(f"{r.label} ({reasons.get(r.label) or r.state})" for r in replicas)
            reached = self.reached()
            what = "the entry points" if node == ENTRY else repr(node)
            after = "" if reached is None else f" after logical time {reached / 1e6:.6g} s"
            raise RunFailed(f"every replica of {what} is lost: {lost}; the output{after} cannot be computed "
                            f"(a fault beyond the model: fewer than k replicas failed, docs/reliability.md)",
                            operator=node, replica=", ".join(r.label for r in replicas), logical_time=reached,
                            result=self.collect())
        if self.feeder.error is not None:
            raise RunFailed(f"feeding the sources failed: {self.feeder.error}") from self.feeder.error

    def on_output(self, app: str, callback: Callable[[np.ndarray], None], keep: bool = True) -> None:
        """Call ``callback(batch)`` in the driver with every new batch application ``app`` receives.

        Callbacks run while :meth:`run`/:meth:`wait` wait, or on each :meth:`poll`. With
        ``keep=False`` the driver keeps none of ``app``'s tuples once its callbacks have had them
        (for results larger than the driver's memory, e.g. :class:`replistream.spark.SparkSink`):
        ``run()``'s ``outputs[app]`` then stays empty and ``stats["handed_off"][app]`` counts them.

        >>> dep.on_output("alerts", lambda batch: print(len(batch), "new alerts"))  # doctest: +SKIP
        """
        with self.delivered.lock:
            if app not in self.delivered.callbacks:
                raise ValueError(f"{app!r} is not an application of query {self.query.name!r}; "
                                 f"applications: {self.query.sinks}")
            self.delivered.callbacks[app].append(callback)
            if not keep:
                self.delivered.keep[app] = False

    def poll(self, wait_s: float | None = None) -> None:
        """Fetch newly delivered tuples from the applications (and run output callbacks).

        Every running application replica has one fetch outstanding; this takes the answers that
        come within ``wait_s`` (default: the detector's ``suspect_after_s``), and stops waiting
        as soon as every replica not suspected has answered: results come from whichever
        replica answers, never held by one that does not (``deploy(app_replicas=2)``)."""
        d = self.delivered
        wait_s = self.detector.suspect_after_s if wait_s is None else float(wait_s)
        deadline = time.time() + wait_s
        died = []
        with d.lock:
            apps = {r.label: r.operator for r in self.topology.replicas()  # add_operator may add applications
                    if r.kind == "application" and self.topology.is_running(r.label)}
            for label in [lab for lab in self._fetches if lab not in apps]:
                del self._fetches[label]
            for label in apps:
                if label not in self._fetches:
                    self._fetches[label] = (self.topology.handle(label).fetch.remote(d.fetched[label]),
                                            d.fetched[label])
            while self._fetches:
                refs = {ref: label for label, (ref, _) in self._fetches.items()}
                ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=min(0.05, max(0.0, deadline - time.time())))
                for ref in ready:
                    label = refs[ref]
                    _, start = self._fetches.pop(label)
                    try:
                        data, arr, count, punct = ray.get(ref)
                    except Exception as e:
                        if is_unavailable(e):  # unreachable for now: asked again next time (the detector decides)
                            continue
                        if not is_actor_death(e):
                            raise
                        died.append((label, f"application died: {type(e).__name__}"))  # recorded below
                        continue
                    if start != d.fetched[label]:
                        continue  # a fetch from an earlier position (cannot happen with one outstanding)
                    d.add_batch(apps[label], data, arr, label)
                    if apps[label] in self.file_sinks and not d.keep[apps[label]]:  # written by the replicas
                        d.handed_off[apps[label]] = max(d.handed_off[apps[label]], int(count))
                    d.punctuation[apps[label]] = max(d.punctuation[apps[label]], int(punct))  # its fastest replica's
                waiting = [lab for lab in self._fetches if not self.detector.is_suspected(lab)]
                if not waiting or time.time() >= deadline:
                    break
        for node, reason in died:  # a kill we asked for is recorded already (mark_failed is idempotent)
            self.mark_failed(node, reason)

    def results(self, app: str) -> np.ndarray:
        """Tuples the application ``app`` received so far (in arrival order)."""
        self.poll()
        return self.delivered.tuples(app, self.query.schema_of(app))

    def results_since(self, app: str, position: int = 0) -> tuple[np.ndarray, int]:
        """``(tuples, next position)``: the tuples application ``app`` received from ``position`` on
        (in arrival order), and the position to ask from next time. A client that keeps the
        position (a script that reconnects with :func:`~.host.attach`, a dashboard) gets each tuple
        once. Positions count what the applications delivered, which they keep, so a detached
        deployment's restored host (:mod:`.lifecycle`) numbers them alike when the application
        runs one replica; with several, a restore may number them in another order (the first
        copy of each is kept from whichever replica answers first).

        >>> rows, pos = dep.results_since("alerts")           # doctest: +SKIP
        >>> more, pos = dep.results_since("alerts", pos)       # doctest: +SKIP
        """
        if app not in self.query.sinks:
            raise ValueError(f"{app!r} is not an application of query {self.query.name!r}; "
                             f"applications: {self.query.sinks}")
        position = int(position)
        if position < 0:
            raise ValueError(f"position must be >= 0, got {position}")
        data = self.results(app)
        return data[position:], len(data)

    def latencies_ms(self, app: str) -> tuple[np.ndarray, np.ndarray]:
        """(arrival time in s since start, end-to-end latency in ms) per delivered tuple.

        Latency = arrival time minus the tuple's timestamp mapped to wall time
        (``t0 + (ts - ts0) / (1e6 * pace)``); meaningful for paced runs.
        """
        data = self.results(app)
        arr = self.delivered.arrivals(app)
        speed = self.speed or 1.0
        lat = (arr - (self.t0 + (data[TS] - self.ts0) / (1e6 * speed))) * 1000.0
        return arr - self.t0, lat

    def run(self, inputs: Mapping[str, Iterable], pace: float | None = None, timeout: float = 600.0,
            scenario=None, progress: Callable[[dict], None] | None = None, chunk_size: int = 10_000,
            idle_timeout: float | Mapping[str, float] | None = None, chunk_ms: float | None = 5.0) -> RunResult:
        """Feed ``inputs``, apply ``scenario`` (a :class:`~replistream.scenario.Scenario`), wait, collect.

        ``chunk_size`` is the most rows the feeder sends to the entry points in one batch,
        ``chunk_ms`` the most wall time a paced chunk spans, and ``idle_timeout`` when a quiet
        source stops holding the others back (see :meth:`feed`).
        """
        from ...progress import reporter

        with reporter("run", self.show_progress) as rep:
            if scenario is not None:
                self.install_scenario(scenario)
            rep.phase("feeding the sources")
            self.feed(inputs, pace, chunk_size, idle_timeout, chunk_ms)
            if scenario is not None:
                self._start_scenario_thread(scenario)
            rep.phase("running" + (f" (paced x{pace:g})" if pace else ""))

            def tick(counts):
                rep.update(detail=", ".join(f"{app} {n:,} tuples" for app, n in counts.items()))
                if progress is not None:
                    progress(counts)

            ok = self.wait(timeout, tick)
            rep.phase("collecting the results")
            res = self.collect()
        if not ok:
            waiting = {n: "none yet" if p == NO_PUNCTUATION else f"{p / 1e6:.6g} s"
                       for n, p in res.punctuation.items() if p != END}
            node, text = self.holdup()
            raise RunFailed(f"the run did not complete within {timeout:g} s and no failure explains it: "
                            f"applications {sorted(waiting)} have not received the end of the stream "
                            f"(last punctuations {waiting}); {text}; raise the timeout if the input is that "
                            f"long", operator=node, logical_time=self.reached(), result=res)
        return res

    def holdup(self, wait_s: float = 2.0) -> tuple[str | None, str]:
        """Where the run is held up: the first node, from the entry points down, that has not
        reached the end of the stream, with each of its replicas' logical time (its watermark; an
        entry point's punctuation) or, for a replica that does not answer within ``wait_s``, that
        it is busy in a call (e.g. a user function that does not return). Returns ``(node, text)``
        (``(None, text)`` if every node has reached the end). What a timeout's error names.

        >>> dep.holdup()   # doctest: +SKIP
        ('pick', "'pick' holds the run back: pick#0 busy in a call (no answer in 2 s), pick#1 at ...")
        """
        running = self.topology.running()
        refs = {label: h.stats.remote() for label, h in running}
        done = self._ask_all(refs, wait_s)
        where: dict[str, list[tuple[str, int | None, str]]] = {}
        for label, ref in refs.items():
            rep = self.topology.replica(label)
            if rep.kind == "application":
                continue
            if ref not in done:
                where.setdefault(rep.operator, []).append((label, None, f"busy in a call (no answer in {wait_s:g} s)"))
                continue
            try:
                st = ray.get(ref)
            except Exception as e:  # noqa: BLE001 - said in the text
                where.setdefault(rep.operator, []).append((label, None, f"unreachable ({type(e).__name__})"))
                continue
            if rep.kind == "entry":
                t = min((int(e["punctuation"]) for e in st.get("entries", {}).values()), default=None)
            else:
                t = st.get("watermark")
                t = None if t is None else int(t)
            where.setdefault(rep.operator, []).append((label, t, "pending a state hand-over" if st.get("pending")
                                                       else ""))

        def at(t: int | None, note: str) -> str:
            if note:
                return note
            if t is None or t == NO_PUNCTUATION:
                return "no punctuation yet"
            return "at the end of the stream" if t == END else f"at logical time {t / 1e6:.6g} s"

        for node in [ENTRY, *self.query.operators]:
            reps = where.get(node)
            if not reps:
                continue
            if any(t == END for _, t, _ in reps):
                continue
            what = "the entry points" if node == ENTRY else repr(node)
            return node, f"{what} hold{'' if node == ENTRY else 's'} the run back: " + \
                ", ".join(f"{label} {at(t, note)}" for label, t, note in reps)
        return None, "every operator reached the end of the stream (the applications have not: see their replicas)"

    def collect(self) -> RunResult:
        """What the applications received so far, as a :class:`~replistream.engines.result.RunResult`:
        outputs, last punctuations, dead letters, ``arrivals`` in seconds since the start, ``ts0`` and
        ``pace`` (so ``latencies(app)`` works), ``end_time`` (the last tuple's arrival), the deployment's
        ``events`` and ``metrics``, and per stream replica what it carried (``links``)."""
        self.poll()
        outputs = {n: self.results(n) for n in self.query.sinks}
        arrivals = {n: self.delivered.arrivals(n) - self.t0 for n in self.query.sinks}
        # every running replica's dead letters, merged: the replicas of a node set the same tuples
        # aside, so a replica that died took only copies with it (its live peers hold the same)
        # (entry replicas: the answer of the one furthest on, as malformed records have no id to
        # merge by, and a replica still catching up from a peer has set aside fewer so far)
        running = self.topology.running()
        answers = [h.dead_letters.remote() for _, h in running]
        entries = {label: h.entry_position.remote() for label, h in running
                   if self.topology.replica(label).kind == "entry"}
        asked = {label: ref for (label, _), ref in zip(running, answers)}
        asked.update({f"{label}|position": ref for label, ref in entries.items()})
        ready = self._ask_all(asked, self.ASK_TIMEOUT_S)
        dead, entry_letters = list(self._retired_letters), []
        for (label, _), ref in zip(running, answers):
            is_entry = label in entries
            if ref not in ready:  # busy in a call that does not return, or suspected: its peers' letters stand
                self.events.append({"t": self.now(), "event": "no_answer", "actor": label, "call": "dead_letters",
                                    "seconds": self.ASK_TIMEOUT_S,
                                    "suspected": self.detector.is_suspected(label)})
                continue
            try:
                letters = ray.get(ref)
                if not is_entry:
                    dead.extend(letters)
                    continue
                pos = ray.get(entries[label]) if entries[label] in ready else None
            except Exception as e:
                if not is_actor_death(e):
                    raise
                continue  # it died after the topology listed it: its peers' letters stand for its own
            if pos is not None:
                entry_letters.append((furthest_key(pos), label, letters))
        if entry_letters:
            dead.extend(max(entry_letters, key=lambda x: x[0])[2])
        dead = merge_dead_letters(dead)
        metrics = self.metrics()
        with self.delivered.lock:
            punct = dict(self.delivered.punctuation)
            handed = {n: c for n, c in self.delivered.handed_off.items() if not self.delivered.keep[n]}
        end = max((float(a.max()) for a in arrivals.values() if len(a)), default=0.0)  # the last tuple's arrival
        stats = {"handed_off": handed} if handed else {}
        if self.file_sinks:  # what each ParquetSink holds (its marker's manifest once complete)
            stats["sinks"] = {app: {"path": sink.path, "complete": sink.complete(),
                                    **({k: v for k, v in sink.manifest().items() if k != "files"}
                                       if sink.complete() else {}),
                                    "files": len(sink.manifest()["files"]) if sink.complete() else None}
                              for app, sink in self.file_sinks.items()}
        return RunResult(outputs, punct, dead, arrivals=arrivals, ts0=int(round(self.ts0)), pace=self.speed,
                         end_time=end, events=list(self.events), links=metrics["stream_replicas"], metrics=metrics,
                         stats=stats)

    # -- failure injection ---------------------------------------------------------------------
    def kill(self, label: str, reason: str = "killed") -> None:
        """Kill one actor by label (``"join#1"``, ``"entry#0"``, an application name)."""
        h = self.topology.handle(label)
        if h is None:
            raise ValueError(f"no actor {label!r}; actors: {sorted(self.handles)}")
        if not self.topology.is_running(label):
            return
        ray.kill(h, no_restart=True)
        self.mark_failed(label, reason)

    def kill_replica(self, operator: str, replica: int) -> None:
        """Kill replica ``replica`` of ``operator`` (``"entry"`` for an entry point)."""
        label = f"{operator}#{replica}"
        if self.topology.handle(label) is None:  # "join" for join_1, or a QueryError saying what to write
            label = f"{resolve_operator(self.query, operator)}#{replica}"
        if self.topology.handle(label) is None:
            raise ValueError(f"{operator!r} has no replica {replica}; actors: {sorted(self.handles)}")
        self.kill(label, "replica killed")

    def kill_server(self, server: str) -> list[str]:
        """Kill every actor on ``server``; on a cluster with ``Server.node`` set, remove the Ray node."""
        if server not in self.servers:
            raise ValueError(f"unknown server {server!r}; servers: {sorted(self.servers)}")
        victims = [label for label, _ in self.topology.running() if self.topology.server(label) == server]
        self._lost_servers.add(server)
        node = self.servers[server].node
        if self.cluster is not None and node:
            for n in list(self.cluster.list_all_nodes()):
                if getattr(n, "node_id", None) == node:
                    self.cluster.remove_node(n)
            for label in victims:
                self.mark_failed(label, f"server {server} removed")
        else:
            for label in victims:
                self.kill(label, f"server {server} killed")
        return victims

    def mark_failed(self, label: str, reason: str) -> None:
        """``label``'s actor died (``reason``): the topology marks it failed, the event is logged
        (``"dead"``), and every running actor drops its links to it."""
        h = self.topology.handle(label) if label in self.topology else None
        if not self.topology.mark_failed(label):
            return
        if h is not None:  # a replica counted failed never runs on (one Ray only could not reach, too)
            kill_actors([h])
        self.events.append({"t": self.now(), "event": "dead", "actor": label, "reason": reason})
        for other, h in self.topology.running():
            if other != label:
                h.drop_link.remote(label, reason)
        if self.repair:
            self._schedule_repair(label, reason)

    # -- automatic repair ----------------------------------------------------------------------
    def _schedule_repair(self, label: str, reason: str) -> None:
        """Queue the repair of crashed ``label`` (``deploy(repair=True)``): an operator or entry
        replica whose server is not lost (an entry replica from a live peer's input state,
        :meth:`repair_entry`); applications are not rebuilt (they hold delivered results)."""
        rep = self.topology.replica(label)
        why = None
        if rep.kind == "application":
            why = "an application is not rebuilt"
        elif rep.server in self._lost_servers:
            why = f"its server {rep.server} is lost"
        elif self.shut_down:
            return
        if why is not None:
            self.repairs.append({"replica": label, "repaired": False, "why": why})
            self.events.append({"t": self.now(), "event": "not_repaired", "actor": label, "why": why})
            return
        self._repair_queue.put((label, time.time()))
        if self._repair_thread is None or not self._repair_thread.is_alive():
            self._repair_thread = threading.Thread(target=self._repair_loop, daemon=True, name="replistream-repair")
            self._repair_thread.start()

    def _repair_loop(self) -> None:
        """Replace each queued crashed replica by a new one on its server, built by hand-over from a
        live peer (:meth:`revive_replica`, Hwang §V-C; a warm spare's process if one is kept), then
        start a spare in place of the one taken. A repair that fails leaves the operator with fewer
        replicas, never with wrong output: it is logged (``repair_failed``), kept in
        :attr:`repairs` and warned about."""
        while not self.shut_down:
            try:
                label, detected = self._repair_queue.get(timeout=0.2)
            except queue.Empty:
                continue
            if self.shut_down:
                return
            if self.delivered.complete():  # nothing is left to compute
                self.repairs.append({"replica": label, "repaired": False, "why": "the run had completed"})
                continue
            op = self.topology.replica(label).operator
            if not any(r.state == "live" and self.topology.is_running(r.label) for r in self.topology.replicas(op)):
                continue  # nothing to hand over from: the run fails naming the operator (check_failures)
            rec = {"replica": label, "detected_wall": detected}
            try:
                if op == ENTRY:
                    new = self.repair_entry(label)
                    rec.update(repaired=True, new=new, installed_wall=time.time())
                else:
                    ev = self.control_loop().replace_replica(label)
                    rec.update(repaired=True, new=ev["new_replicas"][0]["label"], installed_wall=time.time())
                self.events.append({"t": self.now(), "event": "repaired", "actor": label, "new": rec["new"],
                                    "seconds": round(rec["installed_wall"] - detected, 4)})
                if self.spares:
                    self.start_spares(1)
            except Exception as e:  # the run stays exact with the replicas left; said loudly
                if self.shut_down:
                    return
                rec.update(repaired=False, why=f"{type(e).__name__}: {e}", traceback=traceback.format_exc(limit=12))
                self.events.append({"t": self.now(), "event": "repair_failed", "actor": label, "error": rec["why"]})
                warnings.warn(f"replistream: could not repair {label} ({rec['why']}); {op!r} runs on with the "
                              f"replicas left", RuntimeWarning, stacklevel=1)
            self.repairs.append(rec)

    def repair_entry(self, label: str) -> str:
        """Replace the crashed entry replica ``label`` by a new one on its server, from a live
        peer's :meth:`~.actors.EntryActor.entry_checkpoint` (Hwang §III: entry points hold their
        input for their peers): while no chunk is fed and no control action runs
        (:meth:`quiet`), the peer's entry logic and retained output go to the new replica, which
        is connected to every live downstream replica (replaying what it retained; the duplicate
        filters drop what they had) and fed every chunk from then on. Returns its label.

        >>> dep.repair_entry("entry#0")    # doctest: +SKIP
        'entry#2'
        """
        from ...gc import OperatorReplica, StreamReplica

        topo, q = self.topology, self.query
        old = topo.replica(label)
        with self.quiet():
            peers = [r.label for r in topo.replicas(ENTRY) if r.state == "live" and topo.is_running(r.label)
                     and not self.detector.is_suspected(r.label)]  # never wait on a silent one with the feed held
            if not peers:
                raise RuntimeError(f"no live entry replica that answers can hand its input over to a replacement "
                                   f"of {label}")
            ck = ray.get(topo.handle(peers[0]).entry_checkpoint.remote(), timeout=120)
            new_label = topo.next_label(ENTRY)
            index = replica_index(new_label)
            h = self._settle(*self._start(EntryActor, ray_options(self.servers[old.server]), q, index, old.server,
                                          self.conditions, self.t0, self.channel_opts, self.coordinator,
                                          self.strict, self.on_malformed))
            ray.get(h.install_entry.remote(ck), timeout=120)
            topo.add_replica(OperatorReplica(new_label, ENTRY, old.server, "entry", "live", False))
            topo.attach(new_label, h)
            mgr = self.control_loop()
            for src in q.sources:
                for v, port in q.outputs_of(src):
                    for r in topo.replicas(v, state="live"):
                        if topo.is_running(r.label):
                            mgr._connect(StreamReplica(new_label, r.label, port, 0.0, 0.0, 0.0, False, src))
        self.events.append({"t": self.now(), "event": "entry_repaired", "actor": label, "new": new_label,
                            "from": peers[0], "expected": ck["expected"]})
        return new_label

    # -- network conditions -------------------------------------------------------------------
    def _net_event(self, desc: dict) -> None:
        self.events.append({"t": self.now(), **desc})
        self._broadcast_network()

    def slow_server(self, server: str, factor: float, duration: float | None = None) -> None:
        """Stretch processing on ``server`` by ``factor`` (for ``duration`` s, or until restored)."""
        now = self.now()
        self.conditions.slow_server(server, now, now + duration if duration else float("inf"), factor)
        self._net_event({"event": "slow_server", "server": server, "factor": factor})

    def delay_link(self, a: str, b: str, extra_ms: float, duration: float | None = None,
                   both_directions: bool = True) -> None:
        """Add ``extra_ms`` to the emulated link ``a -> b`` (and ``b -> a`` unless told not to)."""
        now = self.now()
        self.conditions.add_delay(a, b, now, now + duration if duration else float("inf"), extra_ms,
                                  both_directions)
        self._net_event({"event": "delay_link", "a": a, "b": b, "extra_ms": extra_ms,
                         "both_directions": both_directions})

    def cut_link(self, a: str, b: str, duration: float | None = None) -> None:
        """Cut the emulated link between ``a`` and ``b`` (for ``duration`` s, or until restored)."""
        now = self.now()
        self.conditions.cut(a, b, now, now + duration if duration else float("inf"))
        self._net_event({"event": "cut_link", "a": a, "b": b})

    def restore(self, a: str | None = None, b: str | None = None, server: str | None = None) -> None:
        """End the delays, cuts and slow-downs on a link or a server."""
        self.conditions.restore(a=a, b=b, server=server, at=self.now())
        self._net_event({"event": "restore", "a": a, "b": b, "server": server})

    def _broadcast_network(self) -> None:
        self.tell({label: h.set_network.remote(self.conditions) for label, h in self.topology.running()})

    def install_scenario(self, scenario) -> None:
        """Validate ``scenario`` against this deployment and install its network events."""
        ops = {n: self.k for n in self.query.operators}
        ops[ENTRY] = len(self.topology.replicas(ENTRY))
        scenario.validate(servers=list(self.servers), operators=ops)
        self._pending_kills = scenario.apply_to(self.conditions, 0.0)

    def _start_scenario_thread(self, scenario) -> None:
        kills = sorted(self._pending_kills, key=lambda e: e.at)

        def loop():
            for ev in kills:
                delay = self.t0 + ev.at - time.time()
                if delay > 0:
                    time.sleep(delay)
                try:
                    if ev.action == "kill_server":
                        self.kill_server(ev.server)
                    elif ev.action == "kill_replica":
                        self.kill_replica(ev.operator, ev.replica)
                    self.events.append({"t": self.now(), "event": ev.action,
                                        "target": ev.server or f"{ev.operator}#{ev.replica}"})
                except Exception as e:  # recorded, not fatal
                    self.events.append({"t": self.now(), "event": "error", "error": repr(e)})

        self._scenario_thread = threading.Thread(target=loop, daemon=True, name="replistream-scenario")
        self._scenario_thread.start()

    # -- metrics ---------------------------------------------------------------------------------
    def metrics(self) -> dict:
        """Per application: delivered tuples and latency; per actor: CPU seconds, links, drops."""
        actors = {}
        asked = {label: h.stats.remote() for label, h in self.handles.items() if self.topology.is_running(label)}
        ready = self._ask_all(asked, self.ASK_TIMEOUT_S)
        for label, h in self.handles.items():
            server = self.topology.server(label)
            if label not in asked:
                actors[label] = {"label": label, "server": server, "alive": False}
                continue
            if asked[label] not in ready:  # alive as far as anyone knows, but busy in a call or suspected
                suspected = self.detector.is_suspected(label)
                actors[label] = {"label": label, "server": server, "alive": True, "busy": True,
                                 "suspected": suspected,
                                 "error": "suspected by the failure detector" if suspected
                                 else f"no answer within {self.ASK_TIMEOUT_S:g} s"}
                continue
            try:
                s = ray.get(asked[label])
                s["alive"] = True
                actors[label] = s
            except Exception as e:  # reported in the metrics
                actors[label] = {"label": label, "server": server, "alive": False, "error": repr(e)}
        apps = {}
        for n in self.query.sinks:
            t, lat = self.latencies_ms(n)
            apps[n] = {
                "delivered": self.delivered.count(n),
                "complete": self.delivered.punctuation.get(n) == END,
                "latency_ms": _percentiles(lat) if self.speed else None,
                "filter_weights": actors.get(n, {}).get("filters", [{}])[0].get("weights"),
            }
        links = [lk for a in actors.values() for lk in a.get("links", [])]
        out = {"applications": apps, "actors": actors, "stream_replicas": links, "events": list(self.events),
               "coordinator": [], "placement": self.plan, **self.fault_tolerance()}
        try:
            out["coordinator"] = self.ask_coordinator("log", timeout=10)
        except Exception as e:  # reported in the metrics
            out["coordinator_error"] = repr(e)
        return out

    def fault_tolerance(self) -> dict:
        """How many more crashes the deployment masks: per node (the entry points as ``"entry"``) its
        live replicas - 1, and the smallest of them (``fault_tolerance``; -1 once a node has no live
        replica). Garbage collection lowers it down to ``kmin - 1`` (docs/reliability.md).

        >>> dep.fault_tolerance()                      # doctest: +SKIP
        {'fault_tolerance': 1, 'fault_tolerance_per_node': {'entry': 1, 'correlate': 1, ...}}
        """
        per = {}
        for node in [ENTRY, *self.query.operators, *self.query.sinks]:
            per[node] = sum(r.state == "live" for r in self.topology.replicas(node)) - 1
        ops = [v for n, v in per.items() if n not in self.query.sinks]
        return {"fault_tolerance": min(ops, default=0), "fault_tolerance_per_node": per}

    def metrics_json(self) -> str:
        """:meth:`metrics` as JSON."""
        return json.dumps(self.metrics(), default=json_default)

    # -- teardown ------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Kill every actor of the deployment (Ray itself keeps running)."""
        self.shut_down = True
        if self._monitor_thread is not None:
            self._monitor_thread.join(10)
        if self.manager is not None:
            self.manager.stop()
        running = self.topology.stop_all()
        wait_quietly([self.coordinator.forget.remote()], timeout=5)  # its kept state goes with the deployment
        if self._repair_thread is not None:
            self._repair_thread.join(30)
        for t in list(self._reconnect_threads):
            t.join(30)
        threads = [self.feeder.thread, self._scenario_thread, self._repair_thread, self._monitor_thread,
                   *self._reconnect_threads,
                   None if self.manager is None else getattr(self.manager, "_thread", None)]
        if pool.pool_size() and self.detached_as is None and not any(t is not None and t.is_alive() for t in threads):
            # every actor stops sending and settles; local ones may be kept for the next deployment
            kinds = {"entry": "EntryActor", "application": "SinkActor"}
            named = [(None if ray_options(self.servers[self.actor_server[label]]) else
                      kinds.get(self.topology.replica(label).kind, "ReplicaActor"), h) for label, h in running]
            label_of = {id(h): label for label, h in running}
            for h in [self.coordinator, self._standby]:
                if h is not None:
                    named.append(("CoordinatorActor", h))
                    label_of[id(h)] = "coordinator"
            running = [(label_of[id(h)], h) for _, h in pool.recycle(named)]
        else:
            running.append(("coordinator", self.coordinator))
            if self._standby is not None:
                running.append(("coordinator", self._standby))
        self.stop_actors(running, "shutdown")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()


def check_detached(name, detached: bool, on_output) -> None:
    """``deploy``'s ``name``/``detached`` checked before anything starts (ValueError naming the fix)."""
    if not isinstance(detached, bool):
        raise ValueError(f"detached must be True or False, got {detached!r}")
    if not detached:
        raise ValueError("name= is for a detached deployment: pass detached=True too (a deployment of this "
                         "script needs no name)")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name):
        raise ValueError(f"detached=True needs name='...' (letters, digits, '_', '.', '-'; at most 64), got "
                         f"{name!r}: other drivers attach to it by that name")
    if on_output:
        raise ValueError("on_output runs callbacks in this script, which a detached deployment outlives: "
                         "write the results with sinks={app: ParquetSink(folder)} instead")


def _deploy_detached(query: Query, name: str, address: str | None, ray_init: dict | None, options: dict):
    """Start the host actor of a detached deployment and deploy ``query`` in it (host.py)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from .host import NAMESPACE, DeploymentClient, DeploymentHost, cluster_address

    if not ray.is_initialized():
        addr = address or cluster_address()
        if addr is None:
            raise RuntimeError("detached=True needs a Ray cluster that outlives this script: start one with "
                               "`replistream up` (or name one with RAY_ADDRESS, e.g. RAY_ADDRESS=auto after `ray start --head`), "
                               "then deploy again")
        init_ray(addr, **(ray_init or {}))
    try:
        ray.get_actor(name, namespace=NAMESPACE)
        raise ValueError(f"a detached deployment named {name!r} runs already on this cluster: "
                         f"replistream.attach({name!r}) to use it, or stop it first")
    except ValueError as e:
        if "runs already" in str(e):
            raise
    ship_user_code(query)
    here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=True)
    host = DeploymentHost.options(name=name, namespace=NAMESPACE, lifetime="detached",
                                  scheduling_strategy=here).remote()
    try:
        ray.get(host.start.remote(query, options), timeout=600)
    except BaseException:
        from .lifecycle import discard

        ray.kill(host, no_restart=True)  # a deployment that did not start leaves nothing behind
        discard(name)
        raise
    return DeploymentClient(host, name)


@checked_keywords
def deploy(query: Query, servers=None, k: int = 2, placement=None, network="zero", *, address: str | None = None,
           seed: int = 0, flush_ms: float = 2.0, max_batch: int = 10_000, max_inflight: int = 16,
           drop_after_s: float = 10.0, strict: bool = False, on_malformed: str = "dead_letter",
           parquet_dir: str | None = None, cluster=None, ray_init: dict | None = None,
           on_output: Mapping[str, Callable] | None = None, gc=None, on_error: str | None = None,
           app_replicas: int = 1, spares: int = 0, repair: bool = False,
           suspect_after_s: float = DEFAULT_SUSPECT_AFTER_S, fail_after_s: float = DEFAULT_FAIL_AFTER_S,
           progress: bool | None = None, sinks: Mapping[str, Any] | None = None, name: str | None = None,
           detached: bool = False) -> Deployment:
    """Deploy ``query`` with ``k`` replicas of every operator on distinct servers.

    ``servers``: a count, city names, :class:`~replistream.network.Server`
    objects (``Server.node`` pins it to a Ray node: a node id, ``label:K=V``
    or ``resource:NAME``), a :class:`~replistream.placement.ServerSet` or a
    server file. ``placement``: ``"spread"`` (default), ``"min-cost"``
    (Algorithm 5, Hwang §V-A), ``"random"``, ``"non-replicated"`` (k=1), a
    :class:`~replistream.placement.PlacementPolicy` (strategy with its
    parameters, rates, source locations), a mapping ``{node: [server, ...]}``
    (``"entry"`` for the entry points), or a callable ``(query, servers, k)
    -> mapping``. Placement policies cost latencies with ``network`` (with
    ``"zero"``: the servers' network coordinates or geography). The
    coordinator actor holds the plan and its network cost
    (``dep.placement``, ``dep.coordinator.network_cost.remote()``). ``network``:
    ``"zero"`` (no emulated delay), ``"geo"`` (the built-in wide-area model),
    ``"geo-static"``, a trace CSV path, or a latency model. Starts Ray if it
    is not running (``address=`` joins an existing cluster). Applications
    deliver to memory (``Deployment.results``), to callbacks
    (``on_output={app: fn}``, run in the driver) and, with ``parquet_dir``,
    to Parquet files (``parquet_dir/<app>/*.parquet``). ``gc``: a
    :class:`~replistream.engines.ray.control.GCConfig` (or a mapping of its
    fields) turns on the coordinator loop of garbage collection (Algorithm 6)
    and revival (Hwang §V-C); its decisions are in ``dep.gc_events()`` and the
    network cost over time in ``dep.network_cost_history()``. ``on_error``
    (``"dead_letter"`` or ``"fail"``) overrides the query's policy for rows a
    user function raises on (:meth:`~replistream.query.Query.with_on_error`).
    ``app_replicas``: replicas of every application (default 1), each with its
    duplicate filter on its own server (the placement's server for the
    application, then the next servers in order; a placement mapping may also
    list several servers for an application); the driver keeps the first copy
    of each result, so losing all but one of them loses nothing.
    ``spares``: warm spare actors started with the deployment and kept idle
    (:mod:`.pool`): a replica started while it runs (a revival after a crash, a
    move, an added replica) takes one instead of starting a process (local
    logical servers only). ``repair=True``: an operator replica that crashes
    (killed, or noticed dead by the liveness check) is replaced on its server
    by a new replica built by hand-over from a live peer, so the operator is
    back to k replicas (``dep.repairs``, ``repaired`` events; entry points,
    applications and replicas of a lost server are not rebuilt).
    ``suspect_after_s``, ``fail_after_s``: the failure detector's bounds for a
    replica that stops answering (a stopped process, a frozen host, a user
    function that never returns) while a peer of its node progresses: after
    ``suspect_after_s`` nothing waits on it, after ``fail_after_s`` it is
    killed and handled as a crash (:mod:`.detector`, docs/reliability.md).
    ``progress``: a phase line on stderr while the call runs, when stderr is a
    terminal and only after 2 s (None: unless :func:`replistream.quiet`;
    False: never; True: also after ``quiet()``); the deployment's ``run()``
    uses the same setting. Every error in the request is raised before any
    actor starts.

    >>> dep = deploy(query, servers=["boston", "london", "tokyo"], k=2, network="geo")   # doctest: +SKIP
    """
    given = {n: v for n, v in locals().items() if n not in ("query", "name", "detached", "address", "ray_init")}
    query.build()
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or int(k) < 1:
        raise ValueError(f"k (the degree of replication) must be an integer >= 1, got {k!r}")
    if on_error is not None:
        query = query.with_on_error(check_on_error(on_error, "deploy"))
    given_servers = servers
    servers = resolve_servers(servers)
    if k > len(servers):
        raise ValueError(f"k={k} replicas need at least {k} distinct servers; {len(servers)} given")
    conditions = resolve_network(network, servers, seed)
    placement_net = placement_network(conditions, given_servers)
    plan, placed = resolve_placement_with_cost(query, servers, k, placement, placement_net)
    if isinstance(app_replicas, bool) or not isinstance(app_replicas, (int, np.integer)) or \
            not 1 <= app_replicas <= len(servers):
        raise ValueError(f"app_replicas must be an integer between 1 and {len(servers)} (the servers), "
                         f"got {app_replicas!r}")
    if app_replicas > 1:
        names = [s.name for s in servers]
        for app in query.sinks:
            where = list(plan[app])
            for srv in names[names.index(where[0]):] + names:
                if len(where) >= app_replicas:
                    break
                if srv not in where:
                    where.append(srv)
            plan[app] = where
        PhysicalPlan(query, plan)  # checked again
        placed = None
    if parquet_dir is not None and any(len(plan[a]) > 1 for a in query.sinks):
        raise ValueError("parquet_dir writes one application replica's output; with several application "
                         "replicas, write Deployment.results() or use on_output")
    if placed is None:
        placed = evaluate_plan(query, servers, plan, placement_net)
    for s in servers:
        ray_options(s)  # a malformed Server.node fails here, before any actor starts
    if on_malformed not in ("raise", "dead_letter"):
        raise ValueError(f"on_malformed must be 'raise' or 'dead_letter', got {on_malformed!r}")
    if gc is not None:
        gc = GCConfig(**gc) if isinstance(gc, Mapping) else gc
        if not isinstance(gc, GCConfig):
            raise ValueError(f"gc must be a GCConfig or a mapping of its fields, got {type(gc).__name__}")
        gc.validate()
        if gc.kmin is not None and gc.kmin > k:
            raise ValueError(f"GCConfig.kmin={gc.kmin} is more than k={k} replicas")
    for app in on_output or {}:
        if app not in query.sinks:
            raise ValueError(f"on_output names {app!r}, not an application of query {query.name!r}")
    from ...sinks import ParquetSink

    for app, sink in (sinks or {}).items():
        if app not in query.sinks:
            raise ValueError(f"sinks names {app!r}, not an application of query {query.name!r}; "
                             f"applications: {query.sinks}")
        if not isinstance(sink, ParquetSink):
            raise ValueError(f"sinks[{app!r}] must be a replistream.ParquetSink, got {type(sink).__name__}")
    if detached or name is not None:
        check_detached(name, detached, on_output)
    for sink in (sinks or {}).values():
        sink.prepare()  # a used folder is refused (or cleaned) before anything starts
    if detached:
        return _deploy_detached(query, name, address, ray_init, given)
    if isinstance(spares, bool) or not isinstance(spares, (int, np.integer)) or spares < 0:
        raise ValueError(f"spares must be a whole number >= 0, got {spares!r}")
    if not isinstance(repair, bool):
        raise ValueError(f"repair must be True or False, got {repair!r}")
    FailureDetector(suspect_after_s, fail_after_s)  # bounds checked before anything starts
    from ...progress import reporter

    with reporter("deploy", progress) as rep:
        rep.phase("starting Ray")
        if address is None and ray_init is None and not ray.is_initialized():
            from .host import cluster_address

            address = cluster_address()  # a cluster kept between scripts (replistream up) is joined
        init_ray(address, **(ray_init or {}))
        ship_user_code(query)
        channel_opts = {"max_batch": max_batch, "flush_ms": flush_ms, "max_inflight": max_inflight,
                        "drop_after_s": drop_after_s,
                        "epoch": uuid.uuid4().hex}  # this deployment's: in every packet and report
        dep = Deployment(query, servers, int(k), plan, conditions, seed, channel_opts, strict, on_malformed,
                         parquet_dir, cluster, gc, suspect_after_s=suspect_after_s, fail_after_s=fail_after_s,
                         reporter=rep, file_sinks=sinks)
        dep.show_progress = progress
        dep.placement = placed
        dep.repair, dep.spares = repair, int(spares)
        if spares:
            rep.phase(f"starting {int(spares)} warm spares")
        dep.start_spares(int(spares))
        rep.phase("handing the placement to the coordinator")
        ray.get(dep.coordinator.set_placement.remote(query, servers, placed, dep.handles, dep.actor_server),
                timeout=60)
        info = ray.get(dep.coordinator.ping.remote(), timeout=60)
        dep._coordinator_pid, dep._coordinator_start = info["pid"], info.get("start")
        dep.start_standby()
        for app, cb in (on_output or {}).items():
            dep.on_output(app, cb)
        dep.start_monitor()
    return dep


def furthest_key(position: Mapping[str, Mapping]) -> tuple[int, int]:
    """How far an entry replica is (:meth:`~.actors.EntryActor.entry_position`): its sources ended,
    then its chunks taken; the replica with the largest key has taken everything its peers took.

    >>> furthest_key({"a": {"expected": 4, "rows": 40, "closed": True}, "b": {"expected": 2, "rows": 9, "closed": False}})
    (1, 6)
    """
    return (sum(bool(p["closed"]) for p in position.values()), sum(int(p["expected"]) for p in position.values()))


def _percentiles(lat: np.ndarray) -> dict:
    if not len(lat):
        return {"count": 0}
    p = np.percentile(lat, [50, 90, 99])
    return {"count": int(len(lat)), "p50": float(p[0]), "p90": float(p[1]), "p99": float(p[2]),
            "max": float(lat.max()), "mean": float(lat.mean())}
