"""Deploy a replicated query on Ray (Hwang §II-B).

:func:`deploy` checks the request before any actor starts (servers, placement,
network, the garbage-collection settings: :mod:`.resolve`), places ``k`` replicas
of every operator on distinct servers, builds the deployment's control plane
(:class:`~.plane.ControlPlane`), which starts the actors (entry points, operator
replicas, applications: :mod:`.actors`; the coordinator: :mod:`.coordinator`) and
connects every upstream replica to every downstream replica as the
:class:`~replistream.plan.PhysicalPlan` says, and returns a :class:`~.client.Deployment`:
the user's thin client of that control plane. ``detached=True`` builds the control
plane in a host actor of the cluster instead (:mod:`.host`), which outlives the script.

>>> import replistream as rs                                  # doctest: +SKIP
>>> dep = rs.deploy(query, servers=6, k=2, network="geo")     # doctest: +SKIP
>>> result = dep.run(inputs, pace=1.0)                        # doctest: +SKIP
>>> result.outputs["alerts"][:3]                              # doctest: +SKIP
"""
from __future__ import annotations

import os
import re
import uuid
from collections.abc import Mapping
from contextlib import contextmanager
from typing import Any, Callable

import numpy as np
import ray

from ...placement.nodes import ray_options
from ...partition import DEFAULT_BITS, check_parallelism, entry_parallelism
from ...plan import PhysicalPlan
from ...query import Query, check_on_error
from ...keywords import checked_keywords  # (#44) deploy(..., paralelism=2): "did you mean", every keyword
from .control import GCConfig
from .detector import DEFAULT_FAIL_AFTER_S, DEFAULT_SUSPECT_AFTER_S, FailureDetector
from .resolve import (evaluate_plan, operators_only, placement_network, resolve_network,
                      resolve_placement_with_cost, resolve_servers)
from .client import Deployment
from .plane import ControlPlane

__all__ = ["RAY_SYSTEM_CONFIG", "Deployment", "deploy", "init_ray"]

#: Ray settings replistream starts Ray with. Packets up to this size travel inline
#: in the actor call instead of through the object store (see channels.py: a dead
#: sender's objects stall their receiver about a second each). A socket connection
#: Ray retries (the raylet's to its object store, a worker's to the raylet) is tried
#: again after 100 ms instead of 1 s, 100 times instead of 10 (the same 10 s in all):
#: the raylet's first try at its store often comes before the store listens, and that
#: second made Ray's own start 2.1 or 3.1 s at random on this project's machine
#: (docs/benchmarks.md, issue #42). On a cluster you start yourself, pass the same
#: ``_system_config`` to ``ray.init``/``ray start``.
RAY_SYSTEM_CONFIG = {"max_direct_call_object_size": 8 * 1024 * 1024,
                     "raylet_client_connect_timeout_milliseconds": 100,
                     "raylet_client_num_connect_attempts": 100}


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
    from .bytecode import cache_package_bytecode

    cache_package_bytecode()  # (every actor process imports the package: compiled once, not in each)
    opts = {"include_dashboard": False}
    if not verbose:
        opts.update(logging_level="ERROR", log_to_driver=False)
        quiet_ray_messages()
    if address == "auto":
        address = _running_cluster()
    local = address is None or address == "local"
    if local:
        opts["address"] = "local"
        opts["_system_config"] = dict(RAY_SYSTEM_CONFIG)
    else:
        opts["address"] = address
    opts.update(kwargs)
    if not local:
        hostport = str(address).split("://")[-1]
        if "://" not in str(address) and re.fullmatch(r"[\w.-]+:\d+", hostport):
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
    if opts.get("log_to_driver") is False:  # no worker log lines come here: a quicker exit
        from .rayexit import install

        install()
    if not local:  # a running cluster: its warm pool of actor processes serves this script's deployments
        from . import warm

        warm.use_cluster(True)


def _file_reader() -> None:
    """For a query with a declared file source: a process for its file reads, ready before the
    feed (issue #42). Joined to a cluster, a reader taken from its warm pool (:mod:`.reader`), once
    per script; else (or none idle) a Ray worker started now beside the replicas (``warm_reader``)."""
    from ... import files

    if files.reader() is None:
        from . import warm

        h = warm.take("ReaderActor")
        if h is not None:
            files.use_reader(h)
            return
    files.warm_reader()


def _running_cluster() -> str:
    """The ``host:port`` that ``address="auto"`` (or ``RAY_ADDRESS=auto``) means: the cluster
    ``ray start`` recorded on this machine, found as Ray finds it but kept as recorded. Ray itself
    turns a recorded 127.0.0.1 into the machine's own address, where a cluster started on the
    loopback interface (``replistream up``) does not listen, and then waits without end for its
    GCS; this address is checked and joined on the loopback interface instead.

    >>> _running_cluster()   # doctest: +SKIP
    '127.0.0.1:6379'
    """
    from ray._private import services

    try:
        found = services.get_ray_address_from_environment("auto", None)
    except ConnectionError:
        found = None
    if not found or found == "auto":
        raise ConnectionError("address='auto' (or RAY_ADDRESS=auto) but no Ray cluster runs on this machine: "
                              "start one (`replistream up`), or unset RAY_ADDRESS to run on a Ray of this "
                              "script's own")
    return found


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

    from .client import Hosted
    from .host import NAMESPACE, DeploymentHost, cluster_address

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
    return Deployment(Hosted(host, name))


