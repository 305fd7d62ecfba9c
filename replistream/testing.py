"""Testing tools for replistream users and for replistream itself.

* :func:`run_reference`: the ideal, non-replicated run (re-exported).
* :func:`run_replicated`: the *replicated in-process harness*. Every operator
  runs as ``k`` replicas, every upstream replica feeds every downstream replica
  through its own FIFO channel, and each replica merges its inputs with
  duplicate filters (Algorithm 1). A seeded scheduler delivers channel heads in
  random order with per-channel speeds (so replicas see different
  interleavings and delays), splits batches at random, re-sends copies, and can
  crash up to ``k - 1`` replicas of every operator and entry point at random
  times. No Ray, no clock: a failing seed reproduces exactly.
* :func:`as_multiset`, :func:`assert_same_output`: compare outputs as multisets
  of (id, ts, values), bit for bit.
* :func:`chunked`, :func:`with_punctuations`: shape in-memory source data.

>>> from replistream import Query
>>> q = Query(); s = q.source("s", {"x": "i8"}, punctuate_every=4)
>>> _ = s.window(size=4, aggs={"n": "count"}).sink("counts")
>>> data = {"s": chunked([{"ts": t, "x": t} for t in range(12)], 5)}
>>> ref = run_reference(q.build(), data)
>>> rep = run_replicated(q, data, k=3, seed=1, crash=True)
>>> assert_same_output(ref.outputs["counts"], rep.outputs["counts"])
>>> rep.complete
True
"""
from __future__ import annotations

import random
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .engine import ReplicaCore, RunResult, _Collector, run_reference, source_streams
from .operators import Item
from .query import Query
from .schema import TS, Punctuation

__all__ = ["run_reference", "run_replicated", "as_multiset", "assert_same_output", "multiset_diff",
           "chunked", "with_punctuations", "HarnessStats", "Sentinel", "KillReplica", "KillServer", "Pause",
           "Call"]


# -- sentinels: scripted events inside a source's input (for deployments) -------------------

class Sentinel:
    """An event placed among a source's input chunks; a deployment's feeder runs it
    when it reaches that point of the input, so failures happen at a known place in
    the stream without sleeping. The in-process engines ignore sentinels.

    >>> inputs = {"s": [[{"ts": 1, "x": 1}], KillReplica("f", 0), [{"ts": 2, "x": 2}]]}
    """

    def apply(self, deployment) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class KillReplica(Sentinel):
    """Kill replica ``replica`` of ``operator`` (``"entry"`` for an entry point)."""

    operator: str
    replica: int

    def apply(self, deployment) -> None:
        deployment.kill_replica(self.operator, self.replica)


@dataclass(frozen=True)
class KillServer(Sentinel):
    """Kill every replica on ``server``."""

    server: str

    def apply(self, deployment) -> None:
        deployment.kill_server(self.server)


@dataclass(frozen=True)
class Pause(Sentinel):
    """Pause the feeder for ``seconds``."""

    seconds: float

    def apply(self, deployment) -> None:
        import time

        time.sleep(self.seconds)


@dataclass(frozen=True)
class Call(Sentinel):
    """Call ``fn(deployment)`` (e.g. ``lambda d: d.cut_link("boston", "zurich", 2.0)``)."""

    fn: object

    def apply(self, deployment) -> None:
        self.fn(deployment)


# -- comparing outputs ----------------------------------------------------------

def as_multiset(batch: np.ndarray) -> Counter:
    """The rows of ``batch`` as a multiset, keyed by their exact bytes (ts, id and values).

    >>> b = np.array([(1, 5, 0.5), (1, 5, 0.5)], dtype=[("ts", "i8"), ("id", "u8"), ("v", "f8")])
    >>> list(as_multiset(b).values())
    [2]
    """
    if batch.dtype.hasobject:
        return Counter(tuple(repr(v) for v in row) for row in batch.tolist())
    packed = np.ascontiguousarray(batch).view(np.dtype((np.void, batch.dtype.itemsize)))
    return Counter(packed.tolist())


