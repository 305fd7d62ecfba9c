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
An upstream replica that dies while the new partitions connect to it is marked failed and its
peers feed them; with none left for an input, the rescale fails naming the replicas lost
(:func:`_connected`, tests/ray/test_rescale_upstream_loss_ray.py).
A detached deployment's host lost meanwhile is followed by one that finishes the rescale once
(:func:`resume`): what it needs is kept with the deployment's state (:mod:`.lifecycle`), and the
client's call sent again gets the record (tests/ray/test_rescale_host_loss_ray.py).

>>> dep.rescale("per_key", 4, strategy="fluid")["steps"]     # doctest: +SKIP
2048
>>> dep.rescale("per_key", 3, strategy="batched", bins_per_step=64)["retired_replicas"]   # doctest: +SKIP
['per_key.3#0', 'per_key.3#1']
"""
from __future__ import annotations

import threading
import time
from contextlib import nullcontext
from dataclasses import replace

import numpy as np
import ray

from ...errors import RunFailed
from ...gc import OperatorReplica, StreamReplica
from ...partition import BinMap, Router, Switch, partition_label
from ...plan import group_of, is_stateful, label_group, replica_index, replica_partition
from ...query import resolve_operator
from ...replica.rescale import Move, pack_moves, plan_steps
from ...schema import as_seconds
from .common import is_actor_death

__all__ = ["STRATEGIES", "partitions", "rescale", "resume"]

#: How the moving bins are cut into steps.
STRATEGIES = ("fluid", "batched", "all-at-once")

#: Event time between two steps of a fluid or batched rescale (1 ms): the steps whose times one
#: punctuation passes are given in one call to each taking replica and installed together (a time
#: window's aggregate even gives them in one pass over its state, replistream/replica/rescale.py),
#: so a taking replica waits at most one round trip per punctuation, whatever the gap; a smaller
#: gap ends the rescale sooner (2,048 steps: two seconds of event time).
GAP_US = 1_000

#: A fluid rescale of a paced feed with no ``gap_us`` given moves its bins in waves, each cut once
#: the previous one is installed (:func:`_pace_next`): the first has this many bins, at
#: :data:`GAP_US`; each later one about :data:`WAVE_S` of the feed's wall time of steps, at the gap
#: the last wave showed the machine can take. A wave kept up if its last bin was installed within
#: :data:`WAVE_SLACK_S` of being due (a punctuation's interval and the polls of :func:`_wait` are in
#: it).
WAVE_FIRST = 32
WAVE_S = 0.5
WAVE_HEADROOM = 1.2
WAVE_SLACK_S = 0.1
#: A wave whose bins took this many times the wall time over which they came due (past
#: :data:`WAVE_SLACK_S`) fell behind: the next gap grows by that much, times :data:`WAVE_HEADROOM`.
WAVE_BEHIND = 1.1

#: Wall time a paced feed has before it reaches a rescale's switch time ``T0``: ``T0`` is placed this
#: far (in the feed's event time) past the largest timestamp fed, and the feed goes on up to it while
#: the switch and the steps are handed out (:func:`_switch`); a hand-out that takes longer pauses the
#: feed at ``T0`` only for the rest. An unpaced feed gets no lead (it would reach ``T0`` at once).
GATE_LEAD_S = 0.25


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
            gap_us: int | None = None, timeout: float = 300.0) -> dict:
    """See :meth:`Deployment.rescale <replistream.engines.ray.changes.Changes.rescale>`."""
    made = dep.change_made()  # the same call sent again after its host was lost: made once
    if made is not None:
        return made
    resumed = _resumed_call(dep)
    if resumed is not None:  # the same call, whose rescale the next host resumed: its outcome
        return resumed
    node = _node(dep, operator)
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown rescale strategy {strategy!r}; choose one of {STRATEGIES}")
    if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 1:
        raise ValueError(f"p (the number of partitions) must be an integer >= 1, got {p!r}")
    bits = int(dep.channel_opts["bits"])
    old_p = int(dep.channel_opts["partitions"][node])
    if p > 1 << bits:
        raise ValueError(f"{p} partitions cannot share 2**{bits} bins; use at most {1 << bits}")
    if strategy == "batched" and bins_per_step is not None and int(bins_per_step) < 1:
        raise ValueError(f"bins_per_step must be >= 1 (bins moved per step; None: about 16 steps), got "
                         f"{bins_per_step!r}")
    if p == old_p:
        return {"change": "rescale", "operator": node, "from": old_p, "to": p, "steps": 0}
    if not is_stateful(dep.query, node) and strategy != "all-at-once":
        strategy = "all-at-once"  # no state to move: one switch
    if dep.rescaling.is_set():
        raise RuntimeError("a rescale is in progress; wait for it to finish")
    dep.rescale_done.clear()
    dep.rescaling.set()
    from .plane import CALL_ID

    if gap_us is not None and int(gap_us) < 1:
        raise ValueError(f"gap (event time between two steps) must be positive, got {gap_us} us")
    # a fluid rescale of a paced feed with no gap given: in waves paced by the machine (_pace_next)
    paced = strategy == "fluid" and gap_us is None and bool(dep.feeder.pace)
    kept = {"operator": node, "from": old_p, "to": p, "strategy": strategy, "bins_per_step": bins_per_step,
            "gap_us": None if gap_us is None else int(gap_us), "timeout": float(timeout), "call": CALL_ID.get(),
            "phase": "starting", "started": time.time(), "paced": paced, "wave_bins": WAVE_FIRST, "wave_gap": GAP_US}
    try:
        _keep(dep, kept)  # before anything changes: a host lost from here on is followed by one that resumes it
        try:
            _begin(dep, kept)
            return _finish(dep, kept)
        except BaseException:
            if dep._rescale_in_flight is not None:  # failed (raised to the caller): not resumed by a later host
                dep._rescale_in_flight = None
                dep.topology.changed.set()
            raise
    finally:
        dep.rescaling.clear()
        dep.rescale_done.set()


def _keep(dep, kept: dict | None) -> None:
    """The rescale in flight (or none), written with the deployment's state at once (a detached
    deployment's, :mod:`.lifecycle`): the next host resumes it from there (:func:`resume`)."""
    dep._rescale_in_flight = None if kept is None else dict(kept)
    if dep._persister is not None:
        dep._persister.persist_now()


