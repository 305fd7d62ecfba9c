"""Batched execution of the simulator: one call per replica and port per epoch, times kept per tuple.

The per-packet engine (:class:`~replistream.sim.engine.Simulator` without ``batch_s``)
pops one event per packet: every reading crosses every stream replica as its own
packet, so a month of the 30-server Fig. 1 scenario is ~4e8 events. With
``Simulator(..., batch_s=E)`` the same run advances in epochs of ``E`` virtual
seconds, and within an epoch each replica hands *all* the packets that reached it
to the shared operator objects in a few calls, while every tuple keeps its own
virtual time:

* **Epochs in query order.** The query is acyclic, so in epoch ``[T, T+E)`` the
  replicas are processed in topological order: when a replica's turn comes,
  every packet that can reach it before ``T+E`` has been sent. Packets arriving
  later wait for the next epoch. ``E`` changes nothing but speed and memory:
  kills, the coordinator and ``until`` fall on epoch boundaries.
* **Links** carry packets (``_Flow``): arrival time, tuple count and punctuation
  per packet, plus the rows. A link's arrivals are computed for all its packets of
  an epoch at once by :func:`~replistream.network.delivery_times` (the latency model
  evaluated vectorised over the send times, for all of a sender's links in one
  ``link_latencies_ms`` call; outages waited out as
  :func:`~replistream.network.delivery_time` waits them out; FIFO order).
* **CPU.** A replica serves its packets in arrival order; the finishing times of
  a FIFO queue (Lindley's recursion ``done_i = max(arrival_i, done_{i-1}) + cost_i``)
  are computed with a cumulative sum and a running maximum. Difference from the
  per-packet engine: each replica has its own queue; replicas on one server do not
  delay each other.
* **Duplicate filters** (Algorithm 1) are the replicas' own
  :class:`~replistream.operators.dupfilter.DuplicateFilter` objects. All the copies
  that reached one port in an epoch go to its filter in one
  :meth:`~replistream.operators.dupfilter.DuplicateFilter.on_rows` call, in arrival
  order, each with the punctuation in force when it arrived: each copy meets the
  filter with exactly the count of earlier copies it would have met packet by packet,
  so the passed tuples and the contribution weights (§V-B) are the same, and a copy
  arriving after a punctuation that covers it is dropped, as it would be.
  Punctuations go to the filter after the epoch's tuples, each channel's maximum.
* **Logic** gets each port's new tuples in one call, then each port's punctuation.
  Union, Filter, Map and applications keep their rows' times (one to one, or by id);
  an equi-Join's output ``l ⊗ r`` leaves at the later of the two tuples' times at this
  replica (Algorithm 2 emits a pair when its second tuple arrives): the engine finds
  each output's pair by its id ``mix(l.id, r.id)`` among the candidate pairs (same key,
  timestamps within the window) of a table of the tuples the Join may still hold.
  Other operators (aggregates, flat maps, sorted inputs) are driven packet by packet,
  as in the per-packet engine. The forwarded punctuation (the logic's watermark,
  :meth:`~replistream.operators.base.OperatorLogic.watermarks`) is emitted at the time
  each input's punctuation raised it.
* **Sources.** Each tuple is released at its own timestamp (a chunk of one reading
  behaves as in the per-packet engine, which releases a chunk at its first
  timestamp), with the punctuation the entry point emits after that tuple
  (:meth:`~replistream.operators.entry.EntryLogic.auto_punctuation`). Sources are read
  before an epoch's end is fixed, so a ``KillReplica`` / ``KillServer`` sentinel
  becomes a kill at an epoch boundary, as a scenario's kill at that time.

What this changes: nothing in the outputs (the tests compare them with the reference
and with the per-packet engine). Latencies agree with the per-packet engine's up to
floating-point rounding (the CPU queue's cumulative sums, numpy's transcendental
functions) except where two replicas on one server compete for its CPU or two packets
arrive at the same instant (ties are broken by link, not by send order).

>>> from replistream.workloads import fig1_query, fig1_inputs
>>> from replistream.network import GeoLatencyModel, default_servers
>>> from replistream.sim import Simulator
>>> q = fig1_query(2, window_s=10)
>>> data = fig1_inputs(2, duration_s=120, period_s=10, seed=1)
>>> servers = [s.name for s in default_servers(10)]
>>> plan = {n: servers[2 * i:2 * i + 2] for i, n in enumerate(["entry", *q.operators])} | {"alerts": [servers[0]]}
>>> net = GeoLatencyModel(default_servers(10), seed=0)
>>> a = Simulator(q, plan, net).run(data)
>>> b = Simulator(q, plan, net, batch_s=60).run(data)
>>> bool(np.allclose(np.sort(a.latencies("alerts")[1]), np.sort(b.latencies("alerts")[1]), atol=1e-9))
True
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from replistream.ids import hash_columns, mix
from replistream.network import delivery_times
from replistream.operators.join import JoinLogic
from replistream.operators.stateless import FilterLogic, MapLogic, UnionLogic
from replistream.plan import ENTRY
from replistream.query import ApplicationLogic
from replistream.schema import ID, TS, Punctuation
from replistream.sources import Sentinel, chunk_time

from .engine import sentinel_kill

__all__ = ["BatchRun", "fifo_done"]

NO_P = int(np.iinfo(np.int64).min)


# -- the CPU queue -----------------------------------------------------------------------------------

def fifo_done(arrival: np.ndarray, cost: np.ndarray, busy: float = -math.inf) -> np.ndarray:
    """Finishing times of a FIFO server (jobs sorted by arrival): Lindley's recursion
    ``done_i = max(arrival_i, done_{i-1}) + cost_i``, vectorised; ``busy`` is when the
    server finishes its earlier work.

    >>> fifo_done(np.array([0.0, 0.5, 0.6, 5.0]), np.array([1.0, 1.0, 0.0, 1.0])).tolist()
    [1.0, 2.0, 2.0, 6.0]
    """
    if not len(arrival):
        return arrival.copy()
    if not cost.any():
        return np.maximum(np.maximum.accumulate(arrival), busy)
    s = np.cumsum(cost)
    lead = np.maximum.accumulate(arrival - (s - cost))
    return s + np.maximum(lead, busy)


# -- packets -----------------------------------------------------------------------------------------

class _Flow:
    """Packets in time order: ``at`` (time), ``punct`` (NO_P: none), ``n`` (rows), and the rows."""

    __slots__ = ("at", "punct", "n", "rows")

    def __init__(self, at, punct, n, rows):
        self.at, self.punct, self.n, self.rows = at, punct, n, rows

    def __len__(self):
        return len(self.at)

    @staticmethod
    def concat(flows: list["_Flow"]) -> "_Flow":
        if len(flows) == 1:
            return flows[0]
        rows = [f.rows for f in flows if f.rows is not None and len(f.rows)]
        return _Flow(np.concatenate([f.at for f in flows]), np.concatenate([f.punct for f in flows]),
                     np.concatenate([f.n for f in flows]),
                     (rows[0] if len(rows) == 1 else np.concatenate(rows)) if rows else flows[0].rows)

    def split(self, limit: float) -> tuple["_Flow | None", "_Flow | None"]:
        """(packets before ``limit``, the rest)."""
        k = int(np.searchsorted(self.at, limit, "left"))
        if k == len(self.at):
            return self, None
        if k == 0:
            return None, self
        r = int(self.n[:k].sum())
        rows = self.rows
        return (_Flow(self.at[:k], self.punct[:k], self.n[:k], rows[:r] if rows is not None else None),
                _Flow(self.at[k:], self.punct[k:], self.n[k:], rows[r:] if rows is not None else None))


def _flow_from_items(t: float, items: list) -> _Flow:
    """One packet at ``t`` holding ``items`` (batches and punctuations)."""
    batches = [it for it in items if not isinstance(it, Punctuation) and len(it)]
    ps = [it.p for it in items if isinstance(it, Punctuation)]
    rows = batches[0] if len(batches) == 1 else (np.concatenate(batches) if batches else None)
    return _Flow(np.array([t]), np.array([max(ps) if ps else NO_P], dtype=np.int64),
                 np.array([0 if rows is None else len(rows)], dtype=np.int64), rows)


def _lookup(keys: np.ndarray, values: np.ndarray, query: np.ndarray, what: str) -> np.ndarray:
    """values[i] where keys[i] == query (every query must be found)."""
    o = np.argsort(keys, kind="stable")
    k = keys[o]
    i = np.searchsorted(k, query)
    i = np.minimum(i, len(k) - 1)
    if len(query) and (not len(k) or not (k[i] == query).all()):
        raise RuntimeError(f"batched simulator: cannot attribute a time to every output of {what}")
    return values[o][i]


class _JoinTimes:
    """Per join replica: the tuples it may still hold (key, ts, id, time), per input, to give each
    output the later of its two input tuples' times."""

    def __init__(self, logic: JoinLogic):
        self.window = logic.window
        self.keys = logic.keys
        self.tab = [None, None]  # per port: (key, ts, id, t)

    def key(self, port: int, rows: np.ndarray) -> np.ndarray:
        keys = self.keys[port]
        if keys is None:
            return np.zeros(len(rows), dtype=np.int64)
        if len(keys) == 1 and rows[keys[0]].dtype.kind in "iub":
            return rows[keys[0]].astype(np.int64)
        return hash_columns(rows, keys).view(np.int64)

    def add(self, port: int, rows: np.ndarray, t: np.ndarray) -> None:
        new = (self.key(port, rows), rows[TS].astype(np.int64), rows[ID], t)
        old = self.tab[port]
        self.tab[port] = new if old is None else tuple(np.concatenate([a, b]) for a, b in zip(old, new))

    def purge(self, in_punct: list[int]) -> None:
        for port in (0, 1):
            tab, p = self.tab[port], in_punct[1 - port]
            if tab is None or p == NO_P:
                continue
            keep = tab[1] > p + 1 - self.window
            if not keep.all():
                self.tab[port] = tuple(a[keep] for a in tab)

    def pair_times(self, probe_port: int, rows: np.ndarray, t: np.ndarray):
        """(ids, times) of every candidate pair of ``rows`` (new on ``probe_port``) with the other table."""
        other = self.tab[1 - probe_port]
        if other is None or not len(rows) or not len(other[0]):
            return np.zeros(0, np.uint64), np.zeros(0)
        pk, pts = self.key(probe_port, rows), rows[TS].astype(np.int64)
        ok, ots, oid, ot = other
        w = self.window
        allk = np.concatenate([pk, ok])
        kmin, kmax = int(allk.min()), int(allk.max())
        if 0 <= kmax - kmin < 1 << 20:  # small integer keys: their offset is the index
            uniq, inv = range(kmax - kmin + 1), allk - kmin
        else:
            uniq, inv = np.unique(allk, return_inverse=True)
        lo_ts = min(int(pts.min()), int(ots.min())) - w
        span = max(int(pts.max()), int(ots.max())) + w - lo_ts + 1
        if len(uniq) * span >= 2 ** 62:
            raise RuntimeError("batched simulator: join keys and timestamps too spread to index")
        comp_o = inv[len(pk):] * span + (ots - lo_ts)
        order = np.argsort(comp_o, kind="stable")
        comp_o = comp_o[order]
        base = inv[:len(pk)] * span - lo_ts
        lo = np.searchsorted(comp_o, base + pts - (w - 1), "left")
        hi = np.searchsorted(comp_o, base + pts + (w - 1), "right")
        cnt = hi - lo
        total = int(cnt.sum())
        if not total:
            return np.zeros(0, np.uint64), np.zeros(0)
        pi = np.repeat(np.arange(len(pk)), cnt)
        oi = order[np.repeat(lo - np.cumsum(cnt) + cnt, cnt) + np.arange(total)]
        pid, qid = rows[ID][pi], oid[oi]
        ids = mix(pid, qid) if probe_port == 0 else mix(qid, pid)
        return ids, np.maximum(t[pi], ot[oi])


