"""A detached deployment's state, kept in Ray's key-value store, and its restore (issue #40).

A detached deployment (``deploy(..., name=, detached=True)``) runs in its serving host actor
(:mod:`.host`). When that host's process dies, for any reason (SIGKILL, an out-of-memory kill, a
crash, a fence after it stopped answering), the host standing by takes it up (:mod:`.standby`),
or Ray's restart of the lost host does when none stands by; its replicas, its coordinator and
the warm actors it leased are *detached* actors that no process owns, so they go on running
meanwhile. What the host knew is kept here, written as it changes, and the next host resumes
from it:

* ``options``: the query and ``deploy()``'s options, written before any actor starts;
* ``registry/<actor id>``: every actor the deployment started or took, written *before* the
  actor is used (:meth:`Persister.registered`): after a restore, an actor that was started but
  never entered the topology (a repair, a move or an added replica cut short) is found and
  stopped, and its label is never given again (:meth:`~.topology.Topology.burn`): a half-done
  action is rolled back, never left half;
* ``state``: the topology (replicas with their actor handles, stream replicas with their
  filter channels), the plan, the query as changed at run time, the clock, the events, the
  changes, the repairs, the control loop's decisions, the dead letters of retired replicas, the
  coordinator's handle and key, the number of sentinels run per source; written by a thread
  (:class:`Persister`) within milliseconds of a change to the topology, and every half second
  when anything else changed;
* ``state["rescale"]``: a rescale in flight (:func:`~.rescale.resume`): written as it begins and
  again, whole, once its switch and steps are cut and before any sender hears of them; the next
  host sends them again and finishes it (or runs one cut short before its switch again), and the
  client's call sent again gets its record; dropped with the record logged, in one write;
* ``feed``: what ``feed()`` was given (lists, arrays, file sources: anything the host can
  read again), written before the first chunk is sent.

Restoring (:func:`restore`): the topology is read back; every replica it says runs is probed
(with a deadline): a dead one is handled as a crash, one still waiting for a hand-over (the
hand-over was cut short) is fenced and handled as a crash, so a repair or the control loop
builds it again; the coordinator is asked and replaced if lost (it keeps its own state,
:mod:`.coordinator`); the feeder resumes from the entry replicas' positions: per source, the
furthest entry replica's next chunk and rows taken are where feeding goes on (the input is read
again and the rows already taken are skipped), and an entry replica behind it catches up from a
peer (:meth:`~.actors.EntryActor.catch_up`; peers keep the last :data:`~.feeder.KEEP_CHUNKS`
chunks) or is declared lost. Results are fetched again from the applications by position.

Why Ray's key-value store and not files: it is the cluster's, readable from whichever node the
host is restarted on, and it is where the coordinator keeps its state already; it lives as long as
the cluster's control service (a head node's loss ends a deployment either way).

>>> Persister.key("monitor", "state")
'replistream/deployments/monitor/state'
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
import time
import warnings
from typing import Any

import ray
from ray import cloudpickle
from ray.experimental import internal_kv

from . import lockorder
from .common import is_actor_death
from .coordinator import KV_NAMESPACE

__all__ = ["Persister", "restore", "discard", "forget", "registry", "put_value", "get_value", "keys", "delete_value", "kill_actors",
           "PREFIX", "PIECE"]

#: Where detached deployments keep their state in Ray's key-value store (namespace
#: :data:`~.coordinator.KV_NAMESPACE`).
PREFIX = "replistream/deployments/"

#: Bytes per key-value entry (a larger value is split).
PIECE = 16 * 1024 * 1024


def put_value(key: str, value: Any) -> None:
    """Keep ``value`` (pickled, split in pieces of :data:`PIECE` bytes) under ``key`` in Ray's
    key-value store; the head entry is written last, so a reader never sees half a value.

    >>> put_value("replistream/deployments/m/feed_id", "abc"); get_value("replistream/deployments/m/feed_id")  # doctest: +SKIP
    'abc'
    """
    raw = cloudpickle.dumps(value)
    n = max(1, -(-len(raw) // PIECE))
    for i in range(n):
        internal_kv._internal_kv_put(f"{key}#{i}", raw[i * PIECE:(i + 1) * PIECE], namespace=KV_NAMESPACE)
    internal_kv._internal_kv_put(key, str(n).encode(), namespace=KV_NAMESPACE)  # written last: complete


def get_value(key: str) -> Any:
    """The value :func:`put_value` kept under ``key`` (None if there is none).

    >>> get_value("replistream/deployments/none/state") is None   # doctest: +SKIP
    True
    """
    head = internal_kv._internal_kv_get(key, namespace=KV_NAMESPACE)
    if head is None:
        return None
    parts = [internal_kv._internal_kv_get(f"{key}#{i}", namespace=KV_NAMESPACE) for i in range(int(head))]
    if any(p is None for p in parts):
        raise RuntimeError(f"the persisted value {key!r} is incomplete in Ray's key-value store")
    return cloudpickle.loads(b"".join(parts))


def keys(prefix: str) -> list[str]:
    """The keys :func:`put_value` wrote under ``prefix`` (not their pieces), sorted.

    >>> keys("replistream/deployments/none/")   # doctest: +SKIP
    []
    """
    found = internal_kv._internal_kv_list(prefix, namespace=KV_NAMESPACE)
    return sorted(k for k in (k.decode() if isinstance(k, bytes) else k for k in found) if "#" not in k[len(prefix):])


def delete_value(key: str) -> None:
    """Drop what :func:`put_value` kept under ``key`` (its pieces included).

    >>> delete_value("replistream/warm/idle/0")   # doctest: +SKIP
    """
    internal_kv._internal_kv_del(key, namespace=KV_NAMESPACE)
    internal_kv._internal_kv_del(key + "#", del_by_prefix=True, namespace=KV_NAMESPACE)


def forget(name: str) -> int:
    """Drop everything kept for deployment ``name``; returns the keys dropped.

    >>> forget("monitor")   # doctest: +SKIP
    12
    """
    return int(internal_kv._internal_kv_del(Persister.key(name, ""), del_by_prefix=True, namespace=KV_NAMESPACE))


def registry(name: str) -> dict[str, Any]:
    """``{actor id: handle}`` of every actor deployment ``name`` started or took.

    >>> len(registry("monitor"))   # doctest: +SKIP
    9
    """
    out = {}
    for key in keys(Persister.key(name, "registry/")):
        h = get_value(key)
        if h is not None:
            out[key.rpartition("/")[2]] = h
    return out


def kill_actors(handles) -> int:
    """``ray.kill`` each of ``handles``; returns how many kills Ray took. One it refused is said in a
    warning, with Ray's reason (an actor gone already is not refused).

    >>> kill_actors([])
    0
    """
    n, refused = 0, []
    for h in handles:
        try:
            ray.kill(h, no_restart=True)
            n += 1
        except (ValueError, ray.exceptions.RayError) as e:
            refused.append(f"{h._actor_id.hex()}: {type(e).__name__}: {e}")
    if refused:
        warnings.warn(f"replistream: Ray refused to kill {len(refused)} actor(s): {refused[:3]}", RuntimeWarning,
                      stacklevel=2)
    return n


def discard(name: str) -> int:
    """Stop every actor deployment ``name`` registered and drop its kept state (a deployment that
    is stopped, or one whose start was cut short and is started again). Returns the actors stopped.

    >>> discard("monitor")   # doctest: +SKIP
    9
    """
    n = kill_actors(registry(name).values())
    forget(name)
    return n


class Persister:
    """Keeps a detached deployment's state in Ray's key-value store as it changes (module doc).
    Its lock is the innermost of the process: it is taken alone, around one write.

    >>> p = Persister(dep)                # doctest: +SKIP
    >>> p.start(); p.persist_now()        # doctest: +SKIP
    """

    #: Seconds between two looks at what changed besides the topology (events, repairs, ...).
    EVERY_S = 0.5

    def __init__(self, dep):
        self.dep = dep
        self.name = dep.detached_as
        self.lock = lockorder.lock("Persister.lock", 4)  # one write of the state at a time (then only the topology's)
        self._mark = None
        self._holds = 0  # blocks during which the thread writes nothing (held())
        self._thread: threading.Thread | None = None
        self.writes = 0
        self.error: str | None = None
        self.gen: int | None = None  # the lease generation its host holds (standby.py); None: not checked

    @staticmethod
    def key(name: str, what: str) -> str:
        return f"{PREFIX}{name}/{what}"

    # -- what is written at once ------------------------------------------------------------
    def registered(self, h) -> None:
        """Actor ``h`` belongs to the deployment (written before it is used)."""
        put_value(self.key(self.name, f"registry/{h._actor_id.hex()}"), h)

    def options(self, query, options: dict) -> None:
        put_value(self.key(self.name, "options"), (query, options))

    def fed(self, args: dict) -> None:
        """What ``feed()`` was given; a ``ValueError`` naming the source if it cannot be kept."""
        for src, data in args["inputs"].items():
            try:
                cloudpickle.dumps(data)
            except Exception as e:
                raise ValueError(f"a detached deployment keeps its input to resume after its host is lost, and "
                                 f"source {src!r}'s input cannot be kept ({type(e).__name__}: {e}): give a list, an "
                                 f"array or a FileSource") from None
        put_value(self.key(self.name, "feed"), args)

    def change_begins(self, marker, seqs: dict) -> None:
        """A change to the running query is about to send ``marker`` as chunk ``seqs[source]`` of each
        open source: kept (with the changed query) before any entry replica gets it."""
        self.dep._markers_in_flight = [*getattr(self.dep, "_markers_in_flight", []), (marker, dict(seqs))]
        self.persist_now()

    def change_done(self, marker) -> None:
        """Every running entry replica was sent ``marker``."""
        self.dep._markers_in_flight = [(m, s) for m, s in getattr(self.dep, "_markers_in_flight", [])
                                       if m.id != marker.id]
        self.persist_now()

    # -- the state ---------------------------------------------------------------------------
    def snapshot(self) -> dict:
        d = self.dep
        mgr = d.manager
        return {
            "name": self.name, "query": d.query, "physical": d._physical, "topology": d.topology,
            "servers": list(d.servers.values()), "k": d.k, "plan": d.plan, "conditions": d.conditions, "seed": d.seed,
            "channel_opts": d.channel_opts, "strict": d.strict, "on_malformed": d.on_malformed,
            "file_sinks": d.file_sinks, "suspect_after_s": d.detector.suspect_after_s,
            "fail_after_s": d.detector.fail_after_s, "t0": d.t0, "ts0": d.ts0, "speed": d.speed,
            "events": list(d.events), "changes": list(d.changes), "repairs": list(d.repairer.repairs), "repair": d.repairer.repair,
            "spares": d.repairer.spares, "retired_letters": list(d._retired_letters), "dormant_of": dict(d.monitor._dormant_of),
            "lost_servers": set(d.repairer._lost_servers), "coordinator": d.coordinator, "coordinator_key": d.coordinator_key,
            "coordinator_pid": d.coord._coordinator_pid, "coordinator_start": getattr(d.coord, "_coordinator_start", None),
            "standby": d.coord._standby, "placement": d.placement,
            "show_progress": d.show_progress,
            "gc": None if mgr is None else {"cfg": mgr.cfg, "running": mgr._thread is not None,
                                            "events": list(mgr.events), "history": list(mgr.history),
                                            "transfers": [dict(t) for t in mgr.transfers]},
            "fed": d.feeder.started, "sentinels": dict(d.feeder.sentinels_run),
            "markers_in_flight": list(getattr(d, "_markers_in_flight", [])), "failure": d.failure,
            "rescale": getattr(d, "_rescale_in_flight", None),
            "reports_seen": d.monitor._reports_seen, "dropped_links": set(d.monitor._dropped_links),
            "link_drops": {k: {f: v for f, v in drop.items() if f != "busy"} for k, drop in d.monitor._link_drops.items()},
            "written": time.time(),
        }

    def _fingerprint(self) -> tuple:
        d = self.dep
        mgr = d.manager
        return (d.topology.version, len(d.events), len(d.changes), len(d.repairer.repairs), len(d._retired_letters),
                d.monitor._reports_seen, d.failure, id(getattr(d, "_rescale_in_flight", None)),
                id(d.coordinator), id(d.coord._standby), d.t0, d.ts0, d.feeder.started,
                tuple(sorted(d.feeder.sentinels_run.items())),
                None if mgr is None else (len(mgr.events), len(mgr.transfers), mgr._thread is not None))

    def persist_now(self, unless_held: bool = False) -> None:
        """Write the state (whatever changed); ``unless_held``: not while a change is being made
        (:meth:`held`; the thread's writes)."""
        with self.lock:
            if unless_held and self._holds:
                return
            if self.gen is not None and not self._still_serving():
                return
            mark = self._fingerprint()
            put_value(self.key(self.name, "state"), self.snapshot())
            self._mark = mark
            self.writes += 1

    def _still_serving(self) -> bool:
        """Whether this host's lease generation is still the newest (standby.py). A host that was
        superseded (another took the deployment up while this process was thought lost) writes
        nothing and ends its process: Ray restarts it, and it stands by."""
        import os

        from .standby import holder

        lease = holder(self.name)
        if lease is None:
            return False  # the deployment is being stopped
        if lease["gen"] != self.gen:
            warnings.warn(f"replistream: detached deployment {self.name!r}: this host (generation {self.gen}) was "
                          f"superseded by {lease['actor']!r} (generation {lease['gen']}); its process ends",
                          RuntimeWarning, stacklevel=2)
            os._exit(1)
        return True

    @contextmanager
    def held(self):
        """While the block runs the thread writes nothing: a change being made (new actors, the
        topology, the query) is written whole by its own explicit write (:meth:`change_begins`,
        its commit point) or not at all, so a host lost meanwhile is restored from before it (the
        actors it started are then stopped, as never recorded). Re-entrant.

        >>> with dep._persister.held(): ...        # doctest: +SKIP
        """
        with self.lock:
            self._holds += 1
        try:
            yield
        finally:
            with self.lock:
                self._holds -= 1
            self.dep.topology.changed.set()  # what changed meanwhile is written next

    def start(self) -> None:
        """Write the state now, then whenever it changes, in a thread of its own."""
        self.persist_now()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="replistream-persist")
        self._thread.start()

    def _loop(self) -> None:
        d = self.dep
        while not d.shut_down:
            d.topology.changed.wait(self.EVERY_S)
            d.topology.changed.clear()
            if d.shut_down:
                return
            try:
                if self._fingerprint() != self._mark:
                    self.persist_now(unless_held=True)
            except Exception as e:  # said in the events and in status(); the next change tries again
                self.error = f"{type(e).__name__}: {e}"
                d.events.append({"t": d.now(), "event": "persist_failed", "error": self.error})
                time.sleep(self.EVERY_S)


