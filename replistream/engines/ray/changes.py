"""Requests that change a running deployment: replicas revived, added, moved
(the control loop, :class:`~.control.ReplicaManager`), and changes to the running query
(:mod:`.reconfigure`, Bartnik §3).

>>> plane.reconfig.move_replica("counts", 0, "s3", strategy="fluid")   # doctest: +SKIP
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable

from . import reconfigure

__all__ = ["Changes"]

#: Seconds a change (or a rescale) issued right after a restore waits for the resumed feed to send
#: a chunk of every open source (:meth:`Changes._fed_since_resume`) before it is refused.
RESUME_WAIT_S = 60.0


class Changes:
    """Requests that change a running deployment: replicas revived, added, moved

    >>> plane.reconfig.move_replica("counts", 0, "s3", strategy="fluid")   # doctest: +SKIP
    """

    def __init__(self, plane):
        self.plane = plane  # the :class:`~.plane.ControlPlane` this part belongs to
        #: held while a change of the running query or a rescale is made: neither starts meanwhile
        self._changing = threading.Lock()

    def revive_replica(self, operator: str, replica: int, strategy: str | None = None,
                       bins_per_step: int | None = None, bits: int | None = None,
                       pause_ms: float = 20.0, lag_ms: float | None = None) -> dict:
        """Replace replica ``replica`` of ``operator`` (running or crashed) by a new replica on the same
        server, built by hand-over from a live peer (docs/design.md, decision 7, Hwang §V-C); returns the event.

        ``strategy`` (``"all-at-once"``, ``"batched"``, ``"fluid"``) moves the checkpoint in steps of
        ``2**bits`` bins at the peer's punctuations (Megaphone §3.3; docs/migration.md); at one
        punctuation the peer takes the next step, and more while its pause stays within
        ``pause_ms`` beyond a step's fixed cost (0: one step per punctuation), holding a step back
        while its output lags more than ``lag_ms`` above its recent minimum (see :meth:`move_replica`).

        >>> dep.revive_replica("correlate", 0)["new_replicas"][0]["label"]   # doctest: +SKIP
        'correlate#2'
        """
        return self.plane.control_loop().handover.replace_replica(f"{operator}#{replica}", strategy=strategy,
                                                         bins_per_step=bins_per_step, bits=bits, pause_ms=pause_ms,
                                                         lag_ms=lag_ms)

    def add_replica(self, operator: str, strategy: str | None = None, bins_per_step: int | None = None,
                    bits: int | None = None, pause_ms: float = 20.0, lag_ms: float | None = None) -> dict:
        """Add a replica of ``operator`` (on the server Algorithm 5 picks) by hand-over from a live peer
        (``strategy`` as for :meth:`revive_replica`).

        >>> dep.add_replica("correlate")["action"]   # doctest: +SKIP
        'create-replica'
        """
        first = next((r.label for r in self.plane.topology.replicas(operator)), None)
        if first is None:
            raise ValueError(f"{operator!r} is not an operator of query {self.plane.query.name!r}")
        return self.plane.control_loop().handover.replace_replica(first, add=True, strategy=strategy, bins_per_step=bins_per_step,
                                                         bits=bits, pause_ms=pause_ms, lag_ms=lag_ms)

    def move_replica(self, operator: str, replica: int, server: str, strategy: str = "all-at-once",
                     bins_per_step: int | None = None, bits: int | None = None, pause_ms: float = 20.0,
                     lag_ms: float | None = None) -> dict:
        """Move replica ``replica`` of ``operator`` to ``server`` while the query runs: a new replica
        there takes the state in steps (Megaphone §3.3: ``"all-at-once"``, ``"batched"`` with
        ``bins_per_step``, ``"fluid"``; ``2**bits`` bins, default 256) from a live peer (the
        replica itself if it is the only one) that keeps serving between steps, taking at one
        punctuation as many steps as keep its pause within ``pause_ms`` beyond a step's fixed
        cost (0: one step per punctuation), and holding a step back while its output lags more than
        ``lag_ms`` (default ``max(pause_ms, 10)``) above its recent minimum (pacing by the live path,
        docs/migration.md); then the old replica retires. Returns the logged event (``handover`` has
        the transfer's figures).

        >>> ev = dep.move_replica("counts", 0, "s3", strategy="fluid", bits=6)   # doctest: +SKIP
        >>> ev["new_replicas"][0]["server"], ev["handover"]["counts#1"]["steps"]   # doctest: +SKIP
        ('s3', 64)
        """
        label = f"{operator}#{replica}"
        if self.plane.topology.handle(label) is None:
            raise ValueError(f"no replica {label!r}")
        if not self.plane.topology.is_running(label):
            raise ValueError(f"{label} is not running; revive it with revive_replica")
        return self.plane.control_loop().handover.replace_replica(label, server=server, strategy=strategy or "all-at-once",
                                                         bins_per_step=bins_per_step, bits=bits, pause_ms=pause_ms,
                                                         lag_ms=lag_ms)

    def rescale(self, operator: str, p: int, strategy: str = "fluid", bins_per_step: int | None = None,
                gap_ms: float | None = None, timeout: float = 300.0) -> dict:
        """Run partitioned ``operator`` as ``p`` partitions from now on, moving bins of its key space
        from the old partitions to the new ones (or, for fewer, from the partitions that go to
        those that stay) while the query runs (Megaphone §3.3): each bin's
        tuples after a logical time go to its new owner, which starts from the old owner's state
        of that bin at that time; every replica of the old owner sends it, the new owner's
        replicas install the first copy. ``strategy``: ``"fluid"`` (one bin per step, the steps
        ``gap_ms`` of event time apart; with no ``gap_ms`` and a paced feed, in waves each cut
        once the last is installed, the gap set by how fast the last one's bins moved: the
        record's ``waves``; unpaced, 1 ms), ``"batched"`` (``bins_per_step`` bins per step; by default the moving bins in about 16
        steps) or
        ``"all-at-once"`` (every bin at one time). Returns the change's record once every step
        is installed (``steps``, ``bins_moved``, ``new_replicas``, ``retired_replicas``,
        ``seconds``); the operator must have been deployed partitioned (``parallelism={op: 1}`` or
        more). Fewer partitions: once their bins are installed elsewhere, the leaving partitions'
        replicas retire (closed, disconnected, forgotten: ``dep.removed``; :mod:`.rescale`); the
        staying ones keep their labels.

        >>> dep.rescale("per_key", 2, strategy="fluid")["bins_moved"]   # doctest: +SKIP
        2048
        >>> dep.partitions("per_key")                                    # doctest: +SKIP
        2
        >>> dep.rescale("per_key", 1, strategy="all-at-once")["retired_replicas"]   # doctest: +SKIP
        ['per_key.1#0', 'per_key.1#1']
        """
        from . import rescale

        entry_parts = int(self.plane.channel_opts.get("entry_partitions") or 1)
        if operator == "entry" or entry_parts > 1:
            raise ValueError("rescale() does not yet run " + ("on the entry points" if operator == "entry" else
                             f"beside entry partitions (entry: {entry_parts})") + "; deploy with "
                             "parallelism={'entry': p} for the entry partitions you want, or without it to rescale")
        gone = {n for c in self.plane.changes if c.get("change") == "remove_operator" for n in c.get("removed", ())}
        if operator in gone:
            raise ValueError(f"rescale(): {operator!r} was removed from the running query (remove_operator); there "
                             f"is nothing left to rescale")
        with self._exclusive("rescale", change=False):
            return rescale.rescale(self.plane, operator, p, strategy, bins_per_step,
                                   gap_us=None if gap_ms is None else max(1, int(gap_ms * 1000)), timeout=timeout)

    def partitions(self, operator: str) -> int:
        """How many partitions ``operator`` runs as now (1: not partitioned; ``"entry"``: the entry
        points' partitions, ``parallelism={"entry": p}``).

        >>> dep.partitions("per_key")   # doctest: +SKIP
        4
        """
        from . import rescale

        if operator == "entry":
            return int(self.plane.channel_opts.get("entry_partitions") or 1)

        return rescale.partitions(self.plane, operator)

    def _partitions_allow(self, what: str) -> None:
        """Refuse, in one line and before anything changes, a change of the running query that does
        not yet run beside partitions: on a partitioned application (``parallelism={app: p}``: a
        removal retires operator replicas only, and an application's replicas are not grouped
        by partition in a plan of the changed query yet; deploy it unpartitioned), or while a
        rescale moves bins (its new partitions are built from the query and topology a change
        rewrites; call again once it returned). Partitioned operators and entry partitions are
        fine: every sender gives a marker to every partition
        (:meth:`~replistream.partition.Router.route`, :class:`~replistream.operators.entry.EntrySplit`)."""
        parts = dict(self.plane.channel_opts.get("partitions") or {})
        query = self.plane.query
        apps = sorted(n for n in parts if query.has_node(n) and query.spec(n).kind == "sink")
        if apps:
            raise ValueError(f"{what}() does not yet run on a deployment with partitioned applications "
                             f"({', '.join(f'{n}: {parts[n]}' for n in apps)}); deploy them unpartitioned to change "
                             f"the running query")
        if self.plane.rescaling.is_set() or self._changing.locked():
            raise RuntimeError(f"{what}() cannot run while a rescale moves bins or another change is made; "
                               f"call it again once that has returned")

    @contextmanager
    def _exclusive(self, what: str, change: bool = True):
        """Run a change of the running query (``change``) or a rescale alone: refused in one line if
        another one or a rescale runs (a rescale reads the query and topology a change rewrites).
        Right after a restore it first waits for the resumed feed (:meth:`_fed_since_resume`)."""
        if change:
            self._partitions_allow(what)
        if not self._changing.acquire(blocking=False):
            raise RuntimeError(f"{what}() cannot run while a rescale moves bins or another change is made; "
                               f"call it again once that has returned")
        try:
            self._fed_since_resume(what)
            yield
        finally:
            self._changing.release()

    def _fed_since_resume(self, what: str, limit: float | None = None) -> None:
        """After a restore (a detached deployment's host lost, :mod:`.lifecycle`): wait, at most
        ``limit`` s (:data:`RESUME_WAIT_S`), until the resumed feed has sent a chunk of every open
        source (:meth:`~.feeder.Feeder.unsent_since_resume`), so that the change's time is past
        everything the lost host fed (:meth:`~.feeder.Feeder.marker_time`, which refuses in one line
        naming the sources if the wait ran out). Logs a ``change_waits_for_feed`` event when it waits."""
        feeder = self.plane.feeder
        behind = feeder.unsent_since_resume()
        if not behind:
            return
        self.plane.events.append({"t": self.plane.now(), "event": "change_waits_for_feed", "change": what,
                                  "sources": behind})
        deadline = time.time() + (RESUME_WAIT_S if limit is None else limit)
        wake = threading.Event()
        while behind and time.time() < deadline and not self.plane.shut_down:
            wake.wait(0.005)
            behind = feeder.unsent_since_resume()

    def transfers(self) -> list[dict]:
        """Progress of every staged state transfer (strategy, steps done of all, peer, restarts, times)."""
        return [] if self.plane.manager is None else [dict(t) for t in self.plane.manager.transfers]

    def gc_events(self) -> list[dict]:
        """Every garbage-collection and revival decision so far, with reason and figures (JSON-ready)."""
        return [] if self.plane.manager is None else list(self.plane.manager.events)

    def network_cost_history(self) -> list[dict]:
        """Network cost (and theta, live stream replicas, worst input delay) per utility period."""
        return [] if self.plane.manager is None else list(self.plane.manager.history)

    # -- changing the running query (Bartnik §3; replistream.replica.changes) -----------------------
    def replace_function(self, operator: str, fn: Callable) -> dict:
        """Give Filter/Map/FlatMap ``operator`` a new function for every tuple with ``ts > p``,
        where ``p`` is the largest timestamp fed so far; returns the change's record (with ``p``).

        A marker carries the change through the running replicas (Bartnik §3); the
        output equals a reference run of ``dep.query``, which now holds both
        functions (:class:`~replistream.replica.changes.TimeSwitch`).

        With partitioned operators (``parallelism={op: p}``) the marker reaches every replica of
        every partition (routers give markers to every partition), so a partitioned operator's
        replicas all switch at ``p`` too; so do entry partitions (``parallelism={"entry": p}``).
        Refused in one line, before anything changes: with a partitioned application, while a
        rescale moves bins or another change is made (:meth:`_partitions_allow`).

        >>> dep.replace_function("hot", lambda b: b["cpu"] > 0.9)["p"]   # doctest: +SKIP
        15000000
        """
        with self._exclusive("replace_function"):
            return reconfigure.replace_function(self.plane, operator, fn)

    def add_operator(self, upstream: str, build: Callable, servers=None) -> dict:
        """Add operators and their application(s) reading stream ``upstream``; they see its
        tuples with ``ts > p`` (``p``: the largest timestamp fed so far). ``build(stream)``
        adds them with the usual :class:`~replistream.query.Stream` methods. Each new
        operator gets ``k`` replicas on distinct servers, by default those of ``upstream``'s
        running replicas (then other servers, in order, if they are fewer than ``k``). The new
        operators are not partitioned; reading a partitioned operator's stream (or a source, with
        entry partitions), each new replica receives from every running replica of every
        partition (a channel group per partition,
        so its punctuation is the one every partition has promised); a partition with no running
        replica is refused, naming it. Refused as :meth:`replace_function` is.

        >>> dep.add_operator("load", lambda s: s.filter(lambda b: b["cpu"] > 0.9, name="very_hot")
        ...                  .sink("very_hot_alerts"))["added"]                      # doctest: +SKIP
        ['very_hot', 'very_hot_alerts']
        """
        with self._exclusive("add_operator"):
            return reconfigure.add_operator(self.plane, upstream, build, servers)

    def remove_operator(self, operator: str) -> dict:
        """Remove ``operator`` and the part of the query only it feeds: it sees its input up to
        ``p`` (the largest timestamp fed so far), then its inputs close, its windows flush and
        its applications complete; its replicas are then stopped (``changes[-1]["retired"]``):
        a partitioned operator's, every partition's (``agg.0#0``, ``agg.1#0``, ...). Refused as
        :meth:`replace_function` is.

        >>> dep.remove_operator("load_per_minute")["removed"]      # doctest: +SKIP
        ['load_per_minute', 'load_stats']
        """
        with self._exclusive("remove_operator"):
            return reconfigure.remove_operator(self.plane, operator)

    def set_replication(self, operator: str, k: int) -> dict:
        """Run ``k`` live replicas of ``operator``: new ones by hand-over from a live peer,
        surplus ones discarded (their stream replicas first).

        A partitioned operator gets ``k`` live replicas in *every* partition: each partition's new
        replicas by hand-over from a live peer of that partition (the only replicas holding its
        keys' state), its surplus discarded among its own. Per partition, because a partition's
        replicas are the copies of one another (``deploy(k=, parallelism=)`` gives each partition
        ``k``, and each masks ``k - 1`` losses of its own); a total over partitions, which hold
        disjoint keys, would say nothing about fault tolerance. A partition with no live replica is
        refused, naming it. Refused as :meth:`replace_function` is.

        >>> dep.set_replication("correlate", 3)["added"]      # doctest: +SKIP
        ['correlate#2']
        >>> dep.set_replication("per_key", 2)["added"]        # doctest: +SKIP
        ['per_key.0#1', 'per_key.1#1']
        """
        with self._exclusive("set_replication"):
            return reconfigure.set_replication(self.plane, operator, k)