@checked_keywords
def deploy(query: Query, servers=None, k: int = 2, placement=None, network="zero", *, address: str | None = None,
           seed: int = 0, flush_ms: float = 2.0, max_batch: int = 10_000, max_inflight: int = 16,
           drop_after_s: float = 10.0, strict: bool = False, on_malformed: str = "dead_letter",
           parquet_dir: str | None = None, cluster=None, ray_init: dict | None = None,
           on_output: Mapping[str, Callable] | None = None, gc=None, on_error: str | None = None,
           app_replicas: int = 1, spares: int = 0, repair: bool = False,
           suspect_after_s: float = DEFAULT_SUSPECT_AFTER_S, fail_after_s: float = DEFAULT_FAIL_AFTER_S,
           progress: bool | None = None, sinks: Mapping[str, Any] | None = None, name: str | None = None,
           detached: bool = False, parallelism: Mapping[str, int] | None = None, bits: int | None = None) -> Deployment:
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
    uses the same setting. ``parallelism``: ``{operator: p}`` runs each named
    operator as ``p`` key partitions, each with ``k`` replicas (labelled
    ``"op.P#R"``); every upstream replica sends each tuple to the replicas of
    the partition that owns its key's bin, one of ``2**bits`` (default 2^12;
    docs/design.md, "Partitions"); ``parallelism={"entry": p}`` runs the entry
    points as ``p`` partitions of ``k`` replicas (``"entry.P#R"``): the feeder
    hands each chunk of a source (a file's chunk is read once per partition's
    replicas) to one partition (docs/design.md, "Entry partitions"). It may name
    an application: each of its ``p`` partitions runs ``k`` replicas
    (``"app.P#R"``, ``app_replicas`` does not apply), fed by tuple id; the driver
    gathers every partition's output, and a ``ParquetSink`` is written per
    partition (:mod:`replistream.sinks`). Every error in the request is raised
    before any actor starts.

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
    bits = DEFAULT_BITS if bits is None else bits
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not 0 <= int(bits) <= 20:
        raise ValueError(f"bits must be an integer from 0 to 20 (2**bits bins of keys), got {bits!r}")
    entry_parts, parallelism = entry_parallelism(parallelism)
    parallelism = check_parallelism(query, parallelism, int(bits), keep_single=True, applications=True)
    partitioned_apps = sorted(n for n in parallelism if n in query.sinks)
    plan, placed = resolve_placement_with_cost(query, servers, k, placement, placement_net, parallelism, int(bits))
    if isinstance(app_replicas, bool) or not isinstance(app_replicas, (int, np.integer)) or \
            not 1 <= app_replicas <= len(servers):
        raise ValueError(f"app_replicas must be an integer between 1 and {len(servers)} (the servers), "
                         f"got {app_replicas!r}")
    if app_replicas > 1:
        names = [s.name for s in servers]
        for app in query.sinks:
            if app in parallelism:
                continue  # a partitioned application runs k replicas per partition
            where = list(plan[app])
            for srv in names[names.index(where[0]):] + names:
                if len(where) >= app_replicas:
                    break
                if srv not in where:
                    where.append(srv)
            plan[app] = where
        PhysicalPlan(query, plan, parallelism=parallelism, keep_single=True, applications=True)  # checked again
        placed = None
    if parquet_dir is not None and partitioned_apps:
        raise ValueError(f"parquet_dir writes one application replica's output; the partitioned application "
                         f"{partitioned_apps[0]!r} runs several: write it with sinks={{{partitioned_apps[0]!r}: "
                         f"ParquetSink(folder)}} instead")
    if parquet_dir is not None and any(len(plan[a]) > 1 for a in query.sinks):
        raise ValueError("parquet_dir writes one application replica's output; with several application "
                         "replicas, write Deployment.results() or use on_output")
    if placed is None:
        placed = evaluate_plan(query, servers, plan, placement_net, operators_only(query, parallelism),
                               int(bits))  # partitions costed where they run ("op.P", else "op")
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
        if any(query.graph.nodes[s].get("files") for s in query.sources):
            _file_reader()
        channel_opts = {"max_batch": max_batch, "flush_ms": flush_ms, "max_inflight": max_inflight,
                        "drop_after_s": drop_after_s, "partitions": dict(parallelism), "bits": int(bits),
                        "entry_partitions": entry_parts,
                        "epoch": uuid.uuid4().hex}  # this deployment's: in every packet and report
        plane = ControlPlane(query, servers, int(k), plan, conditions, seed, channel_opts, strict, on_malformed,
                             parquet_dir, cluster, gc, suspect_after_s=suspect_after_s, fail_after_s=fail_after_s,
                             reporter=rep, file_sinks=sinks)
        plane.show_progress = progress
        plane.placement = placed
        plane.repairer.repair, plane.repairer.spares = repair, int(spares)
        if spares:
            rep.phase(f"starting {int(spares)} warm spares")
        plane.start_spares(int(spares))
        rep.phase("handing the placement to the coordinator")
        ray.get(plane.coordinator.set_placement.remote(query, servers, placed, plane.handles, plane.actor_server),
                timeout=60)
        info = ray.get(plane.coordinator.ping.remote(), timeout=60)
        plane.coord._coordinator_pid, plane.coord._coordinator_start = info["pid"], info.get("start")
        plane.coord.start_standby()
        for app, cb in (on_output or {}).items():
            plane.output.on_output(app, cb)
        plane.monitor.start_monitor()
    return Deployment.of(plane)
