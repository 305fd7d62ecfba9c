"""What the applications deliver, and what a run reports.

:class:`Delivered` keeps the tuples fetched from the application replicas (the first copy of
each, from whichever replica answers first); :class:`Results` fetches them (:meth:`Results.poll`),
waits for the end of the stream, and builds the run's :class:`~..result.RunResult` and metrics.

>>> plane.output.wait(60)            # doctest: +SKIP
"""
from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any, Callable, Iterable

import numpy as np
import ray

from . import lockorder
from ...errors import merge_dead_letters
from ...operators.base import NO_PUNCTUATION
from ...operators.join import concat_rows
from ...plan import ENTRY, label_group
from ...summary import WaitSummary  # (#44) what wait() returns
from ...schema import END, TS
from ..result import RunResult
from .common import READY_S, is_actor_death, is_unavailable, json_default

__all__ = ["Delivered", "Results", "furthest_key"]


class Delivered:
    """The applications' output fetched into the driver: per application its batches, their
    arrival times (wall time), the last punctuation, and the callbacks to run on new batches.
    ``lock`` (re-entrant) guards it (lock 3 of the deployment's order, :mod:`replistream.engines.ray`);
    :meth:`Deployment.poll` holds it while it fetches, so two polls never fetch the same tuples.

    An application with several replicas (``deploy(..., app_replicas=)``) keeps the first copy of
    each tuple, by id, whichever replica delivered it (its replicas' positions are kept apart).
    A partitioned application (``parallelism={app: p}``, replicas ``app.P#R``) is the union of its
    partitions: the first copy of each tuple from any replica, and its punctuation the smallest
    over the partitions of the largest its replicas reached (:meth:`punctuate`).

    >>> d = Delivered(["out"]); d.add_batch("out", np.zeros(2, dtype=[("ts", "i8"), ("id", "u8")]), np.array([5.0, 6.0]))
    >>> d.count("out"), d.arrivals("out").tolist()
    (2, [5.0, 6.0])
    >>> d.add("two", ["two", "two#1"]); b = np.array([(1, 7), (2, 8)], dtype=[("ts", "i8"), ("id", "u8")])
    >>> d.add_batch("two", b, np.zeros(2), "two"); d.add_batch("two", b[::-1], np.ones(2), "two#1")
    >>> d.count("two"), d.fetched["two#1"]
    (2, 2)
    >>> d.add("p", ["p.0#0", "p.0#1", "p.1#0"]); d.punctuate("p", "p.0#0", 9); d.punctuate("p", "p.1#0", 4)
    >>> d.punctuate("p", "p.0#1", 2); d.punctuation["p"]   # partition 1 has promised 4 only
    4
    """

    def __init__(self, apps: Iterable[str]):
        self.lock = lockorder.rlock("Delivered.lock", 3)
        self.fetched: dict[str, int] = {}
        self.batches: dict[str, list] = {}
        self.arrival_times: dict[str, list] = {}
        self.punctuation: dict[str, int] = {}
        self.callbacks: dict[str, list[Callable]] = {}
        self.seen: dict[str, set | None] = {}  # ids delivered, for an application with several replicas
        self.keep: dict[str, bool] = {}  # False: tuples go to the callbacks only (Deployment.on_output(keep=False))
        self.handed_off: dict[str, int] = {}  # tuples of an application not kept, handed to its callbacks
        #: per application, per group of copies (its partition ``app.P``, or ``app``) the largest
        #: punctuation and delivered count any of its replicas reported
        self.groups: dict[str, dict[str, list[int]]] = {}
        for app in apps:
            self.add(app)

    def add(self, app: str, labels: list[str] | None = None) -> None:
        """Start tracking application ``app`` (one added at run time, too), whose replicas are
        ``labels`` (default: one, labelled ``app``)."""
        labels = [app] if labels is None else list(labels)
        with self.lock:
            self.batches[app], self.arrival_times[app] = [], []
            for label in labels:
                self.fetched[label] = 0
            self.seen[app] = set() if len(labels) > 1 else None
            self.punctuation[app], self.callbacks[app] = int(np.iinfo(np.int64).min), []
            self.keep[app], self.handed_off[app] = True, 0
            self.groups[app] = {g: [int(np.iinfo(np.int64).min), 0] for g in dict.fromkeys(map(label_group, labels))}

    def punctuate(self, app: str, label: str, punctuation: int, count: int | None = None) -> None:
        """Replica ``label`` of ``app`` reported its last punctuation (and, for tuples kept in its
        files, how many it delivered): the application's punctuation is the smallest over its
        groups of copies (each partition) of the largest any copy reached; its count of tuples
        not kept the sum over the groups of the largest."""
        with self.lock:
            g = self.groups[app].setdefault(label_group(label), [int(np.iinfo(np.int64).min), 0])
            g[0] = max(g[0], int(punctuation))
            self.punctuation[app] = max(self.punctuation[app], min(x[0] for x in self.groups[app].values()))
            if count is not None:
                g[1] = max(g[1], int(count))
                self.handed_off[app] = max(self.handed_off[app], sum(x[1] for x in self.groups[app].values()))

    def add_batch(self, app: str, data: np.ndarray, arrivals: np.ndarray, label: str | None = None) -> None:
        """Record a batch newly fetched from replica ``label`` of ``app`` (default: its only one),
        keeping only tuples no replica delivered before, and run the callbacks on them."""
        with self.lock:
            self.fetched[label or app] += len(data)
            seen = self.seen[app]
            if seen is not None and len(data):
                ids = data["id"].tolist()
                fresh = np.fromiter((i not in seen for i in ids), dtype=bool, count=len(ids))
                seen.update(ids)
                data, arrivals = data[fresh], arrivals[fresh]
            if not len(data):
                return
            if self.keep[app]:
                self.batches[app].append(data)
                self.arrival_times[app].append(arrivals)
            else:
                self.handed_off[app] += len(data)
            for cb in self.callbacks[app]:
                cb(data)

    def complete(self) -> bool:
        """True when every application received the end of every stream."""
        with self.lock:
            return all(p == END for p in self.punctuation.values())

    def count(self, app: str) -> int:
        """Tuples fetched from ``app`` so far (those handed to callbacks only, too)."""
        with self.lock:
            return int(sum(len(b) for b in self.batches[app])) + self.handed_off[app]

    def arrivals(self, app: str) -> np.ndarray:
        """Wall times the tuples of ``app`` arrived at, in fetch order."""
        with self.lock:
            parts = list(self.arrival_times[app])
        return np.concatenate(parts) if parts else np.zeros(0)

    def tuples(self, app: str, schema) -> np.ndarray:
        """The tuples of ``app`` fetched so far, in arrival order."""
        with self.lock:
            parts = list(self.batches[app])
        return np.concatenate(parts) if parts else schema.empty()


