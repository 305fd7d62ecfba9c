"""The coordinator's side of a staged state transfer on Ray (Megaphone §3.3, docs/migration.md).

:meth:`ReplicaManager.replace_replica(..., strategy=...)
<replistream.engines.ray.control.ReplicaManager.replace_replica>` starts the new
replica pending and subscribed to every live upstream replica (as for any
hand-over; **without replay** when the operator's state splits into bins and a
live peer can send the steps, see below), then calls :func:`staged_install`, which

1. plans the steps (:func:`replistream.replica.plan_transfer`; one step if the
   operator's state does not split by key);
2. turns the new replica into a :class:`~replistream.replica.StagedReplica`
   (``begin_transfer``): what it buffered goes through it;
3. asks a live peer for every step at once (``request_steps``): at each of its
   punctuations (a logical time), between two deliveries, the peer takes the next
   step unless its pacing defers it (below), and more while the pause stays within
   ``pause_ms`` beyond a step's fixed cost, as one checkpoint of those bins with the
   part of its retained output not yet sent, and sends it straight to the receiver
   (``install_step``), then goes on processing; the coordinator only watches the
   receiver's progress (a long poll: ``transfer_status(wait_s, seen)``);
4. if the peer dies before every step is installed, asks another live peer for
   the steps not installed (any live peer will do: each step carries its own
   filter state);
5. waits until the receiver has merged everything into one core
   (``transfer_status()["complete"]``), after which the manager connects its
   outputs and retires what the event replaces.

**No replay from the upstream replicas (issue #30).** A replica subscribed with
replay first receives everything its upstream replicas retain (for a Join fed by
entry points that have not been acknowledged for a while, up to its whole
window), and must drain it before it can keep up. A staged receiver does not
need it. Its links are added by ``connect_for_transfer``, which returns for each
upstream replica ``u`` a *connect mark* ``m_u``: a timestamp at or above every
tuple and punctuation ``u``'s stream carried before the link
(:meth:`~replistream.replica.ReplayLog.bound`: trimmed entries lie at or below the
trim point, the others are in the log; read under the outbox lock with the link
added, so nothing is flushed in between). On input port ``i`` the *gate* is
``c_i = max_u m_u``. The sending peer ``P`` takes no step before its duplicate
filter's punctuation ``p_i`` has reached ``c_i`` on every port (``p_i`` only
grows, so every later step, and every step of a peer that takes over after a
restart, satisfies it too).

Why the output stays exact. Write ``S_i`` for the ideal stream on port ``i``,
``p_i(s)``, ``A_i(s)`` and ``C_s`` for step ``s``'s filter punctuation, applied ids
and checkpoint (restricted to its bins ``B_s``), taken with ``p_i(s) >= c_i``.

A'. *Every tuple and punctuation of* ``S_i`` *above* ``c_i`` *reaches the
   receiver* on the link of each upstream replica ``u`` that lives to send it:
   ``u`` emits all of ``S_i`` (replica consistency, Hwang Definition 2), those
   items above ``m_u <= c_i`` only after the link was added, and a link delivers,
   in order, everything flushed after it was added. (The receiver acknowledges
   nothing until it completes, so if every such ``u`` dies, a replica revived from
   one of them replays everything flushed since the link, as for any pending
   replica.)

Core ``s`` of the receiver starts from ``C_s`` and is fed every tuple of ``B_s``
the receiver gets (buffered ones first). Take a tuple ``x`` of ``S_i`` in ``B_s``:

a. ``ts(x) <= p_i(s)``: ``P`` passed or dropped ``x`` before its punctuation
   reached ``p_i(s)`` (Algorithm 1), so ``x``'s effect is in ``C_s``; core ``s``'s
   filter, restored at ``p_i(s)``, drops every copy the receiver gets.
b. ``ts(x) > p_i(s)`` and ``id(x)`` in ``A_i(s)``: ``P`` applied it, its effect is in
   ``C_s``; the restored applied ids drop every copy.
c. ``ts(x) > p_i(s)``, not applied: ``ts(x) > c_i``, so by A' the receiver gets
   it; core ``s`` applies its first copy only (applied ids drop the others).

Punctuations above ``p_i(s) >= c_i`` reach it by A', those at or below are dropped.
So core ``s`` sees exactly what docs/handover.md's argument C needs above
``p_i(s)``: the role the upstream trim points (at most ``P``'s ``p_i``) played when
the receiver was subscribed with replay. Nothing is lost (a-c cover every tuple)
and nothing is applied twice (the filters drop copies, as they drop a replay's).
The rest of docs/migration.md's argument (merging cores, the adopted output log
taken from each step's retained-but-unsent output, downstream) never used the
replay's content and is unchanged.

The replay is kept where it is needed: hand-overs without a strategy, state that
does not split (one step), no live peer (a dormant checkpoint or a fresh state:
``ReplicaManager._install`` then resubscribes the replica with replay first), and
a gate that does not open because the sender's input paused (its filter
punctuations unchanged for ``replay_after_s``) or after ``gate_timeout_s``: the
receiver is then subscribed once more with replay
(``ReplicaManager.resubscribe_with_replay``: new channels, whose replay covers
everything above the upstream trim points, at most ``P``'s ``p_i``; the peer's
missing feeders were connected with replay by ``cover_peer``) and the gate is
lifted. No step was taken before, so no core relied on the gate.

**Pacing by the live path (issue #30, point 2).** Steps go at the pace the
receiving and sending replicas allow, not only within the pause budget: the
receiver's ``install_step`` answers once the step is installed (its queued
input went through first), and the sender has at most one message unanswered;
at a punctuation it defers the next step while its own output lag (wall time
minus the due time of its watermark on the feeder's clock) exceeds its minimum
over the last 2 s by more than ``lag_ms``, or an output
link has half its packets unacknowledged; these two defer a step at most
``max_defer_ms``. What it did is in the progress record: ``deferred`` (punctuations
at which a step waited, by reason: ``gate``, ``receiver``, ``lag``, ``output``),
``gate_s``, ``lag_ms`` (the sender's output lag: its baseline and maximum).

It works through the control loop's public methods (``peers``, ``cover_peer``,
``notice_failures``, ``record``, ``resubscribe_with_replay``, ``connect_marks``), its
topology and the deployment's ``mark_failed``.

Progress is a dict per transfer in ``manager.transfers`` (and
``Deployment.transfers()``): strategy, bins, steps done, peer(s), restarts,
times, ``replay`` (whether the receiver's upstream links replayed), pacing; each
step and restart is also a coordinator event (``kind="transfer"``).

>>> dep.move_replica("counts", 0, "s3", strategy="fluid", bits=6)["handover"]   # doctest: +SKIP
"""
from __future__ import annotations

