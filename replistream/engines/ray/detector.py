"""The failure detector for slowness: a replica that stops answering is masked like one that crashed.

Hwang's fault model (§II-B) masks a crashed replica because its peers carry the
same streams; over a wide-area network the common fault is not a crash but a
replica that stops answering (a stopped process, a suspended VM, a host
swapping). This detector turns "not answering" into a failure with two bounds:

* **suspected** after ``suspect_after_s`` without progress while a peer of the
  same node progresses: nothing waits on it any more (the feeder goes on
  without it, results and dead letters are taken from its peers);
* **declared failed** after ``fail_after_s`` while a peer progresses *and has
  gone past it* (a logical position further than the one it last reported:
  the punctuation an operator replica reached, the chunks an entry replica
  took; one that never answered is behind a peer that moved since its own first
  report, so a slow actor start is not a failure before anything flowed).
  A replica that answers its probes but is busy in one call gets, on top, twice
  the longest call a peer past it was seen in lately: that peer took that long
  for the same work (a punctuation that released a large backlog at once). Then it is
  treated exactly as a crash (killed, so anything it would send later
  is fenced off, its links dropped, repaired with ``repair=True``). A user
  function that hangs on some rows hangs every replica at the same position,
  so a replica that merely reached those rows first is never declared failed
  because its peers are still behind.

Progress is read from probes the replica answers on a thread of its own (a
concurrency group apart from the data path, so a healthy replica with a long
input queue answers at once): a probe not answered for a while (a stopped or
frozen process), or a replica whose current call has run for a while (a user
function that never returns), makes no progress. "While a peer progresses"
keeps a machine that is slow as a whole, or a node whose every replica is slow
(nothing to mask with), from being declared failed: then the run's own timeout
names what holds it back.

A replica's peers are its copies: the replicas of its node, or for a partitioned node
(``parallelism={node: p}``, labels ``node.P#R``) the replicas of its partition only. Replicas of
two partitions carry different shares of the stream, so their positions (an application's
tuples delivered, above all) do not compare, and one partition progressing masks nothing of
another's.

The detector is plain bookkeeping, no Ray and no clock of its own (callers pass
``now``), so the process that owns the control loop can host it.

>>> d = FailureDetector(suspect_after_s=1.0, fail_after_s=3.0)
>>> for r in ("f#0", "f#1"):
...     d.watch(r, "f", now=0.0)
>>> d.answered("f#1", now=2.0, position=3); d.asked("f#0", now=0.1)
>>> [(v.label, v.state) for v in d.check(now=2.0)]
[('f#0', 'suspected')]
>>> d.answered("f#1", now=3.5, position=7); [(v.label, v.state) for v in d.check(now=3.5)]
[('f#0', 'failed')]
>>> d.is_suspected("f#0"), d.is_suspected("f#1")
(True, False)
"""
from __future__ import annotations

from dataclasses import dataclass

from ...plan import label_group

__all__ = ["FailureDetector", "Verdict", "DEFAULT_SUSPECT_AFTER_S", "DEFAULT_FAIL_AFTER_S"]

#: Default suspicion bound (seconds). A healthy replica answers a probe on a thread of its own,
#: so only CPU starvation delays the answer; ``bench/slowness.py`` records the slowest answer of
#: a healthy replica in each run (``slowest_probe_answer_s``, docs/benchmarks.md). 1.5 s stops the
#: feeder and the result fetches from waiting on a stopped replica well before anything backs up.
DEFAULT_SUSPECT_AFTER_S = 1.5

#: Default bound to declare a silent replica failed (seconds). Hwang's detection time trades
#: availability against false failures: the emulated WAN's latency spikes never delay a probe
#: (probes do not cross emulated links), so the bound guards only against CPU starvation of a
#: healthy process; a false declaration costs one replica (repaired with ``repair=True``), never
#: output, and only happens while a peer has gone past the silent replica.
DEFAULT_FAIL_AFTER_S = 4.0

#: A replica busy in one call (it answers its probes) is declared failed only after
#: ``fail_after_s`` plus this many times the longest call a peer past it was seen in lately
#: (:meth:`FailureDetector.fail_limit_s`): the same heavy call runs on both, one on a busier core.
PEER_CALL_FACTOR = 2.0

#: Seconds a replica's longest call counts for that (its peak is forgotten at its next answer after).
PEAK_KEEP_S = 60.0


@dataclass
class Verdict:
    """A change of a replica's state: ``"suspected"``, ``"failed"`` or ``"cleared"`` (answers again
    before being declared failed), with the silence that caused it (seconds)."""

    label: str
    node: str
    state: str
    silent_s: float


