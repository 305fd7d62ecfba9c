"""Who hands state over to a new replica, and which extra feeders it needs (docs/design.md,
decision 7; Hwang §V-C; docs/handover.md).

A new (or revived) replica subscribes to the live upstream replicas, which
replay their retained output, then installs a live peer's checkpoint, which
reflects everything up to the peer's maximum punctuation ``p`` on each input
port. Everything above ``p`` must reach the new replica by replay or later
sends, so on every port one of its feeders must also feed the peer: that
feeder's retained output then holds every tuple above the peer's ``p``.

These are pure decisions over :class:`~replistream.gc.StreamReplica` records
(``src``, ``dst``, ``port``, ``live``, ``stream``), shared by every engine that
hands replicas over:

* :func:`shares_feeders`: whether a replica already has a feeder of the peer on
  every port the peer is fed on;
* :func:`rank_peers`: candidate peers, those sharing feeders first;
* :func:`missing_feeders`: the stream replicas to open so that it shares them.

>>> from replistream.gc import StreamReplica as S
>>> streams = [S("entry#0", "f#0"), S("entry#1", "f#1"), S("entry#0", "f#2")]
>>> rank_peers("f#2", ["f#1", "f#0"], streams)
['f#0', 'f#1']
>>> [s.id for s in missing_feeders(streams, "f#2", "f#1")]
['entry#1->f#2:0']
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

__all__ = ["missing_feeders", "rank_peers", "shares_feeders"]


def shares_feeders(streams: Sequence, label: str, peer: str) -> bool:
    """True when, on every input port ``peer`` has a live feeder, one of them also feeds ``label``.

    >>> from replistream.gc import StreamReplica as S
    >>> shares_feeders([S("a", "x"), S("b", "y"), S("a", "y", port=1)], "x", "y")
    False
    """
    feeders = {(s.src, s.port) for s in streams if s.live and s.dst == label}
    ports = {s.port for s in streams if s.live and s.dst == peer}
    return all(any((s.src, p) in feeders for s in streams if s.live and s.dst == peer and s.port == p)
               for p in ports)


def rank_peers(label: str, candidates: Iterable[str], streams: Sequence) -> list[str]:
    """``candidates`` (live peers able to give a checkpoint) in the order to ask them: those that
    share feeders with ``label`` (:func:`shares_feeders`) first, then by label.

    >>> from replistream.gc import StreamReplica as S
    >>> rank_peers("x", ["z", "y"], [S("a", "x"), S("a", "y"), S("b", "z")])
    ['y', 'z']
    """
    return sorted(candidates, key=lambda p: (not shares_feeders(streams, label, p), p))


def missing_feeders(streams: Sequence, label: str, peer: str) -> list:
    """The stream replicas into ``label`` to open so it shares every feeder of ``peer``: one per live
    stream replica into ``peer`` whose (source, port) does not feed ``label`` yet, with its rate and
    latency, live, weight 0.

    >>> from replistream.gc import StreamReplica as S
    >>> [s.id for s in missing_feeders([S("a", "x"), S("a", "y"), S("b", "y")], "x", "y")]
    ['b->x:0']
    """
    feeders = {(s.src, s.port) for s in streams if s.live and s.dst == label}
    return [replace(s, dst=label, weight=0.0, live=True)
            for s in streams if s.live and s.dst == peer and (s.src, s.port) not in feeders]