# -- the batched run ---------------------------------------------------------------------------------

class BatchRun:
    """Runs a :class:`~replistream.sim.engine.Simulator` in epochs of ``batch_s`` virtual seconds
    (see the module docs). Internal: use ``Simulator(..., batch_s=...)``.

    It works on the simulator's public state (``query``, ``groups``, ``links``,
    ``entry_links``, ``entries``, ``cpu``, ``net``, ...); what else it needs comes in as
    arguments: ``link_model`` (the latency model of the links), ``read_chunk(source)``
    (the source's next input chunk, None at its end), ``kill(t, event)`` and
    ``victims(event)`` (a scenario kill, and the replicas it names), ``slowdowns``
    (whether a scenario slows servers down). The simulator calls back :meth:`run`,
    :meth:`replay`, :meth:`add_replica` and :meth:`handover`.
    """

    def __init__(self, sim, batch_s: float, until: float | None, *, link_model, read_chunk: Callable,
                 kill: Callable, victims: Callable, slowdowns: bool):
        self.sim = sim
        self.E = float(batch_s)
        self.until = until
        self.link_model = link_model
        self.read_chunk = read_chunk
        self.kill = kill
        self.victims = victims
        self.slowdowns = slowdowns
        q = sim.query
        self.order = [n for n in q.topological() if n in sim.groups]
        self.sources = list(q.sources)  # (the query computes them on every access)
        self.pending: dict[int, list] = {}  # id(link) -> [_Flow, ...] in arrival order
        self.src_pending: dict[tuple, list] = {}  # (source, entry index) -> [_Flow]
        self.src_last: dict[tuple, float] = {}
        self.in_links: dict[int, list] = {}
        for lk in sim.links:
            self.in_links.setdefault(id(lk.receiver), []).append(lk)
        self.busy: dict[int, float] = {}
        self.outbox: dict[tuple, _Flow] = {}  # (id(replica), key) -> packets emitted at/after the epoch end
        self.out_links: dict[tuple, list] = {}
        self.death: dict[int, float] = {}  # id(replica) -> when it dies
        self.kills: list = []  # the scenario's kills and those of sentinels read so far
        for ev in sim.kills:
            self.add_kill(ev)
        self.joins: dict[int, _JoinTimes] = {}
        self._collect: list | None = None  # sends gathered for one model evaluation
        # sources
        self.sched: dict[str, list] = {s: [] for s in q.sources}  # released packets not yet delivered
        self.done_src: dict[str, bool] = {s: False for s in q.sources}
        self.last_feed: dict[str, float] = {s: 0.0 for s in q.sources}
        self.max_t = 0.0
        # a look-ahead epoch's records (see :meth:`run`): the coordinator's call times in it, and per
        # (replica, port) the largest input delay and the last first-copy arrival of each period
        self.rec: dict | None = None
        self.obs_k: int | None = None  # the call being replayed (an index into rec["calls"])
        self.lookahead_epochs = 0
        self.lookahead_calls = 0
        # ``abort(sim) -> str | None``, asked after every epoch (Simulator.run's ``abort``): a reason
        # ends the run there, incomplete, with the reason in ``aborted``
        self.abort: Callable | None = None
        self.aborted: str | None = None

    # -- look-ahead epochs (the coordinator's observations recorded per period) --------------------
    def _record(self, r, port: int, tv: np.ndarray, lv: np.ndarray) -> None:
        """Record first-copy arrivals at ``r``'s ``port`` (times ``tv``, input delays ``lv``) by the
        coordinator period they fall in: the call at ``calls[k]`` observes arrivals in
        ``[calls[k-1], calls[k])``, as when the engine stops at every call."""
        rec = self.rec
        key = (id(r), port)
        w = rec["lag"].get(key)
        if w is None:
            n = len(rec["calls"])
            w = rec["lag"][key] = np.zeros(n)
            w[0] = r.lag[port] if r.lag else 0.0  # what it observed since the last call, before this epoch
            rec["last"][key] = np.full(n, -math.inf)
            rec["last0"][key] = r.last_in[port] if r.last_in else -math.inf
        k = np.minimum(np.searchsorted(rec["calls"], tv, "right"), len(w) - 1)
        np.maximum.at(w, k, lv)
        np.maximum.at(rec["last"][key], k, tv)

    def observation(self, r) -> tuple[list[float], list[float]] | None:
        """(per port: largest input delay, last first-copy arrival) that replica ``r`` had at the
        call being replayed, or None outside a replayed call (then ``r.lag`` and ``r.last_in`` hold it)."""
        if self.obs_k is None:
            return None
        k, rec = self.obs_k, self.rec
        lags, last = [], []
        for port in range(len(r.last_in)):
            key = (id(r), port)
            w = rec["lag"].get(key)
            if w is None:
                lags.append(r.lag[port] if k == 0 else 0.0)
                last.append(r.last_in[port])
            else:
                lags.append(float(w[k]))
                last.append(max(rec["last0"][key], float(rec["last"][key][:k + 1].max())))
        return lags, last

    # -- helpers ---------------------------------------------------------------------------
    def death_of(self, r) -> float:
        return self.death.get(id(r), math.inf)

    def add_kill(self, ev) -> None:
        """A ``kill_server`` / ``kill_replica`` event to carry out at ``ev.at`` (an epoch boundary):
        from then on its victims process and send nothing."""
        self.kills.append(ev)
        for v in self.victims(ev):
            self.death[id(v)] = min(self.death.get(id(v), math.inf), float(ev.at))

    def add_replica(self, r, links: list) -> None:
        """The simulator created replica ``r`` with stream replicas ``links`` (to and from it)."""
        for lk in links:
            self.in_links.setdefault(id(lk.receiver), []).append(lk)
        for ev in self.kills:
            if ev.action == "kill_server" and ev.server == r.server and ev.at > self.sim.now:
                self.death[id(r)] = min(self.death.get(id(r), math.inf), float(ev.at))

    def handover(self, r) -> None:
        """Replica ``r``'s core was replaced by a peer's checkpoint: its join table starts from the
        tuples the checkpoint holds (their times lie in the past, so an output pairing one of
        them leaves at its other tuple's time)."""
        self.joins.pop(id(r), None)
        logic = r.core.logic
        if type(logic) is not JoinLogic:
            return
        jt = self.joins[id(r)] = _JoinTimes(logic)
        tables = logic.checkpoint().tables
        for port, side in enumerate(("left", "right")):
            rows = tables.get(side, {}).get("rows")
            if rows is not None and len(rows):
                jt.add(port, rows, np.full(len(rows), -math.inf))

    def replay(self, t: float, replays: list) -> None:
        """``[(link, log key, items), ...]``: send each link its sender's retained ``items`` at ``t``,
        one packet per sender's log (built once however many links replay it), with one
        evaluation of the latency model."""
        flows, sends = {}, []
        for lk, key, items in replays:
            if key not in flows:
                flows[key] = _flow_from_items(t, items)
            sends.append((lk, flows[key]))
        self.transmit_many(sends)

    def _cpu(self, r, at: np.ndarray, n: np.ndarray) -> np.ndarray:
        sim = self.sim
        cpu = sim.cpu
        if not cpu.scale:
            cost = np.zeros(len(at))
        else:
            us = cpu.per_packet_us + cpu.per_copy_us.get(r.kind, cpu.default_us) * n
            cost = us * 1e-6 * cpu.scale
            if self.slowdowns:
                cost = cost * np.array([sim.net.slowdown(r.server, float(x)) for x in at])
        done = fifo_done(at, cost, self.busy.get(id(r), -math.inf))
        if len(done) and cost.any():
            self.busy[id(r)] = float(done[-1])
            r.cpu_s += float(cost.sum())
        return done

    def _send(self, r, key, links: list, flow: _Flow | None, t_end: float) -> None:
        """Packets ``flow`` (``at`` = emission time) of replica ``r`` on ``links``; those at or after
        ``t_end`` wait in the outbox (GC may change the links before they leave)."""
        k = (id(r), key)
        held = self.outbox.pop(k, None)
        if held is not None:
            flow = held if flow is None else _Flow.concat([held, flow])
        if flow is None or not len(flow):
            return
        now, later = flow.split(t_end)
        if later is not None:
            self.outbox[k] = later
        if now is None:
            return
        d = self.death_of(r)
        if now.at[-1] >= d:  # a dead replica sends nothing from its death on
            now, _ = now.split(d)
            if now is None:
                return
        self.max_t = max(self.max_t, float(now.at[-1]))
        sim = self.sim
        sends = [(lk, now) for lk in links if lk.live and lk.receiver.alive]
        if self._collect is not None:
            self._collect.extend(sends)
        else:
            self.transmit_many(sends)
        if sim.retain:
            items = ([now.rows] if now.rows is not None and len(now.rows) else []) + \
                    ([Punctuation(int(now.punct.max()))] if (now.punct != NO_P).any() else [])
            if r.node == ENTRY:
                log = sim.entry_logs[(key, r.index)]
                log.append(items)
            else:
                log = r.core.output_log
            acks = sim.replay_acks(links)
            if acks:
                log.trim(min(acks))

    def transmit_many(self, sends: list) -> None:
        """``[(link, flow), ...]``: each :meth:`transmit`, with one evaluation of the latency model."""
        if not sends:
            return
        lats = self.link_model.link_latencies_ms([(lk.sender.server, lk.receiver.server) for lk, _ in sends],
                                                 [f.at for _, f in sends])
        for (lk, f), lat in zip(sends, lats):
            self.transmit(lk, f, lat)

    def transmit(self, lk, flow: _Flow, latencies_ms: np.ndarray | None = None) -> None:
        """Send ``flow`` (``at`` = send times) on link ``lk``: FIFO arrivals from the latency model
        (its ``latencies_ms`` at the send times, when already evaluated)."""
        sim = self.sim
        at = delivery_times(self.link_model, lk.sender.server, lk.receiver.server, flow.at, after=lk.last,
                            latencies_ms=latencies_ms)
        if not np.isfinite(at[-1]):
            k = int(np.argmax(~np.isfinite(at)))
            lk.live = False
            sim.wiring += 1
            sim.events.append({"t": float(flow.at[k]), "event": "link dropped", "link": lk.id})
            if k == 0:
                return
            flow, _ = flow.split(float(flow.at[k]))
            at = at[:k]
        lk.last = float(at[-1])
        lk.tuples += int(flow.n.sum())
        lk.packets += len(at)
        self.pending.setdefault(id(lk), []).append(_Flow(at, flow.punct, flow.n, flow.rows))

    # -- sources -------------------------------------------------------------------------------
    def _read(self, src: str, t_end: float) -> None:
        """Push the source's chunks through its entry point until a packet at or after ``t_end``."""
        sim = self.sim
        entry = sim.entries[src]
        sched = self.sched[src]
        while not self.done_src[src] and (not sched or sched[-1].at[-1] < t_end):
            chunk = self.read_chunk(src)
            if chunk is None:
                self.done_src[src] = True
                items = entry.close()
                if items:
                    sched.append(_flow_from_items(self.last_feed[src], items))
                continue
            if isinstance(chunk, Sentinel):  # the feeder reached it after the source's previous reading
                self.add_kill(sentinel_kill(chunk, self.last_feed[src], src))
                continue
            ct = chunk_time(chunk, punctuations=False)
            if ct is not None:
                self.last_feed[src] = max(self.last_feed[src], (ct - sim.ts0) / 1e6)
            prev_max, prev_p = entry.max_ts, entry.punct
            items = entry.push(chunk)
            rows = [it for it in items if not isinstance(it, Punctuation)]
            ps = [it.p for it in items if isinstance(it, Punctuation)]
            if not rows:
                if ps:
                    sched.append(_flow_from_items(self.last_feed[src], items))
                continue
            rows = rows[0]
            ts = rows[TS].astype(np.int64)
            t = np.maximum.accumulate(np.maximum((ts - sim.ts0) / 1e6, self.last_feed[src]))
            self.last_feed[src] = float(t[-1])
            # the punctuation the entry point emits after each tuple (operators/entry.py)
            p = entry.auto_punctuation(np.maximum.accumulate(np.maximum(ts, prev_max)))
            p = np.maximum.accumulate(np.maximum(p, max(prev_p, entry.explicit)))
            if int(p[-1]) != entry.punct:  # not the entry point's rule: put its punctuation on the last tuple
                p[-1] = max(int(p[-1]), entry.punct)
            emitted = np.where(p > _pre(prev_p, p[:-1]), p, NO_P)
            # one packet per release time
            last = _post(t[1:] != t[:-1], True)
            ends = np.flatnonzero(last)
            n = np.diff(_pre(-1, ends))
            pk = np.maximum.reduceat(emitted, _pre(0, ends[:-1] + 1)) if len(ends) > 1 else \
                np.array([emitted.max()])
            sched.append(_Flow(t[ends], pk.astype(np.int64), n.astype(np.int64), rows))

    def _release(self, t_end: float) -> None:
        sim = self.sim
        entries = sim.groups[ENTRY]
        released = []
        for src in self.sources:
            self._read(src, t_end)
            sched = self.sched[src]
            if not sched:
                continue
            flow = _Flow.concat(sched)
            now, later = flow.split(t_end)
            self.sched[src] = [later] if later is not None else []
            if now is None:
                continue
            released.append((src, now))
        for e in entries:
            if not e.alive:
                continue
            located = [(src, now) for src, now in released if sim.sources.get(src) is not None]
            lats = dict(zip([s for s, _ in located], self.link_model.link_latencies_ms(
                [(sim.sources[s], e.server) for s, _ in located], [f.at for _, f in located])))
            for src, now in released:
                where = sim.sources.get(src)
                key = (src, e.index)
                if where is None:
                    f = now
                else:
                    at = delivery_times(self.link_model, where, e.server, now.at, latencies_ms=lats[src])
                    ok = np.isfinite(at)
                    if not ok.all():  # undeliverable within the horizon: that packet is lost
                        sel = np.flatnonzero(ok)
                        at = np.maximum.accumulate(np.maximum(at[sel], self.src_last.get(key, -math.inf)))
                        f = _sub(now, sel, at) if len(sel) else None
                    else:
                        at = np.maximum.accumulate(np.maximum(at, self.src_last.get(key, -math.inf)))
                        f = _Flow(at, now.punct, now.n, now.rows)
                    if f is None:
                        continue
                self.src_last[key] = float(f.at[-1])
                self.src_pending.setdefault(key, []).append(f)

    def _entry(self, e, t_end: float) -> None:
        sim = self.sim
        limit = min(t_end, self.death_of(e))
        parts, srcs = [], []
        for src in self.sources:
            key = (src, e.index)
            q = self.src_pending.get(key)
            if not q:
                continue
            f = _Flow.concat(q)
            now, later = f.split(limit)
            self.src_pending[key] = [later] if later is not None else []
            if now is not None:
                parts.append(now)
                srcs.append(src)
        if not parts:
            for src in self.sources:
                if (id(e), src) in self.outbox:
                    self._send(e, src, sim.entry_links[src].get(e.index, []), None, t_end)
            return
        at = np.concatenate([p.at for p in parts])
        n = np.concatenate([p.n for p in parts])
        which = np.repeat(np.arange(len(parts)), [len(p) for p in parts])
        order = np.lexsort((which, at))
        done = np.empty(len(at))
        done[order] = self._cpu(e, at[order], n[order])
        self.max_t = max(self.max_t, float(at.max()))
        off = 0
        sent = set()
        self._collect = []
        for p, src in zip(parts, srcs):
            d = done[off:off + len(p)]
            off += len(p)
            self._send(e, src, sim.entry_links[src].get(e.index, []), _Flow(d, p.punct, p.n, p.rows), t_end)
            sent.add(src)
        for src in self.sources:
            if src not in sent and (id(e), src) in self.outbox:
                self._send(e, src, sim.entry_links[src].get(e.index, []), None, t_end)
        sends, self._collect = self._collect, None
        self.transmit_many(sends)

    # -- operators and applications ----------------------------------------------------------
    def _gather(self, r, limit: float):
        links, flows = [], []
        for lk in self.in_links.get(id(r), ()):
            q = self.pending.get(id(lk))
            if not q:
                continue
            f = _Flow.concat(q)
            now, later = f.split(limit)
            self.pending[id(lk)] = [later] if later is not None else []
            if now is not None:
                links.append(lk)
                flows.append(now)
        return links, flows

    def _replica(self, r, t_end: float) -> None:
        limit = min(t_end, self.death_of(r))
        links, flows = self._gather(r, limit)
        if not links:
            if not r.is_sink:
                self._send(r, None, r.out, None, t_end)
            return
        # packets in arrival order (ties: by link), through the replica's CPU
        at = np.concatenate([f.at for f in flows])
        n = np.concatenate([f.n for f in flows])
        li = np.repeat(np.arange(len(flows)), [len(f) for f in flows])
        order = np.lexsort((li, at))
        pos = np.empty(len(at), dtype=np.int64)
        pos[order] = np.arange(len(at))
        done = np.empty(len(at))
        done[order] = self._cpu(r, at[order], n[order])
        self.max_t = max(self.max_t, float(at.max()))
        core = r.core
        if not r.last_in:
            r.last_in = [float(at.min())] * len(core.filters)
            r.lag = [0.0] * len(core.filters)
        logic = core.logic
        fast = core.sorters is None and type(logic) in _FAST
        if not fast:
            out_rows, out_t, pe_t, pe_v = self._slow(r, links, flows, at, done, order)
        else:
            out_rows, out_t, pe_t, pe_v = self._fast(r, links, flows, at, done, pos)
        self._emit(r, out_rows, out_t, pe_t, pe_v, t_end)

    def _emit(self, r, out_rows, out_t, pe_t, pe_v, t_end) -> None:
        """Group the outputs (rows with times, punctuations with times) into packets and send them."""
        rows = None
        if out_rows:
            rows = out_rows[0] if len(out_rows) == 1 else np.concatenate(out_rows)
            t = out_t[0] if len(out_t) == 1 else np.concatenate(out_t)
            if len(t) > 1 and not (t[1:] >= t[:-1]).all():
                o = np.argsort(t, kind="stable")
                rows, t = rows[o], t[o]
        else:
            t = np.zeros(0)
        if r.is_sink:
            if rows is not None and len(rows):
                r.recorder.add_rows(rows, t)
            if len(pe_v):
                r.recorder.punct = max(r.recorder.punct, int(pe_v.max()))
            return
        if not len(t) and not len(pe_t):
            self._send(r, None, r.out, None, t_end)
            return
        times = np.unique(np.concatenate([t, pe_t]))
        cnt = np.bincount(np.searchsorted(times, t), minlength=len(times)) if len(t) else \
            np.zeros(len(times), dtype=np.int64)
        punct = np.full(len(times), NO_P, dtype=np.int64)
        if len(pe_t):
            np.maximum.at(punct, np.searchsorted(times, pe_t), pe_v)
        self._send(r, None, r.out, _Flow(times, punct, cnt.astype(np.int64), rows), t_end)

    def _fast(self, r, links, flows, at, done, pos):
        core, logic = r.core, r.core.logic
        sim = self.sim
        ts0 = sim.ts0
        n_ports = len(core.filters)
        new_rows: list = [None] * n_ports
        new_t: list = [None] * n_ports
        pev_t, pev_port, pev_v, pev_pos = [], [], [], []
        pk_off = np.cumsum([0] + [len(f) for f in flows])
        by_port: dict[int, list[int]] = {}
        for i, lk in enumerate(links):
            by_port.setdefault(lk.port, []).append(i)
        for port, idx in sorted(by_port.items()):
            flt = core.filters[port]
            # packets of this port, in processing order
            pk = np.concatenate([np.arange(pk_off[i], pk_off[i + 1]) for i in idx])
            ppos = pos[pk]
            pun = np.concatenate([flows[i].punct for i in idx])
            pchan = np.concatenate([np.full(len(flows[i]), links[i].channel) for i in idx])
            po = np.argsort(ppos, kind="stable")
            pk, ppos, pun, pchan = pk[po], ppos[po], pun[po], pchan[po]
            # punctuation in force before each packet (a packet's own punctuation follows its tuples)
            run = np.maximum.accumulate(np.maximum(pun, flt.max_punct))
            before = _pre(flt.max_punct, run[:-1])
            rows_l = [flows[i].rows for i in idx if flows[i].rows is not None and len(flows[i].rows)]
            if rows_l:
                rows = rows_l[0] if len(rows_l) == 1 else np.concatenate(rows_l)
                # rows stay where they are; ``ro`` lists them in processing order
                inv = np.empty(len(po), dtype=np.int64)
                inv[po] = np.arange(len(po))
                rp = np.repeat(inv, np.concatenate([flows[i].n for i in idx]))  # sorted-packet index of each row
                ro = np.argsort(rp, kind="stable")
                rp = rp[ro]
                # Algorithm 1 over every copy at once, each with the punctuation in force at its arrival
                sel = np.flatnonzero(flt.on_rows(rows, pchan[rp], before[rp], order=ro))
                if len(sel):
                    ts = rows[TS][ro]
                    nrp = rp[sel]
                    nr = rows[ro[sel]]
                    tarr = at[pk[nrp]]
                    new_rows[port], new_t[port] = nr, done[pk[nrp]]
                    # input delay observed (§V-C): arrival minus the packet's first timestamp
                    starts = np.flatnonzero(_pre(True, rp[1:] != rp[:-1]))
                    if len(starts) == len(rp):  # one row per packet
                        tv, lv = tarr, tarr - (ts[sel] - ts0) / 1e6
                    else:
                        pmin = np.minimum.reduceat(ts, starts)
                        upk = nrp[_pre(True, nrp[1:] != nrp[:-1])]
                        k = np.searchsorted(rp[starts], upk)
                        tv = at[pk[upk]]
                        lv = tv - (pmin[k] - ts0) / 1e6
                    lag = float(lv.max())
                    if self.rec is not None:
                        self._record(r, port, tv, lv)
                    if lag > r.lag[port]:
                        r.lag[port] = lag
                    r.last_in[port] = max(r.last_in[port], float(tarr.max()))
            # punctuations: the new maxima, at their packets' times
            newmax = pun > before
            if newmax.any():
                pev_t.append(done[pk[newmax]])
                pev_v.append(pun[newmax])
                pev_pos.append(ppos[newmax])
                pev_port.append(np.full(int(newmax.sum()), port))
                has = pun != NO_P
                chans = np.unique(pchan[has])
                best = [(int(pun[has & (pchan == c)].max()), int(c)) for c in chans.tolist()]
                for v, c in sorted(best):
                    flt.on_punctuation(c, v)
        # the forwarded punctuation (OperatorLogic.forward_punctuation of its watermark), when it rose
        pe_t, pe_v = np.zeros(0), np.zeros(0, dtype=np.int64)
        et = ev = eport = None
        if pev_t:
            et, ev, ep, eport = (np.concatenate(x) for x in (pev_t, pev_v, pev_pos, pev_port))
            o = np.argsort(ep, kind="stable")
            et, ev, eport = et[o], ev[o], eport[o]
            wm = logic.forward_punctuation(logic.watermarks(eport, ev))  # what it promises downstream
            up = wm > np.maximum.accumulate(_pre(logic.forward_punctuation(logic.watermark), wm[:-1]))
            pe_t, pe_v = et[up], wm[up]
        # the logic: each port's new tuples, then each port's punctuation; a Join in slices of a few
        # windows of virtual time, so that its buffers are purged as often as packet by packet
        out_rows, out_t = [], []
        kind = type(logic)
        jt = None
        bounds = [math.inf]
        if kind is JoinLogic:
            jt = self.joins.get(id(r))
            if jt is None or jt.window != logic.window:
                jt = self.joins[id(r)] = _JoinTimes(logic)
            ts_all = [t for t in new_t if t is not None] + ([et] if et is not None else [])
            if ts_all:
                lo = min(float(t[0]) for t in ts_all if len(t))
                hi = max(float(t[-1]) for t in ts_all if len(t))
                step = max(1.0, 6 * logic.window / 1e6)
                bounds = list(np.arange(lo + step, hi + step, step)[:-1]) + [math.inf]
        outs = []
        cut = [0] * n_ports
        ecut = 0
        for b in bounds:
            part = [None] * n_ports
            for port in range(n_ports):
                if new_t[port] is None:
                    continue
                k = int(np.searchsorted(new_t[port], b, "left")) if b != math.inf else len(new_t[port])
                if k > cut[port]:
                    part[port] = (new_rows[port][cut[port]:k], new_t[port][cut[port]:k])
                    cut[port] = k
            if jt is not None:
                for port in range(n_ports):
                    if part[port] is not None:
                        jt.add(port, *part[port])
            for port in range(n_ports):
                if part[port] is None:
                    continue
                nr, nt = part[port]
                got = [x for x in logic.process(port, nr) if not isinstance(x, Punctuation) and len(x)]
                if not got:
                    continue
                o = got[0] if len(got) == 1 else np.concatenate(got)
                outs.append(o)
                if kind is JoinLogic:
                    ids, times = jt.pair_times(port, nr, nt)
                    out_t.append(_lookup(ids, times, o[ID], logic.name))
                elif kind is FilterLogic:
                    out_t.append(_lookup(nr[ID], nt, o[ID], logic.name))
                else:
                    if len(o) != len(nr):
                        raise RuntimeError(f"batched simulator: {logic.name!r} changed the number of rows")
                    out_t.append(nt)
                out_rows.append(o)
            if et is not None:
                k = int(np.searchsorted(et, b, "left")) if b != math.inf else len(et)
                if k > ecut:
                    sl = slice(ecut, k)
                    ecut = k
                    for port in np.unique(eport[sl]).tolist():
                        extra = logic.process(port, Punctuation(int(ev[sl][eport[sl] == port].max())))
                        if any(not isinstance(x, Punctuation) and len(x) for x in extra):
                            raise RuntimeError(f"batched simulator: {logic.name!r} emitted tuples on a punctuation")
            if jt is not None:
                jt.purge(logic.in_punct)
        if len(pe_v) and int(pe_v[-1]) != logic.watermark:
            raise RuntimeError(f"batched simulator: {logic.name!r} watermark {logic.watermark} != {int(pe_v[-1])}")
        if core.output_log is not None and (outs or len(pe_v)):
            core.output_log.append(outs + ([Punctuation(int(pe_v[-1]))] if len(pe_v) else []))
        return out_rows, out_t, pe_t, pe_v

    def _slow(self, r, links, flows, at, done, order):
        """Packet by packet, as the per-packet engine (operators the fast path does not know)."""
        sim = self.sim
        core = r.core
        pk_link = np.repeat(np.arange(len(flows)), [len(f) for f in flows])
        pk_local = np.concatenate([np.arange(len(f)) for f in flows])
        row_off = [_pre(0, np.cumsum(f.n)) for f in flows]
        out_rows, out_t, pe_t, pe_v = [], [], [], []
        for g in order.tolist():
            i, j = int(pk_link[g]), int(pk_local[g])
            f, lk = flows[i], links[i]
            items = []
            if f.n[j]:
                items.append(f.rows[row_off[i][j]:row_off[i][j + 1]])
            if f.punct[j] != NO_P:
                items.append(Punctuation(int(f.punct[j])))
            flt = core.filters[lk.port]
            before = flt.passed
            out = []
            for it in items:
                seen = flt.passed
                out.extend(core.process(lk.port, lk.channel, it))
                if not isinstance(it, Punctuation) and flt.passed > seen:
                    lag = float(at[g]) - (int(it[TS].min()) - sim.ts0) / 1e6
                    if self.rec is not None:
                        self._record(r, lk.port, np.array([float(at[g])]), np.array([lag]))
                    if lag > r.lag[lk.port]:
                        r.lag[lk.port] = lag
            if flt.passed > before:
                r.last_in[lk.port] = float(at[g])
            d = float(done[g])
            for it in out:
                if isinstance(it, Punctuation):
                    pe_t.append(d)
                    pe_v.append(it.p)
                elif len(it):
                    out_rows.append(it)
                    out_t.append(np.full(len(it), d))
        return out_rows, out_t, np.array(pe_t), np.array(pe_v, dtype=np.int64)

    # -- the loop --------------------------------------------------------------------------------
    def pending_work(self) -> bool:
        if not all(self.done_src.values()) or any(self.sched.values()):
            return True
        if any(self.outbox.values()) or any(q for q in self.src_pending.values()):
            return True
        return any(q for q in self.pending.values())

    def next_time(self) -> float:
        """The earliest time anything can happen (a released chunk, an arrival, an emission)."""
        ts = [f[0].at[0] for f in self.sched.values() if f]
        ts += [q[0].at[0] for q in self.src_pending.values() if q]
        ts += [q[0].at[0] for q in self.pending.values() if q]
        ts += [f.at[0] for f in self.outbox.values()]
        return min(ts) if ts else math.inf

    def epoch(self, t_end: float) -> None:
        sim = self.sim
        self._release(t_end)
        entry = ENTRY
        for node in [entry] + self.order:
            for r in sim.groups[node]:
                if not r.alive:
                    for lk in self.in_links.get(id(r), ()):
                        self.pending.pop(id(lk), None)
                    for k in [k for k in self.outbox if k[0] == id(r)]:
                        del self.outbox[k]
                    if node == entry:
                        for src in self.sources:
                            self.src_pending.pop((src, r.index), None)
                    continue
                if node == entry:
                    self._entry(r, t_end)
                else:
                    self._replica(r, t_end)

    def _lookahead(self, t: float, next_call: float, period: float, horizon: float, bar, task) -> float:
        """Run ``[t, c_n)`` without stopping, ``c_1 = next_call, c_2 = c_1 + period, ...`` the
        coordinator's calls up to ``horizon``, recording what each call would observe; then replay the
        calls in order (:meth:`observation` answers ``input_delays``). Calls before the last must
        change nothing (no ``apply_snapshot`` or ``add_replica``), else :class:`LookaheadMiss`: the
        run would have differed. The last call sees the exact state of its time and acts freely.
        Returns the time reached (the last call's)."""
        sim = self.sim
        calls = [next_call]
        while calls[-1] + period <= horizon:
            calls.append(calls[-1] + period)
        t_la = calls[-1]
        self.rec = {"calls": np.array(calls), "lag": {}, "last": {}, "last0": {}}
        known = len(self.kills)
        while t < t_la:
            start = max(t, self.next_time())
            t_end = min(start + self.E if math.isfinite(start) else t_la, t_la)
            if t_end <= t:
                t_end = t_la
            for src in self.sources:
                self._read(src, t_end)
            if len(self.kills) != known:
                raise LookaheadMiss(f"a kill was read inside the look-ahead epoch [{calls[0] - period}, {t_la}): "
                                    f"look-ahead epochs need a run without kills")
            self.epoch(t_end)
            t = t_end
            if bar is not None:
                bar.update(task, completed=min(t, bar.tasks[0].total))
        self.lookahead_epochs += 1
        try:
            for k, c in enumerate(calls):
                self.obs_k = k
                sim.now = c
                self.max_t = max(self.max_t, c)
                before = sim.mutations
                sim.coordinator[1](sim, c)
                self.lookahead_calls += 1
                if k < len(calls) - 1 and sim.mutations != before:
                    raise LookaheadMiss(f"the coordinator acted at t={c:g} inside a look-ahead epoch ending at "
                                        f"{t_la:g}: this run differs from one stopped at every call; run it "
                                        f"without look-ahead")
        finally:
            self.obs_k = None
            self.rec = None
        return t_la

    def run(self, bar=None, task=None) -> None:
        sim = self.sim
        period = sim.coordinator[0] if sim.coordinator is not None else None
        ahead = sim.coordinator[2] if sim.coordinator is not None and len(sim.coordinator) > 2 else None
        next_call = period if period is not None else math.inf
        t = 0.0
        while True:
            if not self.pending_work() and next_call == math.inf:
                break
            if ahead is not None and t == next_call - period and self.pending_work() \
                    and not any(ev.at > t for ev in self.kills):
                horizon = ahead(sim, t)
                if horizon is not None and self.until is not None:
                    horizon = min(horizon, self.until)
                if horizon is not None and horizon >= next_call + period:
                    t = self._lookahead(t, next_call, period, horizon, bar, task)
                    next_call = t + period if self.pending_work() else math.inf
                    if self._aborted(t):
                        break
                    continue
            if not self.pending_work():
                t_end = next_call
            else:
                start = max(t, self.next_time())
                if not math.isfinite(start):
                    start = t
                t_end = start + self.E
                t_end = min([t_end, next_call] + [float(ev.at) for ev in self.kills if ev.at > t])
                if t_end <= t:
                    t_end = t + self.E
            if self.until is not None and t_end > self.until:
                t_end = self.until
                if t_end <= t:
                    break
            # read the sources up to the epoch's end before running it: a sentinel read there is a kill at
            # an epoch boundary, as a scenario's kill at that time
            known = len(self.kills)
            for src in self.sources:
                self._read(src, t_end)
            for ev in self.kills[known:]:
                if ev.at <= t:  # reached right at this boundary: before the epoch runs
                    sim.now = t
                    self.kill(t, ev)
                elif ev.at < t_end:
                    t_end = float(ev.at)
            self.epoch(t_end)
            t = t_end
            for ev in self.kills:  # kills at t: replicas die (their in-flight work was cut at t above)
                if ev.at == t:
                    sim.now = t
                    self.kill(t, ev)
            if t == next_call:
                sim.now = t
                self.max_t = max(self.max_t, t)
                sim.coordinator[1](sim, t)
                next_call = t + period if self.pending_work() else math.inf
            if bar is not None:
                bar.update(task, completed=min(t, bar.tasks[0].total))
            if self.until is not None and t >= self.until:
                break
            if self._aborted(t):
                break
        sim.now = self.max_t

    def _aborted(self, t: float) -> bool:
        """Ask ``abort`` at the end of an epoch; its reason (with the time) ends the run."""
        if self.abort is None:
            return False
        why = self.abort(self.sim)
        if why:
            self.aborted = f"{why} (stopped at t={t:g} s)"
            self.sim.events.append({"t": t, "event": "aborted", "reason": why})
        return bool(why)