def _begin(dep, kept: dict) -> None:
    """The rescale up to its steps handed out (:func:`_start_new`, then :func:`_switch`). A detached
    deployment writes nothing of it until the steps are cut (:meth:`~.lifecycle.Persister.held`),
    then writes it whole (the commit point, ``kept["phase"] = "moving"``) before any sender hears
    of the switch: a host lost before is restored without the new partitions' replicas (stopped as
    never recorded) and runs the rescale again; one lost after sends the switch and the steps again
    (both idempotent) before the feed goes on (:func:`resume`)."""
    with (dep._persister.held() if dep._persister is not None else nullcontext()):
        _start_new(dep, kept)
        _switch(dep, kept)


def _start_new(dep, kept: dict) -> None:
    """More partitions: every sender learns of them (a switch that moves nothing yet), then they
    start and are connected, while the query runs; nothing is routed to them until the switch."""
    node, old_p, p = kept["operator"], kept["from"], kept["to"]
    bits = int(dep.channel_opts["bits"])
    started = kept["started"]
    with (dep.manager.lock if dep.manager is not None else nullcontext()):
        pass  # a control-loop period in progress ends first; the next ones hold their actions (control.tick)
    kept["new_replicas"] = []
    if p > old_p:
        p0, switches = (dep.channel_opts.get("routing") or {}).get(node, (old_p, []))
        current = Router(dep.query, node, BinMap.even(p0, bits), switches).final()
        idle = Switch(np.full(len(current.owner), Switch.NEVER, dtype=np.int64), current.owner.copy(), p)
        _set_routing(dep, node, p, p0, [*switches, idle])
        kept["routed"] = time.time() - started
        kept["new_replicas"] = _start_partitions(dep, node, old_p, p)
    else:  # fewer: the partitions p..old_p-1 give their bins to those that stay, then retire
        kept["routed"] = time.time() - started
    kept["begun"] = time.time() - started


