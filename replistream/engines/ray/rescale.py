"""Live rescaling of a partitioned operator (issue #41; Megaphone, Hoffmann et al. 2019, §3.3):
the control plane's side. The protocol at the replicas and why the output stays exact are in
:mod:`replistream.replica.rescale`; a replica's calls in :mod:`.moving`.

:func:`rescale` changes the number of partitions of ``operator`` from ``p`` to ``p'``; for ``p' > p``:

1. while the deployment is quiet (no chunk fed, no control action), it takes ``T0``, the largest
   timestamp fed so far, and the bins that change owner between the balanced maps of ``p`` and
   ``p'`` partitions (:func:`~replistream.partition.assign_bins`: only into the new partitions);
   it cuts them into *steps* (``"all-at-once"``: one step per pair of partitions at ``T0``;
   ``"batched"``: ``bins_per_step`` bins per step; ``"fluid"``: one bin per step), step ``i``
   switching at ``T0 + i * gap`` (``gap``: 1 ms of event time by default, :data:`GAP_US`);
2. every upstream replica of the operator gets the switch (:class:`~replistream.partition.Switch`):
   from its time on, a moved bin's tuples go to its new owner; none later than ``T0`` exists yet,
   so every replica routes every tuple alike;
3. the new partitions' replicas start (``k`` each, on the servers of partition 0's replicas), fed
   by every upstream replica and feeding every downstream replica (new duplicate-filter channels,
   in the new partitions' groups);
4. each replica of a giving or taking partition gets its steps (:meth:`~.moving.MovingBins.add_moves`);
5. the feed goes on; each step happens at the punctuation that takes the giving partition's
   watermark past its time: every replica of the giving partition sends the bins' state to every
   replica of the taking partition, which installs the first copy.

:func:`rescale` returns once every live replica of the taking partitions installed every step
(or raises :class:`~replistream.errors.RunFailed` naming the steps not done after ``timeout``).
Repairs wait until then, and so do garbage collection, revival and rebalancing (a control-loop
period only measures meanwhile; one in progress when the rescale begins ends first): they
change the topology the new partitions are built from and connected by.

For ``p' < p`` the same steps move the bins of the partitions that go (``p'..p-1``) into those that
stay (the balanced map of ``p'`` partitions: each bin back to the partition it came from, so no
bin moves between two staying ones); nothing is started, and once every step is installed the
leaving partitions retire (:func:`_retire_partitions`): closed with ``END`` once their watermark
passed the last step, disconnected from every sender, forgotten by the topology (``dep.removed``),
their actors killed. A server lost in the middle of the move (a replica of a giving and one of a
taking partition on it) is left to their peers, which give and install every step; a taking
partition with no replica left fails the rescale, naming it (tests/ray/test_rescale_faults_ray.py).
Not yet: the deployment's host process lost in the middle of a rescale (the next host does not
resume it).

>>> dep.rescale("per_key", 4, strategy="fluid")["steps"]     # doctest: +SKIP
2048
>>> dep.rescale("per_key", 3, strategy="batched", bins_per_step=64)["retired_replicas"]   # doctest: +SKIP
['per_key.3#0', 'per_key.3#1']
"""
from __future__ import annotations

import threading
import time
from contextlib import nullcontext

import numpy as np
import ray

from ...errors import RunFailed
from ...gc import OperatorReplica, StreamReplica
from ...partition import BinMap, Router, Switch, partition_label
from ...plan import group_of, is_stateful, label_group, replica_partition
from ...query import resolve_operator
from ...replica.rescale import Move, plan_steps
from ...schema import as_seconds
from .common import is_actor_death

__all__ = ["STRATEGIES", "partitions", "rescale"]

#: How the moving bins are cut into steps.
STRATEGIES = ("fluid", "batched", "all-at-once")

