"""Partitioned operators: which operators split into ``p`` partitions, and how tuples find theirs
(issue #41; Megaphone, Hoffmann et al. 2019, §3).

An operator run with ``parallelism={operator: p}`` runs as ``p`` *partitions*, each replicated
``k`` times (``p x k`` replicas, labelled ``op.P#R``). Its input is cut into ``2**bits`` *bins*
(Megaphone §3.4): a tuple's bin is the top ``bits`` bits of a 64-bit hash, and a partition owns a
set of bins (:class:`BinMap`). Which hash:

* a keyed operator (a time or count window with ``by=``, a join on key equality, band joins
  included, a user operator whose logic names its key,
  :meth:`~replistream.operators.base.OperatorLogic.bin_keys`) by its key: the very hash its state
  keeps its bins by, so a key's bin is the same in the router, in the state and in a transfer;
* a stateless operator (filter, map, flat map, union, a stateless user operator) by its tuple
  id (decision 1: a deterministic function of the tuple, the same on every replica; never
  round-robin, which would depend on the sender's own batching).

An operator whose output for one tuple may depend on tuples of every key cannot be split: a
window or count window with no ``by=`` (a global aggregate), a join with no key, a user
operator whose logic names no key. :func:`check_parallelism` says so in one line, naming the
fix. Entry points are not operators (their partitions: :func:`entry_parallelism`). An application (a sink node) may
be partitioned on the engines that run it as replicas (the in-process engine and Ray:
``check_parallelism(..., applications=True)``): its input is routed by tuple id like a stateless
operator's, and each partition's replicas deliver (and write, :mod:`replistream.sinks`) its share.

Routing (:class:`Router`) is vectorised: one hash pass, one table lookup and one stable sort per
batch, no Python per tuple. Every upstream replica routes each tuple by its content, so every
replica sends a tuple to the same partition; punctuations (and markers of running changes) go
to every partition (:meth:`Router.route`). Replication transparency follows (docs/design.md,
"Partitions").

>>> from replistream import Query
>>> q = Query(); s = q.source("s", {"k": "i8"})
>>> _ = s.window(size=10, by="k", name="w").sink("out"); q = q.build()
>>> check_parallelism(q, {"w": 2})
{'w': 2}
>>> r = Router(q, "w", BinMap.even(2, bits=4))
>>> b = q.schema_of("s").from_columns({"ts": [1, 2, 3, 4], "k": [1, 2, 1, 3]}, ids=[1, 2, 3, 4])
>>> [part["k"].tolist() for part in r.split(0, b)]   # each key in one partition, order kept
[[1, 1], [2, 3]]
"""
from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Iterable

import numpy as np

from .errors import QueryError
from .ids import fmix
from .operators.base import bin_of
from .schema import ID, TS, Punctuation  # noqa: F401 (Punctuation: the doctests)

__all__ = ["DEFAULT_BITS", "BinMap", "Router", "Switch", "assign_bins", "check_parallelism", "entry_parallelism",
           "parallelism_from_options",
           "partition_key", "partition_label", "parse_partition_label"]

#: The entry points' name in ``parallelism`` (as in a placement: :data:`replistream.plan.ENTRY`).
ENTRY = "entry"

#: Bits of the bin of a tuple by default: ``2**12`` bins (Megaphone's experiments use 2^8..2^12).
DEFAULT_BITS = 12

#: Spec classes partitioned by tuple id (stateless).
_BY_TUPLE = ("FilterSpec", "MapSpec", "FlatMapSpec", "UnionSpec")


def partition_label(node: str, partition: int) -> str:
    """The name of one partition of ``node``: ``"node.P"`` (a node's name never holds a dot).

    >>> partition_label("agg", 1)
    'agg.1'
    """
    return f"{node}.{int(partition)}"


