"""Changes to a running deployment at logical times (Bartnik §3; docs/design.md, decision 8).

The deployment's methods ``replace_function``, ``add_operator``,
``remove_operator`` and ``set_replication`` call these functions; the model
and why it is replication-transparent are in :mod:`replistream.replica.changes`.
Each change with a marker:

1. holds the deployment quiet (``Deployment.quiet()``: no control-loop action,
   no chunk sent meanwhile);
2. picks ``p``, the largest timestamp or punctuation the feeder has sent
   (``Feeder.marker_time``; it raises if no change can be placed);
3. writes the change into ``Deployment.query`` at ``p`` (replicas started
   from now on are built from it: a revival never misses the change);
4. sends a marker with the change into every source that has not ended, on
   every running entry replica, after everything sent so far (``Feeder.send_marker``);
5. records the change (``Deployment.record_change``) with ``p`` and its figures.

Replicas apply the change when the marker's first copy reaches them (see
:meth:`replistream.replica.ReplicaCore.process`). The replicas of an added
operator, and the stream replicas into them, come from a
:class:`~replistream.plan.PhysicalPlan` of the changed query; they are entered
in the deployment's :class:`~.topology.Topology`.

Partitioned operators (``parallelism={op: p}``, issue #41): every sender's router gives a marker
to every partition (entry partitions alike), so every replica of every partition applies the
change at ``p``. An added reader of a partitioned stream reads every running replica of every
partition, its duplicate filter's channels grouped by partition; the plan of the changed query
is made with the partitions as they run now (after any rescale); a removed partitioned
operator's replicas are every partition's; ``set_replication`` counts per partition. What does not run yet is refused by
:meth:`~.changes.Changes._partitions_allow`.

>>> dep.replace_function("hot", lambda b: b["cpu"] > 0.6)["change"]   # doctest: +SKIP
'replace_function'
"""
from __future__ import annotations

import threading
import time
from contextlib import nullcontext
from dataclasses import replace
from typing import Callable

import ray

from ...errors import QueryError
from ...gc import OperatorReplica, StreamReplica
from ...partition import parse_partition_label, partition_label
from ...plan import ENTRY, PhysicalPlan, group_of, replica_partition
from ...replica.changes import PENDING, AddOperator, CutSpec, RemoveOperator, ReplaceFunction, new_marker, set_spec
from ...schema import END, as_seconds
from .topology import kind_of

__all__ = ["add_operator", "remove_operator", "replace_function", "set_replication"]


def _send_marker(dep, p: int, change, record: Callable[[int], None] | None = None) -> int:
    """Put the marker of ``change`` at ``p`` after everything sent so far; returns its id
    (``record(id)`` is called first: the change's record, kept with it). A detached deployment
    first keeps the changed query and the marker with the chunk number it takes on each source
    (:meth:`~.lifecycle.Persister.change_begins`): a host lost while the marker is on its way
    finishes the change when it is restored (the marker is sent to the entry replicas that lack
    it, :meth:`~.ingest.Ingest.resume_feed`)."""
    marker = new_marker(p, change)
    if record is not None:
        record(marker.id)
    persister = dep._persister
    if persister is not None:
        with dep.feeder.held():
            persister.change_begins(marker, {src: dep.feeder.seqs[src] for src in dep.feeder.sources
                                             if src in dep.feeder.open_sources})
    dep.feeder.send_marker(marker)
    if persister is not None:
        persister.change_done(marker)
    return marker.id


def _written_whole(dep):
    """While a change is made, a detached deployment writes nothing of it until its marker is about
    to leave (:meth:`~.lifecycle.Persister.held`; :func:`_send_marker` writes it then): a host lost
    before rolls the change back whole, one lost after is restored with it and finishes it."""
    return dep._persister.held() if dep._persister is not None else nullcontext()


def replace_function(dep, operator: str, fn) -> dict:
    """See :meth:`Deployment.replace_function <replistream.engines.ray.deployment.Deployment.replace_function>`."""
    if dep.change_made() is not None:  # the same call sent again after its host was lost: made once
        return dep.change_made()
    ReplaceFunction(operator, fn).check(dep.query)
    rec: dict = {}
    with dep.quiet(), _written_whole(dep):
        p = dep.feeder.marker_time()
        change = ReplaceFunction(operator, fn).resolve(dep.query, p)
        dep.query = change.apply_query(dep.query, p)
        _send_marker(dep, p, change, record=lambda mid: rec.update(dep.record_change(
            {"change": "replace_function", "operator": operator, "p": p, "marker": mid,
             "text": f"{change.describe()} for tuples with ts > {as_seconds(p)}"})))
    return rec


