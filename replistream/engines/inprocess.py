"""The in-process replicated engine: every operator as ``k`` replicas in one process.

Every operator and entry point runs as ``k`` replicas; every upstream replica
feeds every downstream replica through its own FIFO channel, and each replica
merges its inputs with duplicate filters (Algorithm 1). A seeded scheduler
delivers channel heads in random order with per-channel speeds (so replicas
see different interleavings and delays), splits batches at random, re-sends
copies, and can crash up to ``k - 1`` replicas of every operator and entry
point at random times. No Ray, no clock: a failing seed reproduces exactly.
Sentinels in the inputs script events at a point of a source's stream
(:class:`~replistream.sources.KillReplica`; hand-over of stateful replicas,
docs/handover.md: :class:`~replistream.sources.Revive` and
:class:`~replistream.sources.AddReplica` build a replica from a live peer's
checkpoint mid-stream, with upstream replay); ``audit=True`` checks that
every replica emits exactly what the ideal run's copy of its operator emits.

>>> from replistream import Query
>>> from replistream.testing import assert_same_output, chunked
>>> q = Query(); s = q.source("s", {"x": "i8"}, punctuate_every=4)
>>> _ = s.window(size=4, aggs={"n": "count"}).sink("counts")
>>> data = {"s": chunked([{"ts": t, "x": t} for t in range(12)], 5)}
>>> rep = run_replicated(q, data, k=3, seed=1, crash=True)
>>> assert_same_output(run_reference(q.build(), data).outputs["counts"], rep.outputs["counts"])
>>> rep.complete
True
"""
from __future__ import annotations

import random
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ..errors import QueryError
from ..operators import Item
from ..operators.base import NO_PUNCTUATION, OperatorState
from ..query import Query
from ..replica.checkpoint import ReplicaCheckpoint
from ..replica.core import ReplayLog, ReplicaCore
from ..replica.transfer import StagedReplica, plan_transfer, splittable
from ..schema import END, Punctuation
from ..sources import AddReplica, KillReplica, Revive, source_streams
from .reference import run_reference, run_reference_on_streams  # noqa: F401 (run_reference: the doctest)
from .result import Collector, RunResult, as_multiset

__all__ = ["run_replicated", "HarnessStats", "ReplicaDivergence"]


class ReplicaDivergence(AssertionError):
    """Raised by :func:`run_replicated` with ``audit=True`` when some replica emitted a tuple
    the ideal run's copy of its operator does not emit (or emitted one twice), or a replica
    that completed did not emit all of them: a broken hand-over or a replica-inconsistent operator."""


@dataclass
class _Instance:
    node: str
    index: int
    core: ReplicaCore | None  # None for an entry point copy, or a replica waiting for its checkpoint
    items: list[Item] | None = None  # entry copies: the source stream
    cursor: int = 0
    alive: bool = True
    out: list["_Channel"] = field(default_factory=list)
    entry_log: ReplayLog | None = None  # entry copies: what they emitted, for replay
    generation: int = 0
    history: list | None = None  # audit: batches emitted (inherited from the peer at hand-over)
    # hand-over in progress (subscribed, checkpoint not yet installed)
    chan_counts: list[int] | None = None
    ready_at: int = 0
    event: Any = None
    replayed: int = 0
    # staged transfer in progress (Megaphone §3.3): the receiver, the plan, the current peer
    staged: Any = None
    transfer: dict | None = None
    inherited: Counter | None = None  # audit: union of the peers' emissions at each step

    @property
    def label(self) -> str:
        return f"{self.node}#{self.index}" + "'" * self.generation

    @property
    def ready(self) -> bool:
        """Alive and working (an entry copy, or a replica with its state installed)."""
        return self.alive and (self.items is not None or self.core is not None)

    @property
    def receiving(self) -> bool:
        """Takes deliveries: installed, or receiving its state in steps."""
        return self.core is not None or self.staged is not None

    @property
    def log(self) -> ReplayLog | None:
        return self.entry_log if self.items is not None else (self.core.output_log if self.core else None)


