"""The failure monitor of a deployment's control plane (docs/reliability.md, "Slow is dead").

One thread (:meth:`Monitor.start_monitor`) probes every running actor apart from its data path,
feeds the :class:`~.detector.FailureDetector`, acts on the coordinator's reports that name a
replica to fail, reconnects links a sender dropped and moves the holds they left on its log,
keeps a dormant checkpoint of an operator down to one replica (Del Monte 2017), and decides
when a run can no longer complete exactly (:meth:`Monitor.check_failures`).

>>> plane.monitor.watch_once()        # doctest: +SKIP
"""
from __future__ import annotations

import os
import re
import threading
import time
import traceback
import warnings
from typing import Any

import numpy as np
import ray

from ...errors import RunFailed, UserFunctionError
from ...operators.base import NO_PUNCTUATION
from ...partition import Switch, parse_partition_label
from ...plan import ENTRY, label_group
from .common import READY_S, fence_process, is_actor_death, is_unavailable

__all__ = ["Monitor"]


class Monitor:
    """The failure monitor of a deployment's control plane (docs/reliability.md, "Slow is dead").

    >>> plane.monitor.watch_once()        # doctest: +SKIP
    """

    def __init__(self, plane):
        self.plane = plane  # the :class:`~.plane.ControlPlane` this part belongs to
        self._probes: dict[str, Any] = {}  # label -> outstanding probe
        self._probed: dict[str, float] = {}  # label -> when it was last probed
        # label -> (pid, Ray node, process start, actor id) from its probes: who the fence may kill
        self._pids: dict[str, tuple] = {}
        self._reports_seen = 0  # coordinator reports handled by the monitor (_handle_reports)
        self._dropped_links: set[tuple[str, str]] = set()  # (sender, receiver) links dropped, not by a death
        self._link_drops: dict[tuple[str, str], dict] = {}  # per dropped link: when, why, reconnections tried
        self._reconnect_threads: list[threading.Thread] = []
        self._monitor_thread: threading.Thread | None = None
        # operator (partition "op.P" of a partitioned one) -> its last live replica sending dormant checkpoints
        self._dormant_of: dict[str, str] = {}
        self._raised_since: float | None = None  # when a sender first reported that its receiver raised

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
            while not self.plane.shut_down and ray.is_initialized():
                try:
                    self.watch_once()
                    if self.plane.detached_as is not None:
                        self._check_unattended()
                except Exception as e:  # logged and warned: the waits' own checks still raise the run's failures
                    self.plane.events.append({"t": self.plane.now(), "event": "monitor_error", "error": repr(e),
                                              "traceback": traceback.format_exc(limit=8)})
                    warnings.warn(f"replistream: the failure monitor raised {e!r}; it goes on", RuntimeWarning,
                                  stacklevel=1)
                time.sleep(self.MONITOR_EVERY_S)

        self._monitor_thread = threading.Thread(target=loop, daemon=True, name="replistream-monitor")
        self._monitor_thread.start()

    #: Seconds between two checks of a detached deployment's failures when nobody waits on it.
    UNATTENDED_EVERY_S = 1.0

    def _check_unattended(self) -> None:
        """A detached deployment acts on its failures whether or not a client waits on it: every
        :attr:`UNATTENDED_EVERY_S` the monitor runs :meth:`check_failures`; the first failure is kept
        in :attr:`failure`, logged (``run_failed``), said by ``status()``, and raised by every later
        ``wait()``; the deployment keeps running for its results to be read until it is stopped."""
        now = time.time()
        if self.plane.failure is not None or now - getattr(self, "_unattended_at", 0.0) < self.UNATTENDED_EVERY_S:
            return
        self._unattended_at = now
        try:
            self.check_failures()
        except (RunFailed, UserFunctionError) as e:
            self.plane.failure = f"{type(e).__name__}: {e}"
            self.plane.events.append({"t": self.plane.now(), "event": "run_failed", "error": self.plane.failure})

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
        det = self.plane.detector
        now = time.time()
        running = dict(self.plane.topology.running())
        for label in [lab for lab in det.watches if lab not in running]:
            det.forget(label)
        for label in [lab for lab in self._probes if lab not in running]:
            del self._probes[label]
        for label in running:
            det.watch(label, self.plane.topology.replica(label).operator, now)
        if self._probes:
            refs = list(self._probes.values())
            ready = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0])
            for label, ref in list(self._probes.items()):
                if ref not in ready:
                    continue
                del self._probes[label]
                try:
                    ans = ray.get(ref, timeout=READY_S)
                except Exception as e:
                    if is_unavailable(e):  # unreachable for now: no answer (suspected, then declared failed and fenced)
                        continue
                    if is_actor_death(e):
                        self.plane.repairer.mark_failed(label, f"died (noticed by the liveness probe): {type(e).__name__}")
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
                self.plane.events.append({"t": self.plane.now(), "event": v.state, "actor": v.label,
                                          "silent_s": round(v.silent_s, 3)})
        started = time.time()
        self._handle_reports()
        self._reconnect_dropped()
        self._move_drop_holds()
        self.protect_last_replicas()
        held = time.time() - started
        if held > self.STALL_S:  # held up by its own calls (a lost coordinator): it saw nothing meanwhile
            det.resume(time.time())
            self.plane.events.append({"t": self.plane.now(), "event": "monitor_stalled", "seconds": round(held, 3)})

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
            if not (self.plane.topology.is_running(src) and self.plane.topology.is_running(dst)):
                continue
            try:
                lat = self.plane.conditions.latency_ms(self.plane.topology.server(src), self.plane.topology.server(dst), self.plane.now())
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
            if drop.get("busy") or not self.plane.topology.is_running(src):
                continue
            for s in self.plane.topology.streams(src=src, dst=dst):
                ports.setdefault((src, dst), set()).add(s.port)
        asked = {dst: self.plane.topology.handle(dst).gc_report.remote() for (_, dst) in ports
                 if self.plane.topology.is_running(dst) and not self.plane.detector.is_suspected(dst)}
        ready = self.plane._ask_all(asked, 0.5)
        for (src, dst), pset in ports.items():
            drop = self._link_drops[(src, dst)]
            gone = not self.plane.topology.is_running(dst) or drop["tries"] >= self.RECONNECT_TRIES
            points = {}
            acks = []
            if not gone and asked.get(dst) in ready:
                try:
                    acks = ray.get(asked[dst], timeout=READY_S).get("acks") or []
                except Exception:  # noqa: BLE001 - a death: noticed by the probes; the hold stays
                    acks = []
            for port in pset:
                key = gone_key(dst, port)
                if gone:
                    points[key] = None
                elif port < len(acks):
                    points[key] = int(acks[port])
            if points:
                self.plane.topology.handle(src).raise_holds.remote(points)
            if gone:
                self._link_drops.pop((src, dst), None)

    def _reconnect(self, src: str, dst: str, drop: dict) -> None:
        try:
            mgr = self.plane.control_loop()
            with mgr.lock:
                if self.plane.shut_down or not (self.plane.topology.is_running(src) and self.plane.topology.is_running(dst)):
                    return
                streams = [st for st in self.plane.topology.streams(src=src, dst=dst) if st.live]
                replayed = sum(mgr.handover._connect(st) for st in streams)
                self._dropped_links.discard((src, dst))
                self.plane.events.append({"t": self.plane.now(), "event": "link_reconnected", "from": src, "to": dst,
                                          "replayed": int(replayed), "try": drop["tries"]})
        except Exception as e:  # logged; the receiver's other links feed it, or it is declared failed
            self.plane.events.append({"t": self.plane.now(), "event": "reconnect_failed", "from": src, "to": dst,
                                      "error": repr(e)})
        finally:
            drop["busy"] = False
            drop["wall"] = time.time()

    def _upstream_running(self, operator: str) -> list[tuple[str, Any]]:
        """The running replicas that feed ``operator`` or its partition ``"op.P"`` (entry replicas for
        a source; every partition of a partitioned upstream operator)."""
        q, out = self.plane.query, []
        for up in q.inputs_of(parse_partition_label(operator)[0]):
            group = ENTRY if up in q.sources else up
            out += [(r.label, self.plane.topology.handle(r.label)) for r in self.plane.topology.replicas(group)
                    if self.plane.topology.is_running(r.label)]
        return out

    def _hold_upstream(self, operator: str, p: int) -> None:
        """Every running upstream replica of ``operator`` (or of its partition ``"op.P"``) keeps its
        output after punctuation ``p`` (its dormant checkpoint's) under the key ``dormant:<operator>``
        (one per partition); sent, not awaited (the hold only rises)."""
        for _, h in self._upstream_running(operator):
            h.hold_retention.remote(f"dormant:{operator}", int(p))

    def _replica_groups(self) -> list[str]:
        """Every operator's group of copies: the operator, or each partition ``"op.P"`` of a
        partitioned one (those running now, after any rescale)."""
        topo = self.plane.topology
        out = []
        for op in self.plane.query.operators:
            out += list(dict.fromkeys(label_group(r.label) for r in topo.replicas(op))) or [op]
        return out

    def protect_last_replicas(self) -> None:
        """With ``gc.dormant_every_s``: an operator (each partition ``"op.P"`` of a partitioned one,
        on its own) down to one live replica gets a dormant checkpoint (Rhino, Del Monte 2017): its
        upstream replicas first stop trimming the output it may need again (awaited), then the
        replica sends a checkpoint every ``dormant_every_s``, kept under its partition's name
        (:meth:`_hold_upstream` raises the holds as each arrives). Run by the monitor."""
        every = None if self.plane.manager is None else self.plane.manager.cfg.dormant_every_s
        if every is None or self.plane.k < 2:
            return
        for group in self._replica_groups():
            live = [r.label for r in self.plane.topology.replicas(group) if r.state == "live"
                    and label_group(r.label) == group and self.plane.topology.is_running(r.label)]
            if len(live) != 1 or self._dormant_of.get(group) == live[0]:
                continue
            ups = self._upstream_running(group)
            self.plane.tell({f"{label}|hold": h.hold_retention.remote(f"dormant:{group}", NO_PUNCTUATION)
                             for label, h in ups}, timeout=10)
            self.plane.tell({live[0]: self.plane.topology.handle(live[0]).keep_dormant.remote(every)}, timeout=10)
            self._dormant_of[group] = live[0]
            self.plane.events.append({"t": self.plane.now(), "event": "dormant_on", "operator": group,
                                      "replica": live[0], "every_s": every})

    def _groups(self) -> list[str]:
        """Every group of copies: the entry points, each operator (each partition ``"op.P"`` of a
        partitioned one) and each application."""
        q, topo = self.plane.query, self.plane.topology
        out = list(dict.fromkeys(label_group(r.label) for r in topo.replicas(ENTRY))) or [ENTRY]  # (entry.P)
        for node in [*q.operators, *q.sinks]:
            out += list(dict.fromkeys(label_group(r.label) for r in topo.replicas(node))) or [node]
        return out

    def _revive_dormant(self, node: str) -> bool:
        """Every replica of operator ``node`` (or of its partition ``"op.P"``) is lost: revive one
        from that group's dormant checkpoint and the upstream output kept since
        (:meth:`protect_last_replicas`). False if it has none."""
        if parse_partition_label(node)[0] not in self.plane.query.operators or self.plane.manager is None or \
                self.plane.manager.cfg.dormant_every_s is None:
            return False
        got = self.plane.coord.ask_coordinator("dormant_checkpoint", node, timeout=30)
        if got is None:
            return False
        self._check_not_rescaled_since(node, int(got[0]), got[1])
        last = self.plane.topology.replicas(node)[-1].label
        ev = self.plane.control_loop().handover.replace_replica(last)
        self.plane.events.append({"t": self.plane.now(), "event": "revived_from_dormant", "operator": node, "replaced": last,
                                  "new": ev["new_replicas"][0]["label"], "handover": ev.get("handover")})
        return True

    def _check_not_rescaled_since(self, group: str, p: int, source: str) -> None:
        """Raise :class:`RunFailed` if partition ``group``'s dormant checkpoint (at punctuation
        ``p``, from ``source``) predates a bin move of a rescale of its operator: the checkpoint
        holds the partition's bins as they were, and a revived replica would not give or take the
        bins moved since (a checkpoint carries no moves), so the output would not be exact."""
        op, part = parse_partition_label(group)
        if part is None:
            return
        _, switches = (self.plane.channel_opts.get("routing") or {}).get(op, (None, ()))
        later = [int(t) for sw in switches for t in np.asarray(sw.at).tolist() if t != Switch.NEVER and t >= p]
        if later:
            raise RunFailed(f"every replica of {group!r} is lost, and its dormant checkpoint (from {source}, "
                            f"at logical time {p / 1e6:.6g} s) predates bins moved by a rescale of {op!r} at "
                            f"logical time {min(later) / 1e6:.6g} s: it cannot be revived exactly (a dormant "
                            f"checkpoint is not carried through a rescale yet)", operator=group,
                            logical_time=p, result=self.plane.output.collect())

    def _handle_reports(self) -> None:
        """Act on the coordinator's new reports that name a replica to fail: ``declare_failed`` (its
        sender thread raised), ``broken_contract`` (a tuple at or below its own punctuation, named
        with receiver, port, channel and logical time: the sender is declared failed), and dropped
        links not due to a death (a receiver left with no live upstream replica on an input is
        declared failed: it would never progress again)."""
        # a coordinator silent for fail_after_s (at least 4 s) is fenced and replaced, as a replica is
        new = self.plane.coord.ask_coordinator("reports_since", self._reports_seen, timeout=max(4.0, self.plane.detector.fail_after_s))
        self._reports_seen += len(new)
        starved = set()
        for rep in new:
            kind = rep.get("kind")
            if kind == "declare_failed":
                self.declare_failed(rep["replica"], rep["reason"])
            elif kind == "broken_contract":
                sender = self.plane.topology.sender_of(rep["receiver"], rep["port"], rep["channel"])
                what = (f"sent {rep['rows']} tuple(s) from ts={rep['ts']} at or below its own punctuation "
                        f"{rep['punctuation']} to {rep['receiver']} (input {rep['port']}, channel {rep['channel']}; "
                        f"logical time {rep['punctuation'] / 1e6:.6g} s): a broken contract")
                self.plane.events.append({"t": self.plane.now(), "event": "broken_contract", "sender": sender, **rep})
                if sender is None:
                    self.declare_failed(rep["receiver"], f"received a tuple below a punctuation from an unknown "
                                        f"sender: {what}")
                else:
                    self.declare_failed(sender, what)
            elif kind == "stale_packet":  # another deployment's packet, rejected: said, with its sender
                self.plane.events.append({"t": self.plane.now(), "event": "stale_packet", **{k: v for k, v in rep.items()
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
                self.plane.events.append({"t": self.plane.now(), "event": "link_failed", "from": rep["from"], "to": rep["to"],
                                          "reason": reason})
                starved.add(rep["to"])
        for label in starved:
            port = self._starved_port(label)
            node = self.plane.topology.replica(label).operator if label in self.plane.topology else None
            # only while a peer of its node is fed and progresses: a node whose every replica is
            # starved (or stuck) has nothing to mask with, and the run's timeout names it
            covered = node is not None and any(
                r.label != label and self.plane.topology.is_running(r.label) and self._starved_port(r.label) is None
                and not self.plane.detector.is_suspected(r.label) for r in self.plane.topology.copies(label))
            if port is not None and covered:
                self.declare_failed(label, f"no live upstream replica feeds its input {port} any more (links "
                                    f"dropped: {sorted(a for a, b in self._dropped_links if b == label)})")

    def _starved_port(self, label: str) -> int | None:
        """An input port of running ``label`` that no running upstream replica feeds over a link not
        dropped (None: every input is fed)."""
        if label not in self.plane.topology or not self.plane.topology.is_running(label):
            return None
        ports: dict[int, bool] = {}
        for s in self.plane.topology.streams(dst=label):
            fed = s.live and self.plane.topology.is_running(s.src) and (s.src, label) not in self._dropped_links
            ports[s.port] = ports.get(s.port, False) or fed
        return next((p for p, fed in sorted(ports.items()) if not fed), None)

    def declare_failed(self, label: str, reason: str) -> None:
        """Declare running ``label`` failed (the failure detector, a broken contract, a starved
        receiver): logged (``declared_failed``), killed and fenced off (its process is killed with
        SIGKILL, which also ends a stopped process: nothing it would send later arrives), then
        handled as a crash (:meth:`mark_failed`: links dropped everywhere, repaired with
        ``repair=True``)."""
        if label not in self.plane.topology or not self.plane.topology.is_running(label):
            return
        self.plane.events.append({"t": self.plane.now(), "event": "declared_failed", "actor": label, "reason": reason})
        self._fence(label)
        self.plane.repairer.mark_failed(label, f"declared failed: {reason}")

    def _fence(self, label: str) -> None:
        """Kill ``label``'s actor and its process, whatever state the process is in (a stopped
        process does not handle Ray's kill request): SIGKILL on the node that hosts it, only after
        checking that the process is still the one the replica's probes named (its pid, its start
        time and its actor: a pid taken by another process meanwhile is left alone)."""
        h = self.plane.topology.handle(label)
        try:
            ray.kill(h, no_restart=True)
        except Exception as e:  # logged: the actor may be gone already
            self.plane.events.append({"t": self.plane.now(), "event": "kill_failed", "actor": label, "error": repr(e)})
        pid, node, start, actor = (*self._pids.get(label, (None, None)), None, None)[:4]
        if pid is None:
            return
        if actor is not None and h is not None and actor != h._actor_id.hex():
            self.plane.events.append({"t": self.plane.now(), "event": "fence_refused", "actor": label,
                                      "why": f"process {pid} answered for actor {actor}, not {label}'s"})
            return
        fence_process(pid, start, node)

    def check_failures(self) -> None:
        """Raise the run's failure if it has one (see :meth:`wait`); nothing otherwise. Deaths,
        silent replicas and dropped links are noticed by the monitor thread (:meth:`watch_once`)."""
        self.start_monitor()
        down = self.plane.coord.node_down("lost with the node")  # (one socket connect: cheap at every tick)
        if down is not None:
            raise down
        failed = self.plane.coord.ask_coordinator("failures", timeout=30)
        for f in [f for f in failed if f["kind"] == "died"]:  # a sender found its receiver dead
            self.plane.repairer.mark_failed(f["replica"], f"died: {f['reason']}")  # idempotent: one already known is left
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
                err.replica, err.logical_time, err.result = f["replica"], t, self.plane.output.collect()
                raise err
            frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', f.get("traceback") or "")
            at = "" if not frames else f" at {os.path.basename(frames[-1][0])}:{frames[-1][1]} in {frames[-1][2]}"
            raise RunFailed(f"{f['operator']!r} failed ({where}): {f['error']}: {f['message']}{at}; the run cannot "
                            f"complete exactly", operator=f["operator"], replica=f["replica"], logical_time=t,
                            result=self.plane.output.collect())
        for node in self._groups():
            replicas = self.plane.topology.replicas(node)
            if not replicas or any(r.state == "live" for r in replicas):
                continue
            if self._revive_dormant(node):
                continue
            reasons = {e["actor"]: e.get("reason") for e in self.plane.events if e.get("event") == "dead"}
            lost = ", ".join(f"{r.label} ({reasons.get(r.label) or r.state})" for r in replicas)
            reached = self.plane.output.reached()
            what = "the entry points" if node == ENTRY else repr(node)
            after = "" if reached is None else f" after logical time {reached / 1e6:.6g} s"
            raise RunFailed(f"every replica of {what} is lost: {lost}; the output{after} cannot be computed "
                            f"(a fault beyond the model: fewer than k replicas failed, docs/reliability.md)",
                            operator=node, replica=", ".join(r.label for r in replicas), logical_time=reached,
                            result=self.plane.output.collect())
        if self.plane.feeder.error is not None:
            raise RunFailed(f"feeding the sources failed: {self.plane.feeder.error}") from self.plane.feeder.error
        if getattr(self.plane, "failure", None) is not None:  # kept when found (and by a restored host), even
            # if the coordinator that was told it can no longer say it: every later wait() raises it
            raise RunFailed(f"the run failed earlier: {self.plane.failure}", result=self.plane.output.collect())