def remove_operator(dep, operator: str, wait: float = 600.0) -> dict:
    """See :meth:`Deployment.remove_operator <replistream.engines.ray.deployment.Deployment.remove_operator>`.

    Once the removed part's applications got ``END`` (a background thread polls them), its
    operator replicas are disconnected from their upstream replicas, stopped and removed from
    the topology (``rec["retired"]``: when)."""
    if dep.change_made() is not None:  # the same call sent again after its host was lost: made once
        return dep.change_made()
    gone = RemoveOperator(operator).check(dep.query)
    topo = dep.topology
    rec: dict = {}
    with dep.quiet(), _written_whole(dep):
        p = dep.feeder.marker_time()
        change = RemoveOperator(operator)
        dep.query = change.apply_query(dep.query, p)
        apps = [n for n in gone if dep.query.spec(n).kind == "sink"]
        labels = [r.label for n in gone if n not in apps for r in topo.replicas(n)]
        _send_marker(dep, p, change, record=lambda mid: rec.update(dep.record_change(
            {"change": "remove_operator", "operator": operator, "p": p, "marker": mid, "removed": gone,
             "applications": apps, "replicas": labels, "retired": None,
             "text": f"remove {gone}: they see their input up to ts {as_seconds(p)}, then their inputs close"})))
    rec = next(c for c in dep.changes if c.get("marker") == rec["marker"])  # (the record kept: retired is set on it)
    _retire_when_ended(dep, rec, wait)
    return rec


def _retire_when_ended(dep, rec: dict, wait: float = 600.0) -> None:
    """In a thread: once the removed part's applications (``rec["applications"]``) got ``END``, retire
    its operator replicas (``rec["replicas"]``) and say when in ``rec["retired"]``."""
    topo, apps, labels = dep.topology, rec["applications"], rec["replicas"]

    def retire():
        # once the removed part's applications got END, nothing flows through it any more
        # (an actor runs one call at a time: ask, never block it)
        deadline = time.time() + wait
        left = [a for a in apps if topo.is_running(a)]
        while left and time.time() < deadline:
            try:
                done = ray.get([topo.handle(a).stats.remote() for a in left], timeout=60)
            except Exception as e:  # an application died: retire now, and say why
                rec["retire_error"] = repr(e)
                break
            left = [a for a, st in zip(left, done) if st["punctuation"] != END]
            if left:
                time.sleep(0.1)
        _retire(dep, [label for label in labels if label in topo.handles()])
        rec["retired"] = round(dep.now(), 3)

    threading.Thread(target=retire, daemon=True, name=f"replistream-remove-{rec['operator']}").start()


def resume_retiring(dep) -> list[str]:
    """After a restore: the removals (``remove_operator``) whose replicas the lost host had not
    retired yet are retired by this one, as they would have been (returns their operators)."""
    again = []
    for rec in dep.changes:
        if rec.get("change") == "remove_operator" and rec.get("retired") is None and "replicas" in rec:
            _retire_when_ended(dep, rec)
            again.append(rec["operator"])
    return again


def _retire(dep, labels: list[str]) -> None:
    """Disconnect ``labels`` from their upstream replicas, stop them, forget them (topology)."""
    with (dep.manager.lock if dep.manager is not None else nullcontext()):
        running = dep.topology.running()
        dep.tell({f"{src}|{label}": h.disconnect.remote(label) for src, h in running if src not in labels
                  for label in labels}, timeout=60)
        dep.stop_actors(dep.topology.remove(labels), "operator removed")