@dataclass
class _Channel:
    sender: _Instance
    receiver: _Instance
    port: int
    index: int  # which stream replica of the receiver's port this is
    speed: float
    queue: deque = field(default_factory=deque)
    delivered: int = 0


@dataclass
class HarnessStats:
    """What the harness did: steps, crashed replicas, batches split and re-sent, kills
    skipped to keep a working replica (``spared``), and one record per hand-over
    (``handovers``: node, new replica, peer, the checkpoint's punctuations and those of
    the other working replicas, applied ids, state rows, tuples replayed, bytes)."""

    steps: int = 0
    crashed: list[str] = field(default_factory=list)
    splits: int = 0
    resent: int = 0
    spared: list[str] = field(default_factory=list)
    handovers: list[dict] = field(default_factory=list)
    transfers: list[dict] = field(default_factory=list)


def run_replicated(query: Query, inputs: Mapping[str, Any], k: int = 2, seed: int = 0, *, crash: bool = False,
                   split: bool = True, resend_prob: float = 0.05, speed_spread: float = 1.0,
                   strict: bool = False, on_malformed: str = "raise", audit: bool = False,
                   checkpoint_bits: int = 0) -> RunResult:
    """Run ``query`` with every operator and entry point replicated ``k`` times, in process.

    ``crash=True`` kills up to ``k - 1`` replicas of every operator and of every
    entry point at random steps (fail-stop: what they had in flight is lost).
    ``resend_prob`` re-sends a batch on the same channel right after the first
    copy (a retransmission). ``speed_spread`` is the sigma of the lognormal
    per-channel speeds. The result has the same shape as :func:`run_reference`;
    ``stats["harness"]`` is a :class:`HarnessStats` and ``stats["weights"]`` the
    duplicate-filter contribution weights at each application.

    Sentinels among the inputs (:class:`KillReplica`, :class:`Revive`,
    :class:`AddReplica`) run when the first entry-point copy of their source
    reaches them. Hand-over follows docs/design.md, decision 7: every replica keeps
    its output since the last punctuation all its live downstream replicas
    acknowledged (acknowledgements are the receivers' duplicate-filter maximum
    punctuations, read as soon as they change: the most aggressive trimming);
    checkpoints go through ``to_bytes``/``from_bytes``, and with
    ``checkpoint_bits > 0`` are split into bins and reassembled in random order.
    ``audit=True`` compares what every replica emitted (its peer's emissions
    before the checkpoint included) with the ideal run's output of its operator
    and raises :class:`ReplicaDivergence` on any difference.
    """
    if int(k) < 1:
        raise ValueError(f"k (the degree of replication) must be >= 1, got {k}")
    query.build()
    rng = random.Random(seed)
    erng = random.Random(seed * 1_000_003 + 17)  # hand-over choices: the no-event schedule stays as it was
    events: list = []
    streams, entries = source_streams(query, inputs, strict, on_malformed, events=events)
    for _, _, ev in events:
        if isinstance(ev, (Revive, AddReplica)) and ev.operator not in query.operators:
            raise QueryError(f"{type(ev).__name__}: {ev.operator!r} is not an operator of query {query.name!r}")
    inst: dict[str, list[_Instance]] = {}
    for src in query.sources:
        inst[src] = [_Instance(src, i, None, items=streams[src], entry_log=ReplayLog()) for i in range(k)]
    for node in query.operators:
        chans = [len(inst[u]) for u in query.inputs_of(node)]
        inst[node] = [_Instance(node, i, ReplicaCore(query, node, chans, strict, retain=True),
                                history=[] if audit else None) for i in range(k)]
    collectors = {}
    for node in query.sinks:
        chans = [len(inst[u]) for u in query.inputs_of(node)]
        inst[node] = [_Instance(node, 0, ReplicaCore(query, node, chans, strict))]
        collectors[node] = Collector(query.schema_of(node))
    retired: list[_Instance] = []
    channels: list[_Channel] = []
    for node in query.topological():
        for v, port in query.outputs_of(node):
            for i, up in enumerate(inst[node]):
                for down in inst[v]:
                    ch = _Channel(up, down, port, i, rng.lognormvariate(0.0, speed_spread))
                    up.out.append(ch)
                    channels.append(ch)

    stats = HarnessStats()
    crashes: list[tuple[int, _Instance]] = []
    if crash and k > 1:
        horizon = max(1, sum(len(s) for s in streams.values()) * k * max(1, len(query.operators)))
        for node in query.sources + query.operators:
            victims = rng.sample(inst[node], rng.randint(0, k - 1))
            crashes.extend((rng.randrange(horizon), v) for v in victims)
        crashes.sort(key=lambda c: c[0])

    def push(ch: _Channel, item: Item) -> None:
        pieces = [item]
        if split and not isinstance(item, Punctuation) and len(item) > 1 and rng.random() < 0.3:
            cuts = sorted(rng.sample(range(1, len(item)), min(len(item) - 1, rng.randint(1, 3))))
            pieces = np.split(item, cuts)
            stats.splits += 1
        for piece in pieces:
            ch.queue.append(piece)
            if resend_prob and not isinstance(piece, Punctuation) and rng.random() < resend_prob:
                ch.queue.append(piece)
                stats.resent += 1

    def ack(ch: _Channel) -> int:
        """The receiver's acknowledgement: its duplicate filter's maximum punctuation
        (a receiver still waiting for its checkpoint pins everything)."""
        r = ch.receiver
        return r.core.filters[ch.port].max_punct if r.core is not None else NO_PUNCTUATION

    def trim(sender: _Instance) -> None:
        acks = [ack(ch) for ch in sender.out if ch.receiver.alive]
        if acks and sender.log is not None:
            sender.log.trim(min(acks))

    def emit(sender: _Instance, items: list[Item]) -> None:
        for it in items:
            for ch in sender.out:
                if ch.receiver.alive:
                    push(ch, it)
        if sender.history is not None:
            sender.history.extend(it for it in items if not isinstance(it, Punctuation) and len(it))
        if sender.entry_log is not None:
            sender.entry_log.append(items)
        if any(isinstance(it, Punctuation) for it in items):
            trim(sender)

    def kill(victim: _Instance, force: bool = False) -> None:
        if not victim.alive:
            return
        if not force and victim.ready and sum(r.ready for r in inst[victim.node]) <= 1:
            stats.spared.append(victim.label)  # never leave an operator without a working replica
            return
        victim.alive = False
        stats.crashed.append(victim.label)
        for ch in victim.out:
            ch.queue.clear()

    def connect(up: _Instance, down: _Instance, port: int) -> _Channel:
        """A new stream replica up -> down."""
        if down.core is not None:
            idx = down.core.add_channel(port)
        elif down.staged is not None:
            idx = down.staged.add_channel(port)
        else:
            idx = down.chan_counts[port]
            down.chan_counts[port] += 1
        ch = _Channel(up, down, port, idx, erng.lognormvariate(0.0, speed_spread))
        up.out.append(ch)
        channels.append(ch)
        return ch

    def replay(up: _Instance, new_channels: list[_Channel]) -> None:
        """Replay up's retained output on its new stream replicas, once every new receiver
        counts among the acknowledgements that trim it."""
        trim(up)
        items = up.log.items()
        for ch in new_channels:
            for it in items:
                push(ch, it)
                if not isinstance(it, Punctuation):
                    ch.receiver.replayed += len(it)

    def subscribe(ev) -> None:
        node = ev.operator
        group = inst[node]
        if isinstance(ev, Revive):
            if not 0 <= ev.replica < len(group):
                raise QueryError(f"Revive: {node!r} has replicas 0..{len(group) - 1}, got {ev.replica}")
            if any(p.alive and p.node == node and p.index == ev.replica for p in pending):
                return  # that replica is already being revived
            slot, gen = ev.replica, group[ev.replica].generation + 1
        else:
            slot, gen = None, 0
        new = _Instance(node, -1 if slot is None else slot, None, generation=gen,
                        chan_counts=[0] * len(query.inputs_of(node)),
                        ready_at=stats.steps + max(0, int(ev.delay)), event=ev)
        for port, u_node in enumerate(query.inputs_of(node)):
            for up in inst[u_node]:
                if up.ready:  # a replica still waiting for its checkpoint connects when installed
                    replay(up, [connect(up, new, port)])
        pending.append(new)

    def choose_peer(new: _Instance, wanted: int | None) -> _Instance | None:
        group = inst[new.node]
        old = group[new.index] if isinstance(new.event, Revive) else None
        workers = [r for r in group if r.ready]
        chosen = group[wanted] if wanted is not None and 0 <= wanted < len(group) else None
        if chosen is None or not chosen.ready:
            others = [r for r in workers if r is not old]
            chosen = erng.choice(others) if others else (old if old is not None and old.ready else None)
        return chosen

    def install(new: _Instance) -> None:
        ev, node = new.event, new.node
        group = inst[node]
        old = group[new.index] if isinstance(ev, Revive) else None
        workers = [r for r in group if r.ready]
        chosen = choose_peer(new, ev.peer)
        if chosen is None:
            raise RuntimeError(f"hand-over of {new.label}: no working replica of {node!r} to take a checkpoint from")
        if ev.strategy is not None:
            start_transfer(new, chosen)
            return
        ck = chosen.core.checkpoint(checkpoint_bits)
        size = len(ck.to_bytes())
        ck = ReplicaCheckpoint.from_bytes(ck.to_bytes())
        if checkpoint_bits:
            ck.logic = _shuffled_bins(ck.logic, erng)
            if ck.sorters is not None:
                ck.sorters = tuple(_shuffled_bins(st, erng) for st in ck.sorters)
        if ev.tamper is not None:
            ck = ev.tamper(ck)
        if old is not None:
            kill(old, force=True)  # replaced (a no-op when it had crashed)
            retired.append(old)
            group[new.index] = new
        else:
            new.index = len(group)
            group.append(new)
        new.core = ReplicaCore.from_checkpoint(query, ck, new.chan_counts, strict, retain=True)
        new.chan_counts = None
        if audit:
            new.history = list(chosen.history)
            if chosen.inherited is not None:
                new.inherited = Counter(chosen.inherited)
        stats.handovers.append({
            "node": node, "replica": new.label, "peer": chosen.label,
            "replaced": old.label if old is not None else None,
            "punctuation": list(ck.punctuation),
            "others": {r.label: [f.max_punct for f in r.core.filters] for r in workers if r is not chosen},
            "applied": sum(f.applied for f in ck.filters), "state_rows": ck.logic.rows(),
            "replayed": new.replayed, "inherited_output": len(ck.output), "bytes": size,
            "subscribed_for": stats.steps - (new.ready_at - max(0, int(ev.delay))),
        })
        replay(new, [connect(new, down, port) for v, port in query.outputs_of(node)
                     for down in inst[v] + [p for p in pending + transferring if p.node == v] if down.alive])

    def start_transfer(new: _Instance, peer: _Instance) -> None:
        """Begin a staged transfer (Megaphone §3.3): the steps are taken at the peer's punctuations."""
        ev = new.event
        bits = ev.bits if ev.bits is not None else (checkpoint_bits or 3)
        steps = plan_transfer(ev.strategy, bits, ev.bins_per_step, splittable(query, new.node))
        new.staged = StagedReplica(query, new.node, new.chan_counts, bits, strict)
        new.chan_counts = None
        new.transfer = {"steps": steps, "next": 0, "peer": peer, "bits": bits, "restarts": 0,
                        "peers": [], "bytes": [], "started": stats.steps}
        if audit:
            new.inherited = Counter()
        transferring.append(new)
        if peer.core.logic.watermark == END:
            while new.transfer is not None and new.transfer["next"] < len(new.transfer["steps"]):
                take_step(new)

    def take_step(new: _Instance) -> None:
        """The current peer takes the next step's checkpoint now; the receiver installs it."""
        tr = new.transfer
        peer = tr["peer"]
        bins = tr["steps"][tr["next"]]
        ck = peer.core.checkpoint(tr["bits"], bins)
        data = ck.to_bytes()
        ck = ReplicaCheckpoint.from_bytes(data)
        if new.event.tamper is not None:
            ck = new.event.tamper(ck)
        new.staged.install_step(ck, bins)
        tr["next"] += 1
        tr["peers"].append(peer.label)
        tr["bytes"].append(len(data))
        if audit:
            emitted = np.concatenate(peer.history) if peer.history else query.schema_of(new.node).empty()
            new.inherited |= as_multiset(emitted)
            if peer.inherited is not None:  # the peer was itself built by a staged transfer
                new.inherited |= peer.inherited
        if new.staged.complete:
            finish(new)

    def check_peer(new: _Instance) -> None:
        """A transfer whose peer died restarts its remaining steps from another working replica."""
        tr = new.transfer
        if tr is None or tr["next"] >= len(tr["steps"]) or tr["peer"].ready:
            return
        peer = choose_peer(new, None)
        if peer is None:
            raise RuntimeError(f"transfer to {new.label}: no working replica of {new.node!r} left")
        tr["restarts"] += 1
        tr["peer"] = peer
        if peer.core.logic.watermark == END:
            while new.transfer is not None and new.transfer["next"] < len(new.transfer["steps"]):
                take_step(new)

    def finish(new: _Instance) -> None:
        """The staged replica holds every bin in one core: it takes its place and feeds downstream."""
        ev, node, tr = new.event, new.node, new.transfer
        group = inst[node]
        staged = new.staged
        core = staged.core
        items, acked = staged.final_output()
        core.output_log = ReplayLog(items, acked)
        old = group[new.index] if isinstance(ev, Revive) else None
        if old is not None:
            kill(old, force=True)
            retired.append(old)
            group[new.index] = new
        else:
            new.index = len(group)
            group.append(new)
        new.core = core
        new.staged = None
        new.transfer = None
        transferring.remove(new)
        if audit:
            new.history = list(staged.early)
        stats.transfers.append({
            "node": node, "replica": new.label, "strategy": ev.strategy, "bits": tr["bits"],
            "steps": len(tr["steps"]), "peers": tr["peers"], "restarts": tr["restarts"],
            "bytes": tr["bytes"], "merges": staged.merges, "early_tuples": sum(len(b) for b in staged.early),
            "replaced": old.label if old is not None else None, "replayed": new.replayed,
            "harness_steps": stats.steps - tr["started"]})
        replay(new, [connect(new, down, port) for v, port in query.outputs_of(node)
                     for down in inst[v] + [p for p in pending + transferring if p.node == v] if down.alive])

    def run_event(ev) -> None:
        if isinstance(ev, KillReplica):
            nodes = query.sources if ev.operator == "entry" else [ev.operator]
            for n in nodes:
                if n not in inst or not 0 <= ev.replica < len(inst[n]):
                    raise QueryError(f"KillReplica: no replica {ev.replica} of {n!r}")
                kill(inst[n][ev.replica])
        elif isinstance(ev, (Revive, AddReplica)):
            subscribe(ev)

    pending: list[_Instance] = []
    transferring: list[_Instance] = []
    due: dict[str, deque] = {src: deque() for src in query.sources}
    for src, pos, ev in sorted(events, key=lambda e: e[1]):
        due[src].append((pos, ev))

    def fire(src: str, cursor: int) -> None:
        q = due[src]
        while q and q[0][0] <= cursor:
            run_event(q.popleft()[1])

    for src in query.sources:
        fire(src, 0)
    while True:
        while crashes and crashes[0][0] <= stats.steps:
            kill(crashes.pop(0)[1])
        for new in [p for p in pending if p.ready_at <= stats.steps]:
            pending.remove(new)
            install(new)
        for new in list(transferring):
            check_peer(new)
        cands: list = [e for src in query.sources for e in inst[src] if e.alive and e.cursor < len(e.items)]
        weights = [1.0] * len(cands)
        for ch in channels:
            if ch.queue and ch.receiver.alive and ch.receiver.receiving:
                cands.append(ch)
                weights.append(ch.speed)
        if not cands:
            if pending:  # nothing moves until the waiting replicas install their checkpoints
                stats.steps = min(p.ready_at for p in pending)
                continue
            stalled = [t for t in transferring if t.transfer["next"] < len(t.transfer["steps"])]
            if stalled:  # no punctuation will come: the peers take their remaining steps now
                for t in stalled:
                    take_step(t)
                continue
            if any(due.values()):  # events placed after the last item of a source
                for src in query.sources:
                    fire(src, len(streams[src]))
                continue
            break
        pick = rng.choices(cands, weights)[0]
        stats.steps += 1
        if isinstance(pick, _Instance):
            emit(pick, [pick.items[pick.cursor]])
            pick.cursor += 1
            fire(pick.node, pick.cursor)
            continue
        item = pick.queue.popleft()
        pick.delivered += 1
        recv = pick.receiver
        if recv.core is None:  # receiving its state in steps: outputs wait until it completes
            recv.staged.process(pick.port, pick.index, item)
            if recv.staged.complete:
                finish(recv)
            continue
        out = recv.core.process(pick.port, pick.index, item)
        if recv.node in collectors:
            collectors[recv.node].add(out)
        else:
            emit(recv, out)
            if transferring and any(isinstance(it, Punctuation) for it in out):
                for t in list(transferring):  # a step at the peer's logical time (its punctuation)
                    if t.transfer["peer"] is recv and t.transfer["next"] < len(t.transfer["steps"]):
                        take_step(t)

    if transferring:
        raise RuntimeError(f"staged transfers did not complete: "
                           f"{[(t.label, t.staged.stats()) for t in transferring]}")
    everyone = [i for node in query.operators + query.sinks for i in inst[node]] + retired
    dead = [d for e in entries.values() for d in e.dead_letters]
    for i in everyone:
        if i.core is not None:
            dead.extend(i.core.dead_letters())
    weights = {n: [f.weights.tolist() for f in inst[n][0].core.filters] for n in query.sinks}
    result = RunResult(
        outputs={n: c.result() for n, c in collectors.items()},
        punctuation={n: c.punctuation for n, c in collectors.items()},
        dead_letters=dead,
        stats={"harness": stats, "weights": weights,
               "entries": {s: e.stats() for s, e in entries.items()}},
    )
    if audit:
        problems = _audit(query, streams, entries, strict, [i for i in everyone if i.history is not None])
        result.stats["audit"] = problems
        if problems:
            raise ReplicaDivergence("replicas diverge from the ideal run:\n  " + "\n  ".join(problems[:10]))
    return result


