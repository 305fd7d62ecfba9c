"""Feeding a deployment: the inputs given to ``feed()``, the run clock, sentinels.

:class:`Ingest` checks the inputs, starts the :class:`~.feeder.Feeder`, gives every replica the
clock once the first timestamp is known, and resumes the feed from the entry replicas' positions
after the control plane was restored (:mod:`.lifecycle`).

>>> plane.ingest.feed({"load": rows}, pace=1.0)     # doctest: +SKIP
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Callable, Iterable

import numpy as np
import ray

from ...errors import QueryError, RunFailed
from ...idle import Heartbeat, idle_timeouts
from ...operators.base import NO_PUNCTUATION
from ...plan import ENTRY
from ...schema import END
from ...sources import Handed, Sentinel
from ..result import RunResult
from .common import READY_S

__all__ = ["Ingest"]


class Ingest:
    """Feeding a deployment: the inputs given to ``feed()``, the run clock, sentinels.

    >>> plane.ingest.feed({"load": rows}, pace=1.0)     # doctest: +SKIP
    """

    def __init__(self, plane):
        self.plane = plane  # the :class:`~.plane.ControlPlane` this part belongs to

    # -- feeding -------------------------------------------------------------------------------
    def feed(self, inputs: Mapping[str, Iterable], pace: float | None = None, chunk_size: int = 10_000,
             idle_timeout: float | Mapping[str, float] | None = None, chunk_ms: float | None = 20.0) -> None:
        """Start feeding ``inputs`` (``{source: iterable of chunks or records}``) in a background thread.

        With ``pace=s`` a tuple with timestamp ``ts`` is released at wall time
        ``t0 + (ts - ts0) / (1e6 * s)`` (``s=1``: real time), where ``ts0`` is
        the earliest first timestamp over the sources (so epoch timestamps
        replay from now); without it, as fast as the entry points take it.
        Records without ``ts`` are stamped by the feeder's clock (one clock
        for every entry replica). Inputs are cut into batches of at most
        ``chunk_size`` rows (:func:`~replistream.sources.iter_chunks`: a whole
        array or column mapping too), each one Ray call per entry replica; the
        result does not depend on it. Paced, a chunk is also cut into pieces that span at most
        ``chunk_ms`` of wall time (default 20 ms; None: no cut), each sent at its last row's
        time: no row leaves before its time, none waits longer than the span, and the batch size
        follows the rate (:func:`~replistream.sources.cut_by_time`). A row that lets a time window
        downstream close ends its piece, so it leaves at its own time: batching delays rows,
        never the close of a window. With k entry replicas the span is k x ``chunk_ms`` (each
        piece is a call to every entry replica, and each of those calls every downstream
        replica). While the deployment falls behind (pieces leave more than 4 spans
        late) the span doubles, up to 1 s, and it halves back once the replay keeps its schedule
        (:class:`~replistream.sources.AdaptiveCut`; ``feeder.cut.max_seen_ms`` tells how far it grew).

        An input may also be a source object with a ``bind(source, schema)``
        method, e.g. :class:`replistream.spark.SparkSource`: it is checked
        against the source's schema before anything is sent (a mismatch
        raises :class:`~replistream.errors.SchemaError` here) and then yields
        :class:`~replistream.sources.ChunkRef` s, chunks already in Ray's object
        store, which go to the entry points without passing through the driver.

        ``idle_timeout`` (seconds, for every source or ``{source: seconds}``): a source with
        nothing to send for that long no longer holds back the others (a join or a window
        behind it), and gets heartbeat punctuations while it stays quiet; a tuple it sends
        later at or below one is late and dead-lettered (:mod:`replistream.idle`). The
        heartbeats are logged (:meth:`heartbeats`); the reference of such a run is the ideal
        run over :func:`replistream.idle.with_heartbeats` of the same input.
        """
        if self.plane.shut_down:
            raise RuntimeError("this deployment was shut down: deploy the query again to run it")
        if self.plane.started:
            raise RuntimeError("this deployment has already been fed: a deployment runs its query once (its "
                               "replicas hold that run's state); deploy the query again for another run")
        unknown = set(inputs) - set(self.plane.query.sources)
        if unknown:
            raise QueryError(f"inputs given for unknown source(s) {sorted(unknown)}; sources are {self.plane.query.sources}")
        if pace is not None and pace <= 0:
            raise ValueError(f"pace must be > 0, got {pace}")
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a whole number of rows >= 1, got {chunk_size!r}")
        idle = idle_timeouts(idle_timeout, list(self.plane.query.sources))
        if chunk_ms is not None and not (isinstance(chunk_ms, (int, float)) and not isinstance(chunk_ms, bool)
                                         and 0 < chunk_ms < float("inf")):
            raise ValueError(f"chunk_ms must be a number of milliseconds > 0 or None, got {chunk_ms!r}")
        for src, data in inputs.items():
            if hasattr(data, "bind"):
                data.bind(src, self.plane.query.schema_of(src))
        if self.plane._persister is not None:  # kept before the first chunk: a new host process resumes from it
            self.plane._persister.fed({"inputs": dict(inputs), "pace": pace, "chunk_size": chunk_size, "idle": idle,
                                       "chunk_ms": chunk_ms})
        self.plane.speed = pace
        self.plane.t0 = time.time() + 0.05
        self.plane.tell({label: h.set_start.remote(self.plane.t0) for label, h in self.plane.topology.running()})
        self.plane.faults._broadcast_network()
        disorder = {src: self.plane.query.spec(src).max_disorder for src in self.plane.query.sources}
        self.plane.feeder.start(self.plane.query.sources, inputs, pace, chunk_size, self.plane.t0, idle=idle, disorder=disorder,
                                chunk_ms=chunk_ms, punct=self._punctuation_rules(), every=self._release_grids())
        if self.plane._persister is not None:
            # "fed" kept before feed() returns: a host lost after the caller was answered (who then
            # never sends the call again) is followed by one that resumes the feed; the state's
            # next periodic write was too late for that (the new host stood idle, never feeding)
            self.plane._persister.persist_now()

    def heartbeats(self) -> list[Heartbeat]:
        """The heartbeat punctuations put on idle sources so far (:class:`replistream.idle.Heartbeat`:
        source, position, punctuation, wall time); empty unless fed with ``idle_timeout``.

        >>> dep.run(inputs, idle_timeout=0.5); hb = dep.heartbeats()              # doctest: +SKIP
        >>> run_reference(dep.query, with_heartbeats(inputs, hb, chunk_size=10_000))  # doctest: +SKIP
        """
        return self.plane.feeder.heartbeats

    def _feed_started(self, ts0: float) -> None:
        """The feeder knows ``ts0``: the replicas get the clock they measure input delay with (Hwang
        §V-C), and the control loop, if any, starts."""
        self.plane.ts0 = ts0
        self.plane.t0 = self.plane.feeder.t0  # with a pace: the replay starts when the first chunks are there
        self.plane.tell({label: h.set_clock.remote(self.plane.t0, self.plane.ts0, self.plane.speed) for label, h in self.plane.topology.running()})
        if self.plane.manager is not None:
            self.plane.manager.start()

    def resume_feed(self, feed: dict | None) -> dict:
        """Go on feeding after the control plane was restored (:mod:`.lifecycle`): ``feed`` is what
        :meth:`feed` was given. Per source, the furthest entry replica's next chunk and rows taken
        are where feeding resumes (the input is read again, the rows it took skipped); an entry
        replica behind it catches up from a peer first. With entry partitions each partition's furthest
        replica says where that partition stands (``"parts"``): the input is cut and routed again from
        its start, as the lost host did, and each partition is sent only what follows its own
        position (:meth:`~.feeder.Feeder._taken`). Returns ``{source: {"seq", "rows",
        "closed"}}`` and the replicas that catch up. Raises ``RunFailed`` if no entry replica
        answers, or the input was not kept."""
        if feed is None:
            raise RunFailed("the control plane was restored but the input given to feed() was not kept: the "
                            "feed cannot resume", operator=ENTRY)
        running = self.plane.topology.running(ENTRY)
        asked = {label: h.entry_position.remote() for label, h in running}
        ready = self.plane._ask_all(asked, self.plane.detector.fail_after_s)
        positions = {}
        for label, ref in asked.items():
            if ref not in ready:
                continue  # silent: it catches up from a peer once it answers, or is declared failed
            try:
                positions[label] = ray.get(ref, timeout=READY_S)
            except Exception as e:  # noqa: BLE001 - a death: noticed by the monitor
                self.plane.events.append({"t": self.plane.now(), "event": "no_answer", "actor": label, "call": "entry_position",
                                          "error": repr(e)})
        if not positions:
            raise RunFailed("no entry replica answered after the control plane was restored: where the input stands "
                            "is unknown", operator=ENTRY)
        sources = self.plane.query.sources
        parts = self.plane.feeder.entry_partitions
        if parts > 1:  # each entry partition goes on from its own furthest replica (Feeder._taken)
            from ...plan import label_group

            group = {label: int(label_group(label).rpartition(".")[2]) for label in asked}
            missing = [f"{ENTRY}.{i}" for i in range(parts) if not any(group[lb] == i for lb in positions)]
            if missing:
                raise RunFailed(f"no replica of entry partition(s) {missing} answered after the control plane was "
                                f"restored: which rows they took is unknown, so the feed cannot resume exactly",
                                operator=ENTRY)
            if any(src in seqs for _, seqs in getattr(self.plane, "_markers_in_flight", []) for src in sources):
                raise RunFailed("the host was lost while it sent a change's marker to the entry partitions: which "
                                "partitions got it is unknown, so the feed cannot resume exactly", operator=ENTRY)
            best = [{src: max((p for lb, p in positions.items() if group[lb] == i),
                              key=lambda p: p[src]["expected"])[src] for src in sources} for i in range(parts)]
            split = [{src: {"seq": int(b[src]["expected"]), "rows": int(b[src]["rows"]),
                            "closed": bool(b[src]["closed"]), "taken": b[src].get("taken", []),
                            "complete": bool(b[src].get("complete", False)), "punct": b[src].get("punct")} for src in sources} for b in best]
            at = {src: {"seq": 0, "rows": max(sp[src]["rows"] for sp in split),
                        "closed": all(sp[src]["closed"] for sp in split)} for src in sources}
            behind = {label: {src: int(p[src]["expected"]) for src in sources
                              if p[src]["expected"] < split[group[label]][src]["seq"]} for label, p in positions.items()}
        else:
            split = None
            at = {}
            for src in sources:
                best = max(positions.values(), key=lambda p: p[src]["expected"])[src]
                at[src] = {"seq": int(best["expected"]), "rows": int(best["rows"]), "closed": bool(best["closed"])}
            behind = {label: {src: int(p[src]["expected"]) for src in sources
                              if p[src]["expected"] < at[src]["seq"]} for label, p in positions.items()}
        behind = {label: b for label, b in behind.items() if b}
        behind.update({label: {src: 0 for src in self.plane.query.sources} for label in asked if label not in positions})
        # a change whose marker the lost host was sending: entry replicas that lack it get it from a
        # peer (it is in their input logs) or, if none got it, from the resumed feed (finished, not half)
        markers = [] if split is not None else [
            (src, m) for m, seqs in getattr(self.plane, "_markers_in_flight", []) for src, seq in seqs.items()
            if at[src]["seq"] <= seq and not at[src]["closed"]]
        self.plane.feeder.start(self.plane.query.sources, feed["inputs"], feed["pace"], feed["chunk_size"], self.plane.t0,
                                idle=feed["idle"], disorder={src: self.plane.query.spec(src).max_disorder
                                                             for src in self.plane.query.sources},
                                chunk_ms=feed["chunk_ms"], punct=self._punctuation_rules(), every=self._release_grids(), resume={"at": at, "behind": behind, "ts0": self.plane.ts0,
                                                                   "markers": markers, "parts": split})
        self.plane._markers_in_flight = []
        out = {"at": at, "behind": sorted(behind), "markers_sent": [(src, m.id) for src, m in markers]}
        if split is not None:  # (without the ranges each partition took: hundreds of pairs)
            out["parts"] = [{src: {k: v for k, v in pos.items() if k in ("seq", "rows", "closed")}
                             for src, pos in part.items()} for part in split]
        return out

    def _punctuation_rules(self) -> dict:
        """Per source with time windows downstream, the rule by which its entry points' punctuation
        reaches a window's end (:func:`~replistream.sources.window_close_rule`): a paced feed ends a
        piece at each row that lets a window close, so batching never holds a window back."""
        from ...sources import window_close_rule

        query = self.plane.query
        grids = {src: query.window_grid(src) for src in query.sources}
        return {src: window_close_rule(g, query.spec(src).max_disorder) for src, g in grids.items() if g}

    def _release_grids(self) -> dict:
        """Per source whose punctuations release results downstream beyond the windows' ends (a user
        operator, a count window, a sorted input: :meth:`~replistream.query.Query.release_grid`),
        ``(grid, max_disorder)``: a paced feed also ends a piece at such a punctuation, at most once
        per piece's span (:func:`~replistream.sources.release_rule`), so a result waits for the rest
        of its piece at most once per span rather than for a piece more."""
        query = self.plane.query
        out = {}
        for src in query.sources:
            grid = query.release_grid(src)
            if grid is not None and grid != query.window_grid(src):
                out[src] = (int(grid), int(query.spec(src).max_disorder))
        return out

    def _run_sentinel(self, sentinel: Sentinel) -> None:
        if self.plane._persister is not None:  # counted as run before it runs: a restored feed never runs it twice
            self.plane._persister.persist_now()
        from .client import Deployment

        sentinel.apply(Deployment.of(self.plane))  # (what a user's Call(fn) gets: the public API)
        if not isinstance(sentinel, Handed):  # (one per micro-batch of a Spark stream: not an event)
            self.plane.events.append({"t": self.plane.now(), "event": repr(sentinel)})

    def run(self, inputs: Mapping[str, Iterable], pace: float | None = None, timeout: float = 600.0,
            scenario=None, progress: Callable[[dict], None] | None = None, chunk_size: int = 10_000,
            idle_timeout: float | Mapping[str, float] | None = None, chunk_ms: float | None = 20.0) -> RunResult:
        """Feed ``inputs``, apply ``scenario`` (a :class:`~replistream.scenario.Scenario`), wait, collect.

        ``chunk_size`` is the most rows the feeder sends to the entry points in one batch,
        ``chunk_ms`` the most wall time a paced chunk spans, and ``idle_timeout`` when a quiet
        source stops holding the others back (see :meth:`feed`).
        """
        from ...progress import reporter

        with reporter("run", self.plane.show_progress) as rep:
            if scenario is not None:
                self.plane.faults.install_scenario(scenario)
            rep.phase("feeding the sources")
            self.feed(inputs, pace, chunk_size, idle_timeout, chunk_ms)
            if scenario is not None:
                self.plane.faults._start_scenario_thread(scenario)
            rep.phase("running" + (f" (paced x{pace:g})" if pace else ""))

            def tick(counts):
                rep.update(detail=", ".join(f"{app} {n:,} tuples" for app, n in counts.items()))
                if progress is not None:
                    progress(counts)

            ok = self.plane.output.wait(timeout, tick)
            rep.phase("collecting the results")
            res = self.plane.output.collect()
        if not ok:
            waiting = {n: "none yet" if p == NO_PUNCTUATION else f"{p / 1e6:.6g} s"
                       for n, p in res.punctuation.items() if p != END}
            if not waiting:  # every application there is ended, but the feed had not (Results.wait)
                raise RunFailed(f"the run did not complete within {timeout:g} s: every application received the "
                                f"end of the stream but the feed had not ended (a change it makes, add_operator, "
                                f"may still add an application); raise the timeout if the input is that long",
                                logical_time=self.plane.output.reached(), result=res)
            node, text = self.plane.output.holdup()
            raise RunFailed(f"the run did not complete within {timeout:g} s and no failure explains it: "
                            f"applications {sorted(waiting)} have not received the end of the stream "
                            f"(last punctuations {waiting}); {text}; raise the timeout if the input is that "
                            f"long", operator=node, logical_time=self.plane.output.reached(), result=res)
        return res