#: Event time between two steps of a fluid or batched rescale (1 ms): the steps whose times one
#: punctuation passes are given in one call to each taking replica and installed together (a time
#: window's aggregate even gives them in one pass over its state, replistream/replica/rescale.py),
#: so a taking replica waits at most one round trip per punctuation, whatever the gap; a smaller
#: gap ends the rescale sooner (2,048 steps: two seconds of event time).
GAP_US = 1_000


def _node(dep, operator: str) -> str:
    if operator in dep.query.sinks:
        raise ValueError(f"{operator!r} is an application: its partitions are fixed when it is deployed (a rescale "
                         f"moves operator state, not an application's files); deploy again with another "
                         f"parallelism={{{operator!r}: p}} to change them")
    node = resolve_operator(dep.query, operator)
    parts = dep.channel_opts.get("partitions") or {}
    if node not in parts:
        raise ValueError(f"{node!r} is not partitioned; deploy with parallelism={{{node!r}: 1}} (or more) to "
                         f"rescale it while it runs")
    return node


def partitions(dep, operator: str) -> int:
    """How many partitions ``operator`` (or an application) runs as now (1: not partitioned)."""
    node = operator if operator in dep.query.sinks else resolve_operator(dep.query, operator)
    return int((dep.channel_opts.get("partitions") or {}).get(node, 1))


def rescale(dep, operator: str, p: int, strategy: str = "fluid", bins_per_step: int | None = None,
            gap_us: int = GAP_US, timeout: float = 300.0) -> dict:
    """See :meth:`Deployment.rescale <replistream.engines.ray.changes.Changes.rescale>`."""
    node = _node(dep, operator)
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown rescale strategy {strategy!r}; choose one of {STRATEGIES}")
    if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 1:
        raise ValueError(f"p (the number of partitions) must be an integer >= 1, got {p!r}")
    bits = int(dep.channel_opts["bits"])
    old_p = int(dep.channel_opts["partitions"][node])
    if p > 1 << bits:
        raise ValueError(f"{p} partitions cannot share 2**{bits} bins; use at most {1 << bits}")
    if strategy == "batched" and (bins_per_step is None or int(bins_per_step) < 1):
        raise ValueError("strategy='batched' needs bins_per_step >= 1 (bins moved per step)")
    if p == old_p:
        return {"change": "rescale", "operator": node, "from": old_p, "to": p, "steps": 0}
    if not is_stateful(dep.query, node) and strategy != "all-at-once":
        strategy = "all-at-once"  # no state to move: one switch
    if dep.rescaling.is_set():
        raise RuntimeError("a rescale is in progress; wait for it to finish")
    dep.rescale_done.clear()
    dep.rescaling.set()
    started = time.time()
    try:
        with (dep.manager.lock if dep.manager is not None else nullcontext()):
            pass  # a control-loop period in progress ends first; the next ones hold their actions (control.tick)
        p0, switches = (dep.channel_opts.get("routing") or {}).get(node, (old_p, []))
        current = Router(dep.query, node, BinMap.even(p0, bits), switches).final()
        new_labels: list[str] = []
        if p > old_p:
            # the new partitions first, while the query runs: every sender knows them (a switch that
            # moves nothing yet), they start and are connected; nothing is routed to them until the switch
            idle = Switch(np.full(len(current.owner), Switch.NEVER, dtype=np.int64), current.owner.copy(), p)
            _set_routing(dep, node, p, p0, [*switches, idle])
            routed = time.time()
            new_labels = _start_partitions(dep, node, old_p, p)
        else:  # fewer: the partitions p..old_p-1 give their bins to those that stay, then retire
            routed = time.time()
        begun = time.time()
        with dep.quiet():  # no chunk fed meanwhile: no tuple later than t0 exists anywhere
            t0 = dep.feeder.marker_time()
            new = BinMap.even(p, bits)
            steps, times = plan_steps(node, current, new, t0, strategy, bins_per_step, gap_us)
            switch = Switch.between(current, new, times)
            routing = {**(dep.channel_opts.get("routing") or {}), node: (p0, [*switches, switch])}
            dep.channel_opts = {**dep.channel_opts, "routing": routing,
                                "partitions": {**dep.channel_opts["partitions"], node: p}}
            _set_routing(dep, node, p, p0, [*switches, switch])
            targets = {q: [(r.label, dep.topology.handle(r.label)) for r in dep.topology.replicas(partition_label(node, q))
                           if dep.topology.is_running(r.label)] for q in range(max(p, old_p))}
            # a stateless operator has no state to move: the switch alone moves its bins
            involved = {m.src for m in steps} | {m.dst for m in steps} if is_stateful(dep.query, node) else set()
            _all_or_fenced(dep, {label: h.add_moves.remote(steps, targets) for q in sorted(involved)
                                 for label, h in targets[q]}, "its rescale steps")
        held = time.time()
        rec = {"change": "rescale", "operator": node, "from": old_p, "to": p, "strategy": strategy, "at": t0,
               "steps": len(steps), "bins_moved": len(times), "new_replicas": new_labels, "retired_replicas": [],
               "text": f"{node}: {old_p} -> {p} partitions, {len(times)} of {1 << bits} bins in {len(steps)} "
                       f"step(s) from ts {as_seconds(t0)}"}
        if involved:
            _wait(dep, node, steps, timeout)
        stepped = time.time()
        if p < old_p:
            last = max([t0, *(m.at for m in steps)])
            rec["retired_replicas"] = _retire_partitions(dep, node, p, old_p, last, timeout)
            rec["text"] += f"; retired {', '.join(partition_label(node, q) for q in range(p, old_p))}"
        rec["seconds"] = round(time.time() - started, 3)
        # where the time went: telling the senders of the new partitions, starting them (the query
        # runs meanwhile), switching and handing out the steps (the feed held), then the steps
        # themselves as the event time passes theirs, then (fewer partitions) retiring the leaving ones
        rec["phases_s"] = {"routing": round(routed - started, 3), "new_partitions": round(begun - routed, 3),
                           "feed_held": round(held - begun, 3), "steps": round(stepped - held, 3),
                           "retire": round(time.time() - stepped, 3)}
        dep.events.append({"t": dep.now(), "event": "rescaled", **{k: v for k, v in rec.items() if k != "text"}})
        return dep.record_change(rec)
    finally:
        dep.rescaling.clear()
        dep.rescale_done.set()