def _shuffled_bins(state: OperatorState, rng: random.Random) -> OperatorState:
    """Split a state into its bins and reassemble them in random order (as a binned transfer would)."""
    bins = list(range(state.n_bins))
    rng.shuffle(bins)
    return OperatorState.merge([state.select([b]) for b in bins])


def _audit(query: Query, streams: dict, entries: dict, strict: bool, instances: list[_Instance]) -> list[str]:
    """Each replica's emissions against the ideal run's output of its operator (as multisets of rows)."""
    ideal = run_reference_on_streams(query, streams, entries, strict, record_nodes=True).stats["node_outputs"]
    expected = {n: as_multiset(b) for n, b in ideal.items()}
    problems = []
    for i in instances:
        schema = query.schema_of(i.node)
        got = as_multiset(np.concatenate(i.history) if i.history else schema.empty())
        extra = got - expected[i.node]
        if i.inherited is not None:  # a staged receiver: its own emissions, and its peers' at each step
            got = got | i.inherited
        if extra:
            problems.append(f"{i.label} emitted {sum(extra.values())} tuple(s) the ideal run does not "
                            f"(or more copies than it does)")
        complete = i.alive and i.core is not None and i.core.logic.watermark == END
        if complete:
            missing = expected[i.node] - got
            if missing:
                problems.append(f"{i.label} completed without emitting {sum(missing.values())} tuple(s) "
                                f"of the ideal run")
    return problems