@dataclass
class _Watch:
    node: str
    group: str  # its copies: the node, or ``node.P`` for partition P of a partitioned node (_peer_group)
    last_answer: float
    asked: float | None = None  # when the outstanding probe was sent (None: none outstanding)
    busy_s: float = 0.0  # how long its current call had run at its last answer
    state: str = "ok"  # ok | suspected | failed
    position: int | None = None  # its logical position at its last answer (None: never reported)
    first_position: int | None = None  # its position at its first answer that had one
    slowest_s: float = 0.0  # the longest a probe of it waited for its answer
    pending: bool = False  # still waiting for its state (a hand-over, a transfer): not a progressing peer
    heard: bool = False  # answered a probe since it was watched: only then can it be a progressing peer
    peak_s: float = 0.0  # the longest call it was seen in lately (busy_s), and when (kept PEAK_KEEP_S)
    peak_at: float = 0.0


class FailureDetector:
    """Suspects and declares failed replicas that make no progress while a peer does (module doc).

    ``watch(label, node, now)`` starts watching a replica (its node groups it with its
    peers), ``asked``/``answered`` record probes, ``forget`` stops watching (a replica
    killed, retired or failed), and ``check(now)`` returns the state changes since the last
    check. A replica declared failed stays failed (the caller kills it)."""

    def __init__(self, suspect_after_s: float = DEFAULT_SUSPECT_AFTER_S,
                 fail_after_s: float = DEFAULT_FAIL_AFTER_S):
        self.suspect_after_s, self.fail_after_s = check_bounds(suspect_after_s, fail_after_s)
        self.watches: dict[str, _Watch] = {}

    def watch(self, label: str, node: str, now: float) -> None:
        """Start watching ``label`` (a replica of ``node``; of its partition ``P`` when the label is
        ``node.P#R``), as if it had just answered (its silence counts from ``now``); it is a peer
        that progresses only once it really answers."""
        if label not in self.watches:
            self.watches[label] = _Watch(node, _peer_group(label, node), last_answer=now)

    def forget(self, label: str) -> None:
        """Stop watching ``label``."""
        self.watches.pop(label, None)

    def asked(self, label: str, now: float) -> None:
        """A probe was sent to ``label`` (ignored while one is outstanding)."""
        w = self.watches.get(label)
        if w is not None and w.asked is None:
            w.asked = now

    def outstanding(self, label: str) -> bool:
        """Whether ``label`` has a probe not answered yet."""
        w = self.watches.get(label)
        return w is not None and w.asked is not None

    def answered(self, label: str, now: float, busy_s: float = 0.0, position: int | None = None,
                 pending: bool = False) -> None:
        """``label`` answered its probe at ``now``; ``busy_s``: how long its current call had been
        running (0 when idle between calls); ``position``: its logical position (larger is
        further; comparable among the replicas of one node, or of one partition); ``pending``: it still waits for its
        state (a new replica during a hand-over or a transfer), so it is no peer that progresses."""
        w = self.watches.get(label)
        if w is None:
            return
        if w.asked is not None:
            w.slowest_s = max(w.slowest_s, now - w.asked)
        w.last_answer, w.asked, w.busy_s, w.pending = now, None, float(busy_s or 0.0), bool(pending)
        if w.busy_s >= w.peak_s or now - w.peak_at > PEAK_KEEP_S:
            w.peak_s, w.peak_at = w.busy_s, now
        w.heard = True
        if position is not None:
            w.position = int(position)
            if w.first_position is None:
                w.first_position = w.position

    def silent_s(self, label: str, now: float) -> float:
        """Seconds ``label`` has made no progress: since its last answer while a probe is
        outstanding, or how long its current call had run (the larger)."""
        w = self.watches[label]
        silence = 0.0 if w.asked is None else max(0.0, now - w.last_answer)
        return max(silence, w.busy_s)

    def slowest_answers(self) -> dict[str, float]:
        """Per replica watched, the longest a probe waited for its answer (seconds): how close
        healthy replicas come to the bounds (``answered`` times are the caller's, so they include
        how often it looks).

        >>> d = FailureDetector(); d.watch("f#0", "f", 0.0); d.asked("f#0", 1.0); d.answered("f#0", 1.2)
        >>> round(d.slowest_answers()["f#0"], 3)
        0.2
        """
        return {label: w.slowest_s for label, w in self.watches.items()}

    def is_suspected(self, label: str) -> bool:
        """Whether nothing should wait on ``label`` (suspected or declared failed)."""
        w = self.watches.get(label)
        return w is not None and w.state != "ok"

    def suspected(self) -> list[str]:
        """Every replica suspected or declared failed, in watch order."""
        return [label for label, w in self.watches.items() if w.state != "ok"]

    def resume(self, now: float) -> None:
        """The caller could not look for a while (its own thread was held up): what it did not see
        is not the replicas' silence. Outstanding probes count from ``now``.

        >>> d = FailureDetector(1, 2); d.watch("f#0", "f", 0.0); d.asked("f#0", 0.1); d.resume(9.0)
        >>> d.silent_s("f#0", 9.5)
        0.5
        """
        for w in self.watches.values():
            if w.asked is not None:
                w.last_answer = max(w.last_answer, now)

    def check(self, now: float) -> list[Verdict]:
        """The state changes at ``now``: replicas newly suspected or declared failed (only while a
        peer of the same node, or of the same partition, makes progress), and suspected ones
        answering again."""
        silent = {label: self.silent_s(label, now) for label in self.watches}
        progressing: dict[str, list[_Watch]] = {}
        for label, w in self.watches.items():
            # a replica just watched has said nothing yet (a new one may still wait for its state): it
            # is no evidence that the node progresses until it answers, whatever the grace of its watch
            if w.state != "failed" and w.heard and not w.pending and silent[label] < self.suspect_after_s:
                progressing.setdefault(w.group, []).append(w)
        out = []
        for label, w in self.watches.items():
            s = silent[label]
            if w.state == "failed":
                continue
            if s < self.suspect_after_s:
                if w.state == "suspected":
                    w.state = "ok"
                    out.append(Verdict(label, w.node, "cleared", s))
                continue
            peers = progressing.get(w.group)
            if not peers:
                continue  # no peer progresses: nothing to mask with (the run's timeout names it)
            ahead = [p for p in peers if _ahead(p, w)]
            if ahead and s >= self.fail_limit_s(w, ahead, now):
                w.state = "failed"
                out.append(Verdict(label, w.node, "failed", s))
            elif w.state == "ok":
                w.state = "suspected"
                out.append(Verdict(label, w.node, "suspected", s))
        return out

    def fail_limit_s(self, w: _Watch, ahead: list[_Watch], now: float) -> float:
        """How long ``w`` may make no progress before it is declared failed, ``ahead`` being its
        peers past it: ``fail_after_s`` when its probes go unanswered (a stopped process, a frozen
        host); when it answers but is busy in one call, ``fail_after_s`` plus ``PEER_CALL_FACTOR``
        times the longest call one of those peers was seen in lately. A peer that went past it
        through a call of several seconds (a punctuation that released a large backlog at once)
        shows that such a call is the work, not a hang: the replica doing the same work on a
        busier core is not killed for it, while one that hangs in a call its peers passed quickly
        still is.

        >>> d = FailureDetector(1.0, 4.0)
        >>> for label in ("f#0", "f#1"): d.watch(label, "f", 0.0)
        >>> d.answered("f#1", 5.0, busy_s=5.0, position=1); d.answered("f#1", 5.5, position=2)
        >>> d.answered("f#0", 6.0, busy_s=6.0, position=1)   # the same call, on a busier core
        >>> d.fail_limit_s(d.watches["f#0"], [d.watches["f#1"]], 6.0)
        14.0
        >>> [v.state for v in d.check(6.0)]
        ['suspected']
        """
        if w.asked is not None and now - w.last_answer >= self.fail_after_s:
            return self.fail_after_s
        return self.fail_after_s + PEER_CALL_FACTOR * max(p.peak_s for p in ahead)