def _set_routing(dep, node: str, p: int, p0: int, switches: list) -> None:
    """Every running replica that sends to ``node`` routes by the new switches (awaited)."""
    q = dep.query
    senders = []
    for up in q.inputs_of(node):
        senders += [(label, h) for label, h in dep.topology.running(group_of(q, up))]
    _all_or_fenced(dep, {label: h.set_routing.remote(node, p, p0, switches) for label, h in senders},
                   "the rescale's routing")


def _all_or_fenced(dep, calls: dict, what: str) -> None:
    """Wait for ``calls`` (``{label: ObjectRef}``); a replica that does not answer (a stopped one:
    not waited on past the failure detector's suspicion) or fails is declared failed, so that
    nothing it sends without ``what`` arrives anywhere (its peers carry on)."""
    ready = dep._ask_all(calls, 60)
    for label, ref in calls.items():
        why = None
        if ref not in ready:
            why = f"did not take {what} in time"
        else:
            try:
                ray.get(ref, timeout=0)
            except Exception as e:  # noqa: BLE001 - a death or an error: either way it cannot take part
                why = f"could not take {what}: {type(e).__name__}"
        if why is not None:
            dep.monitor.declare_failed(label, why)


def _start_partitions(dep, node: str, old_p: int, p: int) -> list[str]:
    """Start ``k`` replicas of each new partition of ``node`` (on the servers of partition 0's
    replicas; every actor begun at once, then waited for), fed by every running upstream replica
    and feeding every running downstream one."""
    topo, q = dep.topology, dep.query
    servers = [r.server for r in topo.replicas(partition_label(node, 0)) if r.state == "live"] or \
              [r.server for r in topo.replicas(partition_label(node, 0))]
    n_ports = len(q.inputs_of(node))
    begun = []
    for part in range(old_p, p):
        for i, server in enumerate(servers):
            label = f"{partition_label(node, part)}#{i}"
            ins = []
            for port, up in enumerate(q.inputs_of(node)):
                ins += [StreamReplica(r, label, port, 0.0, 0.0, 0.0, True, up) for r, _ in topo.running(group_of(q, up))]
            channels = [sum(1 for s in ins if s.port == port) for port in range(n_ports)]
            groups = []
            for port in range(n_ports):
                parts = [replica_partition(s.src) for s in ins if s.port == port]
                groups.append(None if all(x is None for x in parts) else parts)
            topo.add_replica(OperatorReplica(label, node, server, "operator", "live", is_stateful(q, node)))
            begun.append((label, server, ins, dep._new_actor(q, node, i, server, channels, False, None, part, groups)))
    calls = []
    for label, server, ins, start in begun:
        h = dep._settle(*start)
        dep.set_clock([h])
        topo.attach(label, h)
        chan = [0] * n_ports
        for s in ins:
            calls.append(topo.handle(s.src).connect.remote(s.stream, label, server, h, s.port, chan[s.port], False))
            topo.put_stream(s, chan[s.port])
            chan[s.port] += 1
    ray.get(calls, timeout=60)
    handover = dep.control_loop().handover
    for label, _, _, _ in begun:
        for v, port in q.outputs_of(node):
            for r, _ in topo.running(v):
                handover._connect(StreamReplica(label, r, port, 0.0, 0.0, 0.0, False, node))
    return [label for label, _, _, _ in begun]