# -- the deployment ------------------------------------------------------------------------


class Results:
    """What the applications deliver, and what a run reports.

    >>> plane.output.wait(60)            # doctest: +SKIP
    """

    def __init__(self, plane):
        self.plane = plane  # the :class:`~.plane.ControlPlane` this part belongs to
        self._fetches: dict[str, tuple[Any, int]] = {}  # application replica -> outstanding fetch, from

    # -- waiting and results ----------------------------------------------------------------
    def _client(self):
        """The public :class:`~.client.Deployment` of this plane (what a :class:`WaitSummary` reads)."""
        from .client import Deployment

        return Deployment.of(self.plane)

    def wait(self, timeout: float = 600.0, progress: Callable[[dict], None] | None = None) -> WaitSummary:
        """Wait until every application received the end of every stream: returns a truthy
        :class:`~replistream.summary.WaitSummary` (outputs, dead letters, faults masked). Ends at once,
        raising, when the run can no longer complete exactly (docs/reliability.md): a replica's own
        code raised (:class:`~replistream.errors.UserFunctionError` for a user function, else
        :class:`~replistream.errors.RunFailed`), or every replica of an operator, application or of
        the entry points is lost (``RunFailed`` naming it); returns a falsy one after ``timeout`` s.
        The applications waited for are those there are once the feed has ended: one added by a
        change during the feed (``add_operator``) is waited for even if every other one had ended."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            self.poll(wait_s=0.05)
            if progress is not None:
                progress({n: self.plane.delivered.count(n) for n in self.plane.query.sinks})
            self.plane.monitor.check_failures()
            if self.plane.delivered.complete():
                feeder = self.plane.feeder
                # every chunk's call has returned (or raised)
                if feeder.thread is not None and not feeder.fed_all.wait(max(0.0, deadline - time.time())):
                    break  # the feed has not ended within the timeout
                if not self.plane.delivered.complete():
                    # the applications that had ended were not all there will be: while the feed
                    # ran, a change (add_operator, after a remove_operator ended every application
                    # there was) added one; wait for its end too
                    continue
                self.plane.monitor.check_failures()  # a failure reported as the end arrived still ends the run in error
                return WaitSummary.of(self._client(), True)
            time.sleep(0.05)
        return WaitSummary.of(self._client(), False)

    def reached(self) -> int | None:
        """The logical time every application has reached: the smallest last punctuation they
        received (None before any); output up to it is complete."""
        with self.plane.delivered.lock:
            puncts = [self.plane.delivered.punctuation.get(n, NO_PUNCTUATION) for n in self.plane.query.sinks]
        low = min(puncts, default=NO_PUNCTUATION)
        return None if low == NO_PUNCTUATION else int(low)

    #: Seconds :meth:`collect` and :meth:`metrics` wait for the actors' answers (all asked at once);
    #: one busy in a call that does not return is left out and said so.
    ASK_TIMEOUT_S = 15.0

    def on_output(self, app: str, callback: Callable[[np.ndarray], None], keep: bool = True) -> None:
        """Call ``callback(batch)`` in the driver with every new batch application ``app`` receives.

        Callbacks run while :meth:`run`/:meth:`wait` wait, or on each :meth:`poll`. With
        ``keep=False`` the driver keeps none of ``app``'s tuples once its callbacks have had them
        (for results larger than the driver's memory, e.g. :class:`replistream.spark.SparkSink`):
        ``run()``'s ``outputs[app]`` then stays empty and ``stats["handed_off"][app]`` counts them.

        >>> dep.on_output("alerts", lambda batch: print(len(batch), "new alerts"))  # doctest: +SKIP
        """
        with self.plane.delivered.lock:
            if app not in self.plane.delivered.callbacks:
                raise ValueError(f"{app!r} is not an application of query {self.plane.query.name!r}; "
                                 f"applications: {self.plane.query.sinks}")
            self.plane.delivered.callbacks[app].append(callback)
            if not keep:
                self.plane.delivered.keep[app] = False

    def poll(self, wait_s: float | None = None) -> None:
        """Fetch newly delivered tuples from the applications (and run output callbacks).

        Every running application replica has one fetch outstanding; this takes the answers that
        come within ``wait_s`` (default: the detector's ``suspect_after_s``), and stops waiting
        as soon as every replica not suspected has answered: results come from whichever
        replica answers, never held by one that does not (``deploy(app_replicas=2)``)."""
        d = self.plane.delivered
        wait_s = self.plane.detector.suspect_after_s if wait_s is None else float(wait_s)
        deadline = time.time() + wait_s
        died = []
        with d.lock:
            apps = {r.label: r.operator for r in self.plane.topology.replicas()  # add_operator may add applications
                    if r.kind == "application" and self.plane.topology.is_running(r.label)}
            for label in [lab for lab in self._fetches if lab not in apps]:
                del self._fetches[label]
            for label in apps:
                if label not in self._fetches:
                    self._fetches[label] = (self.plane.topology.handle(label).fetch.remote(d.fetched[label]),
                                            d.fetched[label])
            while self._fetches:
                refs = {ref: label for label, (ref, _) in self._fetches.items()}
                ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=min(0.05, max(0.0, deadline - time.time())))
                for ref in ready:
                    label = refs[ref]
                    _, start = self._fetches.pop(label)
                    try:
                        parts, arrs, count, punct = ray.get(ref, timeout=READY_S)
                    except Exception as e:
                        if is_unavailable(e):  # unreachable for now: asked again next time (the detector decides)
                            continue
                        if not is_actor_death(e):
                            raise
                        died.append((label, f"application died: {type(e).__name__}"))  # recorded below
                        continue
                    if start != d.fetched[label]:
                        continue  # a fetch from an earlier position (cannot happen with one outstanding)
                    # (no schema needed: an empty fetch adds nothing, and an application that
                    # add_operator is adding is in the topology before the query names it)
                    data, arr = joined(parts), joined(arrs)
                    d.add_batch(apps[label], data, arr, label)
                    written = apps[label] in self.plane.file_sinks and not d.keep[apps[label]]  # by the replicas
                    # its fastest replica's (of each partition, for a partitioned application)
                    d.punctuate(apps[label], label, int(punct), int(count) if written else None)
                waiting = [lab for lab in self._fetches if not self.plane.detector.is_suspected(lab)]
                if not waiting or time.time() >= deadline:
                    break
        for node, reason in died:  # a kill we asked for is recorded already (mark_failed is idempotent)
            self.plane.repairer.mark_failed(node, reason)

    def results(self, app: str) -> np.ndarray:
        """Tuples the application ``app`` received so far (in arrival order)."""
        self.poll()
        return self.plane.delivered.tuples(app, self.plane.query.schema_of(app))

    def results_since(self, app: str, position: int = 0) -> tuple[np.ndarray, int]:
        """``(tuples, next position)``: the tuples application ``app`` received from ``position`` on
        (in arrival order), and the position to ask from next time. A client that keeps the
        position (a script that reconnects with :func:`~.host.attach`, a dashboard) gets each tuple
        once. Positions count what the applications delivered, which they keep, so a detached
        deployment's restored host (:mod:`.lifecycle`) numbers them alike when the application
        runs one replica; with several, a restore may number them in another order (the first
        copy of each is kept from whichever replica answers first).

        >>> rows, pos = dep.results_since("alerts")           # doctest: +SKIP
        >>> more, pos = dep.results_since("alerts", pos)       # doctest: +SKIP
        """
        if app not in self.plane.query.sinks:
            raise ValueError(f"{app!r} is not an application of query {self.plane.query.name!r}; "
                             f"applications: {self.plane.query.sinks}")
        position = int(position)
        if position < 0:
            raise ValueError(f"position must be >= 0, got {position}")
        data = self.results(app)
        return data[position:], len(data)

    def latencies_ms(self, app: str) -> tuple[np.ndarray, np.ndarray]:
        """(arrival time in s since start, end-to-end latency in ms) per delivered tuple.

        Latency = arrival time minus the tuple's timestamp mapped to wall time
        (``t0 + (ts - ts0) / (1e6 * pace)``); meaningful for paced runs.
        """
        data = self.results(app)
        arr = self.plane.delivered.arrivals(app)
        speed = self.plane.speed or 1.0
        lat = (arr - (self.plane.t0 + (data[TS] - self.plane.ts0) / (1e6 * speed))) * 1000.0
        return arr - self.plane.t0, lat

    def holdup(self, wait_s: float = 2.0) -> tuple[str | None, str]:
        """Where the run is held up: the first node, from the entry points down, that has not
        reached the end of the stream, with each of its replicas' logical time (its watermark; an
        entry point's punctuation) or, for a replica that does not answer within ``wait_s``, that
        it is busy in a call (e.g. a user function that does not return). Returns ``(node, text)``
        (``(None, text)`` if every node has reached the end). What a timeout's error names.

        >>> dep.holdup()   # doctest: +SKIP
        ('pick', "'pick' holds the run back: pick#0 busy in a call (no answer in 2 s), pick#1 at ...")
        """
        running = self.plane.topology.running()
        refs = {label: h.stats.remote() for label, h in running}
        done = self.plane._ask_all(refs, wait_s)
        where: dict[str, list[tuple[str, int | None, str]]] = {}
        for label, ref in refs.items():
            rep = self.plane.topology.replica(label)
            if rep.kind == "application":
                continue
            if ref not in done:
                where.setdefault(rep.operator, []).append((label, None, f"busy in a call (no answer in {wait_s:g} s)"))
                continue
            try:
                st = ray.get(ref, timeout=READY_S)
            except Exception as e:  # noqa: BLE001 - said in the text
                where.setdefault(rep.operator, []).append((label, None, f"unreachable ({type(e).__name__})"))
                continue
            if rep.kind == "entry":
                t = min((int(e["punctuation"]) for e in st.get("entries", {}).values()), default=None)
            else:
                t = st.get("watermark")
                t = None if t is None else int(t)
            where.setdefault(rep.operator, []).append((label, t, "pending a state hand-over" if st.get("pending")
                                                       else ""))

        def at(t: int | None, note: str) -> str:
            if note:
                return note
            if t is None or t == NO_PUNCTUATION:
                return "no punctuation yet"
            return "at the end of the stream" if t == END else f"at logical time {t / 1e6:.6g} s"

        for node in [ENTRY, *self.plane.query.operators]:
            reps = where.get(node)
            if not reps:
                continue
            if any(t == END for _, t, _ in reps):
                continue
            what = "the entry points" if node == ENTRY else repr(node)
            return node, f"{what} hold{'' if node == ENTRY else 's'} the run back: " + \
                ", ".join(f"{label} {at(t, note)}" for label, t, note in reps)
        return None, "every operator reached the end of the stream (the applications have not: see their replicas)"

    def collect(self) -> RunResult:
        """What the applications received so far, as a :class:`~replistream.engines.result.RunResult`:
        outputs, last punctuations, dead letters, ``arrivals`` in seconds since the start, ``ts0`` and
        ``pace`` (so ``latencies(app)`` works), ``end_time`` (the last tuple's arrival), the deployment's
        ``events`` and ``metrics``, and per stream replica what it carried (``links``)."""
        self.poll()
        outputs = {n: self.results(n) for n in self.plane.query.sinks}
        arrivals = {n: self.plane.delivered.arrivals(n) - self.plane.t0 for n in self.plane.query.sinks}
        # every running replica's dead letters, merged: the replicas of a node set the same tuples
        # aside, so a replica that died took only copies with it (its live peers hold the same)
        # (entry replicas: the answer of the one furthest on, as malformed records have no id to
        # merge by, and a replica still catching up from a peer has set aside fewer so far)
        running = self.plane.topology.running()
        answers = [h.dead_letters.remote() for _, h in running]
        entries = {label: h.entry_position.remote() for label, h in running
                   if self.plane.topology.replica(label).kind == "entry"}
        asked = {label: ref for (label, _), ref in zip(running, answers)}
        asked.update({f"{label}|position": ref for label, ref in entries.items()})
        ready = self.plane._ask_all(asked, self.ASK_TIMEOUT_S)
        dead, entry_letters = list(self.plane._retired_letters), []
        for (label, _), ref in zip(running, answers):
            is_entry = label in entries
            if ref not in ready:  # busy in a call that does not return, or suspected: its peers' letters stand
                self.plane.events.append({"t": self.plane.now(), "event": "no_answer", "actor": label, "call": "dead_letters",
                                          "seconds": self.ASK_TIMEOUT_S,
                                          "suspected": self.plane.detector.is_suspected(label)})
                continue
            try:
                letters = ray.get(ref, timeout=READY_S)
                if not is_entry:
                    dead.extend(letters)
                    continue
                pos = ray.get(entries[label], timeout=READY_S) if entries[label] in ready else None
            except Exception as e:
                if not is_actor_death(e):
                    raise
                continue  # it died after the topology listed it: its peers' letters stand for its own
            if pos is not None:
                entry_letters.append((furthest_key(pos), label, letters))
        for group in {label_group(label) for _, label, _ in entry_letters}:  # each entry partition's, once
            dead.extend(max((e for e in entry_letters if label_group(e[1]) == group), key=lambda x: x[0])[2])
        dead = merge_dead_letters(dead)
        metrics = self.metrics()
        with self.plane.delivered.lock:
            punct = dict(self.plane.delivered.punctuation)
            handed = {n: c for n, c in self.plane.delivered.handed_off.items() if not self.plane.delivered.keep[n]}
        end = max((float(a.max()) for a in arrivals.values() if len(a)), default=0.0)  # the last tuple's arrival
        stats = {"handed_off": handed} if handed else {}
        if self.plane.file_sinks:  # what each ParquetSink holds (its marker's manifest once complete)
            topo = self.plane.topology
            lost = [label for label, running in topo.alive().items() if not running]
            for app, sink in self.plane.file_sinks.items():  # what its lost replicas left half written
                gone = sink.remove_temp_files([label for label in lost if topo.replica(label).operator == app])
                if gone:
                    self.plane.events.append({"t": self.plane.now(), "event": "temp_files_removed",
                                              "application": app, "files": gone})
            stats["sinks"] = {app: {"path": sink.path, "complete": sink.complete(),
                                    **({k: v for k, v in sink.manifest().items() if k != "files"}
                                       if sink.complete() else {}),
                                    "files": len(sink.manifest()["files"]) if sink.complete() else None}
                              for app, sink in self.plane.file_sinks.items()}
        return RunResult(outputs, punct, dead, arrivals=arrivals, ts0=int(round(self.plane.ts0)), pace=self.plane.speed,
                         end_time=end, events=list(self.plane.events), links=metrics["stream_replicas"], metrics=metrics,
                         stats=stats)

    # -- metrics ---------------------------------------------------------------------------------
    def metrics(self) -> dict:
        """Per application: delivered tuples and latency; per actor: CPU seconds, links, drops."""
        actors = {}
        asked = {label: h.stats.remote() for label, h in self.plane.handles.items() if self.plane.topology.is_running(label)}
        ready = self.plane._ask_all(asked, self.ASK_TIMEOUT_S)
        for label, h in self.plane.handles.items():
            server = self.plane.topology.server(label)
            if label not in asked:
                actors[label] = {"label": label, "server": server, "alive": False}
                continue
            if asked[label] not in ready:  # alive as far as anyone knows, but busy in a call or suspected
                suspected = self.plane.detector.is_suspected(label)
                actors[label] = {"label": label, "server": server, "alive": True, "busy": True,
                                 "suspected": suspected,
                                 "error": "suspected by the failure detector" if suspected
                                 else f"no answer within {self.ASK_TIMEOUT_S:g} s"}
                continue
            try:
                s = ray.get(asked[label], timeout=READY_S)
                s["alive"] = True
                actors[label] = s
            except Exception as e:  # reported in the metrics
                actors[label] = {"label": label, "server": server, "alive": False, "error": repr(e)}
        apps = {}
        for n in self.plane.query.sinks:
            # (latency only means something paced: unpaced, not a copy of every tuple delivered)
            lat = self.latencies_ms(n)[1] if self.plane.speed else None
            labels = [r.label for r in self.plane.topology.replicas(n)]
            first = n if n in actors else next((lab for lab in labels if lab in actors), n)
            apps[n] = {
                "delivered": self.plane.delivered.count(n),
                "complete": self.plane.delivered.punctuation.get(n) == END,
                "latency_ms": _percentiles(lat) if lat is not None else None,
                "filter_weights": actors.get(first, {}).get("filters", [{}])[0].get("weights"),
            }
            parts = (self.plane.channel_opts.get("partitions") or {}).get(n)
            if parts is not None:  # a partitioned application: what each of its replicas delivered
                apps[n]["partitions"] = int(parts)
                apps[n]["replicas"] = {lab: actors.get(lab, {}).get("delivered") for lab in labels}
        links = [lk for a in actors.values() for lk in a.get("links", [])]
        out = {"applications": apps, "actors": actors, "stream_replicas": links, "events": list(self.plane.events),
               "coordinator": [], "placement": self.plane.plan, **self.fault_tolerance()}
        try:
            out["coordinator"] = self.plane.coord.ask_coordinator("log", timeout=10)
        except Exception as e:  # reported in the metrics
            out["coordinator_error"] = repr(e)
        return out

    def fault_tolerance(self) -> dict:
        """How many more crashes the deployment masks: per node (the entry points as ``"entry"``) its
        live replicas - 1, and the smallest of them (``fault_tolerance``; -1 once a node has no live
        replica). Garbage collection lowers it down to ``kmin - 1`` (docs/reliability.md).

        >>> dep.fault_tolerance()                      # doctest: +SKIP
        {'fault_tolerance': 1, 'fault_tolerance_per_node': {'entry': 1, 'correlate': 1, ...}}
        """
        per = {}
        for node in [ENTRY, *self.plane.query.operators, *self.plane.query.sinks]:
            live: dict[str, int] = {}  # per group of copies (each partition of a partitioned operator)
            for r in self.plane.topology.replicas(node):
                live[label_group(r.label)] = live.get(label_group(r.label), 0) + (r.state == "live")
            per[node] = min(live.values(), default=0) - 1
        ops = [v for n, v in per.items() if n not in self.plane.query.sinks]
        return {"fault_tolerance": min(ops, default=0), "fault_tolerance_per_node": per}

    def metrics_json(self) -> str:
        """:meth:`metrics` as JSON."""
        return json.dumps(self.metrics(), default=json_default)


def joined(parts: list) -> np.ndarray:
    """The batches of an application's fetch as one array (of no rows and no fields when there
    are none: :meth:`Delivered.add_batch` only counts those): joined
    in the driver, not on the application's thread (:meth:`~.actors.SinkActor.fetch`), as raw
    rows (:func:`~replistream.operators.join.concat_rows`).

    >>> joined([np.arange(2), np.arange(3)]).tolist()
    [0, 1, 0, 1, 2]
    >>> len(joined([]))
    0
    """
    if not parts:
        return np.zeros(0)
    return parts[0] if len(parts) == 1 else concat_rows(parts)


def furthest_key(position: Mapping[str, Mapping]) -> tuple[int, int]:
    """How far an entry replica is (:meth:`~.actors.EntryActor.entry_position`): its sources ended,
    then its chunks taken; the replica with the largest key has taken everything its peers took.

    >>> furthest_key({"a": {"expected": 4, "rows": 40, "closed": True}, "b": {"expected": 2, "rows": 9, "closed": False}})
    (1, 6)
    """
    return (sum(bool(p["closed"]) for p in position.values()), sum(int(p["expected"]) for p in position.values()))


def _percentiles(lat: np.ndarray) -> dict:
    if not len(lat):
        return {"count": 0}
    p = np.percentile(lat, [50, 90, 99])
    return {"count": int(len(lat)), "p50": float(p[0]), "p90": float(p[1]), "p99": float(p[2]),
            "max": float(lat.max()), "mean": float(lat.mean())}