def add_operator(dep, upstream: str, build, servers=None) -> dict:
    """See :meth:`Deployment.add_operator <replistream.engines.ray.deployment.Deployment.add_operator>`.

    The new replicas and the stream replicas among them are those of a
    :class:`~replistream.plan.PhysicalPlan` of the changed query; they read ``upstream``
    from its running replicas, each on the channel of its position among them (for a
    partitioned upstream, operator or entry points, partition by partition, the channels
    grouped by partition). Links among the new replicas open now, links from ``upstream``'s
    replicas when the marker passes each of them (:class:`~replistream.replica.changes.AddOperator`)."""
    topo = dep.topology
    with dep.quiet(), _written_whole(dep):
        if dep.change_made() is not None:  # the same call sent again after its host was lost: made once
            return dep.change_made()
        p = dep.feeder.marker_time()  # raises before anything starts if no change can be placed
        q2, add = AddOperator(upstream, build).extend(dep.query, PENDING)
        group = group_of(q2, upstream)
        parts = _partitions(dep)
        entry_parts = int(dep.channel_opts.get("entry_partitions") or 1)
        up_parts = parts.get(group) if group != ENTRY else (entry_parts if entry_parts > 1 else None)
        ups = _producers(dep, group, up_parts)
        for n in add.added:
            if n in dep.plan:
                raise QueryError(f"add_operator: {n!r} was a node of this deployment; pick a new name")
        if servers is None:
            # beside the stream they read (no new WAN hop), then other servers if those are fewer than k
            servers = list(dict.fromkeys(topo.server(label) for label, _ in ups))
            servers += [s for s in dep.servers if s not in servers][:max(0, dep.k - len(servers))]
        servers = [s if isinstance(s, str) else s.name for s in servers]
        unknown = [s for s in servers if s not in dep.servers]
        if unknown:
            raise ValueError(f"add_operator: unknown server(s) {unknown}; servers: {sorted(dep.servers)}")
        new_placement = {n: [servers[0]] if q2.spec(n).kind == "sink" else [servers[i % len(servers)]
                                                                            for i in range(dep.k)]
                         for n in add.added}
        plan = PhysicalPlan(q2, {**_placement(dep, parts), **new_placement}, parallelism=parts,
                            bits=dep.channel_opts.get("bits"), keep_single=True, entry_partitions=entry_parts)
        # what the new replicas read from upstream's running replicas (each on the channel of its
        # position among them; a partitioned upstream's channels grouped by partition)
        up_groups = [replica_partition(label) for label, _ in ups] if up_parts is not None else None

        def inputs(n: str) -> dict:
            chans, grps = plan.channels(n), plan.channel_groups(n)
            for port, u in enumerate(q2.inputs_of(n)):
                if u == upstream:
                    chans[port], grps[port] = len(ups), up_groups
            return {"channels": chans, "groups": grps}

        created = {r.label: dep.new_actor(q2, n, r.index, plan.server(r), **inputs(n))
                   for n in add.added for r in plan.replicas(n)}
        dep.set_clock(created.values())
        with dep.delivered.lock:
            for n in add.added:
                if q2.spec(n).kind == "sink":
                    dep.delivered.add(n)
                for r in plan.replicas(n):
                    topo.add_replica(OperatorReplica(r.label, n, plan.server(r), kind_of(q2, n),
                                                     stateful=plan.stateful(n)))
                    topo.attach(r.label, created[r.label])
        # links among the new replicas now; from the stream's producers when the marker passes them
        ray.get([created[e.src.label].connect.remote(e.stream, e.dst.label, plan.server(e.dst), created[e.dst.label],
                                                     e.port, e.channel)
                 for e in plan.streams() if e.src.node in add.added and e.dst.node in add.added], timeout=120)
        links: dict[str, list] = {}
        for n in add.added:
            for port, u in enumerate(q2.inputs_of(n)):
                if u == upstream:
                    for ch, (label, _) in enumerate(ups):
                        links.setdefault(label, []).extend(
                            (upstream, r.label, plan.server(r), created[r.label], port, ch) for r in plan.replicas(n))
        change = replace(add, links=links)
        for n in add.added:
            spec = q2.spec(n)
            if isinstance(spec, CutSpec) and spec.lower == PENDING:
                set_spec(q2, n, CutSpec(spec.inner, p, spec.upper))
        dep.query = q2
        dep.plan = {**dep.plan, **new_placement}
        _enter_streams(dep, plan, add.added, upstream, [label for label, _ in ups])
        rec: dict = {}
        text = f"{change.describe()}: they see its tuples with ts > {as_seconds(p)}"
        _send_marker(dep, p, change, record=lambda mid: rec.update(dep.record_change(
            {"change": "add_operator", "upstream": upstream, "added": list(add.added), "p": p, "marker": mid,
             "placement": new_placement, "text": text})))
    return rec


def _partitions(dep) -> dict[str, int]:
    """``{operator: partitions}`` of the deployment's partitioned operators now (after any rescale)."""
    return {n: int(p) for n, p in (dep.channel_opts.get("partitions") or {}).items()}