def parse_partition_label(name: str) -> tuple[str, int | None]:
    """``("agg", 1)`` for ``"agg.1"``; ``(name, None)`` for a name with no partition.

    >>> parse_partition_label("agg.1"), parse_partition_label("agg")
    (('agg', 1), ('agg', None))
    """
    head, sep, tail = str(name).rpartition(".")
    if sep and head and tail.isdigit():
        return head, int(tail)
    return str(name), None


def assign_bins(n_bins: int, partitions: int) -> np.ndarray:
    """The partition of each of ``n_bins`` bins when ``partitions`` share them: the map reached
    from one partition by adding partitions one at a time, each new partition taking an equal
    share from the end of every existing partition's bins. A pure function, so every replica and
    every engine computes the same map. It is balanced (shares differ by at most one bin), and
    going from ``p`` to ``p' > p`` partitions moves bins only into the new partitions: the fewest
    moves a rescale can make (``1 -> 2`` moves half the bins, ``2 -> 4`` half again); going back
    to fewer moves only the bins of the partitions that go, each to the partition it came from.

    >>> assign_bins(8, 2).tolist()
    [0, 0, 0, 0, 1, 1, 1, 1]
    >>> assign_bins(8, 4).tolist()   # partitions 0 and 1 each gave two bins to 2 and 3
    [0, 0, 3, 2, 1, 1, 3, 2]
    >>> np.bincount(assign_bins(16, 3)).tolist()
    [6, 5, 5]
    """
    n_bins, partitions = int(n_bins), int(partitions)
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    if partitions > n_bins:
        raise ValueError(f"{partitions} partitions cannot share {n_bins} bins: each partition needs a bin "
                         f"(raise bits, or use fewer partitions)")
    return _assignment(n_bins, partitions).copy()