def _switch(dep, kept: dict, slack: int = 0) -> None:
    """With the feed gated at ``T0`` (:meth:`~.plane.ControlPlane.gated`: the largest timestamp fed,
    plus ``slack``, plus :data:`GATE_LEAD_S` of a paced feed's event time): the next wave's steps
    (:func:`_cut_wave`: every moving bin at once, or a paced fluid rescale's next few) and the
    rescale's switch from ``T0``, written whole (the commit point), then handed out
    (:func:`_hand_out`), while the feed goes on sending what lies at or before ``T0``. Before the
    gate (issue #41) the feed was held for all of it, and every tuple due meanwhile waited: 15-118
    ms in the 4M-key count's rescales (``phases_s["feed_held"]`` then, ``"gated"`` now;
    docs/experiments/rescale_count4m_p20_2026-11-30.json)."""
    node = kept["operator"]
    bits = int(dep.channel_opts["bits"])
    pace = dep.feeder.pace
    lead = int(slack) + (int(GATE_LEAD_S * pace * 1e6) if pace else 0)
    # the feed goes on up to t0 while the switch and the steps are cut, written and handed out, but
    # sends nothing past it: no tuple later than t0 exists anywhere before every sender has the switch.
    # A paced feed reaches t0 GATE_LEAD_S after now, so it does not pause if that is long enough
    with dep.gated(lead) as t0:
        due = time.time() + (lead - int(slack)) / (1e6 * pace) if pace else time.time()
        p0, switches = (dep.channel_opts.get("routing") or {}).get(node, (kept["from"], []))
        base = kept.setdefault("base", len(switches))  # this rescale's switch: one, redrawn by each wave
        before = Router(dep.query, node, BinMap.even(p0, bits), switches[:base]).final()
        wave, steps, switch = _cut_wave(node, before, switches[base] if base < len(switches) else None,
                                        kept, int(t0), bits)
        switches = [*switches[:base], switch]
        routing = {**(dep.channel_opts.get("routing") or {}), node: (p0, switches)}
        dep.channel_opts = {**dep.channel_opts, "routing": routing,
                            "partitions": {**dep.channel_opts["partitions"], node: kept["to"]}}
        # a stateless operator has no state to move: the switch alone moves its bins
        involved = {m.src for m in steps} | {m.dst for m in steps} if is_stateful(dep.query, node) else set()
        kept.update(phase="moving", p0=int(p0), switches=switches, steps=[*kept.get("steps", []), *steps],
                    bins_moved=kept.get("bins_moved", 0) + len(wave["bins"]),
                    involved=sorted(set(kept.get("involved", ())) | involved))
        kept.setdefault("at", int(t0))
        kept["waves"] = [*kept.get("waves", []), {"at": int(t0), "bins": len(wave["bins"]), "gap_us": wave["gap_us"],
                                                  "left": wave["left"], "first_step": len(kept["steps"]) - len(steps),
                                                  "due": due}]
        _keep(dep, kept)  # the commit point: topology, routing, steps written whole
        _hand_out(dep, kept, steps)
    kept.setdefault("held", time.time() - kept["started"])


