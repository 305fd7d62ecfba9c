"""Live rescaling in the simulator (issue #41; Megaphone, Hoffmann et al. 2019, §3.3).

A :class:`~replistream.sources.Rescale` changes a partitioned operator's number of partitions
mid-run, as ``deployment.rescale(...)`` does on Ray and the sentinel does on the in-process engine.
The control side is the in-process engine's, shared
(:class:`~replistream.engines.inprocess_rescale.RescaleControl`: ``T0``, the steps of
``"fluid"``, ``"batched"`` or ``"all-at-once"``, the routing switch, the replicas'
:class:`~replistream.replica.rescale.Moves`, the retiring partitions' closing); the replica side
(giving and taking bins at a logical time) is :mod:`replistream.replica.rescale`, shared with
every engine. What is the simulator's own:

* **when**: a ``Rescale`` sentinel among a source's input fires at the virtual time the feeder
  reaches it (as ``KillReplica`` does), and ``Simulator(..., rescales=[(at_s, Rescale(...))])``
  schedules one at virtual time ``at_s`` (as a scenario's kills are);
* **T0**: the largest timestamp any sender routed to the operator (every sender shares one
  router here, as in process), or punctuation its upstream replicas passed, if larger;
* **new partitions**: ``k`` replicas each, on ``plan["op.P"]`` when the plan names partition
  ``P``, else on partition 0's servers, wired to every live upstream and downstream replica;
* **the bins' state** travels over the network: a giving replica's state for a step leaves when
  its CPU is done (its server's CPU busy ``CpuModel.per_state_row_us`` per row, an assumption:
  0 by default) and reaches every replica of the taking partition after the link's latency
  (:func:`~replistream.network.delivery_time`); installing costs the taker's CPU the same. A
  message to a dead replica is lost (``lost``); one whose receiver still has an earlier bin to give
  waits at the receiver until it gave it;
* **the record** of each rescale (``RunResult.stats["rescales"]``) adds to the shared one
  ``start_s`` (virtual time it began), ``end_s`` (every working replica gave and installed every
  step and every leaving one closed), ``duration_s``, and over the outputs of every application
  that arrived from ``start_s`` to ``after_s`` past ``end_s`` (``Simulator(..., rescale_after_s=)``,
  1 s by default: what the move held comes out just after it; bench/rescale.py adds one window):
  ``latency_window_s`` (those two times), ``outputs_during``, ``latency_during_max_s``,
  ``latency_during_median_s`` and ``latency_during_p99_s`` (None without an output).

A run that ends with a rescale not done (no working replica left to give a step) raises a
``RuntimeError`` naming what is undone, as the in-process engine does.

>>> from replistream import Query
>>> from replistream.network import ZeroLatency
>>> from replistream.sources import Rescale
>>> from replistream.testing import assert_same_output, chunked, run_reference
>>> from replistream.sim import Simulator
>>> q = Query(); s = q.source("s", {"k": "i8"}, punctuate_every=4)
>>> _ = s.window(size=8, by="k", name="w").sink("out")
>>> recs = [{"ts": t * 100_000, "k": t % 7} for t in range(80)]
>>> data = {"s": chunked(recs, 5)}
>>> plan = {"entry": ["a", "b"], "w": ["a", "b"], "out": ["c"]}
>>> sim = Simulator(q, plan, ZeroLatency(["a", "b", "c"]), parallelism={"w": 1}, bits=3,
...                 rescales=[(2.0, Rescale("w", 3, "fluid", gap=1)), (5.0, Rescale("w", 2, "all-at-once"))])
>>> res = sim.run(data)
>>> assert_same_output(run_reference(q, data).outputs["out"], res.outputs["out"])
>>> [(r["from"], r["to"], r["steps"], r["start_s"]) for r in res.stats["rescales"]]
[(1, 3, 5, 2.0), (3, 2, 2, 5.0)]
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from replistream.engines.inprocess_rescale import RescaleControl, StateMessage
from replistream.engines.result import latency_s
from replistream.network import delivery_time
from replistream.partition import partition_label
from replistream.plan import ENTRY, ReplicaId
from replistream.replica import ReplicaCore
from replistream.schema import TS

if TYPE_CHECKING:
    from .engine import Simulator

__all__ = ["SimRescaler", "state_rows"]


def state_rows(msg: StateMessage) -> int:
    """The rows of keyed state a state message carries (what its CPU cost counts).

    >>> state_rows(StateMessage(None, None, [], ()))
    0
    """
    return sum(int(state.rows()) for _, state in msg.batch)


class SimRescaler(RescaleControl):
    """The rescales of one simulated run (made by the :class:`~replistream.sim.Simulator` when it
    has any): the shared control with the simulator's hooks (see the module docs). ``parked``: per
    receiver, the state messages that arrived before it could install them."""

    engine_name = "the simulator"

    def __init__(self, sim: "Simulator"):
        super().__init__(sim)
        self.outbox: list[StateMessage] = []
        self.parked: dict[int, list[StateMessage]] = {}
        self.open: list[dict] = []  # records of rescales not done yet
        self._steps_of: dict[int, list] = {}  # id(record) -> its steps

    # -- the hooks ---------------------------------------------------------------------------------
    def _new_record(self, rec: dict) -> None:
        rec.update(start_s=self.e.now, end_s=None, duration_s=None)

    def _working(self, r) -> bool:
        return r.alive and r.core is not None

    def _emit(self, r, out: list) -> None:
        if out:
            self.e._emit(self.e.now, r, out, None)

    def _send(self, msg: StateMessage) -> None:
        self.outbox.append(msg)

    def _t0(self, node: str) -> int:
        """The largest timestamp routed to ``node`` so far, or punctuation its upstream replicas
        emitted (an entry point: what the source's entry logic emitted; an operator replica: its
        watermark, an upper bound), whichever is larger."""
        sim, q = self.e, self.e.query
        t0 = sim.routers[node].max_ts
        for up in q.inputs_of(node):
            if q.spec(up).kind == "source":
                t0 = max(t0, sim.entry_punct.get(up, t0))
                continue
            for u in sim.groups[up]:
                if u.core is not None:
                    t0 = max(t0, int(u.core.logic.watermark))
        return max(int(t0), 0)

    def _start_partitions(self, node: str, old_p: int, p: int) -> list[str]:
        """``k`` replicas of each new partition (on ``plan["node.P"]`` if the plan names it, else on
        partition 0's servers), fed by every live upstream replica and feeding every live
        downstream replica."""
        sim, q = self.e, self.e.query
        base = [r.server for r in sim.groups[node] if r.partition == 0]
        labels = []
        for part in range(old_p, p):
            servers = list(sim.later_plan.get(partition_label(node, part), base))
            ins = []
            for up in q.inputs_of(node):
                ug = ENTRY if q.spec(up).kind == "source" else up
                ins.append((up, [u for u in sim.groups[ug] if u.alive]))
            chans = [len(us) for _, us in ins]
            if any(c == 0 for c in chans):
                raise RuntimeError(f"rescale of {node!r}: an input has no live upstream replica to feed "
                                   f"{partition_label(node, part)}")
            groups = [None if all(u.partition is None for u in us) else [u.partition for u in us] for _, us in ins]
            for i, server in enumerate(servers):
                rid = ReplicaId(node, i, partition=part)
                new = sim._new_replica(rid, server, chans, groups)
                sim.groups[node].append(new)
                links = []
                for port, (up, us) in enumerate(ins):
                    for idx, u in enumerate(us):
                        lk = sim._new_link(u, new, port, idx)
                        if u.node == ENTRY:
                            sim.entry_links[up].setdefault(u.index, []).append(lk)
                        else:
                            u.out.append(lk)
                        links.append(lk)
                for v, port in q.outputs_of(node):
                    for d in sim.groups[v]:
                        if d.alive and d.core is not None:
                            lk = sim._new_link(new, d, port, d.core.add_channel(port, part))
                            new.out.append(lk)
                            links.append(lk)
                sim.links.extend(links)
                sim.events.append({"t": sim.now, "event": "created", "replica": new.label, "server": server})
                labels.append(new.label)
        sim.wiring += 1
        return labels

    # -- the simulator's data path -----------------------------------------------------------------
    def begin(self, ev) -> dict:
        """Run ``ev`` now (virtual time ``sim.now``); its record."""
        rec = super().begin(ev)
        steps = self._steps.get(ev.operator, []) if rec.get("at") is not None else []
        self._steps_of[id(rec)] = [m for m in steps if self._record_of.get(m.id) is rec]
        if rec["from"] == rec["to"] or "skipped" in rec:
            rec.update(end_s=rec["start_s"], duration_s=0.0)
        else:
            self.open.append(rec)
            self.check()
        self.e.events.append({"t": self.e.now, "event": "rescale", "operator": ev.operator, "from": rec["from"],
                              "to": rec["to"], "strategy": rec["strategy"]})
        return rec

    def after(self, r, out: list) -> list:
        """:meth:`RescaleControl.after`, then a check whether an open rescale is done."""
        moved = (r.core.moves is not None and bool(r.core.moves.shipped)) or id(r) in self.closing
        out = super().after(r, out)
        if moved and self.open:
            self.check()
        return out

    def flush(self, t: float, sender) -> float:
        """Send the state messages ``sender`` produced, its CPU done at ``t``: the serialisation
        costs its CPU once per state (``per_state_row_us`` a row); each message reaches its
        receiver after the link's latency. Returns when the sender's CPU is free again."""
        if not self.outbox:
            return t
        sim = self.e
        msgs, self.outbox = self.outbox, []
        rows = sum(state_rows(m) for m in {id(m.batch): m for m in msgs}.values())
        done = sim._state_cpu(sender, t, rows)
        for msg in msgs:
            at = delivery_time(sim.net, sender.server, msg.receiver.server, done)
            if math.isinf(at):
                self._record(msg.steps[0])["lost"] += 1
                continue
            sim._push_state(at, msg)
        return done

    def arrive(self, t: float, msg: StateMessage) -> None:
        """A state message reaches its receiver at ``t``: installed now if it can be, else parked."""
        r = msg.receiver
        if not self._working(r) or id(r) in self.closed:
            self._record(msg.steps[0])["lost"] += 1
            return
        if not msg.deliverable():
            self.parked.setdefault(id(r), []).append(msg)
            return
        self._install_at(t, msg)

    def _install_at(self, t: float, msg: StateMessage) -> None:
        sim, r = self.e, msg.receiver
        done = sim._state_cpu(r, t, state_rows(msg))
        out = self.install(msg)
        done = self.flush(done, r)
        if out:
            sim._emit_at(done, t, r, out)
        if self.open:
            self.check()

    def retry(self, t: float, r) -> None:
        """``r`` processed something (it may have given a bin): install what waited for that."""
        waiting = self.parked.get(id(r))
        if not waiting:
            return
        go = [m for m in waiting if m.deliverable()]
        if not go:
            return
        self.parked[id(r)] = [m for m in waiting if m not in go]
        for msg in go:
            self._install_at(t, msg)

    def check(self) -> None:
        """Close the records of the rescales every working replica has done at ``sim.now``."""
        now, still = self.e.now, []
        for rec in self.open:
            if self._done(rec):
                rec["end_s"] = now
                rec["duration_s"] = now - rec["start_s"]
            else:
                still.append(rec)
        self.open = still

    def _done(self, rec: dict) -> bool:
        group = self.e.groups[rec["operator"]]
        for m in self._steps_of.get(id(rec), []):
            for r in group:
                if not self._working(r) or r.core.moves is None or id(r) in self.closed:
                    continue
                if r.partition == m.src and m.id not in r.core.moves.given:
                    return False
                if r.partition == m.dst and m.id not in r.core.moves.installed:
                    return False
        return not any(id(r) in self.closing and self._working(r) for r in group)

    # -- the end -----------------------------------------------------------------------------------
    def summarise(self, outputs: dict, arrivals: dict, ts0: int, after_s: float) -> None:
        """Add to every done record the latency of the applications' outputs that arrived from its
        ``start_s`` to ``after_s`` past its ``end_s``."""
        for rec in self.records:
            if rec.get("end_s") is None:
                continue
            a, b = rec["start_s"], rec["end_s"] + after_s
            lat = []
            for node, rows in outputs.items():
                at = arrivals[node]
                during = (at >= a) & (at <= b)
                if during.any():
                    lat.append(latency_s(at[during], rows[TS][during], ts0))
            got = np.concatenate(lat) if lat else np.zeros(0)
            rec["latency_window_s"] = [a, b]
            rec["outputs_during"] = int(len(got))
            rec["latency_during_max_s"] = float(got.max()) if len(got) else None
            rec["latency_during_median_s"] = float(np.median(got)) if len(got) else None
            rec["latency_during_p99_s"] = float(np.percentile(got, 99)) if len(got) else None