def restore(name: str):
    """The deployment ``name`` as its lost host left it, running again in this process (the module
    doc says how), or None if nothing is kept for it. Logged as a ``control_restored`` event.

    >>> dep = restore("monitor")   # doctest: +SKIP
    """
    from .control import ReplicaManager
    from .plane import ControlPlane

    st = get_value(Persister.key(name, "state"))
    if st is None:
        return None
    started = time.time()
    gc = st["gc"]
    dep = ControlPlane(st["query"], st["servers"], st["k"], st["plan"], st["conditions"], st["seed"], st["channel_opts"],
                       st["strict"], st["on_malformed"], None, None, gc=None, suspect_after_s=st["suspect_after_s"],
                       fail_after_s=st["fail_after_s"], file_sinks=st["file_sinks"], restored=st)
    parts = {"repairs": dep.repairer, "repair": dep.repairer, "spares": dep.repairer, "_lost_servers": dep.repairer,
             "_dormant_of": dep.monitor, "_reports_seen": dep.monitor, "_dropped_links": dep.monitor,
             "_link_drops": dep.monitor, "_coordinator_pid": dep.coord, "_coordinator_start": dep.coord,
             "_standby": dep.coord}  # (the rest is the state the plane's parts share: the plane's own)
    for attr, key in [("t0", "t0"), ("ts0", "ts0"), ("speed", "speed"), ("events", "events"), ("changes", "changes"),
                      ("repairs", "repairs"), ("repair", "repair"), ("spares", "spares"),
                      ("_retired_letters", "retired_letters"), ("_dormant_of", "dormant_of"),
                      ("_lost_servers", "lost_servers"), ("coordinator", "coordinator"),
                      ("coordinator_key", "coordinator_key"), ("_coordinator_pid", "coordinator_pid"),
                      ("_coordinator_start", "coordinator_start"),
                      ("_standby", "standby"), ("placement", "placement"), ("show_progress", "show_progress"),
                      ("_reports_seen", "reports_seen"), ("_dropped_links", "dropped_links"),
                      ("_link_drops", "link_drops"), ("_markers_in_flight", "markers_in_flight"), ("failure", "failure")]:
        if key in st:  # (a state kept by an earlier version may lack the newer fields: their defaults stand)
            setattr(parts.get(attr, dep), attr, st[key])
    dep._registry.update(registry(name))
    if gc is not None:
        dep.manager = ReplicaManager(dep, gc["cfg"])
        dep.manager.events, dep.manager.history = list(gc["events"]), list(gc["history"])
        dep.manager.transfers = list(gc["transfers"])
    dep.feeder.sentinels_run.update(st["sentinels"])
    dep._rescale_in_flight = st.get("rescale")
    if dep._rescale_in_flight is not None:  # repairs wait for the rescale resumed below (rescale.resume)
        dep.rescale_done.clear()
        dep.rescaling.set()
    dep._persister = Persister(dep)  # before anything starts an actor (a repair registers it)
    info = _settle_replicas(dep)
    from .rescale import resume as resume_rescale

    # a rescale the lost host had in flight: its switch and steps sent again before the feed goes on
    info["rescale"] = resume_rescale(dep)
    resumed = None
    if st["fed"]:
        feed = get_value(Persister.key(name, "feed"))
        resumed = dep.ingest.resume_feed(feed)
    # (the control loop starts again when the resumed feeder knows its clock: Deployment._feed_started)
    from .reconfigure import resume_retiring

    info["retiring"] = resume_retiring(dep)  # removals whose replicas the lost host had not retired yet
    dep.events.append({"t": dep.now(), "event": "control_restored", "seconds": round(time.time() - started, 3),
                       "at": time.time(),
                       "state_age_s": round(started - st["written"], 3), "resumed": resumed, **info})
    dep._persister.start()  # (writes the state at once: the restore's event included)
    dep.monitor.start_monitor()
    return dep