def _cut_wave(node: str, before: BinMap, drawn: Switch | None, kept: dict, t0: int, bits: int):
    """The next wave of a rescale from ``before`` (the bin map before it) to the balanced map of
    ``kept["to"]`` partitions: its bins (``{"bins", "gap_us"}``), steps and the rescale's switch
    redrawn (``drawn``: as the waves before left it) with the wave's bins switching at their steps'
    times. Every bin left at once (cut by the strategy, steps ``gap_us`` apart), or with a paced
    fluid rescale (``kept["paced"]``) the next ``kept["wave_bins"]`` of them, ``kept["wave_gap"]``
    apart (:func:`_pace_next`), in the order :func:`~replistream.replica.rescale.plan_steps` cuts
    them (per pair of partitions)."""
    old_p, p = kept["from"], kept["to"]
    new = BinMap.even(p, bits)
    at = drawn.at.copy() if drawn is not None else np.full(1 << bits, Switch.NEVER, dtype=np.int64)
    owner = drawn.owner.copy() if drawn is not None else before.owner.copy()
    left = sorted((src, dst, b) for b, src, dst in before.moves(new) if at[b] == Switch.NEVER)
    if kept.get("paced"):
        take = [b for _, _, b in left[:max(1, int(kept["wave_bins"]))]]
        gap, strategy = int(kept["wave_gap"]), "fluid"
    else:
        take = [b for _, _, b in left]
        gap, strategy = int(kept["gap_us"] or GAP_US), kept["strategy"]
    width = max(p, old_p)  # (until the last wave, bins of leaving partitions stay theirs)
    own = owner.copy()
    moved = np.asarray(take, dtype=np.int64)
    own[moved] = new.owner[moved]
    steps, times = plan_steps(node, BinMap(owner, width), BinMap(own, width), t0, strategy, kept["bins_per_step"], gap)
    for b, t in times:
        at[int(b)] = int(t)
    parts = p if len(take) == len(left) else width
    return {"bins": take, "gap_us": gap, "left": len(left) - len(take)}, steps, Switch(at, own, parts)


def _fed_out(dep) -> bool:
    """True once every source of the feed has ended without error (nothing is routed again)."""
    f = dep.feeder
    return f.error is None and bool(f.sources) and not any(src in f.open_sources for src in f.sources)


