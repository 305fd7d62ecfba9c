"""``replistream chaos``: a seeded campaign of random faults, each run checked against the ideal run.

Every trial deploys one of three queries on local Ray with ``k`` replicas of every operator, feeds a
seeded input that holds malformed records, and injects seeded faults at event times of the input
(sentinels, :mod:`replistream.sources`). The third query, ``partitioned``, is the keyed query with its
window in :data:`PARTITIONS` key partitions (issue #41), each partition a group of ``k`` replicas
of its own; it is replayed paced (:data:`PARTITIONED_PACE`) and rescaled live to one partition
fewer or more, with a seeded strategy (fluid, batched or all-at-once), while the faults go on
(a partition the rescale retires loses no replica; a rescale that comes after the stream ended is
refused, as documented, and counted, not failed). A driver-kill trial of it deploys it partitioned
too, without the rescale (those trials use no sentinels):

* kills of replicas of every operator (every partition) and of the entry points, at most ``k - 1`` per node; half
  of them by the deployment, half behind its back (the actor dies unannounced, as a crashed
  process: only the driver's liveness check and the senders notice);
* replicas that stop answering (SIGSTOP, as a suspended VM or a frozen host): never resumed, or
  resumed after 0.5-6 s (before or after the failure detector declares them failed); they count
  toward the ``k - 1`` of their node, as kills do; the application runs as two replicas, and
  one of them may be stopped;
* with ``repair``: a second kill in a group once its repair has brought it back to k;
* server kills that stay within the fault model (every node keeps a live replica; the
  application's server is spared, as it runs one replica);
* delayed and cut links and slowed servers, for a few seconds each, and links cut without a
  duration and restored later;
* on the keyed query: rows on which the user's map raises (a seeded subset of keys, known in
  advance), a live move of a stateful replica to another server (Megaphone's fluid migration),
  and a runtime change of the map's function to an equivalent one.

With ``driver_kills`` (``replistream chaos --driver-kills``) a share of the trials (default
:data:`DRIVER_KILL_SHARE`, spread evenly from a seeded phase: :func:`is_driver_trial`) are
*driver-kill trials* (issue #29): the trial's input is written to
Parquet files in a temporary folder (its malformed records become rows with a null event time or a
null field, which the files' reader sets aside with a reason); a driver in a process of its own
(:mod:`replistream.chaos_driver`, joined to the campaign's Ray through ``RAY_ADDRESS``) deploys the
query detached (``deploy(..., name=..., detached=True)``) with a
:class:`~replistream.sinks.ParquetSink` per application, feeds the files paced
(:class:`~replistream.files.FileSource`, :data:`TIMING_PACE`) and prints ``fed``; the campaign
attaches (:func:`replistream.attach`), kills the driver with SIGKILL at a seeded moment of the
replay, waits for the end of the stream and reads the sinks' files. The faults of such a trial are
the driver kill, replica kills the deployment's host performs (``kill_replica`` through the
client, at most ``k - 1`` of each node, at seeded moments), and the loss of the host itself, the
deployment's control plane (once, twice in a share of trials; SIGKILL or SIGSTOP: the host standing
by, or Ray's restart of the lost one, restores the deployment, engines/ray/standby.py and
lifecycle.py), and in half the trials its coordinator too (SIGKILL or SIGSTOP); sentinel faults need the driver's
``Deployment`` in the feeder and are not used. The detached deployment is stopped at the end of
the trial, whatever its outcome. No ``replistream up`` is needed: the driver joins the campaign's
own Ray (which outlives the driver, as a cluster would).

The applications' output is compared with :func:`~replistream.engines.reference.run_reference` of
the same query and input as a multiset (lost, duplicated, unexpected), and the dead letters with the
reference's, per place and reason (every malformed record and every failing row set aside once,
with its reason). A trial that raises or times out fails with its reason. The schedule of faults is
a pure function of the seed (timings of course vary).

>>> report = run_campaign(minutes=0.5, seed=1, k=2)   # doctest: +SKIP
>>> report["verdict"]                                   # doctest: +SKIP
'PASS: 3 trials, 9,012 outputs identical to the reference, 0 lost, 0 duplicated, ...'
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .engines.result import multiset_diff
from .errors import ReplistreamError
from .network import default_servers
from .plan import ENTRY
from .query import Query
from .schema import END, seconds
from .sources import Call, KillReplica, KillServer, StopReplica, inject_at
from .workloads import fig1_inputs, fig1_query

__all__ = ["run_campaign", "start_ray", "Trial", "plan_faults", "format_report", "QUERIES", "run_driver_trial",
           "DRIVER_KILL_SHARE", "is_driver_trial"]

#: The queries a campaign alternates between (``partitioned``: the keyed query with its window in
#: :data:`PARTITIONS` key partitions, rescaled live during the trial).
QUERIES = ("fig1", "keyed", "partitioned")

#: The partitioned trial's window: ``{operator: partitions}`` at deployment.
PARTITIONS = {"per_key": 2}


def _failing_keys(seed: int, n_keys: int) -> np.ndarray:
    """The keys on which the keyed query's map raises: a seeded tenth of them."""
    rng = np.random.default_rng(zlib.crc32(f"keys:{seed}".encode()))
    return np.sort(rng.choice(n_keys, size=max(1, n_keys // 10), replace=False))


def _scaler(bad: np.ndarray) -> Callable:
    """The keyed query's map: ``v * 2``, raising on rows whose key is in ``bad`` (row-wise, so
    every replica sets aside the same rows)."""
    bad_set = np.asarray(bad)

    def scale(b):
        hit = np.isin(b["key"], bad_set)
        if hit.any():
            raise ValueError("key not accepted")
        return {"key": b["key"], "v": b["v"] * 2.0}

    return scale


def keyed_query(seed: int, n_keys: int = 200) -> Query:
    """A stateful keyed aggregate: a map (raising on a seeded tenth of the keys), then a sliding
    2 s window per key counting and summing."""
    q = Query("keyed")
    s = q.source("events", {"key": "i8", "v": "f8"}, punctuate_every=seconds(0.5))
    s.map(_scaler(_failing_keys(seed, n_keys)), name="scale").window(
        size=seconds(2), slide=seconds(1), by="key", aggs={"n": "count", "total": ("v", "sum")},
        name="per_key").sink("totals")
    return q.build()


def keyed_inputs(seed: int, n: int = 3000, n_keys: int = 200, span_s: float = 30.0, chunk: int = 50) -> dict:
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(0, seconds(span_s), n))
    key, v = rng.integers(0, n_keys, n), np.round(rng.normal(size=n), 3)
    return {"events": [{"ts": ts[a:a + chunk], "key": key[a:a + chunk], "v": v[a:a + chunk]}
                       for a in range(0, n, chunk)]}


def _with_malformed(records: list, rng: np.random.Generator, source: str, count: int) -> tuple[list, list]:
    """``records`` (column chunks) with ``count`` unreadable records put between chunks; returns the new
    list and a description of each bad record."""
    bad_kinds = [({"ts": None}, "ts is None"), ("not a record", "a string"), (None, "None"),
                 ({"ts": END}, "ts = END")]
    out = list(records)
    described = []
    for _ in range(count):
        template, what = bad_kinds[int(rng.integers(len(bad_kinds)))]
        pos = int(rng.integers(1, len(out)))
        rec = dict(template, **{k: 0 for k in _fields_of(out[0]) if k != "ts"}) if isinstance(template, dict) \
            else template
        out.insert(pos, [rec])
        described.append(f"{source}: {what}")
    return out, described


def _fields_of(chunk) -> list[str]:
    return list(chunk) if isinstance(chunk, dict) else []


@dataclass
class Trial:
    """One trial of a campaign: which query, the faults (event time µs, description, sentinel), and
    the result of the comparison once it ran."""

    index: int
    seed: int
    query: str
    faults: list = field(default_factory=list)
    bad_records: list = field(default_factory=list)
    result: dict = field(default_factory=dict)
    driver_kill: bool = False  # a driver-kill trial (a detached deployment; see the module doc)

    def describe(self) -> list[str]:
        return [f"{t / 1e6:.1f} s {what}" for t, what, _ in self.faults]


def plan_faults(rng: np.random.Generator, plan: dict[str, list[str]], query: Query, k: int, t0: int, t1: int,
                spare: frozenset = frozenset(), repair: bool = False) -> list[tuple[int, str, object]]:
    """A seeded fault schedule within the fault model, as ``(event time, description, sentinel)``.

    ``plan`` is the deployment's ``{node: [server, ...]}`` (``"entry"`` for the entry points). Kills
    of replicas take at most ``k - 1`` of each node; a server kill is chosen only if it leaves every
    node a live replica and spares the applications' servers; links are delayed or cut for 1-3 s.
    Nodes in ``spare`` (one whose replica moves live meanwhile) lose no replica. An application
    with several replicas may have one stopped (SIGSTOP). With ``repair`` a killed operator replica
    may be followed by a second kill in its group once the repair has brought it back to k. The
    coordinator may be lost (killed, crashed, stopped): the deployment replaces it.

    >>> q = fig1_query(n_servers=2)
    >>> plan = {"entry": ["a", "b"], "loads": ["a", "b"], "pings": ["b", "c"], "correlate": ["c", "a"],
    ...         "hot": ["b", "c"], "alerts": ["a"]}
    >>> faults = plan_faults(np.random.default_rng(1), plan, q, 2, 0, 10_000_000)
    >>> all(0 <= t <= 10_000_000 for t, _, _ in faults)
    True
    """
    groups = fault_groups(plan, query)
    apps_servers = {s for a in query.sinks for s in plan[a]}
    killed = {g: set() for g in groups}
    faults = []
    span = t1 - t0

    def at() -> int:
        return int(t0 + span * (0.15 + 0.7 * rng.random()))

    servers = sorted({s for where in plan.values() for s in where})
    for g in groups:  # some replicas of some nodes, never all
        if k > 1 and rng.random() < 0.6 and g not in spare:
            for i in rng.choice(k, size=int(rng.integers(1, k)), replace=False).tolist():
                if len(killed[g]) < k - 1:
                    killed[g].add(i)
                    how = rng.random()
                    if how < 0.35:  # the deployment kills it (and so knows at once)
                        faults.append((at(), f"kill {g}#{i}", KillReplica(g, int(i))))
                    elif how < 0.7:  # it dies behind the deployment's back: only the liveness check tells
                        faults.append((at(), f"crash {g}#{i}", Call(lambda d, label=f"{g}#{i}": _crash(d, label))))
                    elif how < 0.85:  # it stops answering for good: the failure detector must mask it
                        faults.append((at(), f"stop {g}#{i}", StopReplica(g, int(i))))
                    else:  # it stops, then answers again (cleared, or fenced if declared failed meanwhile)
                        pause = float(np.round(0.5 + 5.5 * rng.random(), 1))
                        faults.append((at(), f"stop {g}#{i} for {pause:g} s",
                                       Call(lambda d, g=g, i=int(i), pause=pause: _stop_for(d, g, i, pause))))
    for app in query.sinks:  # an application replica that stops answering (never the last one)
        if len(plan.get(app, [])) > 1 and rng.random() < 0.4:
            faults.append((at(), f"stop {app}#1", StopReplica(app, 1)))
    if repair:  # kill, repair, kill again: the second kill only once the group is back to k
        for g in [g for g in groups if g != ENTRY and killed[g] and g not in spare]:
            if rng.random() < 0.5:
                t = int(t0 + span * (0.75 + 0.2 * rng.random()))
                faults.append((t, f"kill {g} again once repaired",
                               Call(lambda d, g=g, k=k: _kill_again(d, g, k))))
    candidates = [s for s in servers if s not in apps_servers]
    rng.shuffle(candidates)
    for s in candidates[:1]:  # one server, if the model allows it
        hit = {g: {i for i, srv in enumerate(plan[g]) if srv == s} for g in groups}
        if all(len(killed[g] | hit[g]) <= k - 1 for g in groups) and any(hit.values()) \
                and not any(hit[g] for g in spare):
            for g in groups:
                killed[g] |= hit[g]
            faults.append((at(), f"kill server {s}", KillServer(s)))
    for _ in range(int(rng.integers(1, 4))):
        a, b = rng.choice(servers, size=2, replace=False).tolist()
        dur = float(np.round(1.0 + 2.0 * rng.random(), 1))
        what = rng.random()
        if what < 0.35:
            ms = float(np.round(50 + 250 * rng.random()))
            faults.append((at(), f"delay {a}<->{b} +{ms:g} ms for {dur:g} s",
                           Call(lambda d, a=a, b=b, ms=ms, dur=dur: d.delay_link(a, b, ms, dur))))
        elif what < 0.6:
            faults.append((at(), f"cut {a}<->{b} for {dur:g} s",
                           Call(lambda d, a=a, b=b, dur=dur: d.cut_link(a, b, dur))))
        elif what < 0.8:  # cut until restored (no duration): its queue is re-timed by restore()
            t = at()
            faults.append((t, f"cut {a}<->{b} until restored",
                           Call(lambda d, a=a, b=b: d.cut_link(a, b))))
            faults.append((min(t1, t + int(dur * 1e6)), f"restore {a}<->{b}",
                           Call(lambda d, a=a, b=b: d.restore(a, b))))
        else:
            factor = float(np.round(3 + 17 * rng.random()))
            faults.append((at(), f"slow server {a} x{factor:g} for {dur:g} s",
                           Call(lambda d, a=a, factor=factor, dur=dur: d.slow_server(a, factor, dur))))
    if rng.random() < 0.5:  # the coordinator is lost: killed, crashed, or it stops answering
        how = ["killed", "crashed", "stopped"][int(rng.integers(3))]
        faults.append((at(), f"coordinator {how}", Call(lambda d, how=how: _lose_coordinator(d, how))))
    return sorted(faults, key=lambda f: f[0])


def fault_groups(plan: dict[str, list[str]], query: Query) -> list[str]:
    """The replica groups a fault schedule counts kills in: the entry points and every operator, or,
    for a partitioned operator, each of its partitions (``name.i`` in ``plan``), each a group of
    ``k`` replicas of its own.

    >>> q = keyed_query(1)
    >>> fault_groups({"entry": [], "scale": [], "per_key": [], "per_key.0": [], "per_key.1": []}, q)
    ['entry', 'scale', 'per_key.0', 'per_key.1']
    """
    out = [ENTRY]
    for g in query.operators:
        parts = sorted((n for n in plan if n.startswith(g + ".") and n[len(g) + 1:].isdigit()),
                       key=lambda n: int(n[len(g) + 1:]))
        out += parts or [g]
    return out


def _lose_coordinator(dep, how: str) -> None:
    """Lose the deployment's coordinator: ``killed`` (Ray's kill, no restart), ``crashed`` (SIGKILL
    of its process), ``stopped`` (SIGSTOP, never resumed: it is fenced and replaced)."""
    import signal

    import ray

    if how == "killed":
        ray.kill(dep.coordinator, no_restart=True)
    elif dep._coordinator_pid is not None:
        os.kill(dep._coordinator_pid, signal.SIGKILL if how == "crashed" else signal.SIGSTOP)


def _crash(dep, label: str) -> None:
    """Kill ``label``'s actor without telling the deployment (a crashed process, an OOM kill)."""
    import ray

    h = dep.topology.handle(label)
    if h is not None and dep.topology.is_running(label):
        ray.kill(h, no_restart=True)


def _kill_again(dep, group: str, k: int) -> None:
    """Kill the newest running replica of ``group`` if the group is back to ``k`` running replicas
    (a repair replaced the one killed before); otherwise nothing (the fault would exceed the model)."""
    running = [r.label for r in dep.topology.replicas(group) if dep.topology.is_running(r.label)]
    newest = max(running, key=lambda lab: int(lab.rpartition("#")[2]), default=None)
    # a replica a repair started (index >= k) runs: the crash before it was noticed, so a second
    # kill stays within the model (a crash not noticed yet still counts as running)
    if newest is not None and len(running) >= k and int(newest.rpartition("#")[2]) >= k:
        dep.kill(newest, "killed again after its group's repair")


def _stop_for(dep, operator: str, replica: int, pause: float) -> None:
    """Stop ``operator#replica`` (SIGSTOP) and resume it ``pause`` seconds later, from a timer thread
    (the feeder, which runs this sentinel, goes on meanwhile)."""
    if not dep.topology.is_running(f"{operator}#{replica}"):
        return
    dep.stop_replica(operator, replica)
    timer = threading.Timer(pause, lambda: dep.resume_replica(operator, replica))
    timer.daemon = True
    timer.start()


def _time_span(inputs: dict) -> tuple[int, int]:
    lo, hi = None, None
    for chunks in inputs.values():
        for c in chunks:
            if isinstance(c, dict) and len(np.asarray(c["ts"])):
                ts = np.asarray(c["ts"])
                lo = int(ts.min()) if lo is None else min(lo, int(ts.min()))
                hi = int(ts.max()) if hi is None else max(hi, int(ts.max()))
    return lo or 0, hi or 0


def _inject(inputs: dict, faults: list) -> dict:
    """Each fault's sentinel in the first source whose input reaches its time."""
    from .sources import chunk_time

    out = dict(inputs)
    for t, _, sentinel in faults:
        src = next((s for s in sorted(out) if any(chunk_time(c) is not None and chunk_time(c) >= t
                                                  for c in inputs[s])), sorted(out)[0])
        out[src] = inject_at(out[src], t, sentinel)
    return out


def _dead_letters(result) -> dict[str, int]:
    """Dead letters per "where: reason" (late ones included: a correct run has none the reference lacks)."""
    return {f"{where}: {reason}": n for (where, reason), n in result.dead_letter_summary().items()}


#: A partitioned trial (not timed) replays event time at this pace: its rescale must find the stream
#: running (starting new partitions takes seconds on a busy machine), or it is refused.
PARTITIONED_PACE = 2.0

#: What a runtime change placed after every source ended raises (the change is refused, nothing lost).
_REFUSED_AFTER_END = "every source has ended: nothing is left to change"

#: A trial's run may take at most this many times the same trial without faults (``timing=True``).
TIMING_BOUND = 1.5

#: With ``timing=True`` both runs of a trial replay event time at this pace (event seconds per
#: wall second), as a stream arrives: a fault then costs time only when the fastest path it leaves
#: cannot keep up (unpaced, any fault on a 2-s trial's critical path would exceed the bound).
TIMING_PACE = 3.0


def trial_workload(kind: str, seed: int) -> tuple[Query, dict, str, int]:
    """A trial's query, its input (``{source: [column chunk, ...]}``), the source its malformed
    records go to, and its chunk size in rows: a pure function of ``kind`` and ``seed`` (the driver
    of a driver-kill trial builds the same query in its own process)."""
    if kind == "fig1":
        return (fig1_query(n_servers=3, window_s=2.0, punctuate_s=0.5),
                fig1_inputs(n_servers=3, duration_s=30, period_s=0.1, seed=seed, chunk=10), "load_0", 10)
    if kind in ("keyed", "partitioned"):  # (the reference ignores parallelism: the same query)
        return keyed_query(seed), keyed_inputs(seed), "events", 50
    raise ValueError(f"unknown trial query {kind!r}; queries: {QUERIES}")


def deploy_options(seed: int, k: int, servers: list[str], repair: bool = False, kind: str = "keyed") -> dict:
    """The ``deploy`` options of every trial (a driver-kill trial's driver uses the same); a
    ``partitioned`` trial's window runs in :data:`PARTITIONS` partitions.

    >>> deploy_options(1, 2, ["a", "b", "c"], kind="partitioned")["parallelism"]
    {'per_key': 2}
    """
    opts = {"servers": list(servers), "k": k, "network": "geo-static", "seed": seed, "app_replicas": min(2, k),
            "on_malformed": "dead_letter", "repair": repair, "spares": 1 if repair else 0}
    if kind == "partitioned":  # (its rescale's new partitions start from warm spares, as a cluster keeps them)
        opts["parallelism"] = dict(PARTITIONS)
        opts["spares"] = max(opts["spares"], k)
    return opts


def run_trial(trial: Trial, k: int, servers: list[str], timeout: float = 180.0, repair: bool = False,
              timing: bool = False, audit: bool = False) -> dict:
    """Deploy, inject, run, compare; fills and returns ``trial.result``. With ``timing`` the same
    trial first runs without faults, and ``run_seconds`` over ``baseline_seconds`` is checked
    against :data:`TIMING_BOUND` (``timing_ok``). With ``audit`` (the actors' duplicate filters
    audit their drops, ``REPLISTREAM_AUDIT=1``), a replica that dropped as a copy a tuple it never
    passed fails the trial (``unseen_drops``: a loss, named by replica, port and tuple). Any error
    fails the trial with its reason (an unexpected one with its ``traceback`` too), and the campaign
    goes on."""
    from .engines.ray import deploy
    from .engines.reference import run_reference

    rng = np.random.default_rng(trial.seed)
    query, inputs, bad_source, _ = trial_workload(trial.query, trial.seed)
    inputs[bad_source], trial.bad_records = _with_malformed(inputs[bad_source], rng, bad_source,
                                                            int(rng.integers(1, 4)))
    started = time.perf_counter()
    res: dict = {"query": trial.query, "seed": trial.seed}
    moved: dict = {}
    try:
        ref = run_reference(query, inputs, on_malformed="dead_letter")
        if timing:  # the same trial without faults: what its wall time is compared with
            with deploy(query, **deploy_options(trial.seed, k, servers, repair, trial.query)) as dep:
                begun = time.perf_counter()
                dep.run(inputs, timeout=timeout, pace=TIMING_PACE)
                res["baseline_seconds"] = round(time.perf_counter() - begun, 3)
        with deploy(query, **deploy_options(trial.seed, k, servers, repair, trial.query)) as dep:
            t0, t1 = _time_span(inputs)
            to = _rescale_to(rng) if trial.query == "partitioned" else None
            # a replica of a giving partition lost just as the rescale begins, in half the partitioned trials
            giver = None if to is None or k < 2 or rng.random() < 0.5 else \
                f"per_key.{0 if to > PARTITIONS['per_key'] else PARTITIONS['per_key'] - 1}"
            spare = frozenset()
            if trial.query == "keyed":  # (the window whose replica moves live)
                spare = frozenset({"per_key"})
            elif to is not None:  # (the partitions a rescale to fewer retires, and the giver that loses one)
                spare = frozenset({f"per_key.{p}" for p in range(to, PARTITIONS["per_key"])} | ({giver} - {None}))
            trial.faults = plan_faults(rng, dep.plan, query, k, t0, t1, spare=spare, repair=repair)
            if trial.query != "fig1":
                trial.faults += _runtime_changes(rng, dep, trial.seed, t0, t1, moved, rescale_to=to, giver=giver)
                trial.faults.sort(key=lambda f: f[0])
            begun = time.perf_counter()
            # (a partitioned trial is paced: its rescale must find the stream running, or it is refused)
            got = dep.run(_inject(inputs, trial.faults), timeout=timeout,
                          pace=TIMING_PACE if timing else PARTITIONED_PACE if trial.query == "partitioned" else None)
            res["run_seconds"] = round(time.perf_counter() - begun, 3)
            events = _events_of(dep)
            unaudited: list[str] = []
            unseen = _unseen_drops(dep, unaudited=unaudited) if audit else {}
            if "thread" in moved:
                moved["thread"].join(timeout)
            if repair:
                res["repairs"] = sum(1 for r in dep.repairs if r.get("repaired"))
                tried = [r for r in dep.repairs if not r.get("repaired") and "detected_wall" in r]  # (begun, failed)
                failed = [r for r in tried if not r.get("retrying")]
                res["repair_errors"] = [f"{r['replica']}: {r['why']}" for r in failed]
                res["repair_tracebacks"] = [r.get("traceback", "")[-3000:] for r in failed]
                res["repair_retries"] = [f"{r['replica']} (try {r['attempt']}): {r['why']}" for r in tried
                                         if r.get("retrying")]
        _compare_outputs(res, query, ref.outputs, got.outputs)
        if unseen:  # the audit (replistream.operators.dupfilter): where tuples were dropped as copies unseen
            res["unseen_drops"] = unseen
        if unaudited:  # (replicas the trial killed or stopped: their filters' drops are not known)
            res["unaudited"] = unaudited
        if res["lost"] or res["duplicated"] or res["unexpected"]:  # what the next person needs to find why
            res["differences"] = _differences(query, ref.outputs, got.outputs)
            res["events"] = [str(e)[:400] for e in events]
        res["dead_letters_expected"] = _dead_letters(ref)
        res["dead_letters_received"] = _dead_letters(got)
        res["complete"] = bool(got.complete)
        res["error"] = moved.get("error")
        if res["error"] and _REFUSED_AFTER_END in res["error"]:  # the change came after the stream: refused, as
            res["change_refused"], res["error"] = res["error"], None  # documented; counted, not a failure
        if "event" in moved and trial.query == "partitioned":
            res["rescaled"] = {kk: moved["event"].get(kk) for kk in ("from", "to", "strategy", "steps", "seconds")}
        if timing:
            res["timing_ratio"] = round(res["run_seconds"] / max(res["baseline_seconds"], 1e-3), 3)
            res["timing_ok"] = res["timing_ratio"] <= TIMING_BOUND
        res["ok"] = (res["lost"] == 0 and res["duplicated"] == 0 and res["unexpected"] == 0 and res["complete"]
                     and res["dead_letters_expected"] == res["dead_letters_received"] and res["error"] is None
                     and not unseen)
    except (ReplistreamError, RuntimeError, ValueError) as e:
        res.update({"ok": False, "error": f"{type(e).__name__}: {e}"})
    except Exception as e:  # noqa: BLE001 - a bug (the engine's or the campaign's) fails this trial, loudly
        import traceback  # (with where it was raised; the campaign goes on and its verdict is FAIL)

        res.update({"ok": False, "error": f"{type(e).__name__}: {e}",
                    "traceback": "".join(traceback.format_exception(e))[-3000:]})
    res["faults"] = trial.describe()
    res["bad_records"] = list(trial.bad_records)
    res["seconds"] = round(time.perf_counter() - started, 2)
    trial.result = res
    return res


def _compare_outputs(res: dict, query: Query, expected: dict, got: dict) -> None:
    """Count into ``res`` every application's output against the reference's, as a multiset:
    ``outputs``, ``reference_outputs``, ``lost``, ``duplicated`` (an extra copy of an expected
    tuple) and ``unexpected`` (a tuple the reference lacks)."""
    for app in query.sinks:
        lost, extra = multiset_diff(expected[app], got[app])
        res.setdefault("outputs", 0)
        res["outputs"] += int(len(got[app]))
        res["reference_outputs"] = res.get("reference_outputs", 0) + int(len(expected[app]))
        res["lost"] = res.get("lost", 0) + int(len(lost))
        expected_ids = set(expected[app]["id"].tolist())
        dup = int(np.isin(extra["id"], list(expected_ids)).sum()) if len(extra) else 0
        res["duplicated"] = res.get("duplicated", 0) + dup
        res["unexpected"] = res.get("unexpected", 0) + int(len(extra)) - dup


def _differences(query: Query, expected: dict, got: dict, sample: int = 5) -> dict:
    """Per application that differs from the reference: the lost and the extra tuples' count, their
    timestamps' range (seconds) and count per second of event time, and a few of them (a failed
    trial's record says where in the stream the outputs went missing).

    >>> import numpy as np
    >>> q = Query(); _ = q.source("s", {"k": "i8"}).sink("out"); q = q.build()
    >>> a = q.schema_of("s").from_columns({"ts": [1_000_000, 2_500_000], "k": [1, 2]}, ids=[1, 2])
    >>> _differences(q, {"out": a}, {"out": a[:1]})["out"]["lost"]["per_second"]
    {2: 1}
    """
    out = {}
    for app in query.sinks:
        lost, extra = multiset_diff(expected[app], got[app])
        if not len(lost) and not len(extra):
            continue
        out[app] = {}
        for name, rows in (("lost", lost), ("extra", extra)):
            if not len(rows):
                continue
            secs = (np.asarray(rows["ts"], dtype=np.int64) // 1_000_000).tolist()
            out[app][name] = {"n": int(len(rows)), "ts_s": [min(secs), max(secs)],
                              "per_second": {int(s): secs.count(s) for s in sorted(set(secs))},
                              "sample": [str(r) for r in rows[:sample].tolist()]}
    return out


def _unseen_drops(dep, wait_s: float = 10.0, unaudited: list | None = None) -> dict:
    """With the duplicate filters' audit on in the actors (``REPLISTREAM_AUDIT=1`` where their Ray
    started; :func:`start_ray` starts a campaign's so): per running replica whose filters dropped
    tuples as copies that they never passed (a loss, :mod:`replistream.operators.dupfilter`), per
    input port the count and a few of them ``(channel, ts, id)``; empty when none did, or with the
    audit off. A replica that does not answer within ``wait_s`` (one the trial stopped) or died
    (one it killed) is left out, and named with why in ``unaudited`` if given; any other error
    is raised (the trial fails with it)."""
    import ray

    from .engines.ray.common import is_actor_death

    asked = {r.label: dep.topology.handle(r.label).stats.remote() for r in dep.topology.replicas()
             if r.kind != "entry" and dep.topology.is_running(r.label)}
    ready = set(ray.wait(list(asked.values()), num_returns=len(asked), timeout=wait_s)[0]) if asked else set()
    out = {}
    for label, ref in asked.items():
        if ref not in ready:
            if unaudited is not None:
                unaudited.append(f"{label}: no answer in {wait_s:g} s")
            continue
        try:
            st = ray.get(ref, timeout=1.0)  # (ready: answered within the wait above)
        except Exception as e:
            if not is_actor_death(e):
                raise
            if unaudited is not None:  # a replica the trial killed
                unaudited.append(f"{label}: {type(e).__name__}")
            continue
        filters = st.get("filters") or (st.get("core") or {}).get("filters") or []
        bad = {port: {"n": f["unseen_drops"], "sample": f["unseen_sample"]}
               for port, f in enumerate(filters) if f.get("unseen_drops")}
        if bad:
            out[label] = bad
    return out


def _events_of(dep, last: int = 300) -> list:
    """The deployment's last ``last`` events (a failed trial's record keeps them, each as a line of
    at most 400 characters); what cannot be read is said, not raised."""
    try:
        return list(dep.events)[-int(last):]
    except Exception as e:  # noqa: BLE001 - a diagnostic only: the comparison goes on
        return [f"events unreadable: {type(e).__name__}: {e}"]


def _rescale_to(rng: np.random.Generator) -> int:
    """The partitions a partitioned trial's window is rescaled to: one fewer or one more."""
    return PARTITIONS["per_key"] + (1 if rng.random() < 0.5 else -1)


def _in_thread(moved: dict, what: str, fn: Callable) -> Call:
    """A sentinel that runs ``fn(deployment)`` in a thread, as a user would (the feeder goes on);
    the thread is ``moved["thread"]``, an error fails the trial (``moved["error"]``)."""
    def start(d):
        def go():
            try:
                moved["event"] = fn(d)
            except Exception as e:  # the trial fails with it (res["error"])
                moved["error"] = f"{what}: {type(e).__name__}: {e}"
        moved["thread"] = threading.Thread(target=go, name="replistream-chaos-change")
        moved["thread"].start()

    return Call(start)


def _runtime_changes(rng, dep, seed: int, t0: int, t1: int, moved: dict, rescale_to: int | None = None,
                     giver: str | None = None) -> list:
    """On the keyed query: replace the map's function with an equivalent one, and move a replica of
    the stateful window to a server that holds none (fluid migration, in a thread as a user would).
    With ``rescale_to`` (the partitioned trial), rescale the window to that many partitions
    instead of moving a replica (Megaphone's migration; the strategy drawn from the seed); with
    ``giver`` (a partition that gives bins in it, spared by :func:`plan_faults`), one of its
    replicas is killed or crashes 0.2-1.5 s of event time after the rescale is called, while its
    new partitions start or its bins move."""
    span = t1 - t0  # (a rescale refuses other changes while it runs: the function is replaced before it)
    out = [(int(t0 + span * (0.1 if rescale_to is not None else 0.3)), "replace the function of 'scale' (equivalent)",
            Call(lambda d: d.replace_function("scale", _scaler(_failing_keys(seed, 200)))))]
    if rescale_to is not None:
        strategy = ("fluid", "batched", "all-at-once")[int(rng.integers(3))]
        per_step = (None, 16, 64, 256)[int(rng.integers(4))] if strategy == "batched" else None
        out.append((int(t0 + span * 0.3), f"rescale per_key {PARTITIONS['per_key']} -> {rescale_to} ({strategy}"
                    + (f", {per_step} bins a step)" if per_step else ", about 16 steps)" if strategy == "batched"
                       else ")"),
                    _in_thread(moved, "rescale", lambda d: d.rescale("per_key", rescale_to, strategy=strategy,
                                                                     bins_per_step=per_step))))
        if giver is not None:
            i, at = int(rng.integers(dep.k)), int(t0 + span * 0.3 + 1e6 * (0.2 + 1.3 * rng.random()))
            if rng.random() < 0.5:
                out.append((at, f"kill {giver}#{i} during the rescale", KillReplica(giver, i)))
            else:
                out.append((at, f"crash {giver}#{i} during the rescale",
                            Call(lambda d, label=f"{giver}#{i}": _crash(d, label))))
        return out
    taken = set(dep.plan["per_key"])
    free = [s for s in dep.servers if s not in taken]
    if free:
        target, index = free[int(rng.integers(len(free)))], int(rng.integers(dep.k))
        out.append((int(t0 + span * 0.5), f"move per_key#{index} to {target} (live, fluid)",
                    _in_thread(moved, "move_replica",
                               lambda d: d.move_replica("per_key", index, target, strategy="fluid"))))
    return out


#: With ``driver_kills=True``: the share of trials run as driver-kill trials (drawn per trial from the seed).
DRIVER_KILL_SHARE = 0.3

#: Seconds a driver-kill trial's driver may take to deploy and start feeding before the trial fails.
DRIVER_START_TIMEOUT_S = 180.0

#: Grid of a driver-kill trial's Parquet sinks (event-time µs per file).
DRIVER_SINK_EVERY = seconds(5)


def file_sources(dirs: dict[str, str], chunk: int) -> dict:
    """``{source: FileSource}`` over a driver-kill trial's folders (event time in column ``ts``, ``chunk``
    rows per chunk): the same in the driver and in the reference run."""
    from .files import FileSource

    return {src: FileSource(d, time="ts", chunk_size=chunk) for src, d in sorted(dirs.items())}


def _write_parquet_inputs(inputs: dict, bad_source: str, folder: str, rng: np.random.Generator,
                          files: int = 3) -> tuple[dict[str, str], list[str]]:
    """Write each source's column chunks as ``files`` Parquet files in ``folder/<source>/``, with 1-3
    bad rows put in ``bad_source`` (a copy of a row whose event time, or one of its fields, is null:
    the files' reader sets it aside with its reason); returns ``{source: folder}`` and a description
    of each bad row."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    dirs, described = {}, []
    n_bad = int(rng.integers(1, 4))
    for src in sorted(inputs):
        chunks = [c for c in inputs[src] if isinstance(c, dict)]
        names = list(chunks[0])
        cols = {n: np.concatenate([np.asarray(c[n]) for c in chunks]) for n in names}
        nulls = {n: np.zeros(len(cols[n]), dtype=bool) for n in names}
        if src == bad_source:
            for _ in range(n_bad):
                pos = int(rng.integers(1, len(cols["ts"])))
                hole = names[int(rng.integers(len(names)))]  # the event time or a field
                for n in names:
                    cols[n] = np.insert(cols[n], pos, cols[n][pos])
                    nulls[n] = np.insert(nulls[n], pos, n == hole)
                described.append(f"{src}: {'event time' if hole == 'ts' else repr(hole)} null (Parquet row)")
        d = os.path.join(folder, src)
        os.makedirs(d)
        cuts = np.linspace(0, len(cols["ts"]), files + 1).astype(int)
        for i in range(files):
            a, b = int(cuts[i]), int(cuts[i + 1])
            pq.write_table(pa.table({n: pa.array(cols[n][a:b], mask=nulls[n][a:b]) for n in names}),
                           os.path.join(d, f"part-{i}.parquet"))
        dirs[src] = d
    return dirs, described


def _campaign_ray_address() -> str:
    """The address a driver process joins the campaign's Ray at (its GCS; Ray listens on loopback)."""
    import ray

    port = ray.get_runtime_context().gcs_address.rpartition(":")[2]
    return f"127.0.0.1:{port}"


def _wait_for_line(proc: subprocess.Popen, text: str, timeout: float, log: str) -> None:
    """Wait until ``proc`` prints a line holding ``text`` on stdout (its stdout is drained by a thread
    meanwhile and after); raises ``RuntimeError`` with the tail of its log after ``timeout`` s or if
    it exits first."""
    seen = threading.Event()

    def read():
        for line in proc.stdout:
            if text in line:
                seen.set()

    threading.Thread(target=read, name="replistream-chaos-driver-out", daemon=True).start()
    deadline = time.monotonic() + timeout
    while not seen.wait(0.2):
        if proc.poll() is not None and not seen.wait(0.5):
            raise RuntimeError(f"the driver exited with {proc.returncode} before it fed the deployment: "
                               f"{_tail(log)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the driver did not feed the deployment within {timeout:g} s: {_tail(log)}")


def _tail(path: str, lines: int = 3) -> str:
    try:
        with open(path) as f:
            tail = [ln.strip() for ln in f.read().strip().splitlines()[-lines:]]
    except OSError:
        return f"(no log at {path})"
    return " / ".join(tail) or "(its log is empty)"


def _driver_trial_faults(rng: np.random.Generator, query: Query, k: int, t0: int, t1: int,
                         partitioned: bool = False) -> list[tuple]:
    """A driver-kill trial's schedule, as ``(event time µs, description, (fraction of the replay's wall
    time after the driver fed, what))``: the driver killed at 10-70% of the replay, and replicas of
    some nodes (entry points and operators, at most ``k - 1`` of each) killed by the host at
    10-85%. Event times are where the paced replay is at that moment (it starts when the driver
    prints ``fed``, within a chunk's read). ``partitioned``: the window runs in :data:`PARTITIONS`
    partitions, each a group of its own."""
    faults = []

    def at(frac: float) -> int:
        return int(t0 + (t1 - t0) * frac)

    frac = float(np.round(0.1 + 0.6 * rng.random(), 3))
    faults.append((at(frac), "driver killed (SIGKILL) mid-replay", (frac, "driver")))
    plan = {f"{op}.{i}": [] for op, p in (PARTITIONS.items() if partitioned else ()) for i in range(p)}
    for g in fault_groups(plan, query):
        if k > 1 and rng.random() < 0.5:
            for i in sorted(rng.choice(k, size=int(rng.integers(1, k)), replace=False).tolist()):
                f = float(np.round(0.1 + 0.75 * rng.random(), 3))
                faults.append((at(f), f"kill {g}#{i} (by the detached deployment's host)", (f, (g, int(i)))))
    # the control plane (the deployment's host actor) lost once, and a second time in a share of trials:
    # crashed (SIGKILL: Ray restarts it) or stopped (SIGSTOP: its coordinator fences it, then Ray restarts it)
    for _ in range(1 + int(rng.random() < 0.3)):
        f = float(np.round(0.1 + 0.75 * rng.random(), 3))
        how = ["crashed", "stopped"][int(rng.integers(2))]
        faults.append((at(f), f"host {how} (the detached deployment's control plane)", (f, ("host", how))))
    if rng.random() < 0.5:  # its coordinator lost too (crashed or stopped): the control plane replaces it
        f = float(np.round(0.1 + 0.75 * rng.random(), 3))
        how = ["crashed", "stopped"][int(rng.integers(2))]
        faults.append((at(f), f"coordinator {how}", (f, ("coordinator", how))))
    return sorted(faults, key=lambda x: x[0])


def _lose_host(name: str, how: str) -> int:
    """Lose detached deployment ``name``'s serving host process: ``crashed`` (SIGKILL) or ``stopped``
    (SIGSTOP, never resumed: the host standing by, or the coordinator, fences it). Returns the pid."""
    import ray

    from .engines.ray.host import NAMESPACE
    from .engines.ray.standby import serving_host

    pid = ray.get(serving_host(name, NAMESPACE).process.remote(), timeout=60)["pid"]
    os.kill(pid, signal.SIGKILL if how == "crashed" else signal.SIGSTOP)
    return pid


def run_driver_trial(trial: Trial, k: int, servers: list[str], timeout: float = 180.0,
                     repair: bool = False) -> dict:
    """A driver-kill trial (see the module doc): the input in Parquet files, a driver process that
    deploys the query detached and feeds it paced, killed with SIGKILL at a seeded moment; the
    campaign attaches, kills replicas through the host, waits (``timeout``), reads the sinks and
    compares them and the dead letters with the reference; the deployment is stopped at the end.
    Fills and returns ``trial.result``; a trial that raises or times out fails with its reason (its
    folder is then kept and named in ``kept``)."""
    import ray

    from .engines.ray.host import attach, list_deployments
    from .engines.reference import run_reference
    from .sinks import ParquetSink

    trial.driver_kill = True
    rng = np.random.default_rng(trial.seed)
    query, inputs, bad_source, chunk = trial_workload(trial.query, trial.seed)
    started = time.perf_counter()
    res: dict = {"query": trial.query, "seed": trial.seed, "driver_kill": True}
    folder = tempfile.mkdtemp(prefix=f"replistream-chaos-{trial.index}-")
    name = f"chaos-{os.getpid()}-{trial.index}-{trial.seed}"
    proc = client = None
    try:
        dirs, trial.bad_records = _write_parquet_inputs(inputs, bad_source, os.path.join(folder, "in"), rng)
        t0, t1 = _time_span(inputs)
        trial.faults = _driver_trial_faults(rng, query, k, t0, t1, partitioned=trial.query == "partitioned")
        replay_s = (t1 - t0) / 1e6 / TIMING_PACE
        outs = {app: os.path.join(folder, "out", app) for app in query.sinks}
        spec = {"name": name, "query": trial.query, "seed": trial.seed, "options": deploy_options(trial.seed, k, servers, repair, trial.query),
                "inputs": dirs, "chunk": chunk, "sinks": outs, "sink_every": DRIVER_SINK_EVERY, "pace": TIMING_PACE,
                "linger_s": DRIVER_START_TIMEOUT_S + replay_s + timeout}
        with open(os.path.join(folder, "driver.json"), "w") as f:
            json.dump(spec, f)
        log = os.path.join(folder, "driver.log")
        with open(log, "w") as err:
            proc = subprocess.Popen([sys.executable, "-m", "replistream.chaos_driver", os.path.join(folder, "driver.json")],
                                    env={**os.environ, "RAY_ADDRESS": _campaign_ray_address()}, text=True,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err)
        ref = run_reference(query, file_sources(dirs, chunk), on_malformed="dead_letter")  # while it deploys
        _wait_for_line(proc, "fed", DRIVER_START_TIMEOUT_S, log)
        fed = time.monotonic()
        res["driver_fed_after_s"] = round(time.perf_counter() - started, 2)  # files, driver start, deploy
        client = attach(name)
        for _, what, (frac, act) in trial.faults:  # in order of their moment in the replay
            time.sleep(max(0.0, fed + frac * replay_s - time.monotonic()))
            if act == "driver":
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(30)
                res["driver_killed_after_s"] = round(time.monotonic() - fed, 2)
                if name not in list_deployments():
                    raise RuntimeError(f"the detached deployment {name!r} is gone with its killed driver")
                # a kill after the end of the stream tests less: the verdict counts those before it
                res["driver_killed_mid_run"] = not client.status()["complete"]
            elif act[0] == "host":
                _lose_host(name, act[1])
            elif act[0] == "coordinator":
                pid = ray.get(client.coordinator.ping.remote(), timeout=60)["pid"]
                os.kill(pid, signal.SIGKILL if act[1] == "crashed" else signal.SIGSTOP)
            else:
                client.kill_replica(*act)
        ok = client.wait(timeout)
        res["run_seconds"] = round(time.monotonic() - fed, 2)  # from the driver's "fed" to the end of the stream
        if not ok:
            try:
                status = client.status()
            except Exception as e:  # noqa: BLE001 - only said in the reason
                status = f"no status: {type(e).__name__}: {e}"
            raise RuntimeError(f"the detached deployment did not reach the end of the stream within {timeout:g} s "
                               f"after its driver was killed (status: {status})")
        got = client.collect()
        outputs = {}
        for app in query.sinks:
            sink = ParquetSink(outs[app])
            rows = sink.read()  # raises unless the run's completion marker is there
            if sink.manifest()["rows"] != len(rows):
                raise RuntimeError(f"{outs[app]}: the manifest lists {sink.manifest()['rows']} rows, the files hold "
                                   f"{len(rows)}")
            if len(rows) and rows.dtype != ref.outputs[app].dtype:
                raise RuntimeError(f"{outs[app]}: the files' columns {rows.dtype} are not the reference's "
                                   f"{ref.outputs[app].dtype}")
            outputs[app] = rows if len(rows) else ref.outputs[app][:0]
        _compare_outputs(res, query, ref.outputs, outputs)
        res["dead_letters_expected"] = _dead_letters(ref)
        res["dead_letters_received"] = _dead_letters(got)
        res["complete"] = bool(got.complete)
        res["error"] = None
        res["ok"] = (res["lost"] == 0 and res["duplicated"] == 0 and res["unexpected"] == 0 and res["complete"]
                     and res["dead_letters_expected"] == res["dead_letters_received"])
    except Exception as e:  # noqa: BLE001 - any error fails the trial with its reason (Ray's own included)
        res.update({"ok": False, "error": f"{type(e).__name__}: {e}"})
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(30)
        try:  # stop the deployment whatever happened (it outlives the driver by design)
            if client is None and name in list_deployments():
                client = attach(name)
            if client is not None:
                client.stop()
        except Exception as e:  # noqa: BLE001 - a deployment left running fails the trial, loudly
            stop_error = f"could not stop the detached deployment {name!r}: {type(e).__name__}: {e}"
            res.update({"ok": False, "error": "; ".join(x for x in (res.get("error"), stop_error) if x)})
    res["faults"] = trial.describe()
    res["bad_records"] = list(trial.bad_records)
    res["seconds"] = round(time.perf_counter() - started, 2)
    if res["ok"]:
        shutil.rmtree(folder, ignore_errors=True)
    else:
        res["kept"] = folder
    trial.result = res
    return res


#: Whether the Ray this process started (:func:`start_ray`) runs the duplicate filters' audit.
_AUDITED_RAY = False


def start_ray(verbose: bool = False) -> bool:
    """Start this process's Ray for a campaign, its actors with the duplicate filters' audit on
    (``REPLISTREAM_AUDIT=1`` in the environment the raylet starts them with; this process's own
    filters, a reference run's, stay as they were); returns whether the actors audit. A Ray already
    running (a test session's) is used as it is: they audit if it was started with the variable.

    >>> start_ray()   # doctest: +SKIP
    True
    """
    import ray

    from .engines.ray import init_ray

    global _AUDITED_RAY
    if ray.is_initialized():
        return _AUDITED_RAY or os.environ.get("REPLISTREAM_AUDIT") == "1"
    before = os.environ.get("REPLISTREAM_AUDIT")
    os.environ["REPLISTREAM_AUDIT"] = "1"
    try:
        init_ray(verbose=verbose)
    finally:
        if before is None:
            os.environ.pop("REPLISTREAM_AUDIT", None)
        else:
            os.environ["REPLISTREAM_AUDIT"] = before
    _AUDITED_RAY = True
    return True


def run_campaign(minutes: float = 1.0, seed: int = 0, k: int = 2, trials: int | None = None,
                 progress: Callable[[Trial], None] | None = None, repair: bool = False,
                 timing: bool = False, driver_kills: bool | float = False) -> dict:
    """Run trials until ``minutes`` have passed (or ``trials`` trials); the report as a dict (JSON-ready):
    ``verdict`` (one line), ``matches_reference``, ``lost``, ``duplicated``, ``dead_letters`` (expected,
    received, by reason), ``faults`` (counted by kind) and ``trials`` (each with its seed, faults and
    result). ``progress(trial)`` hears each finished trial. ``repair``: deploy with ``repair=True`` and
    one warm spare, so crashed operator replicas are rebuilt during the trials
    (:class:`~replistream.engines.ray.deployment.Deployment`); the repairs are counted. ``timing``:
    each trial also runs without faults first, both paced at :data:`TIMING_PACE`, and its faulty
    run must take at most :data:`TIMING_BOUND` times as long (a timing check; counted in the
    verdict, and a trial over it fails). ``driver_kills``: ``True`` runs a seeded
    :data:`DRIVER_KILL_SHARE` of the trials as driver-kill trials (:func:`run_driver_trial`; a number
    in (0, 1] is that share instead); they have no timing check. The trials' actors audit their
    duplicate filters' drops when this call starts Ray (:func:`start_ray`)."""
    if not k >= 1:
        raise ValueError(f"k must be >= 1, got {k}")
    share = DRIVER_KILL_SHARE if driver_kills is True else float(driver_kills or 0)
    if not 0 <= share <= 1:
        raise ValueError(f"driver_kills must be True, False or a share in (0, 1], got {driver_kills!r}")
    audit = start_ray()
    servers = [s.name for s in default_servers(k + 2)]
    deadline = time.time() + 60.0 * minutes
    done: list[Trial] = []
    i = 0
    while (trials is None and (time.time() < deadline or not done)) or (trials is not None and i < trials):
        t = Trial(i, int(zlib.crc32(f"{seed}:{i}".encode())), QUERIES[i % len(QUERIES)])
        if is_driver_trial(seed, i, share):
            run_driver_trial(t, k, servers, repair=repair)
        else:
            run_trial(t, k, servers, repair=repair, timing=timing, audit=audit)
        done.append(t)
        if progress is not None:
            progress(t)
        i += 1
    return _summarise(done, seed, k, minutes, driver_share=share)


def is_driver_trial(seed: int, i: int, share: float) -> bool:
    """Whether trial ``i`` of the campaign ``seed`` is a driver-kill trial: a ``share`` of the trials,
    evenly spread from a seeded phase (so a short campaign has its share too, e.g. one in every 3 or 4
    trials for 0.3).

    >>> [i for i in range(10) if is_driver_trial(3, i, 0.3)], all(is_driver_trial(3, i, 1.0) for i in range(5))
    ([3, 6, 9], True)
    """
    if share <= 0:
        return False
    u = np.random.default_rng(zlib.crc32(f"driver:{seed}".encode())).random()
    return int(np.floor((i + 1) * share + u)) > int(np.floor(i * share + u))


def _summarise(done: list[Trial], seed: int, k: int, minutes: float, driver_share: float = 0.0) -> dict:
    results = [t.result for t in done]
    total = {key: sum(r.get(key, 0) for r in results) for key in ("outputs", "lost", "duplicated", "unexpected")}
    expected: dict[str, int] = {}
    received: dict[str, int] = {}
    for r in results:
        for kk, v in r.get("dead_letters_expected", {}).items():
            expected[kk] = expected.get(kk, 0) + v
        for kk, v in r.get("dead_letters_received", {}).items():
            received[kk] = received.get(kk, 0) + v
    kinds: dict[str, int] = {}
    for t in done:
        for _, what, _ in t.faults:
            kind = ("server kill" if what.startswith("kill server")
                    else "second kill after a repair" if " again " in what
                    else "replica kill" if what.startswith("kill")
                    else "unannounced replica crash" if what.startswith("crash")
                    else "stopped and resumed replica" if what.startswith("stop") and " for " in what
                    else "stopped replica" if what.startswith("stop")
                    else "slowed server" if what.startswith("slow")
                    else "lost coordinator" if what.startswith("coordinator")
                    else "lost host" if what.startswith("host")  # (the control plane of a detached deployment)
                    else "driver kill" if what.startswith("driver")
                    else "link restore" if what.startswith("restore")
                    else "link delay" if what.startswith("delay") else "link cut" if what.startswith("cut")
                    else "live move" if what.startswith("move") else "runtime change")
            kinds[kind] = kinds.get(kind, 0) + 1
        kinds["malformed record"] = kinds.get("malformed record", 0) + len(t.bad_records)
    timed = [r for r in results if "timing_ok" in r]
    ok = all(r.get("ok") and r.get("timing_ok", True) for r in results)
    failed = [t for t in done if not (t.result.get("ok") and t.result.get("timing_ok", True))]
    n_bad = sum(expected.values())
    head = "PASS" if ok else "FAIL"
    trials = _plural("trial", len(done))
    verdict = (f"{head}: {len(done)} {trials}, {total['outputs']:,} outputs "
               f"{'identical to the reference' if ok else 'compared with the reference'}, {total['lost']:,} lost, "
               f"{total['duplicated']:,} duplicated, {sum(received.values()):,} bad rows dead-lettered with a reason "
               f"({n_bad:,} expected); faults: " + ", ".join(f"{n} {_plural(kk, n)}" for kk, n in sorted(kinds.items())))
    lost_cp = sum(any(w.startswith(("coordinator", "host")) for _, w, _ in t.faults) for t in done)
    verdict += (f"; a control-plane process (the detached host or the coordinator) lost in {lost_cp} of {len(done)} "
                f"{trials}")
    repairs = [r for r in results if "repairs" in r]
    if repairs:
        errs = [e for r in repairs for e in r.get("repair_errors", [])]
        retried = sum(len(r.get("repair_retries", [])) for r in repairs)
        n_repaired = sum(r['repairs'] for r in repairs)
        verdict += (f"; {n_repaired} {_plural('crashed replica', n_repaired)} repaired"
                    + (f", {retried} failed {'try' if retried == 1 else 'tries'} of a repair tried again" if retried else "")
                    + f", {len(errs)} {_plural('repair', len(errs))} failed"
                    + (f" ({'; '.join(errs[:3])})" if errs else ""))
    drivers = [r for r in results if r.get("driver_kill")]
    if driver_share > 0 and not drivers:
        verdict += f"; no driver-kill trial among these {len(done)} (share {driver_share:g})"
    elif drivers:
        verdict += (f"; {len(drivers)} {_plural('driver-kill trial', len(drivers))} (detached deployments), "
                    f"{sum(bool(r.get('driver_killed_mid_run')) for r in drivers)} with the driver killed "
                    f"before the end of the stream")
    parted = [r for r in results if r.get("query") == "partitioned" and not r.get("driver_kill")]
    if parted:
        refused = sum('change_refused' in r for r in parted)
        verdict += (f"; {sum('rescaled' in r for r in parted)} of {len(parted)} "
                    f"{_plural('partitioned trial', len(parted))} rescaled live"
                    + (f" ({refused} {_plural('rescale', refused)} came after the stream ended: refused)" if refused else ""))
    if timed:
        worst = max(r["timing_ratio"] for r in timed)
        verdict += (f"; timing: {sum(r['timing_ok'] for r in timed)} of {len(timed)} {_plural('trial', len(timed))} within "
                    f"{TIMING_BOUND:g}x the same trial without faults (worst {worst:.2f}x)")
    if failed:
        verdict += f"; failed trials: {', '.join(str(t.index) for t in failed)}"
    return {"verdict": verdict, "matches_reference": ok, "seed": seed, "k": k, "minutes": minutes,
            "trials_run": len(done), **total, "dead_letters": {"expected": expected, "received": received},
            "faults": kinds, "trials": results}


def format_report(report: dict) -> str:
    """The campaign as a table (one row per trial), for the command line."""
    lines = [f"{'#':>3} {'query':<6} {'outputs':>8} {'lost':>5} {'dup':>4} {'dead letters':>13} {'s':>6}  "
             f"verdict / faults"]
    for i, r in enumerate(report["trials"]):
        exp, rec = sum(r.get("dead_letters_expected", {}).values()), sum(r.get("dead_letters_received", {}).values())
        verdict = "ok" if r.get("ok") else f"FAIL {r.get('error') or ''}".strip()
        if "timing_ratio" in r:
            verdict += f" ({r['timing_ratio']:.2f}x{'' if r['timing_ok'] else ' OVER THE BOUND'})"
        lines.append(f"{i:>3} {r['query']:<6} {r.get('outputs', 0):>8,} {r.get('lost', 0):>5} "
                     f"{r.get('duplicated', 0):>4} {f'{rec}/{exp}':>13} {r['seconds']:>6.1f}  {verdict}: "
                     + "; ".join(r["faults"]))
    return "\n".join(lines)


def _plural(kind: str, n: int) -> str:
    """A fault kind of the verdict, plural unless ``n`` is 1.

    >>> _plural("link cut", 2), _plural("unannounced replica crash", 2), _plural("second kill after a repair", 3)
    ('link cuts', 'unannounced replica crashes', 'second kills after a repair')
    >>> _plural("lost host", 1)
    'lost host'
    """
    if n == 1:
        return kind
    head, sep, tail = kind.partition(" after ")  # (the noun comes before a qualifier)
    return (head + ("es" if head.endswith(("sh", "ch", "s")) else "s")) + (sep + tail if sep else "")