def _pre(x, a: np.ndarray) -> np.ndarray:
    """``np.r_[x, a]`` for a 1-d array ``a`` (in ``a``'s dtype), without ``np.r_``'s per-call cost."""
    out = np.empty(len(a) + 1, dtype=a.dtype)
    out[0] = x
    out[1:] = a
    return out


def _post(a: np.ndarray, x) -> np.ndarray:
    """``np.r_[a, x]`` for a 1-d array ``a`` (in ``a``'s dtype)."""
    out = np.empty(len(a) + 1, dtype=a.dtype)
    out[:-1] = a
    out[-1] = x
    return out


class LookaheadMiss(RuntimeError):
    """A coordinator acted inside a look-ahead epoch (:meth:`BatchRun.run`): the run so far is not
    the one stopped at every call, so it cannot go on; run it again without look-ahead."""


_FAST = {UnionLogic, MapLogic, FilterLogic, ApplicationLogic, JoinLogic}


def _sub(flow: _Flow, sel: np.ndarray, at: np.ndarray) -> _Flow:
    """The packets ``sel`` of ``flow`` with arrival times ``at``."""
    off = _pre(0, np.cumsum(flow.n))
    rows = None
    if flow.rows is not None:
        idx = np.concatenate([np.arange(off[i], off[i + 1]) for i in sel.tolist()]) if len(sel) else np.zeros(0, int)
        rows = flow.rows[idx]
    return _Flow(at, flow.punct[sel], flow.n[sel], rows)