import time

import ray

from ...replica.transfer import pack_steps, plan_transfer, splittable
from .common import is_actor_death

__all__ = ["staged_install"]


def staged_install(mgr, label: str, handle, pending: set, strategy: str, bins_per_step: int | None = None,
                   bits: int = 8, pause_ms: float = 20.0, step_timeout_s: float = 120.0,
                   force_after_s: float = 0.5, poll_s: float = 0.2, lag_ms: float | None = None,
                   max_defer_ms: float = 250.0, replay_after_s: float = 2.0, gate_timeout_s: float = 15.0) -> dict:
    """Move a live peer's state into the pending replica ``label`` (``handle``) in steps.

    ``pause_ms``: the longest pause the peer takes at one punctuation beyond a step's fixed cost;
    it takes the next step, and as many more as fit (0: one step per punctuation).
    ``lag_ms`` (default ``max(pause_ms, 10)``): how far the peer's output lag may rise above its
    recent minimum before it defers a step; ``max_defer_ms``: the longest it defers one for its
    lag or output backlog (the receiver's answer always holds the next one back).
    ``force_after_s``: if no step was installed for this long (no punctuation came, e.g. the
    input paused), the peer is asked to take its next step(s) at once, and again after each
    further ``force_after_s``. ``step_timeout_s``: with no
    step installed for this long, the transfer fails. ``replay_after_s``, ``gate_timeout_s``:
    when a receiver subscribed without replay falls back to a replay (module doc).
    ``poll_s``: the longest wait of one status poll (each returns as soon as a step is installed).
    Returns the hand-over record. A transfer that cannot finish (the receiver died, no live peer
    is left, a step timed out) is marked ``"failed"`` with the reason in ``dep.transfers()``, and
    the error is raised.

    >>> staged_install(mgr, "counts#2", handle, {"counts#2"}, "fluid", bits=6)["steps"]   # doctest: +SKIP
    64
    """
    before = len(mgr.transfers)
    try:
        return _staged_install(mgr, label, handle, pending, strategy, bins_per_step, bits, pause_ms,
                               step_timeout_s, force_after_s, poll_s, lag_ms, max_defer_ms, replay_after_s,
                               gate_timeout_s)
    except Exception as e:
        mgr.connect_marks.pop(label, None)
        progress = mgr.transfers[before] if len(mgr.transfers) > before else None
        receiver_died = is_actor_death(e) or not mgr.topology.is_running(label)
        why = (f"receiver {label} died: {type(e).__name__}" if receiver_died else f"{type(e).__name__}: {e}")
        if progress is not None:
            progress["state"], progress["error"] = "failed", why
        mgr.record({"kind": "transfer", "action": "failed", "replica": label, "error": why,
                    "text": f"transfer to {label} failed: {why}"})
        raise


