"""Scripted demonstrations that drive a deployment the way a user would.

* :func:`live_reconfiguration`: the Fig. 1 query on Ray changed while it runs (a
  function replaced, an operator added, a Join replica moved), checked against the
  reference run of the changed query; behind ``replistream reconfigure`` and
  ``examples/live_reconfiguration.py``.

>>> live_reconfiguration(duration_s=6)["matches_reference"]   # doctest: +SKIP
True
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from .engines.ray import deploy
from .engines.reference import run_reference
from .engines.result import multiset_diff
from .schema import seconds
from .sources import Call, inject_at
from .workloads import fig1_inputs, fig1_query

__all__ = ["live_reconfiguration"]


def live_reconfiguration(n_servers: int = 4, duration_s: float = 16.0, period_s: float = 0.25, k: int = 2,
                         strategy: str = "fluid", pace: float | None = None, seed: int = 0,
                         network="geo-static", say: Callable[[str], None] | None = None) -> dict:
    """The scripted example behind ``replistream reconfigure`` and ``examples/live_reconfiguration.py``.

    The Fig. 1 query runs with ``k`` replicas; at known points of the input
    (:class:`~replistream.sources.inject_at`) the deployment, while it runs:

    * at 25% of the readings, replaces the alert filter's function (CPU > 0.6
      instead of > 0.5 from then on);
    * at 40%, adds a per-server load aggregate with its application, reading the
      union of the load streams;
    * at 55%, moves ``correlate#0`` (the stateful Join) to another server, taking
      its state from a live peer with ``strategy`` while the feed goes on.

    Returns a JSON-ready report: the changes with their ``p``, the move's
    hand-over figures, and per application the output size and whether it
    equals the reference run of the changed query exactly (``lost``,
    ``duplicates``, ``matches_reference``). ``say``, when given, hears each phase
    as it starts (the CLI prints them on stderr), and each change as it happens.

    >>> live_reconfiguration(duration_s=8)["matches_reference"]   # doctest: +SKIP
    True
    """
    query = fig1_query(n_servers=n_servers, window_s=2.0, punctuate_s=0.5)
    inputs = fig1_inputs(n_servers=n_servers, duration_s=duration_s, period_s=period_s, seed=seed, chunk=4)
    moved: dict = {}

    def move(dep):
        taken = {dep.topology.server(label) for label, _ in dep.topology.running("correlate")}
        free = [s for s in dep.servers if s not in taken]

        def run():
            try:
                moved["event"] = dep.move_replica("correlate", 0, free[0], strategy=strategy)
            except Exception as e:  # reported, and the run's check below still decides
                moved["error"] = repr(e)

        moved["thread"] = threading.Thread(target=run, name="replistream-move")
        moved["thread"].start()

    t0 = time.perf_counter()
    tell = say or (lambda text: None)

    def told(text, fn):
        def call(d):
            tell(f"{time.perf_counter() - t0:6.1f} s  {text}")
            return fn(d)
        return call

    script = inject_at(inputs["load_0"], seconds(0.25 * duration_s), Call(told(
        "replacing the filter 'hot' (cpu > 0.6 from now on)",
        lambda d: d.replace_function("hot", lambda b: (b["cpu"] > 0.6) & (b["rtt_ms"] > 0)))))
    script = inject_at(script, seconds(0.40 * duration_s), Call(told(
        "adding the aggregate 'load_stats' and its application", lambda d: d.add_operator(
            "loads", lambda s: s.window(size=seconds(2), by="server", aggs={"n": "count", "avg_cpu": ("cpu", "mean")},
                                        name="load_stats").sink("load_per_server")))))
    script = inject_at(script, seconds(0.55 * duration_s), Call(told(f"moving correlate#0 ({strategy})", move)))
    tell(f"starting Ray and {k} replicas of every operator on {n_servers} servers ...")
    with deploy(query, servers=n_servers, k=k, network=network, seed=seed) as dep:
        tell(f"{time.perf_counter() - t0:6.1f} s  up; feeding {duration_s:g} s of readings")
        res = dep.run({**inputs, "load_0": script}, pace=pace, timeout=300)
        if "thread" in moved:
            moved["thread"].join(timeout=300)
        tell(f"{time.perf_counter() - t0:6.1f} s  run complete; comparing with the reference run of the changed "
             f"query")
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