def _retire_partitions(dep, node: str, p: int, old_p: int, after: int, timeout: float) -> list[str]:
    """Retire partitions ``p..old_p-1`` of ``node`` once they gave every bin (a rescale to fewer
    partitions); returns the replicas retired. In order:

    1. each running replica of theirs closes once its watermark reached ``after`` (the last step's
       time): it sends ``END`` after everything it emitted, so every downstream duplicate filter
       stops waiting for its partition having had all of its tuples, and it ignores its input
       from then on (:meth:`~.moving.MovingBins.close_partition`);
    2. every other running replica stops sending to them (:meth:`~.actors._Base.disconnect`: a
       stream replica removed, not a failure: no drop reported);
    3. once their outboxes are idle (``END`` processed by every receiver it was sent to), their
       dead letters are kept with the run's, the topology forgets them (``dep.removed``; no repair,
       no copies counted) and their actors are stopped, as for a removed operator.

    A replica lost meanwhile is left to its peers; a partition none of whose replicas closed
    raises :class:`~replistream.errors.RunFailed` after ``timeout`` s, naming it."""
    topo = dep.topology
    groups = [partition_label(node, q) for q in range(p, old_p)]
    labels = [r.label for g in groups for r in topo.replicas(g)]
    deadline = time.time() + timeout
    wake = threading.Event()
    closed: set[str] = set()
    while True:  # 1. closed, each once its watermark reached `after`
        got = _answers(dep, {label: h.close_partition.remote(after) for g in groups
                             for label, h in topo.running(g) if label not in closed})
        closed |= {label for label, done in got.items() if done}  # (one lost or silent: its peers close it)
        open_ = [g for g in groups if not any(label_group(label) == g for label in closed)]
        if not open_ and all(label in closed for g in groups for label, _ in topo.running(g)):
            break
        dep.monitor.check_failures()
        if time.time() > deadline:
            raise RunFailed(f"rescale of {node!r}: partition(s) {open_ or groups} not closed after {timeout:g} s "
                            f"(their watermark stayed below ts {after})", operator=node)
        wake.wait(0.05)
    with (dep.manager.lock if dep.manager is not None else nullcontext()):
        # 2. no one sends to them any more
        running = [(src, h) for src, h in topo.running() if src not in labels]
        dep.tell({f"{src}|{label}": h.disconnect.remote(label) for src, h in running for label in labels}, timeout=60)
        # 3. their END delivered: then they go
        while True:
            got = _answers(dep, {label: h.idle.remote() for g in groups for label, h in topo.running(g)})
            busy = [label for label, idle in got.items() if not idle]
            if not busy:
                break
            if time.time() > deadline:
                raise RunFailed(f"rescale of {node!r}: {busy} closed but did not deliver their output "
                                f"within {timeout:g} s", operator=node)
            wake.wait(0.05)
        for label, h in [(label, h) for g in groups for label, h in topo.running(g)]:
            try:  # (its dead letters stay part of the run's, as a retired replica's: plane.retire)
                dep._retired_letters.extend(ray.get(h.dead_letters.remote(), timeout=30))
            except Exception as e:  # noqa: BLE001 - logged; its peers' letters stand for its own
                dep.events.append({"t": dep.now(), "event": "no_answer", "actor": label, "call": "dead_letters",
                                   "error": repr(e)})
        dep.stop_actors(topo.remove(labels), "partition retired by a rescale")
    for g in groups:
        dep.events.append({"t": dep.now(), "event": "partition_retired", "partition": g,
                           "replicas": [label for label in labels if label.startswith(f"{g}#")],
                           "closed": sorted(label for label in closed if label.startswith(f"{g}#"))})
    return labels