def _staged_install(mgr, label, handle, pending, strategy, bins_per_step, bits, pause_ms, step_timeout_s,
                    force_after_s, poll_s, lag_ms, max_defer_ms, replay_after_s, gate_timeout_s) -> dict:
    topo = mgr.topology
    op = topo.replica(label).operator
    split = splittable(mgr.dep.query, op)
    steps = plan_transfer(strategy, bits, bins_per_step, split)
    gate = mgr.connect_marks.pop(label, None)  # None: its upstream links replayed (module doc)
    ray.get(handle.begin_transfer.remote(bits), timeout=120)
    progress = {"replica": label, "operator": op, "strategy": strategy, "bits": bits,
                "splittable": split, "steps": len(steps), "done": 0, "peer": None, "peers": [],
                "restarts": 0, "state": "running", "started_s": round(mgr.now(), 3), "step_s": [],
                "added_streams": [], "replay": gate is None, "gate": gate, "replay_fallback": None}
    mgr.transfers.append(progress)
    t0 = time.time()
    lag_s = None if lag_ms is None else lag_ms / 1e3

    def pick_peer() -> str:
        peers = mgr.handover.peers(label, pending)
        if not peers:
            progress["state"] = "failed"
            raise RuntimeError(f"transfer to {label}: no live peer of {op!r} left")
        peer = peers[0]
        progress["added_streams"] += mgr.handover.cover_peer(label, peer)
        progress["peer"] = peer
        return peer

    peer = pick_peer()
    requested = False
    seen: set[int] = set()
    last_progress = time.time()
    forced = 0.0  # when the peer was last asked to take a step at once
    gs = {"t0": time.time()}  # the gate's watch (_check_gate)
    while True:
        if not topo.is_running(peer):
            dead = peer
            mgr.meter.notice_failures()
            # the peer may have died after its last step reached the receiver (a sender retiring, or
            # declared failed once the receiver had taken over): nothing is left to restart then
            status = ray.get(handle.transfer_status.remote(0.0, len(seen)), timeout=60)
            late = {int(i) for i in status["installed"]} - seen
            seen |= late
            progress["peers"] += [dead] * len(late)
            progress["step_s"] += [round(time.time() - t0, 4)] * len(late)
            progress["done"] = len(seen)
            if len(seen) == len(steps) or status["complete"]:
                break
            peer = pick_peer()
            progress["restarts"] += 1
            first = min(set(range(len(steps))) - seen, default=len(steps))
            mgr.record({"kind": "transfer", "action": "restart", "replica": label, "step": first,
                        "dead_peer": dead, "peer": peer,
                        "text": f"transfer to {label}: peer {dead} died with {len(steps) - len(seen)} step(s) "
                                f"not installed (first {first}); they restart from {peer}"})
            requested = False
        if not requested:
            # every step not installed yet, at once: the peer takes them at its punctuations,
            # more than one per punctuation while its pause stays within pause_ms
            # (packed: 4,096 small arrays took 11 ms or more to deserialize on the peer's data thread)
            todo = pack_steps([(i, steps[i]) for i in range(len(steps)) if i not in seen])
            try:
                ray.get(topo.handle(peer).request_steps.remote(handle, todo, bits, pause_ms / 1e3, gate, lag_s,
                                                                max_defer_ms / 1e3), timeout=60)
            except Exception as e:  # the peer died: marked failed, and the loop picks another
                if not is_actor_death(e):
                    raise  # anything else fails the transfer loudly (staged_install records it)
                if topo.is_running(peer):
                    mgr.dep.repairer.mark_failed(peer, "died during a state transfer")
                continue
            requested, last_progress, forced = True, time.time(), 0.0
            gs = {"t0": time.time()}
        status = ray.get(handle.transfer_status.remote(poll_s, len(seen)), timeout=60)
        new = {int(i) for i in status["installed"]} - seen
        if new:
            seen |= new
            now = round(time.time() - t0, 4)
            for i in sorted(new):
                progress["peers"].append(peer)
                progress["step_s"].append(now)
            progress["done"] = len(seen)
            last_progress, forced = time.time(), 0.0
        if len(seen) == len(steps) or status["complete"]:
            break
        if gate is not None and not seen:
            _check_gate(mgr, label, handle, peer, progress, gs, replay_after_s, gate_timeout_s)
            if progress["replay_fallback"] is not None:
                gate = None  # subscribed again with replay: the peer's steps need not wait for the marks
                requested = False
                continue
        if time.time() - last_progress > step_timeout_s:
            progress["state"] = "failed"
            first = min(set(range(len(steps))) - seen)
            raise TimeoutError(f"transfer to {label}: step {first} not installed after {step_timeout_s} s")
        if time.time() - max(last_progress, forced) > force_after_s:
            # no punctuation came (the input paused): the peer takes its next step(s) now, and
            # again after each further force_after_s without progress (sent, not awaited: if the
            # peer died, the next round notices it in the topology)
            topo.handle(peer).take_steps_now.remote()
            forced = time.time()
    # every bin is in; the receiver completes once its cores agree on a punctuation
    deadline = time.time() + step_timeout_s
    while not status["complete"]:
        if time.time() > deadline:
            progress["state"] = "failed"
            raise TimeoutError(f"transfer to {label}: all steps installed but no common punctuation "
                               f"after {step_timeout_s} s ({status})")
        status = ray.get(handle.transfer_status.remote(poll_s, len(steps)), timeout=60)
    progress["state"] = "complete"
    progress["seconds"] = round(time.time() - t0, 4)
    reports = {}
    for p in set(progress["peers"]):
        try:
            reports[p] = ray.get(topo.handle(p).transfer_report.remote(), timeout=30)
        except Exception:  # a peer that died after its steps: no report from it (its steps count anyway)
            reports[p] = None
    key = repr(handle)
    taken = [r for rep in reports.values() if rep for r in rep if r.get("receiver", key) == key]
    progress["max_checkpoint_s"] = max((r["checkpoint_s"] + r["send_s"] for r in taken), default=None)
    progress["bytes"] = sum(r["bytes"] for r in taken)
    progress["sends"] = len(taken)  # checkpoints sent: steps taken at one punctuation go as one
    deferred: dict[str, int] = {}
    for r in taken:
        for why, n in (r.get("deferred") or {}).items():
            deferred[why] = deferred.get(why, 0) + n
    progress["deferred"] = deferred
    progress["forced_sends"] = sum(1 for r in taken if r.get("forced"))
    gates = [r["gate_s"] for r in taken if r.get("gate_s") is not None]
    progress["gate_s"] = round(min(gates), 4) if gates else None
    lags = [r["lag_s"] for r in taken if r.get("lag_s") is not None]
    bases = [r["lag_base_s"] for r in taken if r.get("lag_base_s") is not None]
    tops = [r["lag_max_s"] for r in taken if r.get("lag_max_s") is not None]
    progress["lag_ms"] = None if not lags else {
        "base": round(1e3 * min(bases), 1), "max": round(1e3 * max(tops), 1),
        "at_sends_max": round(1e3 * max(lags), 1)}
    progress["first_step_s"] = progress["step_s"][0] if progress["step_s"] else None
    mgr.record({"kind": "transfer", "action": "complete", "replica": label, "strategy": strategy,
                "steps": len(steps), "seconds": progress["seconds"], "restarts": progress["restarts"],
                "replay": progress["replay"], "deferred": deferred,
                "text": f"transfer to {label}: {len(steps)} step(s) of {strategy} in {progress['seconds']:.3f} s"
                        f" ({'with' if progress['replay'] else 'without'} replay from upstream)"})
    return {"peer": progress["peers"][-1] if progress["peers"] else None, "strategy": strategy,
            "steps": len(steps), "restarts": progress["restarts"], "seconds": progress["seconds"],
            "extra_streams": progress["added_streams"], "max_checkpoint_s": progress["max_checkpoint_s"],
            "bytes": progress["bytes"], "sends": progress["sends"], "pause_ms": pause_ms,
            "replay": progress["replay"], "replay_fallback": progress["replay_fallback"],
            "gate_s": progress["gate_s"], "first_step_s": progress["first_step_s"], "deferred": deferred,
            "lag_ms": progress["lag_ms"], **{k: status.get(k) for k in ("merges", "early_tuples")}}


