"""Changes to a running deployment at logical times (Bartnik §3; docs/design.md, decision 8).

The deployment's methods ``replace_function``, ``add_operator``,
``remove_operator`` and ``set_replication`` call these functions; the model
and why it is replication-transparent are in :mod:`replistream.replica.changes`.
Each change:

1. takes the coordinator's lock (no revival or garbage collection runs
   meanwhile) and the feeder's lock (no chunk is sent meanwhile);
2. picks ``p``, the largest timestamp or punctuation the feeder has sent;
3. writes the change into ``Deployment.query`` at ``p`` (replicas started
   from now on are built from it: a revival never misses the change);
4. sends a marker with the change into every source that has not ended, on
   every live entry replica, after everything sent so far;
5. records the change (``Deployment.changes``) with ``p`` and its figures.

Replicas apply the change when the marker's first copy reaches them (see
:meth:`replistream.replica.ReplicaCore.process`).
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import replace

import ray

from ...errors import QueryError
from ...gc import ENTRY, OperatorReplica, StreamReplica
from ...replica.changes import PENDING, AddOperator, CutSpec, RemoveOperator, ReplaceFunction, new_marker, set_spec
from ...schema import END


@contextmanager
def _quiet(dep):
    """No coordinator period and no chunk in flight while the change is made."""
    mgr = dep.manager
    with (mgr.lock if mgr is not None else nullcontext()):
        with dep._feed_lock:
            yield


def _marker_time(dep) -> int:
    if not dep._feeding:
        raise RuntimeError("a running query changes while it is fed: call feed() first (before it, deploy the "
                           "query you want; once every source has ended, nothing is left to change)")
    if dep._tmax_unknown:
        raise RuntimeError("the feeder could not tell the largest timestamp of some input chunk, so it "
                           "cannot place a change after it; give chunks with a 'ts' column")
    if not any(s in dep._open_sources for s in dep.query.sources):
        raise RuntimeError("every source has ended: nothing is left to change")
    from ...operators.base import NO_PUNCTUATION

    return NO_PUNCTUATION if dep._max_fed is None else int(dep._max_fed)


def _send_marker(dep, p: int, change) -> int:
    """Put the marker after everything sent so far on every open source; returns its id."""
    marker = new_marker(p, change)
    for src in dep.query.sources:
        if src in dep._open_sources:
            dep._send_chunk(src, dep._seqs[src], marker, dep._inflight)
            dep._seqs[src] += 1
    return marker.id


def _record(dep, rec: dict) -> dict:
    rec = {"t": round(time.time() - dep.t0, 3), **rec}
    dep.changes.append(rec)
    dep.events.append({"event": "change", **rec})
    return rec


def replace_function(dep, operator: str, fn) -> dict:
    """See :meth:`Deployment.replace_function`."""
    ReplaceFunction(operator, fn).check(dep.query)
    with _quiet(dep):
        p = _marker_time(dep)
        change = ReplaceFunction(operator, fn).resolve(dep.query, p)
        dep.query = change.apply_query(dep.query, p)
        mid = _send_marker(dep, p, change)
    return _record(dep, {"change": "replace_function", "operator": operator, "p": p, "marker": mid,
                         "text": f"{change.describe()} for tuples with ts > {p}"})


def remove_operator(dep, operator: str, wait: float = 600.0) -> dict:
    """See :meth:`Deployment.remove_operator`."""
    gone = RemoveOperator(operator).check(dep.query)
    dep._replicas()  # the coordinator's view, so the removed replicas can be forgotten there
    with _quiet(dep):
        p = _marker_time(dep)
        change = RemoveOperator(operator)
        dep.query = change.apply_query(dep.query, p)
        mid = _send_marker(dep, p, change)
    apps = [n for n in gone if dep.query.spec(n).kind == "sink"]
    labels = [l for n in gone if n not in apps for l, _ in dep._instances(n)]
    rec = _record(dep, {"change": "remove_operator", "operator": operator, "p": p, "marker": mid,
                        "removed": gone, "applications": apps, "retired": None,
                        "text": f"remove {gone}: they see their input up to ts {p}, then their inputs close"})

    def retire():
        # once the removed part's applications got END, nothing flows through it any more
        # (an actor runs one call at a time: ask, never block it)
        deadline = time.time() + wait
        left = list(apps)
        while left and time.time() < deadline:
            try:
                done = ray.get([dep.sinks[a].stats.remote() for a in left], timeout=60)
                left = [a for a, st in zip(left, done) if st["punctuation"] != END]
            except Exception:
                break
            if left:
                time.sleep(0.1)
        _retire(dep, labels)
        rec["retired"] = round(time.time() - dep.t0, 3)

    threading.Thread(target=retire, daemon=True, name=f"replistream-remove-{operator}").start()
    return rec


def _retire(dep, labels: list[str]) -> None:
    """Disconnect ``labels`` from their upstream replicas, stop them, forget them."""
    mgr = dep.manager
    with (mgr.lock if mgr is not None else nullcontext()):
        calls = [h.disconnect.remote(l) for src, h in list(dep.handles.items()) if dep.alive.get(src)
                 and src not in labels for l in labels]
        from .deployment import _get_quietly

        _get_quietly(calls, timeout=60)
        for l in labels:
            with dep._lock:
                dep.alive[l] = False
                dep.removed.add(l)
            try:
                ray.kill(dep.handles[l], no_restart=True)
            except Exception:
                pass
        if mgr is not None:
            for l in labels:
                mgr.reps.pop(l, None)
            for sid in [sid for sid, s in mgr.streams.items() if s.src in labels or s.dst in labels]:
                mgr.streams.pop(sid, None)
                mgr.chan.pop(sid, None)


def add_operator(dep, upstream: str, build, servers=None) -> dict:
    """See :meth:`Deployment.add_operator`."""
    from .actors import ReplicaActor, SinkActor
    from .deployment import _ray_options

    dep._replicas()  # the coordinator's view must exist before the query grows (it is built from the plan)
    with _quiet(dep):
        q2, add = AddOperator(upstream, build).extend(dep.query, PENDING)
        ups = [(l, h) for l, h in dep._instances(upstream) if dep.alive.get(l)]
        if not ups:
            raise RuntimeError(f"add_operator: no live replica produces {upstream!r}")
        for n in add.added:
            if n in dep.handles or n in dep.replicas or n in dep.sinks:
                raise QueryError(f"add_operator: {n!r} was a node of this deployment; pick a new name")
        if servers is None:
            servers = [dep.actor_server[l] for l, _ in ups]  # beside the stream they read: no new WAN hop
        servers = [s if isinstance(s, str) else s.name for s in servers]
        unknown = [s for s in servers if s not in dep.servers]
        if unknown:
            raise ValueError(f"add_operator: unknown server(s) {unknown}; servers: {sorted(dep.servers)}")
        k = dep.k
        plan = {}
        for n in add.added:
            plan[n] = [servers[0]] if q2.spec(n).kind == "sink" else [servers[i % len(servers)] for i in range(k)]
        chan_of = {l: i for i, (l, _) in enumerate(ups)}
        created: dict[str, list] = {}
        for n in add.added:
            chans = [len(ups) if u == upstream else len(plan[u]) for u in q2.inputs_of(n)]
            hs = []
            for i, srv in enumerate(plan[n]):
                opts = _ray_options(dep.servers[srv])
                if q2.spec(n).kind == "sink":
                    h = SinkActor.options(**opts).remote(q2, n, srv, chans, dep.conditions, dep.t0, dep.channel_opts,
                                                         dep.coordinator, dep.strict, None)
                else:
                    h = ReplicaActor.options(**opts).remote(q2, n, i, srv, chans, dep.conditions, dep.t0,
                                                            dep.channel_opts, dep.coordinator, dep.strict)
                hs.append(h)
            created[n] = hs
        ray.get([h.set_clock.remote(dep.t0, dep.ts0, dep.speed) for hs in created.values() for h in hs],
                timeout=120)

        def label(n, i):
            return n if q2.spec(n).kind == "sink" else f"{n}#{i}"

        with dep._poll_lock, dep._lock:
            for n, hs in created.items():
                for i, h in enumerate(hs):
                    dep._register(label(n, i), plan[n][i], h)
                if q2.spec(n).kind == "sink":
                    dep.sinks[n] = hs[0]
                    dep._fetched[n], dep._outputs[n], dep._arrivals[n] = 0, [], []
                    dep._punct[n], dep._callbacks[n] = -(1 << 63), []
                else:
                    dep.replicas[n] = hs
        # links among the new nodes now; from the stream's producers when the marker passes them
        calls, links = [], {}
        for n in add.added:
            for v, port in q2.outputs_of(n):
                for ci, uh in enumerate(created[n]):
                    for di, dh in enumerate(created[v]):
                        calls.append(uh.connect.remote(n, label(v, di), plan[v][di], dh, port, ci))
        ray.get(calls, timeout=120)
        for v, port in q2.outputs_of(upstream):
            if v not in add.added:
                continue
            for ul, _ in ups:
                for di, dh in enumerate(created[v]):
                    links.setdefault(ul, []).append((upstream, label(v, di), plan[v][di], dh, port, chan_of[ul]))
        p = _marker_time(dep)
        change = replace(add, links=links)
        for n in add.added:
            spec = q2.spec(n)
            if isinstance(spec, CutSpec) and spec.lower == PENDING:
                set_spec(q2, n, CutSpec(spec.inner, p, spec.upper))
        dep.query = q2
        dep.plan = {**dep.plan, **plan}
        mid = _send_marker(dep, p, change)
        _register_with_manager(dep, upstream, add.added, plan, chan_of)
    return _record(dep, {"change": "add_operator", "upstream": upstream, "added": list(add.added), "p": p,
                         "marker": mid, "placement": plan,
                         "text": f"{change.describe()}: they see its tuples with ts > {p}"})


def _register_with_manager(dep, upstream: str, added, plan: dict, chan_of: dict) -> None:
    """Tell the coordinator about the new replicas and stream replicas (for GC and revival)."""
    from ...plan import is_stateful

    mgr = dep.manager
    q = dep.query
    up_op = ENTRY if q.spec(upstream).kind == "source" else upstream
    for n in added:
        spec = q.spec(n)
        if spec.kind == "sink":
            mgr.reps[n] = OperatorReplica(n, n, plan[n][0], "application")
        else:
            stateful = is_stateful(q, n)
            for i, srv in enumerate(plan[n]):
                mgr.reps[f"{n}#{i}"] = OperatorReplica(f"{n}#{i}", n, srv, "operator", stateful=stateful)
    labels = {n: ([n] if q.spec(n).kind == "sink" else [f"{n}#{i}" for i in range(len(plan[n]))]) for n in added}
    for n in added:
        for u in q.inputs_of(n):
            if u == upstream:
                srcs = [r for r in mgr.reps.values() if r.operator == up_op]
                for r in srcs:
                    for d in labels[n]:
                        port = [p for v, p in q.outputs_of(upstream) if v == n][0]
                        s = StreamReplica(r.label, d, port, 0.0, 0.0, 0.0, r.label in chan_of, upstream)
                        mgr.streams[s.id] = s
                        if r.label in chan_of:
                            mgr.chan[s.id] = chan_of[r.label]
            else:
                port = q.inputs_of(n).index(u)
                for ci, src in enumerate(labels[u]):
                    for d in labels[n]:
                        s = StreamReplica(src, d, port, 0.0, 0.0, 0.0, True, u)
                        mgr.streams[s.id] = s
                        mgr.chan[s.id] = ci


def set_replication(dep, operator: str, k: int) -> dict:
    """See :meth:`Deployment.set_replication`."""
    if operator not in dep.replicas:
        raise ValueError(f"set_replication: {operator!r} is not an operator of this deployment; operators: "
                         f"{sorted(dep.replicas)}")
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"set_replication: k must be an integer >= 1, got {k!r}")
    mgr = dep._replicas()
    added, discarded = [], []
    with mgr.lock:
        mgr._notice_failures()
        live = sorted(l for l, r in mgr.reps.items() if r.operator == operator and r.live and dep.alive.get(l))
        for _ in range(max(0, k - len(live))):
            ev = dep.add_replica(operator)
            added.extend(r["label"] for r in ev.get("new_replicas", []))
        for label in live[k:][::-1] if len(live) > k else []:
            streams = [sid for sid, s in mgr.streams.items() if s.live and label in (s.src, s.dst)]
            mgr._apply_discard(streams, [label])
            discarded.append(label)
            mgr._event({"kind": "reconfiguration", "action": "discard", "replica": label,
                        "text": f"set_replication({operator!r}, {k}): {label} discarded"})
    return _record(dep, {"change": "set_replication", "operator": operator, "k": k, "added": added,
                         "discarded": discarded, "p": None,
                         "text": f"{operator!r} now has {k} live replica(s)"})




def live_reconfiguration(n_servers: int = 4, duration_s: float = 16.0, period_s: float = 0.25, k: int = 2,
                         strategy: str = "fluid", pace: float | None = None, seed: int = 0,
                         network="geo-static") -> dict:
    """The scripted example behind ``replistream reconfigure`` and ``examples/live_reconfiguration.py``.

    The Fig. 1 query runs with ``k`` replicas; at known points of the input
    (``testing.inject_at``) the deployment, while it runs:

    * at 25% of the readings, replaces the alert filter's function (CPU > 0.6
      instead of > 0.5 from then on);
    * at 40%, adds a per-server load aggregate with its application, reading the
      union of the load streams;
    * at 55%, moves ``correlate#0`` (the stateful Join) to another server, taking
      its state from a live peer with ``strategy`` while the feed goes on.

    Returns a JSON-ready report: the changes with their ``p``, the move's
    hand-over figures, and per application the output size and whether it
    equals the reference run of the changed query exactly (``lost``,
    ``duplicates``, ``matches_reference``).

    >>> live_reconfiguration(duration_s=8)["matches_reference"]   # doctest: +SKIP
    True
    """
    from ...engines import run_reference
    from ...schema import seconds
    from ...engines.result import multiset_diff
    from ...sources import Call, inject_at
    from ...workloads import fig1_inputs, fig1_query
    from .deployment import deploy

    query = fig1_query(n_servers=n_servers, window_s=2.0, punctuate_s=0.5)
    inputs = fig1_inputs(n_servers=n_servers, duration_s=duration_s, period_s=period_s, seed=seed, chunk=4)
    moved: dict = {}

    def move(dep):
        import threading

        free = [s for s in dep.servers if s not in {dep.actor_server[l] for l in dep.handles
                                                    if l.startswith("correlate#") and dep.alive.get(l)}]

        def run():
            try:
                moved["event"] = dep.move_replica("correlate", 0, free[0], strategy=strategy)
            except Exception as e:  # reported, and the run's check below still decides
                moved["error"] = repr(e)

        moved["thread"] = threading.Thread(target=run, name="replistream-move")
        moved["thread"].start()

    script = inject_at(inputs["load_0"], seconds(0.25 * duration_s),
                       Call(lambda d: d.replace_function("hot", lambda b: (b["cpu"] > 0.6) & (b["rtt_ms"] > 0))))
    script = inject_at(script, seconds(0.40 * duration_s), Call(lambda d: d.add_operator(
        "loads", lambda s: s.window(size=seconds(2), by="server", aggs={"n": "count", "avg_cpu": ("cpu", "mean")},
                                    name="load_stats").sink("load_per_server"))))
    script = inject_at(script, seconds(0.55 * duration_s), Call(move))
    with deploy(query, servers=n_servers, k=k, network=network, seed=seed) as dep:
        res = dep.run({**inputs, "load_0": script}, pace=pace, timeout=300)
        if "thread" in moved:
            moved["thread"].join(timeout=300)
        changed = dep.query
        changes = [{k: c[k] for k in ("change", "p", "text") if k in c} for c in dep.changes]
        transfers = dep.transfers()
    ref = run_reference(changed, inputs)
    apps = {}
    for app in changed.sinks:
        lost, extra = multiset_diff(ref.outputs[app], res.outputs[app])
        apps[app] = {"outputs": int(len(res.outputs[app])), "reference_outputs": int(len(ref.outputs[app])),
                     "lost": int(len(lost)), "duplicates": int(len(extra))}
    ev = moved.get("event") or {}
    return {"changes": changes,
            "move": {"strategy": strategy, "error": moved.get("error"),
                     "new_replicas": [r.get("label") for r in ev.get("new_replicas", [])],
                     "server": (ev.get("new_replicas") or [{}])[0].get("server"),
                     "apply_seconds": ev.get("apply_seconds"), "transfers": transfers},
            "applications": apps, "complete": bool(res.complete),
            "matches_reference": bool(res.complete) and all(a["lost"] == 0 and a["duplicates"] == 0
                                                           for a in apps.values()) and "error" not in moved,
            "reference_unchanged_outputs": {a: int(len(o)) for a, o in run_reference(query, inputs).outputs.items()},
            "seed": seed, "servers": n_servers, "k": k}


__all__ = ["add_operator", "live_reconfiguration", "remove_operator", "replace_function", "set_replication"]