def _answers(dep, asked: dict) -> dict:
    """``{label: answer}`` of the calls ``asked`` (``{label: ObjectRef}``) that answered within 30 s,
    none waited on once its replica is suspected (``dep._ask_all``); a dead replica's call is left
    out like a silent one's, any other error raised."""
    ready = dep._ask_all(asked, 30.0)
    got = {}
    for label, ref in asked.items():
        if ref not in ready:
            continue
        try:
            got[label] = ray.get(ref, timeout=0)
        except Exception as e:
            if not is_actor_death(e):
                raise
    return got


def _wait(dep, node: str, steps: list[Move], timeout: float) -> None:
    """Until every live replica of each taking partition installed its steps (and every giving
    one gave them); a replica lost meanwhile is left to its peers, but a taking partition with no
    running replica left is never done (the run's failure check names it: every replica lost).
    Raises RunFailed naming the steps not done after ``timeout`` s."""
    take: dict[int, set[str]] = {}
    give: dict[int, set[str]] = {}
    for m in steps:
        take.setdefault(m.dst, set()).add(m.id)
        give.setdefault(m.src, set()).add(m.id)
    deadline = time.time() + timeout
    wake = threading.Event()
    while True:
        missing = []
        for role, parts in (("take", take), ("give", give)):
            for q, want in parts.items():
                asked = {label: h.moves_status.remote() for label, h in dep.topology.running(partition_label(node, q))}
                if not asked and role == "take":  # every replica of a taking partition lost: nothing holds its
                    missing.append((partition_label(node, q), role, ["(no running replica)"], len(want)))  # bins
                for label, ref in asked.items():
                    try:
                        st = ray.get(ref, timeout=30)
                    except Exception as e:
                        if is_actor_death(e):
                            continue  # a replica lost meanwhile: its peers carry the steps
                        if isinstance(e, ray.exceptions.GetTimeoutError):  # silent: the detector decides;
                            missing.append((label, role, ["(no answer in 30 s)"], len(want)))  # named if it lasts
                            continue
                        raise
                    left = want & set(st[role])
                    if left:
                        missing.append((label, role, sorted(left)[:3], len(left)))
        if not missing:
            return
        dep.monitor.check_failures()
        if time.time() > deadline:
            raise RunFailed(f"rescale of {node!r}: steps not done after {timeout:g} s: "
                            + "; ".join(f"{lab} to {role} {n} step(s), e.g. {ids}" for lab, role, ids, n in missing[:4]),
                            operator=node)
        wake.wait(0.2)