def _settle_replicas(dep) -> dict:
    """After a restore: stop what the lost host started and never recorded (rolled back), and find
    which of the recorded replicas still run (a dead one is a crash; one still waiting for a
    hand-over that was cut short is fenced, then a crash)."""
    from ...plan import ENTRY

    topo = dep.topology
    known = {h._actor_id.hex() for h in topo.handles().values() if h is not None}
    known |= {h._actor_id.hex() for h in (dep.coordinator, dep.coord._standby) if h is not None}
    orphans = [h for aid, h in dep._registry.items() if aid not in known]
    # a replica says its label; a coordinator (one replaced before the host was lost, or a standby of
    # it) has none to burn: it is stopped all the same
    labels = [h.stats.remote() for h in orphans if _class_of(h) != "CoordinatorActor"]
    ready = set(ray.wait(labels, num_returns=len(labels), timeout=2.0)[0]) if labels else set()
    burned, unnamed = [], 0
    for ref in labels:
        try:  # (stopped below whether or not it answers: one that does not is counted as unnamed)
            lab = ray.get(ref, timeout=0).get("label") if ref in ready else None
        except Exception as e:  # noqa: BLE001 - a death or its own error: it is stopped all the same
            if not is_actor_death(e):
                warnings.warn(f"replistream: an actor the lost host started did not say its label ({e!r}); it is "
                              f"stopped", RuntimeWarning, stacklevel=2)
            lab = None
        if lab:
            topo.burn(lab)
            burned.append(lab)
        else:
            unnamed += 1
    kill_actors(orphans)
    for lab in burned:  # every running replica forgets its links to them
        for other, h in topo.running():
            h.drop_link.remote(lab, "rolled back after the control plane was restored")
    running = topo.running()
    # a garbage collection the lost host had decided (kept before its senders heard of it) is finished:
    # each stream replica the topology says is discarded is removed at its sender (a hold where the
    # receiver stays fed, as the control loop does; nothing if it was removed already)
    fed = {(s.dst, s.port) for s in topo.streams(live=True) if topo.is_running(s.src)}
    discards = {s.id: topo.handle(s.src).disconnect.remote(s.dst, s.port, (s.dst, s.port) in fed)
                for s in topo.streams(live=False)
                if topo.is_running(s.src) and topo.is_running(s.dst) and topo.replica(s.dst).state == "live"}
    done = set(ray.wait(list(discards.values()), num_returns=len(discards), timeout=dep.detector.suspect_after_s)[0]) \
        if discards else set()
    finished = sorted(sid for sid, ref in discards.items() if ref in done and _answer(ref))
    probes = {label: h.probe.remote() for label, h in running}
    ready = set(ray.wait(list(probes.values()), num_returns=len(probes), timeout=dep.detector.fail_after_s)[0]) \
        if probes else set()
    dead, pending = [], []
    for label, ref in probes.items():
        if ref not in ready:
            continue  # silent: the failure detector decides, as for any replica
        try:
            ans = ray.get(ref, timeout=0)  # (ready)
        except Exception as e:  # noqa: BLE001 - a death, or a process Ray cannot reach
            dead.append((label, f"lost while the control plane was restored: {type(e).__name__}"))
            continue
        dep.monitor._pids[label] = (int(ans["pid"]), ans.get("node"), ans.get("start"), ans.get("actor"))
        if ans.get("pending"):
            pending.append(label)
    repair, dep.repairer.repair = dep.repairer.repair, False  # repairs are scheduled below, once, for what is missing
    try:
        for label, why in dead:
            dep.repairer.mark_failed(label, why)
        for label in pending:
            dep.monitor.declare_failed(label, "its hand-over was cut short by the loss of the control plane")
    finally:
        dep.repairer.repair = repair
    repairing = _repairs_cut_short(dep) if repair else []
    try:
        ray.get(dep.coordinator.ping.remote(), timeout=dep.detector.fail_after_s)
    except Exception as e:  # noqa: BLE001 - replaced from the state it kept
        dep.coord.replace_coordinator(dep.coordinator, f"lost with the control plane: {type(e).__name__}", fence=True)
    return {"rolled_back": burned, "orphans_stopped": len(orphans), "orphans_unnamed": unnamed,
            "dead": [d for d, _ in dead],
            "pending": pending, "repairing": repairing, "discards_finished": finished,
            "entries": [label for label, _ in topo.running(ENTRY)]}


