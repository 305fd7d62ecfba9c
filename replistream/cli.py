"""The ``replistream`` command line.

``replistream demo`` runs the paper's Fig. 1 network-monitoring query with
every operator replicated ``k`` times, crashes replicas mid-run, and checks
the delivered output against the ideal non-replicated run.

By default it deploys on local Ray over the emulated wide-area network,
replays the readings in real time, kills the server of one join replica
halfway, and reports end-to-end latency before and after the failure.
``--engine inprocess`` runs the same operators in the in-process replicated
engine (:func:`replistream.testing.run_replicated`) instead: no Ray, no
clock, random crashes, a few seconds.

>>> main(["demo", "--engine", "inprocess", "--servers", "3", "--duration", "60", "--period", "10", "--json"])
... # doctest: +ELLIPSIS
{"engine": "in-process", ...}
0

``replistream place`` computes a replica placement (Algorithm 5, Hwang §V-A,
or a baseline) for a query over a set of servers and prints it with its
network cost and its bandwidth and cost relative to the non-replicated
placement (k=1); ``--plot`` draws it on a world map.

>>> main(["place", "--servers", "8", "--k", "2", "--json"])  # doctest: +ELLIPSIS
{"query": "fig1", "servers": 8, "strategy": "min-cost", "k": 2, ...}
0
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import sys
import threading
import time

import numpy as np

from .progress import Heartbeat


class CliError(Exception):
    """A mistake on the command line, found before anything slow starts: ``main`` prints it as one
    line, ``replistream <command>: error: <what is wrong and the fix>``, and exits with 2.

    >>> str(CliError("--duration must be > 0 seconds, got -5"))
    '--duration must be > 0 seconds, got -5'
    """


class _Parser(argparse.ArgumentParser):
    """argparse, answering a mistake with one line (no usage block) and, for an unknown option, the
    nearest known one."""

    def error(self, message):
        hint = ""
        unknown = re.match(r"unrecognized arguments: (\S+)", message)
        if unknown:
            near = difflib.get_close_matches(unknown.group(1).split("=")[0], sorted(_all_options(self)), n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
        self.exit(2, f"{self.prog}: error: {message}{hint}; see {self.prog} --help\n")


def _all_options(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of ``parser`` and of its subcommands."""
    out = set()
    for action in parser._actions:
        out.update(o for o in action.option_strings if o.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out |= _all_options(sub)
    return out


def _positive(args, *names: str, unit: str = "") -> None:
    for name in names:
        v = getattr(args, name.replace("-", "_"))
        if v is not None and not (np.isfinite(v) and v > 0):
            raise CliError(f"--{name} must be > 0{' ' + unit if unit else ''}, got {v:g}")


def _check_file(path: str, what: str, flag: str) -> None:
    if not os.path.isfile(path):
        raise CliError(f"{flag}: no {what} at {path!r}" + ("" if os.path.exists(path) else
                       " (the file does not exist; check the path)"))
    if not os.access(path, os.R_OK):
        raise CliError(f"{flag}: cannot read {path!r} (permission denied)")


def _check_out_file(path: str, flag: str, suffixes: tuple[str, ...] = ()) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    if suffixes and not path.lower().endswith(suffixes):
        raise CliError(f"{flag}: {path!r} must end in {' or '.join(suffixes)}")
    if not os.path.isdir(folder):
        raise CliError(f"{flag}: the folder {folder!r} does not exist; create it or choose another path")
    if not os.access(folder, os.W_OK):
        raise CliError(f"{flag}: cannot write in {folder!r} (permission denied)")


def check_demo(args) -> None:
    """Every argument of ``demo`` checked before Ray starts; raises :class:`CliError` naming the mistake.

    >>> args = build_parser().parse_args(["demo", "--servers", "1", "--k", "3"])
    >>> check_demo(args)
    Traceback (most recent call last):
    ...
    replistream.cli.CliError: --k 3 needs at least 3 servers (replicas of an operator run on distinct servers); got --servers 1
    """
    if args.k < 1:
        raise CliError(f"--k must be >= 1, got {args.k}")
    if args.servers < 1:
        raise CliError(f"--servers must be >= 1, got {args.servers}")
    from .network.servers import CITIES

    if args.servers > len(CITIES):
        raise CliError(f"--servers must be <= {len(CITIES)} (the built-in cities), got {args.servers}")
    if args.k > args.servers:
        raise CliError(f"--k {args.k} needs at least {args.k} servers (replicas of an operator run on distinct "
                       f"servers); got --servers {args.servers}")
    _positive(args, "duration", "period", "window", "latency-bin", "utility-period", "gc-period", "threshold",
              unit="seconds")
    if args.period > args.duration:
        raise CliError(f"--period {args.period:g} s is longer than --duration {args.duration:g} s: no reading "
                       f"would be sent")
    if not 0 < args.theta_fraction <= 1:
        raise CliError(f"--theta-fraction must be in (0, 1], got {args.theta_fraction:g}")
    if args.kmin is not None and not 1 <= args.kmin <= args.k:
        raise CliError(f"--kmin must be between 1 and --k {args.k}, got {args.kmin}")
    if args.congest_ms < 0:
        raise CliError(f"--congest-ms must be >= 0, got {args.congest_ms:g}")
    if args.congest_at is not None and not 0 <= args.congest_at <= args.duration:
        raise CliError(f"--congest-at must be within the run (0..{args.duration:g} s), got {args.congest_at:g}")
    if args.engine == "inprocess" and args.scenario not in (None, "none"):
        raise CliError("--scenario FILE needs the Ray engine (the in-process engine has no clock: it crashes "
                       "replicas at random); drop --engine inprocess, or use --scenario none")
    if args.engine == "inprocess" and (args.gc or args.revival):
        raise CliError("--gc and --revival need the Ray engine; drop --engine inprocess")
    from .network.servers import default_servers

    names = [s.name for s in default_servers(args.servers)]
    if args.network not in ("geo", "geo-static", "zero"):
        if not args.network.endswith(".csv"):
            raise CliError(f"--network must be geo, geo-static, zero or a trace .csv file, got {args.network!r}")
        _check_file(args.network, "latency trace", "--network")
        from .network import TraceLatencyModel

        try:
            TraceLatencyModel.from_csv(args.network)
        except ValueError as e:
            raise CliError(f"--network: {e}") from None
    if args.scenario not in (None, "none"):
        _check_file(args.scenario, "scenario file", "--scenario")
        from .scenario import Scenario
        from .workloads import fig1_query

        try:
            scenario = Scenario.from_file(args.scenario)
            query = fig1_query(n_servers=args.servers, window_s=args.window, punctuate_s=args.period)
            scenario.validate(servers=names, operators={n: args.k for n in query.operators})
        except ValueError as e:
            raise CliError(f"--scenario: {e}") from None
        late = [e for e in scenario.events if e.at > args.duration]
        if late:
            raise CliError(f"--scenario: the event at {late[0].at:g} s ({late[0].action}) comes after the run's "
                           f"{args.duration:g} s; lengthen --duration or move the event")


def check_place(args) -> None:
    """Every argument of ``place`` checked before any work; raises :class:`CliError`."""
    if args.k < 1:
        raise CliError(f"--k must be >= 1, got {args.k}")
    spec = args.server_spec
    if not spec.isdigit():
        if not spec.lower().endswith((".csv", ".toml")):
            raise CliError(f"--servers must be a number of built-in cities or a .csv/.toml server file, got {spec!r}")
        _check_file(spec, "server file", "--servers")
    elif int(spec) < 1:
        raise CliError(f"--servers must be >= 1, got {spec}")
    if args.monitored is not None and args.monitored < 1:
        raise CliError(f"--monitored must be >= 1, got {args.monitored}")
    _positive(args, "alpha")
    if args.d_min is not None and not (np.isfinite(args.d_min) and args.d_min >= 0):
        raise CliError(f"--d-min must be >= 0 ms, got {args.d_min:g}")
    if args.plot:
        _check_out_file(args.plot, "--plot", (".png", ".pdf", ".svg"))
    args.partitions = _check_place_parallelism(args)
    args.loads = _check_place_loads(args)


def _place_query(args):
    """The query ``place`` will place, built to check names against (cheap: no test run)."""
    if args.query == "fig1":
        from .workloads import fig1_query

        return fig1_query(n_servers=1)  # the operators' names do not depend on the servers
    import importlib

    mod, _, fn = args.query.partition(":")
    if not fn:
        raise CliError(f"--query must be fig1 or MODULE:FUNCTION, got {args.query!r}")
    try:
        query = getattr(importlib.import_module(mod), fn)()
        query.build()
    except (ImportError, AttributeError, ValueError) as e:
        raise CliError(f"--query {args.query}: cannot build the query: {e}") from None
    return query


def _check_place_loads(args) -> dict[str, float]:
    """``--load NODE=L`` (repeatable) of ``place``: the load of one replica of ``entry``, an operator
    (the whole operator: each of its partitions carries ``L/P``) or an application, in server
    capacities (Algorithm 5's load test ``load(s) + load(o) < alpha x capacity(s)``).

    >>> _check_place_loads(build_parser().parse_args(["place", "--load", "correlate=1.2"]))
    {'correlate': 1.2}
    >>> _check_place_loads(build_parser().parse_args(["place", "--load", "corelate=1"]))
    Traceback (most recent call last):
    ...
    replistream.cli.CliError: --load: 'corelate' is not a node of query 'fig1' (entry, loads, pings, correlate, hot, alerts); did you mean 'correlate'?
    """
    if not args.load:
        return {}
    query = _place_query(args)
    nodes = ["entry", *query.operators, *query.sinks]
    out: dict[str, float] = {}
    for item in args.load:
        name, sep, value = item.partition("=")
        try:
            load = float(value) if sep else float("nan")
        except ValueError:
            load = float("nan")
        if not sep or not name or not (np.isfinite(load) and load >= 0):
            raise CliError(f"--load takes NODE=LOAD with LOAD a number >= 0 (server capacities), e.g. "
                           f"--load correlate=0.5; got {item!r}")
        if name not in nodes:
            near = difflib.get_close_matches(name, nodes, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            raise CliError(f"--load: {name!r} is not a node of query {query.name!r} ({', '.join(nodes)}){hint}")
        if name in out:
            raise CliError(f"--load names {name!r} twice; give each node once")
        out[name] = load
    return out


def _check_place_parallelism(args) -> dict[str, int]:
    """``--parallelism NODE=P`` (repeatable) and ``--bits B`` of ``place``, checked against the query
    with :func:`~replistream.partition.check_parallelism`'s messages; ``{node: p}`` with ``p >= 2``
    (one partition is the node as it is). NODE is an operator, ``entry`` (the entry points' partitions,
    laid out on the entry points' servers) or an application (its partitions spread from its server,
    as ``deploy()`` runs them).

    >>> args = build_parser().parse_args(["place", "--parallelism", "corelate=2"])
    >>> _check_place_parallelism(args)
    Traceback (most recent call last):
    ...
    replistream.cli.CliError: --parallelism: query 'fig1' has no operator 'corelate' (operators: loads, pings, correlate, hot); did you mean 'correlate'?
    >>> _check_place_parallelism(build_parser().parse_args(["place", "--parallelism", "correlate=2", "--bits", "4"]))
    {'correlate': 2}
    >>> _check_place_parallelism(build_parser().parse_args(["place", "--parallelism", "entry=2",
    ...                                                     "--parallelism", "alerts=3"]))
    {'entry': 2, 'alerts': 3}
    """
    from .partition import node_parallelism_from_options

    query = _place_query(args) if args.parallelism else None
    try:
        return node_parallelism_from_options(args.parallelism, args.bits, query)
    except ValueError as e:
        raise CliError(str(e)) from None


def check_reconfigure(args) -> None:
    """Every argument of ``reconfigure`` checked before Ray starts; raises :class:`CliError`."""
    if args.k < 1:
        raise CliError(f"--k must be >= 1, got {args.k}")
    if args.servers < 1:
        raise CliError(f"--servers must be >= 1, got {args.servers}")
    if args.k > args.servers:
        raise CliError(f"--k {args.k} needs at least {args.k} servers (replicas of an operator run on distinct "
                       f"servers); got --servers {args.servers}")
    _positive(args, "duration", unit="seconds")
    _positive(args, "pace")


def _demo_inprocess(args) -> int:
    from .testing import run_reference, run_replicated
    from .workloads import fig1_inputs, fig1_query

    t0 = time.perf_counter()
    query = fig1_query(n_servers=args.servers, window_s=args.window)
    inputs = fig1_inputs(n_servers=args.servers, duration_s=args.duration, period_s=args.period, seed=args.seed)
    from rich.console import Console

    progress = Console(stderr=True)  # on stderr, also with --json
    if progress:
        progress.print(f"[bold]replistream demo[/]: Fig. 1 query, {args.servers} servers, k={args.k}, "
                       f"{args.duration:g} s of readings every {args.period:g} s, seed {args.seed}")
        progress.print("running the reference (ideal, non-replicated) run ...")
    ref = run_reference(query, inputs)
    if progress:
        progress.print(f"running the replicated run (k={args.k}, crashing up to k-1 replicas of every operator) ...")
    rep = run_replicated(query, inputs, k=args.k, seed=args.seed, crash=args.scenario != "none")
    got = rep.outputs["alerts"]
    h = rep.stats["harness"]
    weights = rep.stats["weights"]["alerts"][0]
    summary = {
        "engine": "in-process",
        "servers": args.servers,
        "k": args.k,
        "seed": args.seed,
        "inputs": int(sum(s["tuples_out"] for s in ref.stats["entries"].values())),
        **_compare(ref.outputs["alerts"], got),
        "complete": bool(rep.complete),
        "dead_letters": rep.dead_letter_count(),
        "crashed_replicas": sorted(h.crashed),
        "stream_replica_weights": [round(w, 2) for w in weights],
        "delivery_steps": h.steps,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    crashed = len(summary["crashed_replicas"])
    summary["verdict"] = _verdict(summary, [f"{crashed} replica(s) crashed at random" if crashed else "no crash"])
    if args.json:
        print(json.dumps(summary))
    else:
        print(summary["verdict"])
        table = _result_table("Fig. 1 query, in-process replicated run against the ideal run", summary)
        table.add_row("replicas crashed", ", ".join(summary["crashed_replicas"]) or "none")
        table.add_row("delivery steps (items moved between replicas)", f"{summary['delivery_steps']:,}")
        table.add_row("contribution weight per upstream replica at 'alerts' (1 per first copy, 1/j per j-th; §V-B)",
                      " ".join(f"{w:g}" for w in summary["stream_replica_weights"]))
        table.add_row("run time (s)", f"{summary['seconds']:g}")
        _print(table)
        if len(got):
            from .engines.result import format_rows

            print("first alerts:")
            print(format_rows(got[np.argsort(got["ts"])][:3], ["ts", "server", "cpu", "dst", "rtt_ms"]))
    return 0 if summary["matches_reference"] and summary["complete"] else 1


def _print(renderable) -> None:
    """A rich table on stdout (so ``replistream demo > out.txt`` keeps it), at a readable width."""
    from rich.console import Console

    Console(width=max(120, Console().width)).print(renderable)


def _verdict(summary: dict, notes: list[str]) -> str:
    """The one-line verdict a run command prints first: PASS or FAIL, what was compared, what happened.

    >>> _verdict({"matches_reference": True, "complete": True, "outputs": 2784, "reference_outputs": 2784,
    ...           "lost": 0, "duplicates": 0, "unexpected": 0}, ["saopaulo killed at 15.1 s"])
    'PASS: 2,784 alerts identical to the ideal run (0 lost, 0 duplicated); saopaulo killed at 15.1 s'
    """
    ok = summary["matches_reference"] and summary["complete"]
    if ok:
        head = f"PASS: {summary['outputs']:,} alerts identical to the ideal run (0 lost, 0 duplicated)"
    else:
        head = (f"FAIL: {summary['outputs']:,} alerts against {summary['reference_outputs']:,} in the ideal run: "
                f"{summary['lost']:,} lost, {summary['duplicates']:,} duplicated, {summary['unexpected']:,} not in "
                f"the ideal run" + ("" if summary["complete"] else "; the end of the stream never arrived"))
    return "; ".join([head, *[n for n in notes if n]])


def _result_table(title: str, summary: dict):
    """The rows every run command shares, named in plain words; callers add their own."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    table.add_column("what")
    table.add_column("value", justify="right")
    rows = [("alerts in the ideal (non-replicated, failure-free) run", summary["reference_outputs"]),
            ("alerts delivered", summary["outputs"]),
            ("lost (in the ideal run, never delivered)", summary["lost"]),
            ("duplicated (delivered more than once)", summary["duplicates"]),
            ("unexpected (not in the ideal run)", summary["unexpected"]),
            ("output identical to the ideal run", "yes" if summary["matches_reference"] else "NO"),
            ("end of stream reached", "yes" if summary["complete"] else "NO"),
            ("records set aside (dead letters)", summary["dead_letters"])]
    for what, value in rows:
        table.add_row(what, f"{value:,}" if isinstance(value, int) else str(value))
    return table


def _compare(expected: np.ndarray, got: np.ndarray) -> dict:
    from .testing import as_multiset

    e, g = as_multiset(expected), as_multiset(got)
    extra = g - e
    return {
        "outputs": int(len(got)),
        "reference_outputs": int(len(expected)),
        "lost": int(sum((e - g).values())),
        "duplicates": int(sum(n for k, n in extra.items() if k in e)),
        "unexpected": int(sum(n for k, n in extra.items() if k not in e)),
        "matches_reference": bool(e == g),
    }


def _pcts(lat: np.ndarray) -> dict:
    if not len(lat):
        return {"count": 0, "p50": None, "p99": None}
    p50, p99 = np.percentile(lat, [50, 99])
    return {"count": int(len(lat)), "p50": round(float(p50), 1), "p99": round(float(p99), 1)}


def _latency_bins(t_arr: np.ndarray, lat: np.ndarray, width: float) -> list[dict]:
    """Latency percentiles of what arrived in each ``width``-second bin of the run (arrival time).

    >>> _latency_bins(np.array([0.5, 1.0, 6.0]), np.array([100.0, 300.0, 50.0]), 5.0)
    [{'t': 0.0, 'count': 2, 'p50': 200.0, 'p99': 298.0, 'max': 300.0}, {'t': 5.0, 'count': 1, 'p50': 50.0, 'p99': 50.0, 'max': 50.0}]
    """
    out = []
    if not len(lat) or not width > 0:
        return out
    bins = np.floor(np.asarray(t_arr) / width).astype(np.int64)
    for b in np.unique(bins):
        sel = lat[bins == b]
        p = _pcts(sel)
        out.append({"t": round(float(b * width), 3), "count": p["count"], "p50": p["p50"], "p99": p["p99"],
                    "max": round(float(sel.max()), 1)})
    return out


def _demo_ray(args) -> int:
    from .network import default_servers
    from .engines.ray import deploy
    from .scenario import Event, Scenario
    from .testing import run_reference
    from .workloads import fig1_inputs, fig1_query

    from rich.console import Console

    t0 = time.perf_counter()
    console = Console(stderr=True)  # progress on stderr, also with --json (stdout stays the report)
    servers = default_servers(args.servers)
    query = fig1_query(n_servers=args.servers, window_s=args.window, punctuate_s=args.period)
    inputs = fig1_inputs(n_servers=args.servers, duration_s=args.duration, period_s=args.period, seed=args.seed,
                         chunk=1)
    if console:
        console.print(f"[bold]replistream demo[/]: Fig. 1 query on Ray, {args.servers} servers "
                      f"({', '.join(s.name for s in servers)}), k={args.k}, {args.duration:g} s of readings every "
                      f"{args.period:g} s, emulated WAN, seed {args.seed}")
    hb = Heartbeat(console.print).start()  # stopped once the run ends (the finally below)
    hb.say("starting Ray and the replicas ...", phase="starting Ray and the replicas")
    try:
        from .engines.ray import init_ray

        init_ray(verbose=args.verbose)
        gc_cfg = None
        if args.gc or args.revival:
            from .engines.ray import GCConfig

            gc_cfg = GCConfig(utility_period_s=args.utility_period, gc_period_s=args.gc_period,
                              theta_fraction=args.theta_fraction, gc=args.gc, max_steps=None,
                              kmin=min(2, args.k) if args.kmin is None else args.kmin,
                              revival=args.revival, threshold_s=args.threshold, proactive=args.revival)
        dep = deploy(query, servers=servers, k=args.k, network=args.network, seed=args.seed, gc=gc_cfg)
    except BaseException:
        hb.stop()
        raise
    hb.say(f"Ray and {len(dep.handles)} replicas up after {time.perf_counter() - t0:.1f} s; "
           f"computing the ideal run to compare with ...", phase="computing the ideal run")
    congest = None
    try:
        app_server = dep.plan["alerts"][0]
        if gc_cfg is not None and args.scenario is None:
            scenario = Scenario([])  # with --gc/--revival: no kill; --revival injects congestion instead
            if args.revival:
                congest_at = args.duration / 2 if args.congest_at is None else args.congest_at
                congest = threading.Timer(congest_at / 1.0, lambda: dep.manager.congest_surviving_path(
                    args.congest_ms))
        elif args.scenario == "none":
            scenario = Scenario([])
        elif args.scenario:
            scenario = Scenario.from_file(args.scenario)
        else:
            victim = next((s for s in dep.plan["correlate"] if s != app_server), dep.plan["correlate"][0])
            scenario = Scenario([Event(at=args.duration / 2, action="kill_server", server=victim)])
        if console:
            console.print(dep_summary(dep))
            for ev in scenario.events:
                console.print(f"scenario: at {ev.at:g} s {ev.action} "
                              f"{ev.server or ''}{ev.operator or ''}{'' if ev.replica is None else '#%d' % ev.replica}"
                              f"{ev.a or ''}{'-' + ev.b if ev.b else ''}")
        ref = run_reference(query, inputs)
        if congest is not None:
            _start_after_feed(dep, congest)
        hb.say(f"replaying {args.duration:g} s of readings in real time ...", phase="replaying the readings")
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TimeElapsedColumn(), console=console) as bar:  # off a terminal: drawn once, at the end
            task = bar.add_task("alerts delivered", total=len(ref.outputs["alerts"]))

            def on_progress(counts):
                bar.update(task, completed=counts.get("alerts", 0))
                hb.detail = f"{counts.get('alerts', 0):,} of {len(ref.outputs['alerts']):,} alerts delivered"
                if console.is_terminal:  # the bar shows it
                    hb.alive()

            res = dep.run(inputs, pace=1.0, scenario=scenario, timeout=args.duration * 3 + 60, progress=on_progress)
        t_arr, lat = dep.latencies_ms("alerts")
        fail_times = [e["t"] for e in dep.events if e.get("event") in ("kill_server", "kill_replica")]
        t_fail = min(fail_times) if fail_times else None
        summary = {"engine": "ray", "servers": args.servers, "k": args.k, "seed": args.seed,
                   **_compare(ref.outputs["alerts"], res.outputs["alerts"]),
                   "complete": res.complete,
                   "dead_letters": res.dead_letter_count(),
                   "failures": [e for e in dep.events if e.get("event") in ("kill_server", "kill_replica", "dead")],
                   "failure_at_s": None if t_fail is None else round(t_fail, 2),
                   "latency_ms": {
                       "all": _pcts(lat),
                       "before_failure": _pcts(lat[t_arr < t_fail] if t_fail is not None else lat),
                       "after_failure": _pcts(lat[t_arr >= t_fail] if t_fail is not None else lat[:0]),
                   },
                   "latency_over_time_ms": _latency_bins(t_arr, lat, args.latency_bin),
                   "filter_weights": res.metrics["applications"]["alerts"]["filter_weights"],
                   "dropped_stream_replicas": len([e for e in res.metrics["coordinator"]
                                                   if e.get("kind") == "channel_dropped"]),
                   "fault_tolerance": res.metrics.get("fault_tolerance"),
                   "fault_tolerance_per_node": res.metrics.get("fault_tolerance_per_node"),
                   "seconds": round(time.perf_counter() - t0, 2)}
        if gc_cfg is not None:
            summary.update(_gc_summary(dep, t_arr, lat, args))
    finally:
        if congest is not None:
            congest.cancel()
        dep.shutdown()
        hb.stop()
    summary["verdict"] = _verdict(summary, _ray_notes(summary, gc_cfg is not None))
    if args.json:
        print(json.dumps(summary))
        return 0 if summary["matches_reference"] and summary["complete"] else 1
    print(summary["verdict"])
    table = _result_table("Fig. 1 query on Ray, replicated, against the ideal run", summary)
    failures = [f"{'server' if e['event'] == 'kill_server' else 'replica'} {e.get('target')} killed at {e['t']:.1f} s"
                for e in summary["failures"] if e.get("event") in ("kill_server", "kill_replica")]
    table.add_row("failures injected", "; ".join(failures) or "none")
    lat = summary["latency_ms"]
    if summary["failure_at_s"] is not None:
        for phase, words in (("before_failure", "before the failure"), ("after_failure", "after the failure")):
            p = lat[phase]
            table.add_row(f"latency {words}, p50 / p99 (ms)", f"{p['p50']} / {p['p99']}  ({p['count']:,} alerts)")
    else:
        p = lat["all"]
        table.add_row("latency, p50 / p99 (ms)", f"{p['p50']} / {p['p99']}  ({p['count']:,} alerts)")
    table.add_row("stream replicas dropped (links from or to a replica that died)",
                  f"{summary['dropped_stream_replicas']:,}")
    if summary.get("fault_tolerance") is not None:
        table.add_row("fault tolerance at the end (fewest live replicas - 1, over operators)",
                      f"{summary['fault_tolerance']}: {fault_tolerance_meaning(summary['fault_tolerance'])}")
    table.add_row("contribution weight per upstream replica at 'alerts' (1 per first copy, 1/j per j-th; §V-B)",
                  " ".join(f"{w:.1f}" for w in summary["filter_weights"] or []))
    if gc_cfg is not None:
        cost = [h["cost"] for h in summary["network_cost"]]
        if cost:
            table.add_row("network cost, static deployment -> lowest -> at the end (bytes/s x ms)",
                          f"{cost[0]:,.0f} -> {min(cost):,.0f} -> {cost[-1]:,.0f}")
        table.add_row("theta, the cost GC aims under (bytes/s x ms)",
                      "-" if summary["theta"] is None else f"{summary['theta']:,.0f}")
        table.add_row("replicas discarded by GC / revived", f"{summary['gc_discards']} / {summary['revivals']}")
        for phase, p in summary["latency_phases_ms"].items():
            table.add_row(f"latency {phase.replace('_', ' ')}, p50 / p99 (ms)",
                          f"{p['p50']} / {p['p99']}  ({p['count']:,} alerts)")
    table.add_row("run time (s)", f"{summary['seconds']:g}")
    _print(table)
    after, before = lat["after_failure"], lat["before_failure"]
    if summary["failure_at_s"] is not None and after["p50"] is not None and before["p50"] is not None \
            and after["p50"] < before["p50"]:
        print("note: latency after the failure is lower than before: each alert is the first of its copies to "
              "arrive, and with fewer replicas there is less queueing on the servers that remain.")
    if gc_cfg is not None:
        if args.verbose:
            print("decisions (time since the start, kind, what and why):")
            for e in summary["events"]:
                print(f"{e['t']:7.2f} s  {e['kind']:<10} {e['text']}")
        else:
            print(f"{len(summary['events'])} GC and revival decisions: --verbose lists them, --json gives them all")
    return 0 if summary["matches_reference"] and summary["complete"] else 1


def _ray_notes(summary: dict, gc: bool) -> list[str]:
    """The verdict's notes for a Ray demo: the failure and latency around it, or what GC saved."""
    notes = []
    kills = [e for e in summary["failures"] if e.get("event") in ("kill_server", "kill_replica")]
    lat = summary["latency_ms"]
    if kills:
        e = kills[0]
        notes.append(f"{e.get('target')} killed at {e['t']:.1f} s")
        b, a = lat["before_failure"], lat["after_failure"]
        if b["p99"] is not None and a["p99"] is not None:
            notes.append(f"p99 latency {b['p99']:.0f} ms before, {a['p99']:.0f} ms after")
    elif lat["all"]["p99"] is not None:
        notes.append(f"p99 latency {lat['all']['p99']:.0f} ms")
    if gc and summary.get("network_cost"):
        cost = [h["cost"] for h in summary["network_cost"]]
        notes.append(f"network cost {cost[0]:,.0f} -> {cost[-1]:,.0f} bytes/s x ms "
                     f"({summary['gc_discards']} replicas discarded, {summary['revivals']} revived)")
    if summary.get("fault_tolerance") is not None:
        notes.append(f"fault tolerance {summary['fault_tolerance']} at the end: "
                     f"{fault_tolerance_meaning(summary['fault_tolerance'])}")
    return notes


def fault_tolerance_meaning(tolerance: int) -> str:
    """What a deployment's fault tolerance (its operators' fewest live replicas - 1) means, in words:
    how many more server losses the run survives. An operator's replicas are on distinct
    servers, so a server loss takes at most one replica of each.

    >>> fault_tolerance_meaning(1)
    '1 more server loss survivable'
    >>> fault_tolerance_meaning(2)
    '2 more server losses survivable'
    >>> fault_tolerance_meaning(0)
    'no further server loss survivable (an operator has one replica left: losing its server ends the run)'
    >>> fault_tolerance_meaning(-1)
    'an operator has no live replica left'
    >>> fault_tolerance_meaning("1")
    Traceback (most recent call last):
    ...
    TypeError: fault tolerance must be an int (fewest live replicas - 1), got '1'
    """
    if isinstance(tolerance, bool) or not isinstance(tolerance, int):
        raise TypeError(f"fault tolerance must be an int (fewest live replicas - 1), got {tolerance!r}")
    if tolerance < 0:
        return "an operator has no live replica left"
    if tolerance == 0:
        return "no further server loss survivable (an operator has one replica left: losing its server ends the run)"
    return f"{tolerance} more server loss{'es' if tolerance > 1 else ''} survivable"


def _start_after_feed(dep, timer) -> None:
    """Start ``timer`` once the deployment's run clock has started (feed() resets ``dep.t0``)."""
    import threading

    def go():
        while not dep.started:
            time.sleep(0.01)
        delay = timer.interval - (time.time() - dep.t0)
        timer.interval = max(0.0, delay)
        timer.start()

    threading.Thread(target=go, daemon=True).start()


def _gc_summary(dep, t_arr, lat, args) -> dict:
    """The --gc/--revival fields: network cost over time, theta, decisions, latency by phase."""
    events = dep.gc_events()
    keep = ("t", "kind", "action", "trigger", "text", "replica", "utility", "cost", "cost_before", "cost_after", "theta",
            "delay_s", "threshold_s", "applied", "apply_seconds", "error")
    hist = dep.network_cost_history()
    theta = next((h["theta"] for h in reversed(hist) if h["theta"] is not None), None)
    out = {"network_cost": [{"t": h["t"], "cost": round(h["network_cost"], 1),
                             "live_stream_replicas": h["live_stream_replicas"],
                             "max_delay_s": round(h["max_delay_s"], 3)} for h in hist],
           "theta": None if theta is None else round(theta, 1),
           "events": [{k: e[k] for k in keep if k in e} for e in events],  # "none" decisions too, with why
           "gc_discards": sum(e["kind"] == "gc" for e in events),
           "revivals": sum(e["kind"] == "revival" and bool(e.get("applied")) for e in events)}
    below = [h["t"] for h in hist if theta is not None and h["network_cost"] <= theta]
    out["cost_below_theta_at_s"] = below[0] if below else None
    cong = [e["t"] for e in events if e["kind"] == "congestion"]
    phases = {}
    if cong:
        t_c = cong[0]
        # the revival that answers the congestion: the first delay-triggered one applied after it;
        # its effect is read from two utility periods later (the new path catching up)
        rev = [e["t"] for e in events if e["kind"] == "revival" and e.get("applied") and e["t"] > t_c
               and e.get("trigger") == "delay"]
        t_r = min(rev) if rev else None
        settle = 2 * args.utility_period
        phases["before_congestion"] = _pcts(lat[t_arr < t_c])
        phases["congested"] = _pcts(lat[(t_arr >= t_c) & (t_arr < (t_r if t_r is not None else np.inf))])
        phases["after_revival"] = _pcts(lat[t_arr >= t_r + settle] if t_r is not None else lat[:0])
        out["congestion_at_s"] = round(t_c, 2)
        out["first_revival_at_s"] = None if t_r is None else round(t_r, 2)
        out["last_revival_at_s"] = None if not rev else round(max(rev), 2)
        out["after_revival_from_s"] = None if t_r is None else round(t_r + settle, 2)
    else:
        t_b = out["cost_below_theta_at_s"]
        phases["before_cost_below_theta"] = _pcts(lat[t_arr < t_b] if t_b is not None else lat)
        phases["after_cost_below_theta"] = _pcts(lat[t_arr >= t_b] if t_b is not None else lat[:0])
    out["latency_phases_ms"] = phases
    return out


def dep_summary(dep) -> str:
    lines = ["placement:"]
    for node, where in dep.plan.items():
        lines.append(f"  {node:<10} -> {', '.join(where)}")
    return "\n".join(lines)


def _place_inputs(args):
    """(servers, ServerSet, query, stats, source locations, description of the rates) for ``place``."""
    from .placement import QueryStats, ServerSet, fig1_sources, load_servers

    spec = args.server_spec
    if spec.isdigit():
        n = int(spec)
        if n < 1:
            raise ValueError(f"--servers must be >= 1, got {n}")
        ss = ServerSet.builtin(n)
    else:
        ss = load_servers(spec)
    servers = list(ss.servers)
    if args.query == "fig1":
        from .testing import run_reference
        from .workloads import fig1_inputs, fig1_query

        monitored = args.monitored or len(servers)
        if monitored < 1:
            raise ValueError(f"--monitored must be >= 1, got {monitored}")
        query = fig1_query(n_servers=monitored)
        duration, period = 600.0, 10.0
        run = run_reference(query, fig1_inputs(monitored, duration_s=duration, period_s=period, seed=0))
        stats = QueryStats.from_run(query, run, duration)
        rates = (f"measured in a {duration:g} s test run of the reference engine, one reading per source every "
                 f"{period:g} s (bytes/s)")
        sources = fig1_sources(query, servers)
    else:
        import importlib

        mod, _, fn = args.query.partition(":")
        if not fn:
            raise ValueError(f"--query must be fig1 or MODULE:FUNCTION, got {args.query!r}")
        query = getattr(importlib.import_module(mod), fn)()
        query.build()
        stats = QueryStats.estimate(query)
        rates = "estimated: 1 tuple/s per source, selectivity 1 (bytes/s)"
        sources = {}
    return servers, ss, query, stats, sources, rates


def _place(args) -> int:
    from .placement import (D_MIN, ALPHA, PlacementError, application_partition_layout, cost_with_application_partitions,
                            entry_partition_layout, place, problem_from_query)

    try:
        servers, ss, query, stats, sources, rates = _place_inputs(args)
        partitions = getattr(args, "partitions", None)
        if partitions is None:  # main() checks first; a direct call checks here
            partitions = _check_place_parallelism(args)
        loads = getattr(args, "loads", None)
        if loads is None:
            loads = _check_place_loads(args)
        if loads:
            from .placement import QueryStats

            stats = QueryStats(stats.rates, {**stats.loads, **loads}, stats.unit)
        # the model partitions operators (Algorithm 5 per partition); the entry points and each application
        # are placed as one node, and their partitions laid out from it as deploy() lays them out
        entry_parts = partitions.get("entry", 1)
        apps = {a: p for a, p in partitions.items() if a in query.sinks}
        operators = {n: p for n, p in partitions.items() if n != "entry" and n not in apps}
        problem = problem_from_query(query, servers, ss.latency(), stats, sources=sources,
                                     parallelism=operators, bits=args.bits)
        params: dict = {}
        alpha = ALPHA if args.alpha is None else args.alpha
        d_min = D_MIN if args.d_min is None else args.d_min
        if args.strategy == "min-cost":
            params = {"alpha": alpha, "d_min": d_min, "initial": args.initial}
        elif args.strategy == "random":
            params = {"seed": args.seed}
            if args.alpha is not None:
                params["alpha"] = args.alpha
            if args.d_min is not None:
                params["d_min"] = args.d_min
        else:
            params = {"alpha": alpha}
        placed = place(problem, args.k, args.strategy, **params)
        base = place(problem, 1, "non-replicated", alpha=alpha)
        names = [s.name if hasattr(s, "name") else s for s in servers]
        layout = {**entry_partition_layout(placed.plan(), entry_parts),
                  **application_partition_layout(placed.plan(), names, args.k, apps)}
        cost, bandwidth = placed.network_cost, placed.bandwidth
        base_cost, base_bandwidth = base.network_cost, base.bandwidth
        if apps:  # the applications' input reaches each partition where it runs
            cost, bandwidth = cost_with_application_partitions(problem, placed.replicas, layout, apps)
            base_cost, base_bandwidth = cost_with_application_partitions(
                problem, base.replicas, application_partition_layout(base.plan(), names, 1, apps), apps)
    except (PlacementError, ValueError, ImportError, AttributeError) as e:
        print(f"replistream place: {e}", file=sys.stderr)
        return 2
    rel = {"bandwidth": bandwidth / base_bandwidth if base_bandwidth else float("nan"),
           "network_cost": cost / base_cost if base_cost else float("nan")}
    if not apps:
        rel = placed.relative_to(base)
    plan = placed.plan()
    plan.update({n: v for n, v in layout.items() if not n.startswith("entry.")})  # deploy(placement=) takes "app.P"
    summary = {
        "query": args.query, "servers": len(servers), "strategy": args.strategy, "k": args.k,
        "parallelism": {**({"entry": entry_parts} if entry_parts > 1 else {}), **problem.parallelism, **apps},
        "bits": args.bits,
        "params": {k: v for k, v in placed.params.items() if k != "k"},
        "network_cost": cost, "bandwidth": bandwidth,
        "relative_bandwidth": rel["bandwidth"], "relative_network_cost": rel["network_cost"],
        "baseline": {"strategy": "non-replicated", "k": 1, "network_cost": base_cost,
                     "bandwidth": base_bandwidth},
        "units": {"rate": stats.unit, "latency": "ms", "network_cost": f"{stats.unit} x ms"},
        "rates": rates,
        "placement": plan,
        # entry and application partitions, laid out from their node's servers as deploy() lays them out
        "partitions": layout,
        "replicas": [{"node": d.node, "replica": d.replica, "phase": d.phase, "server": d.server, "cost": d.cost,
                      "how": d.how, "rejected": [vars(a) for a in d.alternatives]} for d in placed.decisions],
    }
    if args.plot:
        from .placement.plot import plot_placement

        try:
            plot_placement(placed, servers, args.plot)
        except ValueError as e:
            print(f"replistream place: cannot plot: {e}", file=sys.stderr)
            return 2
        summary["plot"] = args.plot
    if args.json:
        print(json.dumps(summary))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    parts = "".join(f", {op} in {p} partitions" for op, p in summary["parallelism"].items())
    table = Table(title=f"{args.strategy} placement of {query.name!r}, k={args.k}, {len(servers)} servers{parts}")
    table.add_column("node (op.P: partition P)" if parts else "node")
    table.add_column("servers (replica 0, 1, ...)")
    rows = dict(placed.plan())
    for node in list(rows):  # each entry or application partition under its node
        if node == "entry" or node in apps:
            rows.update({n: v for n, v in layout.items() if n.rpartition(".")[0] == node})
    rows = {n: rows[n] for n in sorted(rows, key=lambda n: list(placed.plan()).index(n.rpartition(".")[0])
                                       if n in layout else list(placed.plan()).index(n))}
    for node, where in rows.items():
        how = " (with the entry points)" if node.startswith("entry.") else \
            " (spread from the application's server)" if node in layout else ""
        table.add_row(node, ", ".join(where) + how)
    console.print(table)
    console.print(f"network cost {placed.network_cost:.6g} ({summary['units']['network_cost']}), "
                  f"bandwidth {placed.bandwidth:.6g} ({stats.unit})")
    console.print(f"relative to the non-replicated placement (k=1): bandwidth {rel['bandwidth']:.2f}x, "
                  f"network cost {rel['network_cost']:.2f}x")
    console.print(f"rates {rates}")
    if args.explain:
        console.print(placed.explain(), markup=False, highlight=False)
    if args.plot:
        console.print(f"plot written to {args.plot}")
    return 0


def check_chaos(args) -> None:
    """Every argument of ``chaos`` checked before Ray starts; raises :class:`CliError`."""
    if not (np.isfinite(args.minutes) and args.minutes > 0):
        raise CliError(f"--minutes must be > 0, got {args.minutes:g}")
    if args.trials is not None and args.trials < 1:
        raise CliError(f"--trials must be >= 1, got {args.trials}")
    if not 1 <= args.k <= 6:
        raise CliError(f"--k must be between 1 and 6 (the campaign uses k + 2 servers), got {args.k}")
    if args.driver_kills is not None and not (np.isfinite(args.driver_kills) and 0 < args.driver_kills <= 1):
        raise CliError(f"--driver-kills takes a share of the trials in (0, 1], got {args.driver_kills:g}")


def _chaos(args) -> int:
    from rich.console import Console

    from .chaos import format_report, run_campaign

    err = Console(stderr=True, highlight=False)
    planned = f"{args.trials} trials" if args.trials else f"trials for {args.minutes:g} min"
    t0 = time.perf_counter()
    with Heartbeat(lambda text: err.print(text, markup=False)) as hb:
        hb.say(f"replistream chaos: {planned}, k={args.k}, seed {args.seed}; starting Ray ...", phase="starting Ray")
        from .chaos import start_ray

        start_ray(verbose=args.verbose)  # (its actors audit their duplicate filters' drops)
        hb.say(f"{time.perf_counter() - t0:7.1f} s  Ray up; trial 0 starts", phase="trial 0")

        def progress(trial):
            r = trial.result
            verdict = "ok" if r.get("ok") else f"FAIL {r.get('error') or ''}".strip()
            if r.get("unseen_drops"):  # (the audit: tuples dropped as copies that were never passed)
                verdict += " (dropped unseen: " + ", ".join(
                    f"{label} port {port}: {d['n']}" for label, ports in r["unseen_drops"].items()
                    for port, d in ports.items()) + ")"
            hb.say(f"{time.perf_counter() - t0:7.1f} s  trial {trial.index} ({trial.query}): {r.get('outputs', 0):,} "
                   f"outputs, {r.get('lost', 0)} lost, {r.get('duplicated', 0)} duplicated, "
                   f"{sum(r.get('dead_letters_received', {}).values())} set aside; {verdict}; faults: "
                   f"{'; '.join(r['faults']) or 'none'}; {len(trial.bad_records)} malformed records",
                   phase=f"trial {trial.index + 1}")

        report = run_campaign(minutes=args.minutes, seed=args.seed, k=args.k, trials=args.trials, progress=progress,
                              repair=args.repair, timing=args.timing, driver_kills=args.driver_kills or False)
    if args.json:
        print(json.dumps(report))
    else:
        print(report["verdict"])
        print(format_report(report))
        if report["dead_letters"]["expected"] != report["dead_letters"]["received"]:
            print("dead letters expected:", report["dead_letters"]["expected"])
            print("dead letters received:", report["dead_letters"]["received"])
    return 0 if report["matches_reference"] else 1


def _demo(args) -> int:
    if args.engine == "inprocess":
        return _demo_inprocess(args)
    return _demo_ray(args)


def _reconfigure(args) -> int:
    from .demos import live_reconfiguration

    from rich.console import Console

    err = Console(stderr=True, highlight=False)
    with Heartbeat(lambda text: err.print(text, markup=False)) as hb:
        hb.say(f"replistream reconfigure: the Fig. 1 query on Ray, {args.servers} servers, k={args.k}, changed while "
               f"it runs", phase="starting Ray")
        from .engines.ray import init_ray

        init_ray(verbose=args.verbose)

        def say(text: str) -> None:  # the demo's phases, each then the heartbeat's phase (without its time)
            hb.say(text, phase=re.sub(r"^\s*[\d.]+ s\s+", "", text).rstrip(" ."))

        rep = live_reconfiguration(n_servers=args.servers, duration_s=args.duration, k=args.k,
                                   strategy=args.strategy, pace=args.pace, seed=args.seed, say=say)
    if args.json:
        from .engines.ray.common import json_default

        print(json.dumps(rep, default=json_default))
    else:
        from rich.console import Console
        from rich.table import Table

        console = Console(width=max(120, Console().width))
        apps = rep["applications"].values()
        lost, dup = sum(a["lost"] for a in apps), sum(a["duplicates"] for a in apps)
        outs = sum(a["outputs"] for a in apps)
        head = "PASS" if rep["matches_reference"] else "FAIL"
        print(f"{head}: {outs:,} outputs against the reference run of the changed query ({lost:,} lost, {dup:,} "
              f"duplicated); {len(rep['changes'])} change(s) at run time and one live move of a Join replica")
        for c in rep["changes"]:
            console.print(f"[bold]{c['change']}[/bold] at logical time {c['p'] / 1e6:.3f} s: {c['text']}",
                          highlight=False)
        mv = rep["move"]
        console.print(f"[bold]move_replica[/bold] correlate#0 -> {mv['new_replicas']} on {mv['server']} "
                      f"({mv['strategy']}, {mv['apply_seconds']} s){' ERROR ' + mv['error'] if mv['error'] else ''}",
                      highlight=False)
        table = Table(title="applications against the reference run of the changed query", title_justify="left")
        for col in ("application", "outputs", "reference", "lost", "duplicates"):
            table.add_column(col)
        for app, a in rep["applications"].items():
            table.add_row(app, f"{a['outputs']:,}", f"{a['reference_outputs']:,}", str(a["lost"]), str(a["duplicates"]))
        console.print(table)
    return 0 if rep["matches_reference"] else 1


def _up(args) -> int:
    import time

    from .engines.ray.cluster import up
    from .progress import Heartbeat

    if args.num_cpus is not None and args.num_cpus < 1:
        raise CliError(f"--num-cpus must be >= 1, got {args.num_cpus}")
    if not 0 < args.port < 65536:
        raise CliError(f"--port must be between 1 and 65535, got {args.port}")
    if not 0 <= args.dashboard_port < 65536 or args.dashboard_port == args.port:
        raise CliError(f"--dashboard-port must be between 1 and 65535 and not the head's port (0: no dashboard), "
                       f"got {args.dashboard_port}")
    t0 = time.perf_counter()
    emit = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    with Heartbeat(emit, every=3.0) as hb:
        hb.say("up: checking the port and the Ray token ...", phase="checking")

        def say(text: str) -> None:
            hb.say(f"up: {text}", phase="starting the Ray head" if text.startswith("starting") else None)

        try:
            addr = up(num_cpus=args.num_cpus, port=args.port, say=say, dashboard_port=args.dashboard_port or None)
        except RuntimeError as e:
            raise CliError(str(e)) from None
    from .engines.ray.cluster import recorded

    board = (recorded(addr) or {}).get("dashboard")
    print(f"up: a Ray cluster runs at {addr} (started in {time.perf_counter() - t0:.1f} s); deploy() in any script "
          f"of this user on this machine joins it, and detached deployments live in it; "
          + (f"dashboard: {board}; " if board else "")
          + f"`replistream down{'' if args.port == 6379 else f' --port {args.port}'}` stops it")
    return 0


def _down(args) -> int:
    import time

    from .engines.ray.cluster import down

    address = None if args.port is None else f"127.0.0.1:{args.port}"
    t0 = time.perf_counter()
    try:
        stopped = down(address, say=lambda text: print(f"down: {text}", file=sys.stderr, flush=True))
    except RuntimeError as e:
        raise CliError(str(e)) from None
    where = "" if address is None else f" at {address}"
    print(f"down: the local Ray cluster{where} is stopped ({time.perf_counter() - t0:.1f} s)" if stopped
          else f"down: no cluster started by `replistream up` runs{where}")
    return 0


def _connect() -> None:
    """Join the running cluster (CliError naming the fix if there is none)."""
    import ray

    from .engines.ray import init_ray
    from .engines.ray.host import cluster_address

    addr = cluster_address()
    if addr is None:
        raise CliError("no Ray cluster runs on this machine (and RAY_ADDRESS is not set): start one with "
                       "`replistream up`, then deploy with detached=True")
    if not ray.is_initialized():
        init_ray(addr)


def _status(args) -> int:
    from .engines.ray.host import attach, list_deployments

    _connect()
    names = [args.name] if args.name else list_deployments()
    if args.name and args.name not in list_deployments():
        raise CliError(f"no detached deployment named {args.name!r}; running: {list_deployments() or 'none'}")
    rows = [attach(n).status() for n in names]
    if args.json:
        print(json.dumps(rows))
        return 0
    pool = _warm_pool_line()
    if pool:
        print(pool)
    if not rows:
        print("status: no detached deployment runs on this cluster")
        return 0
    print(f"status: {len(rows)} detached deployment(s), {sum(r['complete'] for r in rows)} complete")
    for r in rows:
        apps = ", ".join(f"{a} {v['delivered']:,} tuples{' (complete)' if v['complete'] else ''}"
                         for a, v in r["applications"].items())
        print(f"  {r['name']}: query {r['query']!r}, running {r['running_s']:g} s, "
              f"{'fed' if r['fed'] else 'not fed yet'}; {apps}; fault tolerance {r['fault_tolerance']} "
              f"({fault_tolerance_meaning(r['fault_tolerance'])})")
    return 0


def _warm_pool_line() -> str | None:
    """How the warm pool of the cluster `replistream up` started is doing (it fills in the background):
    full, still filling, or why it could not start; None for a cluster `up` did not start."""
    from .engines.ray.cluster import recorded, warm_state
    from .engines.ray.host import cluster_address

    addr = cluster_address()
    rec = recorded(addr) if addr and addr != "auto" and ":" in addr else None
    if rec is None or "warm_pid" not in rec:
        return None
    got = warm_state(addr)
    if got is None:
        return "warm pool: still filling (started by `replistream up`)"
    if got.get("error"):
        return f"warm pool: could not start: {got['error']} (deployments start their own processes meanwhile)"
    idle = sum((got.get("warm") or {}).get("idle", {}).values())
    return f"warm pool: full when `replistream up` last looked ({idle} idle actor processes)"


def _stop(args) -> int:
    from .engines.ray.host import attach, list_deployments

    _connect()
    if args.name not in list_deployments():
        raise CliError(f"no detached deployment named {args.name!r}; running: {list_deployments() or 'none'}")
    attach(args.name).stop()
    print(f"stop: deployment {args.name!r} stopped")
    return 0


def _dashboard(args) -> int:
    """``replistream dashboard``: serve the dashboard of the running cluster in the foreground."""
    from .dashboard import port_free
    from .dashboard.server import cluster_token, serve
    from .engines.ray.host import cluster_address

    if not 0 < args.port < 65536:
        raise CliError(f"--port must be between 1 and 65535, got {args.port}")
    addr = cluster_address()
    if addr is None:
        raise CliError("no Ray cluster runs on this machine (and RAY_ADDRESS is not set): start one with "
                       "`replistream up`, or set RAY_ADDRESS")
    if not port_free(args.port, args.host):
        raise CliError(f"port {args.port} is in use on {args.host}: choose another with --port")
    token = cluster_token()
    if args.token_file:
        try:
            with open(args.token_file) as f:
                token = f.read().strip() or None
        except OSError as e:
            raise CliError(f"--token-file {args.token_file!r} cannot be read ({e.strerror})") from None
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"dashboard: listening on {args.host}, not only on loopback: anyone who reaches it sees the "
              f"deployments", file=sys.stderr, flush=True)
    serve(addr, args.port, host=args.host, token=token,
          on_ready=lambda url: print(f"dashboard: {url} (cluster {addr}; control actions "
                                     f"{'need the cluster token' if token else 'off: no token'}); Ctrl-C stops it",
                                     flush=True))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="replistream",
        description="Replicated, replication-transparent stream processing (Hwang, Cetintemel, Zdonik 2008).")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser("demo", help="run the Fig. 1 monitoring query replicated, with crashes, "
                                       "and compare with the ideal run")
    demo.add_argument("--k", type=int, default=2, help="replicas per operator (default 2)")
    demo.add_argument("--servers", type=int, default=6, help="servers, each monitored and hosting replicas (default 6)")
    demo.add_argument("--duration", type=float, default=30.0, help="seconds of readings, replayed in real time "
                                                                   "(default 30)")
    demo.add_argument("--period", type=float, default=0.5, help="seconds between readings (default 0.5)")
    demo.add_argument("--window", type=float, default=2.0, help="join window in seconds (default 2)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.add_argument("--scenario", metavar="FILE", default=None,
                      help="failure scenario (JSON or TOML); default: kill one join server halfway; "
                           "'none' for no failure")
    demo.add_argument("--network", default="geo", help="emulated network: geo (default), geo-static, zero, "
                                                       "or a trace CSV")
    demo.add_argument("--engine", choices=["ray", "inprocess"], default="ray",
                      help="ray (default) or the in-process replicated engine (no clock, random crashes)")
    demo.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    demo.add_argument("--latency-bin", type=float, default=5.0, help="seconds per bin of latency_over_time_ms "
                      "(Ray engine; default 5)")
    demo.add_argument("--gc", action="store_true",
                      help="garbage-collect replicas (Algorithm 6) down to --theta-fraction of the first measured "
                           "network cost; reports network cost over time and every decision (no server is killed)")
    demo.add_argument("--revival", action="store_true",
                      help="revive replicas on input delays over --threshold (Hwang §V-C) and proactively under "
                           "theta; injects --congest-ms on the surviving path at --congest-at")
    demo.add_argument("--theta-fraction", type=float, default=0.3, help="--gc: theta as a fraction of the first "
                                                                       "measured network cost (default 0.3)")
    demo.add_argument("--kmin", type=int, default=None, help="--gc: fewest live replicas per operator, so that "
                                                            "k-1 failures stay masked (default min(2, k))")
    demo.add_argument("--utility-period", type=float, default=1.0, help="seconds between utility/cost/delay "
                                                                       "measurements (default 1; paper 30)")
    demo.add_argument("--gc-period", type=float, default=2.0, help="seconds between garbage collections "
                                                                  "(default 2; paper 300)")
    demo.add_argument("--threshold", type=float, default=1.5, help="--revival: input delay (s) that makes a replica "
                                                                  "hindered (default 1.5; paper 10)")
    demo.add_argument("--congest-at", type=float, default=None, help="--revival: when (s) to add delay on the "
                                                                    "surviving path (default: half the duration)")
    demo.add_argument("--congest-ms", type=float, default=3000.0, help="--revival: extra delay in ms (default 3000)")
    demo.add_argument("--verbose", action="store_true", help="also list every GC and revival decision, and let "
                                                             "Ray's own log lines through")
    demo.set_defaults(func=_demo, check=check_demo)

    place = sub.add_parser("place", help="place k replicas of every operator of a query on servers "
                                         "(min-cost Algorithm 5 or a baseline) and print the network cost")
    place.add_argument("--servers", dest="server_spec", metavar="FILE|N", default="30",
                       help="server file (.csv or .toml: name, lat/lon or x/y/z, capacity, node) or a number of "
                            "built-in cities (default 30)")
    place.add_argument("--query", default="fig1", help="fig1 (default: the paper's Fig. 1 query, every server "
                                                      "running a load and a ping source) or MODULE:FUNCTION "
                                                      "returning a Query")
    place.add_argument("--monitored", type=int, default=None,
                       help="fig1: monitored servers, each with two sources (default: all servers)")
    place.add_argument("--k", type=int, default=3, help="replicas per operator, kmax (default 3)")
    place.add_argument("--alpha", type=float, default=None, help="load threshold: a server takes a replica while "
                                                                 "load + load(o) < alpha x capacity (default 0.8)")
    place.add_argument("--d-min", dest="d_min", type=float, default=None,
                       help="minimum latency in ms between servers holding replicas of one operator (default 30)")
    place.add_argument("--strategy", choices=["min-cost", "random", "non-replicated"], default="min-cost",
                       help="min-cost (default; Algorithm 5), random, non-replicated (k=1)")
    place.add_argument("--initial", choices=["spring", "greedy"], default="spring",
                       help="min-cost's first replicas: spring relaxation (default) or Algorithm 5 itself")
    place.add_argument("--seed", type=int, default=0, help="seed of the random strategy (default 0)")
    place.add_argument("--json", action="store_true", help="print one JSON object")
    place.add_argument("--explain", action="store_true", help="also print why every replica went where it did")
    place.add_argument("--plot", metavar="FILE.png", default=None,
                       help="draw servers, replicas and stream replicas on a world map")
    place.add_argument("--parallelism", metavar="NODE=P", action="append", default=[],
                       help="run operator NODE as P key partitions, each with k replicas placed on its own "
                            "(Algorithm 5 per partition; repeatable, e.g. --parallelism correlate=2); NODE may also "
                            "be entry (P entry partitions, all on the entry points' servers) or an application (P "
                            "partitions of k replicas, spread from its server as deploy() spreads them)")
    place.add_argument("--load", metavar="NODE=L", action="append", default=[],
                       help="load of one replica of NODE (entry, an operator, an application) in server "
                            "capacities, for the load test load(s) + load(o) < alpha x capacity(s); a partition "
                            "of an operator carries L/P (repeatable; default 0: place by network cost only)")
    place.add_argument("--bits", type=int, default=12,
                       help="the key space of a partitioned operator is cut into 2**bits bins; P <= 2**bits "
                            "(default 12)")
    place.set_defaults(func=_place, check=check_place)

    rec = sub.add_parser("reconfigure", help="change a running Fig. 1 query (replace a filter's function, add "
                                             "an operator, move a stateful replica) and compare with the "
                                             "reference run of the changed query")
    rec.add_argument("--servers", type=int, default=4, help="servers (default 4)")
    rec.add_argument("--k", type=int, default=2, help="replicas per operator (default 2)")
    rec.add_argument("--duration", type=float, default=16.0, help="seconds of readings (default 16)")
    rec.add_argument("--strategy", choices=["all-at-once", "batched", "fluid"], default="fluid",
                     help="how the moved Join replica's state moves (default fluid: one bin per step)")
    rec.add_argument("--pace", type=float, default=None, help="replay speed (1 = real time; default: as fast "
                                                             "as the entry points take it)")
    rec.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    rec.add_argument("--json", action="store_true", help="print one JSON object")
    rec.add_argument("--verbose", action="store_true", help="let Ray's own log lines through")
    rec.set_defaults(func=_reconfigure, check=check_reconfigure)

    chaos = sub.add_parser("chaos", help="a seeded campaign of random faults (kills, server kills, delayed and "
                                         "cut links, malformed records, failing user-function rows, live moves, "
                                         "live rescales of a partitioned operator, lost coordinators; with --driver-kills, killed drivers of detached "
                                         "deployments) checked against the ideal run")
    chaos.add_argument("--minutes", type=float, default=1.0, help="run trials until this many minutes have passed "
                                                                  "(default 1; each trial takes 10-30 s)")
    chaos.add_argument("--trials", type=int, default=None, help="run exactly this many trials instead")
    chaos.add_argument("--seed", type=int, default=0, help="seed of the fault schedules and inputs (default 0)")
    chaos.add_argument("--k", type=int, default=2, help="replicas per operator (default 2)")
    chaos.add_argument("--repair", action="store_true", help="deploy with repair=True and one warm spare: crashed "
                       "operator replicas are rebuilt during the trials")
    chaos.add_argument("--timing", action="store_true", help="run each trial paced (3 event seconds per second), "
                       "and first without faults: a trial whose run takes more than 1.5x as long fails the timing check")
    chaos.add_argument("--driver-kills", type=float, nargs="?", const=0.3, default=None, metavar="SHARE",
                       help="run a seeded share of the trials (default 0.3) with a detached deployment whose driver "
                       "is killed: the input goes to Parquet files, a driver process deploys the query detached "
                       "(ParquetSink per application) and feeds the files paced, is killed with SIGKILL mid-replay; "
                       "the campaign attaches, kills replicas through the deployment's host, waits, compares the "
                       "files with the ideal run and stops the deployment. The driver joins the campaign's own Ray: "
                       "no `replistream up` needed. No timing check on these trials")
    chaos.add_argument("--json", action="store_true", help="print one JSON object (the verdict is in it)")
    chaos.add_argument("--verbose", action="store_true", help="let Ray's own log lines through")
    chaos.set_defaults(func=_chaos, check=check_chaos)

    up_ = sub.add_parser("up", help="start a local Ray cluster kept between scripts (loopback only, Ray token "
                                    "authentication): deployments join it, detached ones live in it; returns once "
                                    "it answers, its warm pool of actor processes fills in the background")
    up_.add_argument("--num-cpus", type=int, default=None, help="CPUs Ray may use (default: the machine's)")
    up_.add_argument("--port", type=int, default=6379, help="the head's port (default 6379)")
    up_.add_argument("--dashboard-port", type=int, default=8270,
                     help="the live dashboard's port on 127.0.0.1 (default 8270; 0: no dashboard)")
    up_.set_defaults(func=_up)
    down_ = sub.add_parser("down", help="stop the local Ray cluster and every deployment in it")
    down_.add_argument("--port", type=int, default=None, help="the port of the cluster to stop (default: the one "
                                                             "`replistream up` started; needed when several run)")
    down_.set_defaults(func=_down)
    status = sub.add_parser("status", help="list the detached deployments running on the cluster, with their "
                                           "progress and fault tolerance")
    status.add_argument("name", nargs="?", default=None, help="only this deployment")
    status.add_argument("--json", action="store_true", help="print one JSON list")
    status.set_defaults(func=_status)
    stop = sub.add_parser("stop", help="stop a detached deployment")
    stop.add_argument("name", help="the deployment's name")
    stop.set_defaults(func=_stop)

    dash = sub.add_parser("dashboard", help="serve a live web dashboard of the cluster's detached deployments "
                                            "(loopback only unless --host says otherwise)")
    dash.add_argument("--port", type=int, default=8270, help="the port it listens on (default 8270)")
    dash.add_argument("--host", default="127.0.0.1", help="the interface it listens on (default 127.0.0.1)")
    dash.add_argument("--token-file", default=None, help="a file holding the token control actions (killing a "
                                                         "replica) need; default: the cluster's Ray token, if any")
    dash.set_defaults(func=_dashboard)

    from .sim.cli import register as register_sim, run as run_sim  # replistream sim <experiment> (Hwang §VI)

    register_sim(sub).set_defaults(func=run_sim)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from . import __version__

        print(__version__)
        return 0
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    prog = f"replistream {args.command}"
    try:
        if getattr(args, "check", None):
            args.check(args)
        return args.func(args)
    except CliError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # one line naming it; --debug shows where
        if args.debug:
            raise
        print(f"{prog}: error: {type(e).__name__}: {e} (run with --debug for the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