def _placement(dep, parts: dict[str, int]) -> dict[str, list[str]]:
    """The deployment's placement as it runs now, for a plan of the changed query: without the
    partitions a rescale retired, with the servers of those it started."""
    placed = {}
    for n, where in dep.plan.items():
        base, q = parse_partition_label(n)
        if q is None or base not in parts or q < parts[base]:
            placed[n] = list(where)
    for op, p in parts.items():
        for q in range(p):
            key = partition_label(op, q)
            if key not in placed and op not in placed:
                placed[key] = list(dict.fromkeys(r.server for r in dep.topology.replicas(key)))
    return placed


def _producers(dep, group: str, partitions: int | None) -> list:
    """``(label, handle)`` of the running replicas of ``group`` (a partitioned one's, operator or
    entry points, partition by partition, each partition's in the order added: a new reader's
    channels); raises, naming it, if none runs (or none of some partition: its tuples would be lost)."""
    ups = dep.topology.running(group)
    if partitions is None:
        if not ups:
            raise RuntimeError(f"add_operator: no live replica produces {group!r}")
        return ups
    by_part = [[(label, h) for label, h in ups if replica_partition(label) == q] for q in range(partitions)]
    lost = [partition_label(group, q) for q, reps in enumerate(by_part) if not reps]
    if lost:
        raise RuntimeError(f"add_operator: no live replica of partition(s) {lost} of {group!r}; call it again once "
                           f"they are repaired (dep.repairs)")
    return [r for reps in by_part for r in reps]


def _enter_streams(dep, plan: PhysicalPlan, added, upstream: str, connected: list[str]) -> None:
    """Enter the new stream replicas in the topology (for garbage collection and revival): among the
    new replicas, live; from every replica of ``upstream``'s group, live for those ``connected``
    (on the channel of their position), not live for the others (a revival may open them)."""
    topo = dep.topology
    q = plan.query
    group = group_of(q, upstream)
    chan_of = {label: i for i, label in enumerate(connected)}
    for n in added:
        dsts = plan.replicas(n)
        for port, u in enumerate(q.inputs_of(n)):
            if u == upstream:
                for r in topo.replicas(group):
                    for d in dsts:
                        live = r.label in chan_of
                        topo.put_stream(StreamReplica(r.label, d.label, port, 0.0, 0.0, 0.0, live, upstream),
                                        chan_of.get(r.label))
            else:
                for e in plan.in_streams(dsts[0]):
                    if e.port != port:
                        continue
                    for d in dsts:
                        topo.put_stream(StreamReplica(e.src.label, d.label, port, 0.0, 0.0, 0.0, True, u), e.channel)


def set_replication(dep, operator: str, k: int) -> dict:
    """See :meth:`Deployment.set_replication <replistream.engines.ray.deployment.Deployment.set_replication>`."""
    operators = dep.query.operators
    if operator not in operators:
        raise ValueError(f"set_replication: {operator!r} is not an operator of this deployment; operators: "
                         f"{sorted(operators)}")
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"set_replication: k must be an integer >= 1, got {k!r}")
    mgr = dep.control_loop()
    topo = dep.topology
    added, discarded = [], []
    # a partitioned operator: k in every partition, each from and among its own partition's replicas
    parts = _partitions(dep).get(operator)
    groups = [operator] if parts is None else [partition_label(operator, q) for q in range(parts)]
    with mgr.lock:
        mgr.meter.notice_failures()
        lives = {group: sorted(topo.serving(group), key=_label_order) for group in groups}
        lost = [group for group, live in lives.items() if not live]
        if lost:  # (before anything changes)
            raise RuntimeError(f"set_replication: no live replica of {lost} to hand the state over from; call it "
                               f"again once repaired (dep.repairs)")
        for group, live in lives.items():
            for _ in range(max(0, k - len(live))):
                ev = dep.reconfig.add_replica(group)
                added.extend(r["label"] for r in ev.get("new_replicas", []))
            for label in live[k:][::-1] if len(live) > k else []:
                mgr.handover.discard(label, f"set_replication({operator!r}, {k}): {label} discarded")
                discarded.append(label)
    each = f" in each of its {parts} partitions" if parts is not None else ""
    return dep.record_change({"change": "set_replication", "operator": operator, "k": k, "added": added,
                              "discarded": discarded, "p": None,
                              "text": f"{operator!r} now has {k} live replica(s){each}"})


def _label_order(label: str) -> tuple:
    """Replica labels by partition, then by number (``"agg#10"`` after ``"agg#9"``)."""
    head, _, tail = label.rpartition("#")
    return (head, int(tail) if tail.isdigit() else -1, label)