@functools.lru_cache(maxsize=64)
def _assignment(n_bins: int, partitions: int) -> np.ndarray:
    held = [np.arange(n_bins, dtype=np.int64)]  # per partition, its bins in the order it took them
    for q in range(1, partitions):
        share = [n_bins // (q + 1) + (1 if i < n_bins % (q + 1) else 0) for i in range(q + 1)]
        taken = []
        for i in range(q):
            give = len(held[i]) - share[i]
            if give > 0:
                taken.append(held[i][len(held[i]) - give:])
                held[i] = held[i][:len(held[i]) - give]
        held.append(np.sort(np.concatenate(taken)) if taken else np.zeros(0, dtype=np.int64))
    owner = np.empty(n_bins, dtype=np.int64)
    for i, bins in enumerate(held):
        owner[bins] = i
    return owner


class BinMap:
    """Which partition owns each of ``2**bits`` bins: ``owner[b]``. :meth:`even` is the
    deterministic default (:func:`assign_bins`, balanced); a rescale (Megaphone §3.3) names the bins that
    move (:meth:`moves`) and builds the map after the move (:meth:`with_owner`).

    >>> m = BinMap.even(2, bits=3)
    >>> m.owner.tolist(), m.partitions, m.bins_of(1).tolist()
    ([0, 0, 0, 0, 1, 1, 1, 1], 2, [4, 5, 6, 7])
    >>> m.moves(BinMap.even(4, bits=3))   # (bin, from, to): only into the new partitions
    [(2, 0, 3), (3, 0, 2), (6, 1, 3), (7, 1, 2)]
    >>> BinMap.even(4, bits=3).moves(m)   # fewer: only out of the partitions that go
    [(2, 3, 0), (3, 2, 0), (6, 3, 1), (7, 2, 1)]
    """

    def __init__(self, owner: Iterable[int], partitions: int | None = None):
        own = np.asarray(list(owner) if not isinstance(owner, np.ndarray) else owner, dtype=np.int64)
        n = len(own)
        if n == 0 or n & (n - 1):
            raise ValueError(f"a bin map needs 2**bits bins, got {n}")
        if len(own) and int(own.min()) < 0:
            raise ValueError(f"a bin map's partitions are numbered from 0, got {int(own.min())}")
        p = int(own.max()) + 1 if partitions is None else int(partitions)
        if int(own.max()) >= p:
            raise ValueError(f"bin map names partition {int(own.max())} of {p}")
        self.owner = own
        self.owner.setflags(write=False)
        self.partitions = p
        self.bits = n.bit_length() - 1

    @classmethod
    def even(cls, partitions: int, bits: int = DEFAULT_BITS) -> "BinMap":
        """``partitions`` owning contiguous, equal ranges of ``2**bits`` bins (:func:`assign_bins`)."""
        if not 0 <= int(bits) <= 20:
            raise ValueError(f"bits must be in 0..20, got {bits}")
        return cls(assign_bins(1 << int(bits), partitions), partitions)

    def bins_of(self, partition: int) -> np.ndarray:
        """The bins ``partition`` owns, ascending."""
        return np.flatnonzero(self.owner == int(partition))

    def moves(self, other: "BinMap") -> list[tuple[int, int, int]]:
        """``(bin, from, to)`` for every bin whose owner differs in ``other`` (same number of bins)."""
        if len(other.owner) != len(self.owner):
            raise ValueError(f"bin maps of {len(self.owner)} and {len(other.owner)} bins do not compare")
        diff = np.flatnonzero(self.owner != other.owner)
        return list(zip(diff.tolist(), self.owner[diff].tolist(), other.owner[diff].tolist()))

    def with_owner(self, bins: Iterable[int], partition: int, partitions: int | None = None) -> "BinMap":
        """A new map in which ``partition`` owns ``bins`` (the others keep theirs)."""
        own = self.owner.copy()
        own[np.asarray(list(bins), dtype=np.int64)] = int(partition)
        return BinMap(own, max(self.partitions, int(partition) + 1) if partitions is None else partitions)

    def __eq__(self, other) -> bool:
        return (isinstance(other, BinMap) and self.partitions == other.partitions
                and np.array_equal(self.owner, other.owner))

    def __repr__(self) -> str:
        return f"BinMap({self.partitions} partitions, 2**{self.bits} bins)"


def partition_key(query, node: str, applications: bool = False) -> str:
    """How ``node`` splits: ``"key"`` (by the key its state is binned by) or ``"tuple"`` (by
    tuple id: stateless; an application too, with ``applications``). A
    :class:`~replistream.errors.QueryError` names why it cannot split and the fix.

    >>> from replistream import Query
    >>> q = Query(); s = q.source("s", {"k": "i8"})
    >>> _ = s.filter(lambda b: b["k"] > 0, name="f").window(10, name="total").sink("out")
    >>> partition_key(q, "f")
    'tuple'
    >>> partition_key(q, "total")
    Traceback (most recent call last):
    ...
    replistream.errors.QueryError: parallelism: 'total' is a window with no by= key (a global aggregate: every output may depend on every tuple), so it cannot be partitioned; give it by=... or leave it out of parallelism
    """
    spec = query.spec(node)
    while type(spec).__name__ == "CutSpec":  # added or removed while running: split as the operator it wraps
        spec = spec.inner
    kind = type(spec).__name__
    fix = "or leave it out of parallelism"
    if spec.kind == "source":
        raise QueryError(f"parallelism: {node!r} is a source, read by the entry points, which are not "
                         f"partitioned; name the operators that read it instead")
    if spec.kind == "sink":
        if applications:
            return "tuple"  # an application's input splits like a stateless operator's: by tuple id
        raise QueryError(f"parallelism: {node!r} is an application, which is not partitioned here (the in-process "
                         f"and Ray engines partition applications: run_replicated(..., parallelism=) or "
                         f"deploy(..., parallelism=)); name an operator, {fix}")
    if kind in _BY_TUPLE:
        return "tuple"
    if kind in ("TimeWindowSpec", "CountWindowSpec"):
        if spec.by:
            return "key"
        what = "window" if kind == "TimeWindowSpec" else "count_window"
        raise QueryError(f"parallelism: {node!r} is a {what} with no by= key (a global aggregate: every output "
                         f"may depend on every tuple), so it cannot be partitioned; give it by=... {fix}")
    if kind == "JoinSpec":
        if spec.left_key is not None and spec.right_key is not None:
            return "key"
        raise QueryError(f"parallelism: {node!r} is a join with no key (any tuple may match any other), so it "
                         f"cannot be partitioned; join on=... (or left_key=/right_key=) {fix}")
    if kind == "CustomSpec":
        logic = query.build_logic(node)
        if logic.stateless:
            return "tuple"
        schemas = query.in_schemas(node)
        if all(logic.bin_keys(i, s.empty()) is not None for i, s in enumerate(schemas)):
            return "key"
        raise QueryError(f"parallelism: {node!r} is a user operator ({type(logic).__name__}) whose logic names no "
                         f"key (bin_keys returns None), so it cannot be partitioned; build it on "
                         f"KeyedOperatorLogic (or implement bin_keys) {fix}")
    raise QueryError(f"parallelism: {node!r} is a {kind}, which replistream does not know how to partition; "
                     f"leave it out of parallelism")


def check_parallelism(query, parallelism: Mapping[str, int] | None, bits: int = DEFAULT_BITS,
                      keep_single: bool = False, applications: bool = False) -> dict[str, int]:
    """``parallelism`` checked against ``query``: ``{operator: p}`` with every name an operator of
    the query (an operator's name, or the method that made the query's only operator of its kind:
    ``"window"``), every ``p`` an integer from 1 to ``2**bits``, every operator one that can be
    partitioned (:func:`partition_key`). Returns it with operators' own names and without the
    entries ``p == 1`` (one partition: the operator as it is), unless ``keep_single`` (a deployment
    keeps them: the operator runs as one partition ``op.0``, which it can rescale). With
    ``applications`` (the engines that run an application's partitions: in process and Ray) an
    application may be named too; elsewhere it is refused. Any mistake: a one-line
    ``QueryError`` (or ``ValueError`` for a wrong ``p``) naming it and the fix.

    >>> from replistream import Query
    >>> q = Query(); s = q.source("s", {"k": "i8"})
    >>> _ = s.window(10, by="k").map(lambda b: {"k": b["k"]}, {"k": "i8"}, name="m").sink("out")
    >>> check_parallelism(q, {"window": 4, "m": 1})
    {'window_1': 4}
    >>> check_parallelism(q, {"m": 0})
    Traceback (most recent call last):
    ...
    ValueError: parallelism['m'] must be an integer >= 1 (the number of partitions), got 0; write 1 for an unpartitioned operator
    >>> check_parallelism(q, {"windw": 2})
    Traceback (most recent call last):
    ...
    replistream.errors.QueryError: parallelism: query 'query' has no operator 'windw' (operators: window_1, m); did you mean 'window_1'?
    """
    from .query import resolve_operator

    if parallelism is None:
        return {}
    if not isinstance(parallelism, Mapping):
        raise QueryError(f"parallelism must be a mapping {{operator: partitions}}, got {type(parallelism).__name__}"
                         f" {parallelism!r}; write e.g. parallelism={{'agg': 2}}")
    out: dict[str, int] = {}
    for name, p in parallelism.items():
        if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or int(p) < 1:
            raise ValueError(f"parallelism[{name!r}] must be an integer >= 1 (the number of partitions), got "
                             f"{p!r}; write 1 for an unpartitioned operator")
        if int(p) > 1 << int(bits):
            raise ValueError(f"parallelism[{name!r}] = {int(p)} exceeds the {1 << int(bits)} bins (2**{bits}) a key "
                             f"space is cut into; use at most {1 << int(bits)} partitions")
        if name == ENTRY:
            raise QueryError("parallelism: the entry points are not partitioned here (deploy() and run_replicated() "
                             "take parallelism={'entry': p}); name the operators that read the sources")
        if isinstance(name, str) and query.has_node(name):
            partition_key(query, name, applications)  # a source (or an application): says why not
        if applications and isinstance(name, str) and name in query.sinks:
            node = name
        else:
            try:
                node = resolve_operator(query, name, also=())
            except QueryError as e:
                raise QueryError(f"parallelism: {e}") from None
        partition_key(query, node, applications)
        if node in out:
            raise QueryError(f"parallelism names {node!r} twice (as {name!r} too); name each operator once")
        if int(p) > 1 or keep_single:
            out[node] = int(p)
    return out


def entry_parallelism(parallelism: Mapping[str, int] | None) -> tuple[int, dict | None]:
    """``(entry partitions, the rest of parallelism)``: ``parallelism["entry"]`` (default 1: the
    entry points unpartitioned, each replica reading every source) checked, and the mapping
    without it, for :func:`check_parallelism`. With ``p > 1`` entry partitions, one feeder
    hands each chunk of a source to one partition (all ``k`` replicas of it), so each chunk is
    read once per replica set (docs/design.md, "Entry partitions").

    >>> entry_parallelism({"entry": 2, "agg": 3}), entry_parallelism(None)
    ((2, {'agg': 3}), (1, None))
    >>> entry_parallelism({"entry": 0})
    Traceback (most recent call last):
    ...
    ValueError: parallelism['entry'] must be an integer >= 1 (the number of entry partitions), got 0; write 1 for unpartitioned entry points
    """
    if not isinstance(parallelism, Mapping) or ENTRY not in parallelism:
        return 1, parallelism
    p = parallelism[ENTRY]
    if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or int(p) < 1:
        raise ValueError(f"parallelism['entry'] must be an integer >= 1 (the number of entry partitions), got "
                         f"{p!r}; write 1 for unpartitioned entry points")
    return int(p), {n: v for n, v in parallelism.items() if n != ENTRY}


class Switch:
    """One rescale's routing change (Megaphone §3.3): per bin, the logical time ``at[bin]`` after
    which its tuples go to partition ``owner[bin]`` (bins that do not move: ``at`` the largest
    time, never). Every sender holds the same switches before any tuple later than their times
    exists, so every replica routes a tuple alike, by its content and timestamp.

    >>> m = BinMap.even(1, bits=2)
    >>> sw = Switch.between(m, BinMap.even(2, bits=2), [(2, 10), (3, 20)])
    >>> sw.at.tolist()[:2], sw.at.tolist()[2:], sw.owner.tolist(), sw.partitions
    ([9223372036854775807, 9223372036854775807], [10, 20], [0, 0, 1, 1], 2)
    """

    NEVER = int(np.iinfo(np.int64).max)

    def __init__(self, at: np.ndarray, owner: np.ndarray, partitions: int):
        self.at = np.asarray(at, dtype=np.int64)
        self.owner = np.asarray(owner, dtype=np.int64)
        self.partitions = int(partitions)

    @classmethod
    def between(cls, old: BinMap, new: BinMap, times: Iterable[tuple[int, int]]) -> "Switch":
        """The switch from ``old`` to ``new``, bin ``b`` switching at time ``t`` for each
        ``(b, t)`` of ``times`` (every bin whose owner changes must be given)."""
        at = np.full(len(old.owner), cls.NEVER, dtype=np.int64)
        for b, t in times:
            at[int(b)] = int(t)
        moving = np.flatnonzero(old.owner != new.owner)
        if (at[moving] == cls.NEVER).any():
            raise ValueError(f"bins {moving[at[moving] == cls.NEVER][:5].tolist()} change owner with no time")
        return cls(at, new.owner.copy(), new.partitions)

    def __repr__(self) -> str:
        moving = self.at != self.NEVER
        return f"Switch({int(moving.sum())} bins to {self.partitions} partitions)"


class Router:
    """Sends each input tuple of ``node`` to the partition that owns its bin (``binmap``): what
    every upstream replica runs on what it emits to ``node``. :meth:`partition_of` is one vectorised
    pass (hash, top bits, table lookup); :meth:`split` cuts a batch into one batch per partition,
    each in the batch's own order; :meth:`route` splits a list of items, giving every punctuation
    and marker to every partition.

    >>> from replistream import Query
    >>> q = Query(); a = q.source("a", {"k": "i8"}); b = q.source("b", {"key": "i4"})
    >>> _ = a.join(b, window=5, left_key="k", right_key="key", name="j").sink("out"); q = q.build()
    >>> r = Router(q, "j", BinMap.even(3, bits=6))
    >>> left = q.schema_of("a").from_columns({"ts": [1, 2], "k": [5, 6]}, ids=[1, 2])
    >>> right = q.schema_of("b").from_columns({"ts": [1, 2], "key": [5, 6]}, ids=[3, 4])
    >>> r.partition_of(0, left).tolist() == r.partition_of(1, right).tolist()   # a key meets itself
    True
    >>> [len(x) for x in r.route(0, [left, Punctuation(2)])]   # the punctuation reaches all three
    [2, 1, 2]
    """

    def __init__(self, query, node: str, binmap: BinMap, moves: Iterable["Switch"] = ()):
        self.node = node
        self.by = partition_key(query, node, applications=True)  # an application: by tuple id
        self.binmap = binmap
        #: the rescales so far, in order (:class:`Switch`): from each one's time on, per bin, the
        #: tuples go to that rescale's owner
        self.moves: tuple[Switch, ...] = tuple(moves)
        for m in self.moves:
            if len(m.owner) != len(binmap.owner):
                raise ValueError(f"a switch of {len(m.owner)} bins on a map of {len(binmap.owner)}")
        self._logic = query.build_logic(node) if self.by == "key" else None

    @property
    def partitions(self) -> int:
        return max([self.binmap.partitions, *(m.partitions for m in self.moves)])

    def final(self) -> BinMap:
        """The bin map for tuples later than every switch (the owners after the last rescale)."""
        return self.binmap if not self.moves else BinMap(self.moves[-1].owner, self.moves[-1].partitions)

    def key_hash(self, port: int, batch: np.ndarray) -> np.ndarray:
        """The 64-bit hash whose top bits are each tuple's bin: the operator's key hash (the
        one its state is binned by), or the mixed tuple id for a stateless operator."""
        if self._logic is None:
            return fmix(batch[ID])
        return self._logic.bin_keys(port, batch)

    def bins(self, port: int, batch: np.ndarray) -> np.ndarray:
        """Each tuple's bin."""
        return bin_of(self.key_hash(port, batch), self.binmap.bits)

    def partition_of(self, port: int, batch: np.ndarray) -> np.ndarray:
        """Each tuple's partition (int64): its bin's owner, or after a rescale's switch time for
        its bin (``ts > at[bin]``), that rescale's owner."""
        bins = self.bins(port, batch)
        owner = self.binmap.owner[bins]
        if self.moves:
            ts = batch[TS]
            for m in self.moves:
                owner = np.where(ts > m.at[bins], m.owner[bins], owner)
        return owner

    def split(self, port: int, batch: np.ndarray) -> list[np.ndarray]:
        """``batch`` cut into one batch per partition (some empty), each keeping ``batch``'s order."""
        p = self.partitions
        if not len(batch):
            return [batch[:0]] * p
        part = self.partition_of(port, batch)
        first = int(part[0])
        if (part == first).all():  # common with few keys per batch: no copy
            return [batch if i == first else batch[:0] for i in range(p)]
        order = np.argsort(part, kind="stable")
        cuts = np.cumsum(np.bincount(part, minlength=p))[:-1]
        return np.split(batch[order], cuts)

    def route(self, port: int, items: Iterable) -> list[list]:
        """Per partition, the items it receives: each batch's share of tuples (empty shares left
        out), and every punctuation and marker."""
        p = self.partitions
        out: list[list] = [[] for _ in range(p)]
        for it in items:
            if isinstance(it, np.ndarray):
                for i, part in enumerate(self.split(port, it)):
                    if len(part):
                        out[i].append(part)
            else:  # Punctuation, Marker: every partition
                for lst in out:
                    lst.append(it)
        return out


def parallelism_from_options(items, bits: int, query) -> dict[str, int]:
    """The command lines' ``--parallelism OP=P`` (repeatable: ``items``) and ``--bits B``, checked
    against ``query``'s operators with :func:`check_parallelism`'s messages: ``{operator: p}`` with
    ``p >= 2``; any mistake a one-line ``ValueError`` naming the option and the fix (``replistream
    place`` and ``replistream sim`` print it as their error).

    >>> from replistream.workloads import fig1_query
    >>> parallelism_from_options(["correlate=2"], 4, fig1_query(n_servers=1))
    {'correlate': 2}
    >>> parallelism_from_options(["correlate"], 4, None)
    Traceback (most recent call last):
    ...
    ValueError: --parallelism takes OPERATOR=PARTITIONS, e.g. --parallelism correlate=2; got 'correlate'
    """
    if not 0 <= int(bits) <= 20:
        raise ValueError(f"--bits must be an integer from 0 to 20 (2**bits bins of keys), got {bits}")
    given: dict[str, int] = {}
    for item in items or ():
        name, sep, p = item.partition("=")
        if not sep or not name or not p.strip().lstrip("-").isdigit():
            raise ValueError(f"--parallelism takes OPERATOR=PARTITIONS, e.g. --parallelism correlate=2; got {item!r}")
        if name in given:
            raise ValueError(f"--parallelism names {name!r} twice; give each operator once")
        given[name] = int(p)
    if not given:
        return {}
    try:
        return check_parallelism(query, given, bits)
    except (QueryError, ValueError) as e:
        msg = str(e)
        msg = msg[len("parallelism: "):] if msg.startswith("parallelism: ") else msg
        more = " (or raise --bits)" if " bins (2**" in msg else ""
        raise ValueError(f"--parallelism: {msg}{more}") from None


def node_parallelism_from_options(items, bits: int, query) -> dict[str, int]:
    """The command lines' ``--parallelism NODE=P`` (repeatable: ``items``) and ``--bits B``, where
    NODE is an operator (:func:`parallelism_from_options`), ``entry`` (the entry points'
    partitions) or one of ``query``'s applications (its partitions): ``{node: p}`` with ``p >= 2``
    (one partition is the node as it is); any mistake a one-line ``ValueError`` naming the option
    and the fix (``replistream place`` and ``replistream sim fig3/fig4`` print it as their error).

    >>> from replistream.workloads import fig1_query
    >>> node_parallelism_from_options(["entry=2", "alerts=3", "correlate=2"], 4, fig1_query(n_servers=1))
    {'entry': 2, 'correlate': 2, 'alerts': 3}
    >>> node_parallelism_from_options(["alerts=two"], 4, fig1_query(n_servers=1))
    Traceback (most recent call last):
    ...
    ValueError: --parallelism takes NODE=PARTITIONS, e.g. --parallelism alerts=2; got 'alerts=two'
    """
    apps = set(query.sinks) if query is not None else set()
    operators, others = [], {}
    for item in items or ():
        name, sep, p = item.partition("=")
        if name != ENTRY and name not in apps:
            operators.append(item)
            continue
        if not sep or not p.strip().lstrip("-").isdigit():
            raise ValueError(f"--parallelism takes NODE=PARTITIONS, e.g. --parallelism {name}=2; got {item!r}")
        if name in others:
            raise ValueError(f"--parallelism names {name!r} twice; give each node once")
        others[name] = int(p)
    out = parallelism_from_options(operators, bits, query)  # (--bits checked even without --parallelism)
    try:
        entry, others = entry_parallelism(others)
        out.update(check_parallelism(query, others, bits, applications=True) if others else {})
    except (QueryError, ValueError) as e:
        msg = str(e)
        raise ValueError(msg if msg.startswith("--") else f"--parallelism: {msg.removeprefix('parallelism: ')}") from None
    return {**({ENTRY: entry} if entry > 1 else {}), **out}