def _check_gate(mgr, label, handle, peer, progress, gs: dict, replay_after_s, gate_timeout_s) -> None:
    """No step installed yet and the receiver was subscribed without replay: if the peer's gate is
    still closed while its input has paused (its filter punctuations unchanged for
    ``replay_after_s``), or ``gate_timeout_s`` after the request, subscribe the receiver again with
    replay (module doc) and record why in ``progress["replay_fallback"]``. ``gs``: ``{"t0": when
    the steps were asked, "punct": the peer's filter punctuations last seen, "since": since when}``."""
    now = time.time()
    try:
        pacing = ray.get(mgr.topology.handle(peer).transfer_pacing.remote(handle), timeout=30)
    except Exception as e:  # the peer died: the main loop notices it in the topology
        if not is_actor_death(e):
            raise
        return
    if pacing is None or pacing["gate"] is None:
        return  # open (or every step taken): the first step is on its way
    punct = tuple(pacing["punct"])
    if punct != gs.get("punct"):
        gs["punct"], gs["since"] = punct, now
    paused = now - gs["since"] > replay_after_s
    if not paused and now - gs["t0"] <= gate_timeout_s:
        return
    why = ("the sender's input paused before its punctuations reached the connect marks" if paused else
           f"the gate stayed closed for {gate_timeout_s:g} s")
    streams = mgr.handover.resubscribe_with_replay(label)
    progress["replay_fallback"] = {"why": why, "streams": streams, "sender_punct": list(punct),
                                   "gate": list(pacing["gate"])}
    mgr.record({"kind": "transfer", "action": "replay_fallback", "replica": label, "why": why,
                "text": f"transfer to {label}: subscribed again with replay ({why})"})