def multiset_diff(expected: np.ndarray, actual: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows missing from ``actual``, rows in ``actual`` not expected), with multiplicity."""
    e, a = as_multiset(expected), as_multiset(actual)
    missing, extra = e - a, a - e

    def rows(c: Counter, like: np.ndarray) -> np.ndarray:
        if like.dtype.hasobject:
            return like[:0]
        keys = [k for k, n in c.items() for _ in range(n)]
        if not keys:
            return like[:0]
        return np.frombuffer(b"".join(keys), dtype=like.dtype)

    return rows(missing, expected), rows(extra, actual)


def assert_same_output(expected: np.ndarray, actual: np.ndarray, ordered: bool = False) -> None:
    """Raise ``AssertionError`` unless ``actual`` equals ``expected`` as a multiset
    (or, with ``ordered=True``, as a sequence), showing what is lost and what is extra.
    """
    if expected.dtype != actual.dtype:
        raise AssertionError(f"dtypes differ: expected {expected.dtype}, got {actual.dtype}")
    if ordered:
        if len(expected) == len(actual) and expected.tobytes() == actual.tobytes():
            return
        if as_multiset(expected) == as_multiset(actual):
            raise AssertionError("same tuples, different order")
    missing, extra = multiset_diff(expected, actual)
    if len(missing) or len(extra):
        dup = sum(max(0, n - as_multiset(expected).get(k, 0)) for k, n in as_multiset(actual).items()
                  if k in as_multiset(expected))
        raise AssertionError(
            f"output differs from reference: {len(missing)} lost, {len(extra)} extra "
            f"({dup} of them duplicates)\n  lost: {missing[:5].tolist()}\n  extra: {extra[:5].tolist()}")


# -- shaping inputs ---------------------------------------------------------------

def chunked(records: Sequence[Mapping], size: int) -> list[list[Mapping]]:
    """Split a list of records into chunks of ``size`` (the batches a source delivers).

    >>> [len(c) for c in chunked([{}] * 5, 2)]
    [2, 2, 1]
    """
    if size < 1:
        raise ValueError(f"chunk size must be >= 1, got {size}")
    return [list(records[i:i + size]) for i in range(0, len(records), size)]


def with_punctuations(records: Sequence[Mapping], every: int, rng: random.Random | None = None,
                      max_chunk: int = 8) -> list:
    """Chunk time-ordered ``records`` at random sizes and insert explicit punctuations.

    After a chunk whose last timestamp is ``t``, a punctuation ``t - 1`` is
    inserted with probability ``1/every`` (never violating the contract for
    records sorted by ts).
    """
    rng = rng or random.Random(0)
    out: list = []
    i = 0
    last_p = None
    while i < len(records):
        n = rng.randint(1, max_chunk)
        chunk = list(records[i:i + n])
        i += n
        out.append(chunk)
        if i < len(records) and rng.random() < 1.0 / every:
            p = int(records[i]["ts"]) - 1
            if last_p is None or p > last_p:
                out.append(Punctuation(p))
                last_p = p
    return out


# -- the replicated in-process harness ---------------------------------------------

@dataclass
class _Instance:
    node: str
    index: int
    core: ReplicaCore | None  # None for an entry point copy
    items: list[Item] | None = None  # entry copies: the source stream
    cursor: int = 0
    alive: bool = True
    out: list["_Channel"] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.node}#{self.index}"


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
    """What the harness did: steps, crashed replicas, batches split and re-sent."""

    steps: int = 0
    crashed: list[str] = field(default_factory=list)
    splits: int = 0
    resent: int = 0


def run_replicated(query: Query, inputs: Mapping[str, Any], k: int = 2, seed: int = 0, *, crash: bool = False,
                   split: bool = True, resend_prob: float = 0.05, speed_spread: float = 1.0,
                   strict: bool = False, on_malformed: str = "raise") -> RunResult:
    """Run ``query`` with every operator and entry point replicated ``k`` times, in process.

    ``crash=True`` kills up to ``k - 1`` replicas of every operator and of every
    entry point at random steps (fail-stop: what they had in flight is lost).
    ``resend_prob`` re-sends a batch on the same channel right after the first
    copy (a retransmission). ``speed_spread`` is the sigma of the lognormal
    per-channel speeds. The result has the same shape as :func:`run_reference`;
    ``stats["harness"]`` is a :class:`HarnessStats` and ``stats["weights"]`` the
    duplicate-filter contribution weights at each application.
    """
    if int(k) < 1:
        raise ValueError(f"k (the degree of replication) must be >= 1, got {k}")
    query.build()
    rng = random.Random(seed)
    streams, entries = source_streams(query, inputs, strict, on_malformed)
    inst: dict[str, list[_Instance]] = {}
    for src in query.sources:
        inst[src] = [_Instance(src, i, None, items=streams[src]) for i in range(k)]
    for node in query.operators:
        chans = [len(inst[u]) for u in query.inputs_of(node)]
        inst[node] = [_Instance(node, i, ReplicaCore(query, node, chans, strict)) for i in range(k)]
    collectors = {}
    for node in query.sinks:
        chans = [len(inst[u]) for u in query.inputs_of(node)]
        inst[node] = [_Instance(node, 0, ReplicaCore(query, node, chans, strict))]
        collectors[node] = _Collector(query.schema_of(node))
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

    def emit(sender: _Instance, items: list[Item]) -> None:
        for it in items:
            for ch in sender.out:
                if ch.receiver.alive:
                    push(ch, it)

    def kill(victim: _Instance) -> None:
        victim.alive = False
        stats.crashed.append(victim.label)
        for ch in victim.out:
            ch.queue.clear()

    while True:
        while crashes and crashes[0][0] <= stats.steps:
            kill(crashes.pop(0)[1])
        cands: list = [e for src in query.sources for e in inst[src] if e.alive and e.cursor < len(e.items)]
        weights = [1.0] * len(cands)
        for ch in channels:
            if ch.queue and ch.receiver.alive:
                cands.append(ch)
                weights.append(ch.speed)
        if not cands:
            break
        pick = rng.choices(cands, weights)[0]
        stats.steps += 1
        if isinstance(pick, _Instance):
            emit(pick, [pick.items[pick.cursor]])
            pick.cursor += 1
            continue
        item = pick.queue.popleft()
        pick.delivered += 1
        recv = pick.receiver
        out = recv.core.process(pick.port, pick.index, item)
        if recv.node in collectors:
            collectors[recv.node].add(out)
        else:
            emit(recv, out)

    dead = [d for e in entries.values() for d in e.dead_letters]
    for node in query.operators + query.sinks:
        for i in inst[node]:
            dead.extend(i.core.dead_letters())
    weights = {n: [f.weights.tolist() for f in inst[n][0].core.filters] for n in query.sinks}
    return RunResult(
        outputs={n: c.result() for n, c in collectors.items()},
        punctuation={n: c.punctuation for n, c in collectors.items()},
        dead_letters=dead,
        stats={"harness": stats, "weights": weights,
               "entries": {s: e.stats() for s, e in entries.items()}},
    )
