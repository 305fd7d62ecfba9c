"""Hand-overs the control loop applies: a replica replaced, added or moved by hand-over from a
live peer (decision 7, Hwang §V-C; staged transfers, Megaphone §3.3), stream replicas discarded
(Algorithm 6) or connected with a replay of their sender's retention log.

>>> plane.manager.handover.replace_replica("join#0")     # doctest: +SKIP
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import ray

from ...gc import OperatorReplica, RevivalEvent, StreamReplica, partition_view
from ...plan import group_of, label_group, replica_partition
from ...replica.handover import missing_feeders, rank_peers, shares_feeders
from ...replica.transfer import STRATEGIES, splittable
from .channels import NO_ACK
from .common import is_actor_death
from .transfer import staged_install


__all__ = ["HandOver"]


class HandOver:
    """Hand-overs the control loop applies: a replica replaced, added or moved by hand-over from a

    >>> plane.manager.handover.replace_replica("join#0")     # doctest: +SKIP
    """

    def __init__(self, mgr):
        self.mgr = mgr  # the :class:`~.control.ReplicaManager` whose state it reads and changes

    # -- by request ------------------------------------------------------------------------------
    def replace_replica(self, label: str, add: bool = False, checkpoint: bool = True, server: str | None = None,
                        strategy: str | None = None, bins_per_step: int | None = None,
                        bits: int | None = None, pause_ms: float = 20.0, lag_ms: float | None = None) -> dict:
        """Start a new replica of ``label``'s operator on its server by hand-over from a live peer,
        fed by every live upstream replica and feeding every live downstream replica; unless
        ``add``, then discard ``label`` (kill it if it still runs). Returns the logged event.
        ``checkpoint=False`` starts it from a fresh state instead (a negative control for
        tests: a stateful replica then misses what its window held).

        ``server`` places the new replica there (default: ``label``'s server, or Algorithm 5's
        choice with ``add``); with ``label`` still running that is a *move*. ``strategy``
        (``"all-at-once"``, ``"batched"`` with ``bins_per_step``, ``"fluid"``; Megaphone §3.3)
        moves the checkpoint in steps of ``2**bits`` bins (default 8 bits), each taken at a
        punctuation of the sending peer while it keeps serving, as many at one punctuation as keep
        its pause within ``pause_ms`` beyond a step's fixed cost, and paced by the live path: the
        receiver's answers, and the peer's output lag (at most ``lag_ms`` above its recent minimum,
        default ``max(pause_ms, 10)``) (:func:`replistream.engines.ray.transfer.staged_install`);
        progress is in :attr:`transfers`. When the state splits into bins the new replica's upstream
        links do not replay their retained output: the steps cover it.
        ``strategy=None`` is the single-step hand-over of docs/handover.md.

        What ``Deployment.revive_replica``/``add_replica``/``move_replica`` (and the
        :class:`~replistream.sources.Revive` sentinel) run.

        >>> dep.control_loop().replace_replica("join#0", checkpoint=False)["action"]   # doctest: +SKIP
        'replace-replica'
        """
        topo = self.mgr.topology
        with self.mgr.lock:
            if label not in topo:
                raise ValueError(f"no replica {label!r}; replicas: {sorted(r.label for r in topo.replicas())}")
            old = topo.replica(label)
            if old.kind != "operator":
                raise ValueError(f"{label!r} is {'an entry point' if old.kind == 'entry' else 'an application'}: "
                                 f"only operator replicas can be revived or added (an entry point's input "
                                 f"cannot be replayed; an application has one replica)")
            if old.state == "failed":
                self.mgr.meter.notice_failures()
            if server is not None and server not in self.mgr.dep.servers:
                raise ValueError(f"no server {server!r}; servers: {sorted(self.mgr.dep.servers)}")
            if strategy is not None and strategy not in STRATEGIES:
                raise ValueError(f"unknown transfer strategy {strategy!r}; choose one of {STRATEGIES}")
            if not pause_ms >= 0:
                raise ValueError(f"pause_ms must be >= 0 (0: one transfer step per punctuation), got {pause_ms}")
            given = server
            server = old.server if given is None else given
            if add and given is None:
                snap = self.mgr.last_snapshot or partition_view(topo.snapshot(self.mgr.kmin)).snapshot
                op = snap.replica(label).operator if snap.has_replica(label) else old.operator  # "op.P": a partition
                server = self.mgr._place(op, snap, label) or old.server
            e = self._replacement(label, server, add, "request",
                                  f"requested: {'add a replica of' if add else 'replace'} {label} by hand-over")
            started = time.time()
            how = {"checkpoint": checkpoint,
                   "staged": None if strategy is None else {"strategy": strategy, "bins_per_step": bins_per_step,
                                                            "bits": 8 if bits is None else int(bits),
                                                            "pause_ms": float(pause_ms), "lag_ms": lag_ms}}
            info = self._apply_revival(e, how)
            rec = {"kind": "revival", **e.to_dict(), "text": e.describe(), "applied": True,
                   "apply_seconds": round(time.time() - started, 3), **info}
            self.mgr.record(rec)
            return rec

    def discard(self, label: str, text: str) -> None:
        """Discard the running replica ``label`` and its live stream replicas (as Algorithm 6 does), and
        log it as a reconfiguration with ``text``."""
        with self.mgr.lock:
            self._apply_discard([s.id for s in self.mgr.topology.streams(live=True, touching=label)], [label])
            self.mgr.record({"kind": "reconfiguration", "action": "discard", "replica": label, "text": text})

    def _replacement(self, label: str, server: str, add: bool, trigger: str, reason: str, **kw) -> RevivalEvent:
        """The RevivalEvent that starts a new replica of ``label``'s operator on ``server``, fed by
        every live upstream replica and feeding every live downstream replica (and, unless
        ``add``, discards ``label`` and its stream replicas)."""
        topo = self.mgr.topology
        old = topo.replica(label)
        new_label = topo.next_label(label_group(label))  # of its partition, for a partitioned operator
        new = OperatorReplica(new_label, old.operator, server, "operator", "live", old.stateful)
        q = self.mgr.dep.query
        streams = []
        for p, up in enumerate(q.inputs_of(old.operator)):
            for r in topo.replicas(group_of(q, up), state="live"):
                streams.append(StreamReplica(r.label, new_label, p, 0.0, 0.0, 0.0, True, up))
        for v, p in q.outputs_of(old.operator):
            for r in topo.replicas(v, state="live"):
                streams.append(StreamReplica(new_label, r.label, p, 0.0, 0.0, 0.0, True, old.operator))
        drop = [] if add or not old.live else [s.id for s in topo.streams(live=True, touching=label)]
        return RevivalEvent("create-replica" if add else "replace-replica", trigger, label, reason,
                            new_replicas=(new,), new_streams=tuple(streams), discard_streams=tuple(drop),
                            discard_replicas=() if add or not old.live else (label,),
                            handover=(new_label,) if new.stateful else (), **kw)

    # -- applying decisions to the actors -----------------------------------------------------
    def _apply_discard(self, streams, replicas) -> None:
        """Stop the discarded stream replicas at their sources; retire the replicas left dormant."""
        topo = self.mgr.topology
        calls = {}
        gone = [topo.stream(sid) for sid in streams]
        for s in gone:
            topo.disconnect(s.id)
        if self.mgr.dep._persister is not None:  # kept before any sender hears of it: a restored host finishes it
            self.mgr.dep._persister.persist_now()
        retiring = set(replicas)
        for s in gone:
            if topo.is_running(s.src):
                # a receiver another sender still feeds may lag this sender's other receivers: the
                # sender's log holds what it has not acknowledged, for a replay if s is revived
                hold = s.dst not in retiring and self.mgr.meter._fed(s.dst, s.port)
                calls[f"{s.src}|{s.id}"] = topo.handle(s.src).disconnect.remote(s.dst, s.port, hold)
        self.mgr.dep.tell({key: ref for key, ref in calls.items()}, timeout=60)
        for label in replicas:
            self.mgr.dep.retire(label)

    def _stream_name(self, s: StreamReplica) -> str:
        return s.stream or self.mgr.topology.replica(s.src).operator

    def _apply_revival(self, e: RevivalEvent, how: dict | None = None) -> dict:
        """Apply a revival decision: start its replicas (pending, subscribed with replay), hand
        state over to them, connect their outputs and the revived stream replicas, then discard
        what the event replaces. ``how``: ``{"checkpoint": False}`` starts them fresh;
        ``{"staged": {...}}`` moves the state in steps (:func:`.transfer.staged_install`)."""
        topo = self.mgr.topology
        how = {"checkpoint": True, "staged": None, **(how or {})}
        info: dict[str, Any] = {}
        new_labels = [r.label for r in e.new_replicas]
        for r in e.new_replicas:
            topo.add_replica(r)
        wanted = {sid: topo.stream(sid) for sid in e.revive_streams}
        for s in e.new_streams:
            topo.put_stream(replace(s, live=False))
            wanted[s.id] = s
        to_start = [lab for lab in list(e.revive_replicas) + new_labels if topo.replica(lab).kind == "operator"]
        for lab in e.revive_replicas:
            topo.set_state(lab, "live")
        started: dict[str, Any] = {}
        try:
            # 1. start pending actors, 2. subscribe them to their upstream replicas (with replay;
            # without for a staged transfer of state that splits, whose steps cover what a replay
            # would: engines/ray/transfer.py)
            for lab in to_start:
                ins = [s for s in wanted.values() if s.dst == lab and s.src not in to_start]
                replay = not self._staged_without_replay(lab, set(to_start), how)
                started[lab] = self._start(topo.replica(lab), ins, replay=replay)
            # 3. hand-over: a checkpoint from a live peer, taken after the subscription
            handover = {}
            for lab in to_start:
                handover[lab] = self._install(lab, started[lab], set(started), how)
            info["handover"] = handover
            # 4. their outputs, 5. revived stream replicas between running replicas. Each new
            # replica's log (the peer's retained output it adopted, and what it emitted since) is
            # held whole until every one of its output links is connected: the first link's
            # acknowledgements would otherwise trim it past what a later link's receiver has, and
            # that replay's punctuation would pass the receiver's filter ahead of tuples it still
            # waits for from slower senders, which it would then drop as copies (a loss; found by
            # the duplicate filters' audit in a chaos trial, docs/reliability.md)
            with self.logs_held(to_start):
                for s in wanted.values():
                    if topo.stream(s.id).live:
                        continue  # connected in _start
                    self._connect(s)
        except Exception:
            for lab in to_start:
                self.mgr.connect_marks.pop(lab, None)
            for lab in started:  # a half-started replica must not linger
                topo.set_state(lab, "dormant")
                self._apply_discard([s.id for s in topo.streams(live=True, touching=lab)], [lab])
            raise
        # 6. what a replacement discards
        if e.discard_streams or e.discard_replicas:
            self._apply_discard(e.discard_streams, e.discard_replicas)
        return info

    #: The hold key under which a new replica's log is kept whole while its outputs are connected.
    CONNECTING = "connecting"

    @contextmanager
    def logs_held(self, labels: list[str]):
        """While its output links are connected one at a time (each replaying its log), the whole
        retention log of each running replica of ``labels`` is held (decision 7): the first
        receiver's acknowledgements must not trim it before the last link replays it. Held before
        (awaited) and released after, whatever happens between.

        >>> with mgr.handover.logs_held(["pings#2"]):      # doctest: +SKIP
        ...     mgr.handover._connect(stream)
        """
        held = self._hold_logs(labels)
        try:
            yield held
        finally:
            self._release_logs(held)

    def _hold_logs(self, labels: list[str]) -> list[str]:
        """Hold the whole retention log of each running replica of ``labels`` (awaited: before any
        of its output links exists, nothing is trimmed from it yet); returns those held."""
        topo = self.mgr.topology
        calls = {lab: topo.handle(lab).hold_retention.remote(self.CONNECTING, NO_ACK) for lab in labels
                 if topo.is_running(lab)}
        held = []
        for lab, call in calls.items():
            try:
                ray.get(call, timeout=60)
                held.append(lab)
            except Exception as e:
                if not is_actor_death(e):
                    raise
                self.mgr.dep.repairer.mark_failed(lab, f"died while its outputs were connected: {type(e).__name__}")
        return held

    def _release_logs(self, labels: list[str]) -> None:
        """Release the holds of :meth:`_hold_logs` (sent, not awaited: a replica that died meanwhile
        holds nothing any more)."""
        topo = self.mgr.topology
        for lab in labels:
            h = topo.handle(lab)
            if h is not None:
                h.raise_holds.remote({self.CONNECTING: None})

    def _connect(self, s: StreamReplica) -> int:
        """Connect ``s`` (both ends running) on a new filter channel, replaying the source's log."""
        topo = self.mgr.topology
        dst = topo.handle(s.dst)
        try:
            ch = ray.get(dst.add_channel.remote(s.port, replica_partition(s.src)), timeout=60)
        except Exception as e:
            if not is_actor_death(e):
                raise
            # the downstream replica died meanwhile, unannounced (within the fault model): its peers
            # get this stream; the death is recorded as such
            self.mgr.dep.repairer.mark_failed(s.dst, f"died while {s.src} was connected to it: {type(e).__name__}")
            return 0
        try:
            n = ray.get(topo.handle(s.src).connect.remote(self._stream_name(s), s.dst, topo.server(s.dst), dst,
                                                         s.port, ch, True), timeout=60)
        except Exception as e:
            if not is_actor_death(e):
                raise
            # the upstream replica died meanwhile (a crash within the fault model): its peers feed on
            self.mgr.dep.repairer.mark_failed(s.src, f"died while connecting to {s.dst}: {type(e).__name__}")
            return 0
        topo.put_stream(replace(s, live=True), ch)
        return n

    def _staged_without_replay(self, label: str, pending: set, how: dict) -> bool:
        """Whether ``label`` (about to start) will get its state by a staged transfer whose steps
        make a replay from its upstream replicas unnecessary: a strategy was asked, the operator's
        state splits into bins, and a live peer can send the steps (otherwise a dormant checkpoint
        or a fresh state is installed, which needs the replay)."""
        if not how.get("checkpoint", True) or how.get("staged") is None:
            return False
        op = self.mgr.topology.replica(label).operator
        return splittable(self.mgr.dep.query, op) and bool(self.peers(label, pending))

    def resubscribe_with_replay(self, label: str) -> list[str]:
        """Connect ``label`` once more to each of its live upstream replicas, on new channels, this
        time replaying their retained output (the links without replay stay; duplicate filters
        drop what comes twice): a staged transfer's fallback when it cannot go without the
        replay (:func:`.transfer.staged_install`). Returns the stream ids reconnected.

        >>> mgr.resubscribe_with_replay("join#2")   # doctest: +SKIP
        ['entry#0->join#2:0', 'entry#0->join#2:1']
        """
        done = []
        for s in self.mgr.topology.streams(live=True, dst=label):
            if self.mgr.topology.is_running(s.src):
                self._connect(s)
                done.append(s.id)
        self.mgr.connect_marks.pop(label, None)
        return done

    def _start(self, rep: OperatorReplica, ins: list[StreamReplica], replay: bool = True):
        """Create the actor of ``rep`` pending, fed by ``ins`` (each replaying its log). With
        ``replay=False`` (a staged transfer, :meth:`_staged_without_replay`) the links carry only
        what their senders flush from now on; each sender's connect mark (``connect_for_transfer``)
        goes, per input port the largest, to :attr:`connect_marks` for the transfer's gate."""
        topo = self.mgr.topology
        n_ports = len(self.mgr.dep.query.inputs_of(rep.operator))
        channels = [0] * n_ports
        groups: list = [None] * n_ports  # per port, each channel's upstream partition (a partitioned upstream)
        chan_of = {}
        for s in ins:
            chan_of[s.id] = channels[s.port]
            channels[s.port] += 1
            part = replica_partition(s.src)
            if part is not None:
                groups[s.port] = (groups[s.port] or []) + [part]
        for p in range(n_ports):
            if channels[p] == 0:
                raise RuntimeError(f"cannot start {rep.label}: no live upstream replica feeds its port {p}")
        if any(g is not None and len(g) != c for g, c in zip(groups, channels)):
            raise RuntimeError(f"cannot start {rep.label}: a port is fed by partitioned and unpartitioned replicas")
        h = self.mgr.dep.start_replica(rep.label, channels, pending=True, groups=groups)
        calls = []
        for s in ins:
            src = topo.handle(s.src)
            if replay:
                call = src.connect.remote(self._stream_name(s), rep.label, rep.server, h, s.port, chan_of[s.id], True)
            else:
                call = src.connect_for_transfer.remote(self._stream_name(s), rep.label, rep.server, h, s.port,
                                                       chan_of[s.id])
            calls.append((s, call))
            topo.put_stream(replace(s, live=True), chan_of[s.id])
        fed = [0] * n_ports
        marks = [NO_ACK] * n_ports
        for s, call in calls:
            try:
                got = ray.get(call, timeout=60)
                fed[s.port] += 1
                if not replay:
                    marks[s.port] = max(marks[s.port], int(got))
            except Exception as e:
                if not is_actor_death(e):
                    raise
                # an upstream replica died meanwhile (within the fault model): its peers feed the new one
                self.mgr.dep.repairer.mark_failed(s.src, f"died while connecting to {rep.label}: {type(e).__name__}")
        for p in range(n_ports):
            if fed[p] == 0:
                raise RuntimeError(f"cannot start {rep.label}: every upstream replica feeding its port {p} died")
        if not replay:
            self.mgr.connect_marks[rep.label] = marks
        return h

    # -- hand-over: the peer and its feeders (replistream.replica.handover) ---------------------
    def peers(self, label: str, pending: set) -> list[str]:
        """Running live peers of ``label``'s operator that can give it a checkpoint (not in
        ``pending``), those whose inputs share a feeder with ``label`` on every port first, those on
        a server over the load bound (:meth:`rebalance`) last."""
        topo = self.mgr.topology
        candidates = [r.label for r in topo.copies(label, state="live") if r.label != label
                      and topo.is_running(r.label) and r.label not in pending]
        ranked = rank_peers(label, candidates, topo.streams())
        return sorted(ranked, key=lambda p: topo.server(p) in self.mgr.overloaded)  # stable: overloaded ones last

    def cover_peer(self, label: str, peer: str) -> list[str]:
        """Unless ``label`` shares a feeder with ``peer`` on every port, subscribe it to the peer's
        feeders it lacks (with replay), so the replay covers everything above the peer's ``p``;
        returns the stream ids added."""
        streams = self.mgr.topology.streams()
        if shares_feeders(streams, label, peer):
            return []
        added = []
        for s in missing_feeders(streams, label, peer):
            self._connect(s)
            added.append(s.id)
        return added

    def _install(self, label: str, handle, pending: set, how: dict) -> dict:
        """Hand-over (docs/design.md, decision 7): install a checkpoint from a live peer whose inputs share
        a feeder with ``label`` on every port; subscribe ``label`` to more feeders if needed.
        With a transfer strategy (``how["staged"]``), the checkpoint moves in steps of bins
        instead (Megaphone §3.3, :mod:`.transfer`)."""
        rep = self.mgr.topology.replica(label)
        if not how["checkpoint"]:
            ray.get(handle.install.remote(None), timeout=120)
            return {"peer": None, "checkpoint": None}
        peers = self.peers(label, pending)
        if label in self.mgr.connect_marks and (not peers or how["staged"] is None):
            self.resubscribe_with_replay(label)  # subscribed without replay, but no staged transfer now
        if not peers:
            # kept per partition ("op.P") for a partitioned operator's replica, per operator otherwise
            dormant = self.mgr.dep.coord.ask_coordinator("dormant_checkpoint", label_group(label), timeout=60)
            if dormant is not None:  # every replica was lost: the last one's dormant checkpoint
                p, source, ck = dormant
                got = ray.get(handle.install.remote(ck), timeout=300)
                return {"peer": None, "dormant": {"from": source, "punctuation": int(p)}, **got}
            if rep.stateful:
                raise RuntimeError(f"no live peer of {rep.operator!r} can hand its state over to {label}")
            ray.get(handle.install.remote(None), timeout=120)
            return {"peer": None}
        if how["staged"] is not None:
            return staged_install(self.mgr, label, handle, pending, **how["staged"])
        for peer in peers:
            added = self.cover_peer(label, peer)
            try:
                ck = ray.get(self.mgr.topology.handle(peer).checkpoint.remote(), timeout=120)
            except Exception as e:
                if not is_actor_death(e):
                    raise
                # the peer died unannounced (within the fault model): the next live peer hands over
                self.mgr.dep.repairer.mark_failed(peer, f"died while handing its state over to {label}: {type(e).__name__}")
                continue
            got = ray.get(handle.install.remote(ck), timeout=300)
            return {"peer": peer, "extra_streams": added, **got}
        raise RuntimeError(f"every live peer of {rep.operator!r} died while handing its state over to {label}")