def _ahead(peer: _Watch, w: _Watch) -> bool:
    """Whether ``peer`` is further than ``w``: by position; a peer that reports none is (its answers
    are its progress). A replica that never reported a position (it has not answered yet: a slow
    actor start on loaded cores) is behind only a peer that moved since its own first report, so a
    replica is not declared failed for starting slower than its peers before anything flowed."""
    if peer.position is None:
        return True
    if w.position is None:
        return peer.first_position is not None and peer.position > peer.first_position
    return peer.position > w.position


def _peer_group(label: str, node: str) -> str:
    """The copies ``label`` is compared with: ``"out.1"`` for ``"out.1#0"``, partition 1 of the
    partitioned node ``out`` (its replicas alone carry that partition's share), else ``node``.

    >>> _peer_group("out.1#0", "out"), _peer_group("out#1", "out"), _peer_group("f.2#0", "f")
    ('out.1', 'out', 'f.2')
    """
    group = label_group(label)
    base, dot, part = group.rpartition(".")
    return group if dot and base == node and part.isdigit() else node


def check_bounds(suspect_after_s, fail_after_s) -> tuple[float, float]:
    """Validate the detector's bounds (seconds, ``0 < suspect_after_s <= fail_after_s``).

    >>> check_bounds(1, 2)
    (1.0, 2.0)
    >>> check_bounds(3, 2)
    Traceback (most recent call last):
    ...
    ValueError: suspect_after_s (3) must be > 0 and at most fail_after_s (2)
    """
    for name, v in (("suspect_after_s", suspect_after_s), ("fail_after_s", fail_after_s)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v == v or v <= 0 or v == float("inf"):
            raise ValueError(f"{name} must be a number of seconds > 0, got {v!r}")
    if suspect_after_s > fail_after_s:
        raise ValueError(f"suspect_after_s ({suspect_after_s}) must be > 0 and at most fail_after_s ({fail_after_s})")
    return float(suspect_after_s), float(fail_after_s)