def _class_of(h) -> str | None:
    """The class name of actor handle ``h`` (None if Ray does not say)."""
    descriptor = getattr(h, "_ray_actor_creation_function_descriptor", None)
    return getattr(descriptor, "class_name", None)


def _answer(ref) -> int:
    """How many links a finished ``disconnect`` call removed: 0 if its actor died (the failure detector's
    to notice); any other error is raised."""
    try:
        return int(ray.get(ref, timeout=0))
    except Exception as e:
        if is_actor_death(e):
            return 0
        raise


def _repairs_cut_short(dep) -> list[str]:
    """With ``repair=True``: the repairs the lost host had queued or begun (kept in memory only),
    scheduled again: per operator (per partition of a partitioned one) and for the entry points
    (per entry partition), as many of its failed replicas not yet repaired (oldest first) as it
    lacks live replicas to be back to k (an operator's own k after a ``set_replication``)."""
    from ...plan import ENTRY, label_group
    from .repair import wanted_replicas

    topo = dep.topology
    done = {r["replica"] for r in dep.repairer.repairs if not r.get("retrying")}  # (a try to be made again: not done)
    groups: dict[str, tuple[str, list]] = {}  # (an unpartitioned operator's group is the operator)
    for node in [ENTRY, *dep.query.operators]:
        for r in topo.replicas(node):
            groups.setdefault(label_group(r.label), (node, []))[1].append(r)
    again = []
    for group, (node, reps) in groups.items():
        live = len(topo.serving(group))
        lacking = [r.label for r in reps if r.state == "failed" and r.label not in done]
        for label in lacking[:max(0, wanted_replicas(dep, node) - live)]:
            dep.repairer._schedule_repair(label, "a repair cut short by the loss of the control plane")
            again.append(label)
    return again
