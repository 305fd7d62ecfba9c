"""The ``replistream`` command line.

``replistream demo`` runs the paper's Fig. 1 network-monitoring query with
every operator replicated ``k`` times, crashes replicas mid-run, and checks
the delivered output against the ideal non-replicated run.

Until the Ray runtime lands the demo uses the in-process replicated engine
(:func:`replistream.testing.run_replicated`): the same operator objects,
duplicate filters and entry-point logic, with channels as in-memory FIFO
queues delivered in a seeded random order instead of Ray actor calls.

>>> main(["demo", "--servers", "3", "--duration", "60", "--json"])  # doctest: +ELLIPSIS
{"engine": "in-process", ...}
0
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


def _demo(args) -> int:
    from .testing import as_multiset, run_reference, run_replicated
    from .workloads import fig1_inputs, fig1_query

    t0 = time.perf_counter()
    query = fig1_query(n_servers=args.servers, window_s=args.window)
    inputs = fig1_inputs(n_servers=args.servers, duration_s=args.duration, period_s=args.period, seed=args.seed)
    progress = None
    if not args.json:
        from rich.console import Console

        progress = Console(stderr=True)
        progress.print(f"[bold]replistream demo[/]: Fig. 1 query, {args.servers} servers, k={args.k}, "
                       f"{args.duration:g} s of readings every {args.period:g} s, seed {args.seed}")
        progress.print("running the reference (ideal, non-replicated) run ...")
    ref = run_reference(query, inputs)
    if progress:
        progress.print(f"running the replicated run (k={args.k}, crashing up to k-1 replicas of every operator) ...")
    rep = run_replicated(query, inputs, k=args.k, seed=args.seed, crash=not args.no_crash)
    expected, got = ref.outputs["alerts"], rep.outputs["alerts"]
    e, g = as_multiset(expected), as_multiset(got)
    lost = sum((e - g).values())
    extra = g - e
    duplicates = sum(n for k, n in extra.items() if k in e)  # extra copies of expected tuples
    h = rep.stats["harness"]
    weights = rep.stats["weights"]["alerts"][0]
    summary = {
        "engine": "in-process",
        "servers": args.servers,
        "k": args.k,
        "seed": args.seed,
        "inputs": int(sum(s["tuples_out"] for s in ref.stats["entries"].values())),
        "outputs": int(len(got)),
        "reference_outputs": int(len(expected)),
        "lost": int(lost),
        "duplicates": int(duplicates),
        "unexpected": int(sum(n for k, n in extra.items() if k not in e)),
        "matches_reference": bool(e == g),
        "complete": bool(rep.complete),
        "dead_letters": rep.dead_letter_count(),
        "crashed_replicas": sorted(h.crashed),
        "stream_replica_weights": [round(w, 2) for w in weights],
        "delivery_steps": h.steps,
        "seconds": round(time.perf_counter() - t0, 3),
    }
    if args.json:
        print(json.dumps(summary))
    else:
        from rich.table import Table

        table = Table(title="Fig. 1 query: replicated run vs. ideal run")
        table.add_column("what")
        table.add_column("value", justify="right")
        for key in ("inputs", "reference_outputs", "outputs", "lost", "duplicates", "unexpected",
                    "matches_reference", "complete", "dead_letters", "delivery_steps", "seconds"):
            table.add_row(key, str(summary[key]))
        table.add_row("crashed replicas", ", ".join(summary["crashed_replicas"]) or "none")
        table.add_row("filter weights at 'alerts'", " ".join(f"{w:g}" for w in summary["stream_replica_weights"]))
        progress.print(table)
        if len(got):
            first = got[np.argsort(got["ts"])][:3]
            progress.print("first alerts (ts in µs):", first[["ts", "server", "cpu", "dst", "rtt_ms"]].tolist())
    return 0 if summary["matches_reference"] and summary["complete"] else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="replistream",
        description="Replicated, replication-transparent stream processing (Hwang, Cetintemel, Zdonik 2008).")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser("demo", help="run the Fig. 1 monitoring query replicated, with crashes, "
                                       "and compare with the ideal run")
    demo.add_argument("--k", type=int, default=2, help="replicas per operator (default 2)")
    demo.add_argument("--servers", type=int, default=10, help="monitored servers (default 10)")
    demo.add_argument("--duration", type=float, default=600.0, help="seconds of readings (default 600)")
    demo.add_argument("--period", type=float, default=10.0, help="seconds between readings (default 10)")
    demo.add_argument("--window", type=float, default=10.0, help="join window in seconds (default 10)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.add_argument("--no-crash", action="store_true", help="do not crash replicas")
    demo.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    demo.set_defaults(func=_demo)
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
    if getattr(args, "k", 1) < 1:
        parser.error(f"--k must be >= 1, got {args.k}")
    if getattr(args, "servers", 1) < 1:
        parser.error(f"--servers must be >= 1, got {args.servers}")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