def _pace_next(dep, kept: dict, wave: dict) -> None:
    """A paced fluid rescale's next wave, from how the last one went (Megaphone's controller issues
    the next migration step once the previous one is done, §3.3; here in waves, since every sender
    must hold a step's time before the feed reaches it): the steps of ``wave`` were due from
    ``wave["due"]`` (when the feed reached its ``T0``), one every ``gap_us`` of event time, and all
    were installed at ``wave["done"]``. Past :data:`WAVE_SLACK_S`, if that took more than
    :data:`WAVE_BEHIND` times the wall time over which they came due, the bins moved slower than
    the feed made them due: the next gap grows by that ratio times :data:`WAVE_HEADROOM` (at most
    8x); if the wave ended well within its slack, the gap shrinks by a tenth (never below
    :data:`GAP_US`). The next wave has about :data:`WAVE_S` of steps at that gap. So a taking
    replica waits, per punctuation, for the bins of that punctuation's steps only, and the move
    goes as fast as the machine moves bins, not as the caller guessed.

    >>> from types import SimpleNamespace as NS
    >>> kept, dep = {}, NS(feeder=NS(pace=1.0))
    >>> _pace_next(dep, kept, {"bins": 32, "gap_us": 1000, "due": 0.0, "done": 0.3, "left": 2016})
    >>> kept["wave_gap"], kept["wave_bins"]   # 32 bins due over 32 ms took 0.2 s past the slack
    (7500, 66)
    >>> _pace_next(dep, kept, {"bins": 66, "gap_us": 7500, "due": 0.0, "done": 0.5, "left": 1950})
    >>> kept["wave_gap"], kept["wave_bins"]   # kept up (within half the slack): a tenth less
    (6750, 74)
    """
    pace = float(dep.feeder.pace or 1.0)
    n, gap = max(1, int(wave["bins"])), int(wave["gap_us"])
    took = max(0.0, float(wave["done"]) - float(wave["due"]))
    span = n * gap / (1e6 * pace)  # the wall time over which its steps came due
    behind = (took - WAVE_SLACK_S) / span  # > 1: its bins took longer than the feed made them due
    if behind > WAVE_BEHIND:
        gap = round(min(8.0, behind * WAVE_HEADROOM) * gap)
    elif took - span < WAVE_SLACK_S / 2:
        gap = max(GAP_US, round(gap * 0.9))
    kept["wave_gap"] = gap
    kept["wave_bins"] = max(1, int(WAVE_S * pace * 1e6 // gap))


def _hand_out(dep, kept: dict, steps: list | None = None) -> None:
    """Every sender gets the rescale's switch, every running replica of a giving or taking partition
    the steps (``steps``: a wave's; None: every step so far) (awaited; a replica that cannot take
    them is declared failed). Both idempotent: a host that resumes the rescale sends them again
    (:func:`resume`)."""
    node, p = kept["operator"], kept["to"]
    _set_routing(dep, node, p, kept["p0"], kept["switches"])
    targets = {q: [(r.label, dep.topology.handle(r.label)) for r in dep.topology.replicas(partition_label(node, q))
                   if dep.topology.is_running(r.label)] for q in range(max(p, kept["from"]))}
    steps = kept["steps"] if steps is None else steps
    packed = pack_moves(steps)  # (cut once: as 2,048 dataclasses, pickled again for each replica)
    involved = {m.src for m in steps} | {m.dst for m in steps}
    _all_or_fenced(dep, {label: h.add_moves.remote(packed, targets) for q in kept["involved"] if q in involved
                         for label, h in targets[q]}, "its rescale steps")


def _finish(dep, kept: dict) -> dict:
    """The rescale from its first wave handed out to its record: every wave's steps installed, the
    next wave cut after each (:func:`_pace_next`, :func:`_switch`), then (fewer partitions) the
    leaving partitions retired; the record logged and, with the rescale no longer in flight,
    written at once (a host lost after this returns the record to the call sent again)."""
    node, old_p, p = kept["operator"], kept["from"], kept["to"]
    bits = int(dep.channel_opts["bits"])
    timeout = kept["timeout"]
    started = kept["started"]
    held = started + kept.get("held", time.time() - started)
    whole = bool(kept.get("resumed"))  # (resumed: every step so far handed out again, and waited for)
    while True:
        wave = kept["waves"][-1]
        mine = kept["steps"] if whole else kept["steps"][wave["first_step"]:]
        if kept["involved"] and mine:
            # (the rescale's timeout is for all its waves: what is left of it)
            _wait(dep, node, mine, max(0.0, started + timeout - time.time()), every=0.05 if kept.get("paced") else 0.2)
        whole = False
        wave["done"] = time.time()
        if not wave.get("left"):
            break
        _pace_next(dep, kept, wave)
        try:
            if _fed_out(dep):
                raise RuntimeError("every source has ended")
            if kept.get("resumed") and not kept.get("floored"):  # T0 past what the lost host fed, too
                _resumed_floor(dep)
                kept["floored"] = True
            _switch(dep, kept)  # (raises before any gate or change if the feed ended meanwhile)
        except RuntimeError:
            if not _fed_out(dep):
                raise
            # every source ended between two waves: no tuple will be routed again, so the bins not
            # moved yet stay where they are (their partitions emit their state at the end, as
            # without the rescale); the record says how many
            kept["unmoved"] = int(wave["left"])
            break
    t0, steps = kept["at"], kept["steps"]
    rec = {"change": "rescale", "operator": node, "from": old_p, "to": p, "strategy": kept["strategy"], "at": t0,
           "steps": len(steps), "bins_moved": kept["bins_moved"], "new_replicas": list(kept["new_replicas"]),
           "retired_replicas": [],
           "text": f"{node}: {old_p} -> {p} partitions, {kept['bins_moved']} of {1 << bits} bins in {len(steps)} "
                   f"step(s) from ts {as_seconds(t0)}"}
    if kept.get("paced"):  # each wave: its bins, the event time between its steps, its wall time
        rec["waves"] = [{"bins": w["bins"], "gap_ms": w["gap_us"] / 1000, "s": round(w["done"] - w["due"], 3)}
                        for w in kept["waves"]]
        rec["text"] += f" in {len(kept['waves'])} wave(s)"
    if kept.get("unmoved"):
        rec["unmoved_bins"] = kept["unmoved"]
        rec["text"] += f"; every source ended with {kept['unmoved']} bin(s) not moved (they stayed with their partitions)"
    if kept.get("resumed"):
        rec["resumed"] = kept["resumed"]  # by a host that took the deployment up after the one running it was lost
    stepped = time.time()
    if p < old_p:
        last = max([t0, *(m.at for m in steps)])
        left = [r.label for q in range(p, old_p) for r in dep.topology.replicas(partition_label(node, q))]
        if left or not kept.get("resumed"):
            rec["retired_replicas"] = _retire_partitions(dep, node, p, old_p, last, timeout)
        else:  # (retired whole by the lost host, which was lost before it logged the record)
            rec["retired_replicas"] = sorted(label for label in dep.topology.removed()
                                             if label_group(label) in {partition_label(node, q) for q in range(p, old_p)})
        rec["text"] += f"; retired {', '.join(partition_label(node, q) for q in range(p, old_p))}"
    rec["seconds"] = round(time.time() - started, 3)
    # where the time went: telling the senders of the new partitions, starting them (the query
    # runs meanwhile), switching and handing out the steps (the feed gated at T0), then the steps
    # themselves as the event time passes theirs, then (fewer partitions) retiring the leaving ones
    rec["phases_s"] = {"routing": round(kept["routed"], 3), "new_partitions": round(kept["begun"] - kept["routed"], 3),
                       "gated": round(held - started - kept["begun"], 3), "steps": round(stepped - held, 3),
                       "retire": round(time.time() - stepped, 3)}
    dep.events.append({"t": dep.now(), "event": "rescaled", **{k: v for k, v in rec.items() if k != "text"}})
    rec = dep.record_change(rec)
    try:
        _keep(dep, None)  # the record and the end of the rescale in flight in one write
    except Exception as e:  # noqa: BLE001 - said; the persister's thread writes both on its next look
        dep.events.append({"t": dep.now(), "event": "persist_failed", "error": repr(e)[:300]})
    return rec


def resume(dep) -> dict | None:
    """After a restore (:func:`~.lifecycle.restore`, before the feed goes on): the rescale the lost
    host had in flight (``dep._rescale_in_flight``, kept with the state), resumed; None if there
    was none. Its switch and steps were cut and written before any sender heard of them
    (``phase == "moving"``): they are sent again (every sender and replica takes them once), then a
    thread waits for the steps (the replicas move the bins by themselves meanwhile: the host only
    watches), retires the leaving partitions (fewer) and logs the record under the client's call
    id, so the call sent again to this host returns it (:func:`_resumed_call`). Cut short before
    (``"starting"``): nothing of it was written, its new partitions' replicas were stopped as
    never recorded (:func:`~.lifecycle._settle_replicas`), and the thread runs it again once the
    feed goes on. If it cannot be finished, the deployment ends loudly (``dep.failure``, the run's
    failure; :class:`~replistream.errors.RunFailed`) naming the operator, the partitions and ``T0``,
    and so does the call sent again.

    >>> resume(dep)["phase"]   # doctest: +SKIP
    'moving'
    """
    kept = getattr(dep, "_rescale_in_flight", None)
    if kept is None:
        return None
    kept = {**kept, "resumed": kept["phase"], "started": time.time()}
    dep.rescale_done.clear()
    dep.rescaling.set()  # repairs, GC, revival and rebalancing wait for it, as for any rescale
    out: dict = {"call": kept["call"], "done": threading.Event(), "timeout": kept["timeout"]}
    dep._rescale_resume = out
    node = kept["operator"]
    info = {"operator": node, "from": kept["from"], "to": kept["to"], "phase": kept["phase"], "at": kept.get("at")}
    done = next((c for c in dep.changes if c.get("change") == "rescale" and c.get("operator") == node
                 and kept.get("at") is not None and c.get("at") == kept["at"]), None)
    if done is not None:  # its record was written (by the persister's thread) just before the host was lost
        dep._rescale_in_flight = None
        out.update(rec=done)
        dep.rescaling.clear()
        dep.rescale_done.set()
        out["done"].set()
        return {**info, "recorded": True}
    held = None
    try:
        if kept["phase"] == "moving":
            _hand_out(dep, kept)  # before the feed goes on: no tuple later than T0 is fed before every sender has the switch
        else:  # cut short before its commit point: run again, the new partitions started before the feed goes on
            if dep._persister is not None:  # (written whole at the commit point, as a first run: released by the thread)
                held = dep._persister.held()
                held.__enter__()
            _start_new(dep, kept)
    except Exception as e:  # noqa: BLE001 - the deployment ends loudly (below, in the thread)
        out["error0"] = e

    def run():
        from .plane import CALL_ID

        token = CALL_ID.set(kept["call"])
        try:
            if "error0" in out:
                if held is not None:
                    held.__exit__(None, None, None)
                raise out["error0"]
            if kept["phase"] == "starting":
                try:
                    _resumed_floor(dep)  # (marker_time then adds the sources' max_disorder: T0 past what was fed)
                    _switch(dep, kept)
                finally:
                    if held is not None:
                        held.__exit__(None, None, None)
            out["rec"] = _finish(dep, kept)
        except Exception as e:  # noqa: BLE001 - said loudly: the run's failure, and the call's error
            parts = ", ".join(partition_label(node, q) for q in range(min(kept["from"], kept["to"]),
                                                                       max(kept["from"], kept["to"])))
            at = kept.get("at")
            msg = (f"the rescale of {node!r} from {kept['from']} to {kept['to']} partitions (partitions {parts}; "
                   + (f"switch at ts {at}" if at is not None else "cut short before its switch time was taken")
                   + f") could not be finished after the deployment's host was lost: {type(e).__name__}: {e}")
            out["error"] = RunFailed(msg, operator=node, logical_time=at)
            dep.failure = f"RunFailed: {msg}"
            dep.events.append({"t": dep.now(), "event": "run_failed", "error": dep.failure})
            try:  # the run's failure, as a replica's own: every wait() raises it (Monitor.check_failures)
                dep.coordinator.report.remote("fatal", {
                    "replica": parts, "operator": node, "logical_time": at, "user_function": False,
                    "error": "RunFailed", "message": msg, "row": None, "cause": None, "traceback": None,
                    "rid": f"rescale-resume/{node}/{kept['call']}/{kept['started']}"})
            except Exception as e2:  # noqa: BLE001 - status() and this call's error still say it
                dep.events.append({"t": dep.now(), "event": "no_answer", "actor": "coordinator", "call": "report",
                                   "error": repr(e2)[:300]})
            try:
                _keep(dep, None)  # (ended: not resumed again by a later host)
            except Exception as e3:  # noqa: BLE001 - the failure is kept by the persister's next write; said
                dep.events.append({"t": dep.now(), "event": "persist_failed", "error": repr(e3)[:300]})
        finally:
            CALL_ID.reset(token)
            dep.rescaling.clear()
            dep.rescale_done.set()
            out["done"].set()

    threading.Thread(target=run, daemon=True, name=f"replistream-rescale-resume-{node}").start()
    return info


def _resumed_floor(dep, limit: float = 120.0) -> None:
    """For a rescale run again after a restore: wait (at most ``limit`` s) until the resumed feed has
    sent a chunk of every source, so that ``T0`` can be placed past every tuple fed before the host
    was lost too (which the restored feeder never saw): :meth:`~.feeder.Feeder.marker_time` then
    adds the sources' largest ``max_disorder`` to the largest timestamp fed since (a tuple fed
    earlier is at most that much later than one fed after it). Raises ``RuntimeError`` naming the
    sources for which no bound is known: one that had ended before the restore, or sent nothing
    since in ``limit`` s."""
    f = dep.feeder
    deadline = time.time() + limit
    wake = threading.Event()
    while f.resumed is None or not (f.feeding or f.fed_all.is_set()):  # (a short rest may be fed whole already)
        if time.time() > deadline or dep.shut_down:
            raise RuntimeError(f"the feed did not resume within {limit:g} s")
        wake.wait(0.001)
    at = f.resumed["at"]
    ended = sorted(src for src in f.sources if at[src]["closed"])
    if ended:
        raise RuntimeError(f"source(s) {ended} had ended before the host was lost: no switch time can be placed "
                           f"past every tuple they fed")
    while True:
        behind = f.unsent_since_resume()
        if not behind:
            return
        if time.time() > deadline or dep.shut_down:
            raise RuntimeError(f"source(s) {behind} sent nothing within {limit:g} s of the feed's resuming: no "
                               f"switch time past what they fed before the host was lost is known")
        wake.wait(0.001)


def _resumed_call(dep) -> dict | None:
    """The outcome of the rescale a restored host resumed (:func:`resume`) for the client's call
    running now (the same call, sent again to this host): its record once done, or its error
    raised; None if this call is not the resumed one. Waits at most the rescale's ``timeout`` plus
    a minute, then raises naming it."""
    from .plane import CALL_ID

    res = getattr(dep, "_rescale_resume", None)
    call = CALL_ID.get()
    if res is None or call is None or res["call"] != call:
        return None
    if not res["done"].wait(res["timeout"] + 60):
        raise RunFailed(f"the rescale resumed after the deployment's host was lost did not end within "
                        f"{res['timeout'] + 60:g} s", operator="rescale")
    if "error" in res:
        raise res["error"]
    return res["rec"]


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
            if label in getattr(topo, "_burned", ()):  # (its start was rolled back after a restore)
                label = topo.next_label(partition_label(node, part))
            i = replica_index(label)
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
            calls.append((label, s, topo.handle(s.src).connect.remote(s.stream, label, server, h, s.port,
                                                                      chan[s.port], False)))
            topo.put_stream(s, chan[s.port])
            chan[s.port] += 1
    _connected(dep, node, calls, n_ports)
    handover = dep.control_loop().handover
    with handover.logs_held([label for label, _, _, _ in begun]):
        for label, _, _, _ in begun:
            for v, port in q.outputs_of(node):
                for r, _ in topo.running(v):
                    handover._connect(StreamReplica(label, r, port, 0.0, 0.0, 0.0, False, node))
    return [label for label, _, _, _ in begun]


def _connected(dep, node: str, calls: list, n_ports: int, timeout: float = 60.0) -> None:
    """Wait for the new partitions' upstream links (``calls``: ``(new label, stream replica, its
    connect call)``). An upstream replica that died meanwhile (a crash within the fault model) is
    marked failed, as a hand-over does (:meth:`~.handover.HandOver._connect`): its link is not live,
    every running actor drops it, and its surviving peers feed the new replicas. A new replica none
    of whose upstream replicas of some input port survived raises
    :class:`~replistream.errors.RunFailed` naming the replicas lost; any other error is raised."""
    topo = dep.topology
    deadline = time.time() + timeout
    fed: dict[str, set[int]] = {}
    lost: dict[str, str] = {}
    for label, s, ref in calls:
        try:
            ray.get(ref, timeout=max(0.0, deadline - time.time()))
        except Exception as e:
            if not is_actor_death(e):
                raise
            lost[s.src] = type(e).__name__
            topo.put_stream(replace(s, live=False))  # (mark_failed does nothing if the detector was first)
            dep.repairer.mark_failed(s.src, f"died while the rescale of {node} connected it to {label}: "
                                            f"{type(e).__name__}")
            continue
        fed.setdefault(label, set()).add(s.port)
    if lost:
        dep.events.append({"t": dep.now(), "event": "rescale_upstream_lost", "operator": node,
                           "replicas": sorted(lost)})
    unfed = sorted({(label, port) for label, _, _ in calls for port in range(n_ports)
                    if port not in fed.get(label, set())})
    if unfed:
        raise RunFailed(f"rescale of {node!r}: every upstream replica feeding its new partitions was lost while "
                        f"they connected ({', '.join(sorted(lost))}); no input reaches "
                        + ", ".join(f"{label} port {port}" for label, port in unfed[:4])
                        + (f" and {len(unfed) - 4} more" if len(unfed) > 4 else ""), operator=node)


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


def _wait(dep, node: str, steps: list[Move], timeout: float, every: float = 0.2) -> None:
    """Until every live replica of each taking partition installed its steps (and every giving
    one gave them); a replica lost meanwhile is left to its peers, but a taking partition with no
    running replica left is never done (the run's failure check names it: every replica lost).
    Raises RunFailed naming the steps not done after ``timeout`` s. Asks every ``every`` s."""
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
        wake.wait(every)
