"""``replistream sim <experiment>``: the paper's experiments from the command line (Hwang §VI).

``register(subparsers)`` adds the ``sim`` subcommand to replistream's CLI;
``run(args)`` runs it. Also runnable alone as ``python -m replistream.sim``.

    replistream sim fig4 --quick --json          # JSON on stdout
    replistream sim fig2 --out results/          # PNG, JSON and CSV in results/
    replistream sim fig5 --out r/ --resume       # kmax rows in parallel; keeps rows done earlier
    replistream sim trace --out t/ --servers 30  # a CSV latency trace
    replistream sim fig4 --quick --parallelism correlate=2 --bits 8   # the Join in 2 key partitions
    replistream sim fig3 --quick --parallelism entry=2 --parallelism alerts=2   # entry, application partitions
    replistream sim rescale --quick --json       # live rescaling, each strategy, in simulated time

>>> import argparse
>>> p = argparse.ArgumentParser(prog="replistream"); sub = p.add_subparsers(dest="command")
>>> _ = register(sub)
>>> args = p.parse_args(["sim", "fig4", "--quick", "--seed", "3"])
>>> args.experiment, args.quick, args.seed, args.json
('fig4', True, 3, False)
"""
from __future__ import annotations

import argparse
import json
import math
import sys

from .experiments import EXPERIMENTS, jsonable, run_experiment, table, verdict

__all__ = ["register", "run", "main", "ABOUT"]


#: One line per experiment: what ``replistream sim --help`` lists.
ABOUT = {
    "fig2": "latency over time at the Join's output around a crash of one server (Hwang Sec. VI-B)",
    "fig3": "end-to-end latency over time for kmax = 1, 2, 3 on min-cost placements (Sec. VI-C)",
    "fig4": "latency distribution (CCDF) of random against min-cost placement, kmax = 1..5 (Sec. VI-E)",
    "fig5": "network cost of static replication, GC, and GC with revival at one latency guarantee (Sec. VI-F)",
    "table1": "per-replica CPU cost by degree of replication (Sec. VI-D)",
    "rescale": "live rescaling 1 -> 2 -> 4 partitions: fluid, batched, all-at-once in simulated time (issue #41)",
    "trace": "write a CSV latency trace of the built-in wide-area network model (no experiment)",
}

#: fig5's own options (accepted, hidden, by the other experiments only to say they are fig5's).
FIG5_OPTIONS = ("jobs", "resume", "hours", "kmax", "damping", "create", "metric", "trials", "thetas", "volatility")
#: The experiments that run the query with partitioned operators (``--parallelism``, ``--bits``; issue #41):
#: those that place it with Algorithm 5 and simulate each placement.
PARTITIONED = ("fig3", "fig4")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true",
                   help="reduced scale, what the tests run: from 0.5 s (table1) to a few minutes (fig4, ten "
                        "simulations) on a 2-core machine")
    p.add_argument("--seed", type=int, default=0, help="seed of the network model, inputs and random placement")
    p.add_argument("--json", action="store_true", help="print the data as JSON instead of a table")
    p.add_argument("--out", default=None, metavar="DIR", help="write <experiment>.png/.json/.csv here")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                   help="one labelled progress line per simulated run on stderr (experiment, kmax, strategy; "
                        "default; off a terminal, one line as each run ends); --no-progress for none")


def _fig5(p: argparse.ArgumentParser, hidden: bool = False) -> None:
    h = (lambda text: argparse.SUPPRESS) if hidden else (lambda text: text)
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help=h("run the kmax rows in N processes (default: one per CPU at full scale)"))
    p.add_argument("--resume", action="store_true", default=None,
                   help=h("reuse rows an earlier run with the same parameters wrote to --out DIR/fig5_rows/, "
                          "and the simulated runs a row stopped halfway had finished (DIR/fig5_rows/trials/)"))
    p.add_argument("--trials", default=None, metavar="DIR",
                   help=h("keep each simulated run in DIR instead of --out DIR/fig5_rows/trials/ (with "
                          "--resume, reuse them); --metric max and p99 share the runs they both answer"))
    p.add_argument("--hours", type=float, default=None, metavar="H",
                   help=h("simulated hours (default: the scale's, 24 full, 1/12 quick)"))
    p.add_argument("--kmax", type=int, nargs="+", default=None, metavar="K", help=h("only these kmax rows"))
    p.add_argument("--damping", action=argparse.BooleanOptionalAction, default=None,
                   help=h("damped revival (default; persistence, hysteresis, hold: FIG5_DAMPING); "
                          "--no-damping revives on every delay above the threshold, as before"))
    p.add_argument("--create", action=argparse.BooleanOptionalAction, default=None,
                   help=h("revival may start new replicas (default); --no-create skips those decisions"))
    p.add_argument("--metric", choices=["max", "p99"], default=None,
                   help=h("the latency the 1 s guarantee bounds (default max)"))
    p.add_argument("--thetas", type=float, nargs="+", default=None, metavar="F",
                   help=h("the GC targets, fractions of the static cost, decreasing (default 0.8 0.6 0.45 "
                          "0.35 0.25 0.18 0.12 0.08 0.05 0.03)"))
    p.add_argument("--volatility", type=float, default=None, metavar="X",
                   help=h("the network's rates of delay spikes and link outages, x the model's (default 1: "
                          "a spike per 600 s per direction, an outage per 12 h per link; 0 turns both off)"))


def _partitions(p: argparse.ArgumentParser, hidden: bool = False) -> None:
    h = (lambda text: argparse.SUPPRESS) if hidden else (lambda text: text)
    p.add_argument("--parallelism", metavar="NODE=P", action="append", default=None,
                   help=h("run operator NODE as P key partitions, each placed and replicated on its own "
                          "(Algorithm 5 per partition; repeatable, e.g. --parallelism correlate=2); "
                          "entry=P runs the entry points as P entry partitions on their servers, alerts=P the "
                          "application as P partitions spread from its server, as deploy() lays them out"))
    p.add_argument("--bits", type=int, default=None, metavar="B",
                   help=h("a partitioned operator's key space is cut into 2**B bins; P <= 2**B (default 12)"))


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``sim`` subcommand to an ``argparse`` subparsers object; returns its parser. Each
    experiment is a subcommand of its own with its own options (``replistream sim fig5 --help``)."""
    listing = "\n".join(f"  {name:<7} {text}" for name, text in ABOUT.items())
    p = subparsers.add_parser(
        "sim", help="run one of the paper's experiments (Fig. 2-5, Table I) in the simulator",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run one of Hwang et al. 2008's experiments in the trace-driven simulator; writes a PNG "
                    "plot and the data\n(JSON, CSV) to --out and prints a short table (or JSON with --json).\n\n"
                    f"experiments:\n{listing}\n\n"
                    "Each has its own options: replistream sim <experiment> --help. Every experiment takes\n"
                    "--quick, --seed, --json, --out and --progress; fig5 has its own as well, fig3 and fig4 take\n"
                    "--parallelism and --bits (partitioned operators, entry points and application), trace has\n"
                    "--servers, --days and --step.")
    exps = p.add_subparsers(dest="experiment", metavar="EXPERIMENT", required=True,
                            help="one of the experiments above")
    for name, text in ABOUT.items():
        e = exps.add_parser(name, description=f"{name}: {text}.")
        if name == "trace":
            e.add_argument("--seed", type=int, default=0, help="seed of the network model")
            e.add_argument("--out", default=None, metavar="DIR", help="write the CSV trace here (required)")
            e.add_argument("--servers", type=int, default=100, help="number of built-in cities (<= 119)")
            e.add_argument("--days", type=float, default=30.0, help="length in days")
            e.add_argument("--step", type=float, default=10.0, help="seconds between samples")
            e.set_defaults(quick=False, json=False, progress=False, jobs=None)
        else:
            _common(e)
            _fig5(e, hidden=name != "fig5")
            _partitions(e, hidden=name not in PARTITIONED)
        e.set_defaults(func=run)
    p.set_defaults(func=run)
    return p


def check(args) -> str | None:
    """What is wrong with the parsed ``sim`` arguments, in one line with the fix (None when nothing is),
    found before any simulation starts.

    >>> import argparse
    >>> check(argparse.Namespace(experiment="fig2", out="/proc/nope", jobs=None, servers=100, days=30.0, step=10.0))
    "--out: cannot create or write the folder '/proc/nope' (No such file or directory); choose a folder you can write"
    """
    import os

    for flag, folder in (("--out", args.out), ("--trials", getattr(args, "trials", None))):
        if folder is None:
            continue
        try:  # the folder is made now rather than after a long run; a probe file shows it takes files
            os.makedirs(folder, exist_ok=True)
            probe = os.path.join(folder, ".replistream-write-test")
            with open(probe, "w"):
                pass
            os.remove(probe)
        except OSError as e:
            return (f"{flag}: cannot create or write the folder {folder!r} ({e.strerror}); choose a folder "
                    f"you can write")
    if getattr(args, "jobs", None) is not None and args.jobs < 1:
        return f"--jobs must be >= 1, got {args.jobs}"
    th = getattr(args, "thetas", None)
    if th is not None and (any(not 0 < f <= 1 for f in th) or any(a <= b for a, b in zip(th, th[1:]))):
        return (f"--thetas must be fractions of the static cost in (0, 1], most generous first, got "
                f"{' '.join(f'{f:g}' for f in th)}; e.g. --thetas 0.05 0.03 0.02 0.01")
    vol = getattr(args, "volatility", None)
    if vol is not None and not (vol >= 0 and math.isfinite(vol)):
        return f"--volatility must be a finite number >= 0 (1 is the model's rates), got {vol:g}"
    if getattr(args, "parallelism", None) is not None or getattr(args, "bits", None) is not None:
        if args.experiment not in PARTITIONED:
            return (f"--parallelism and --bits are {' and '.join(PARTITIONED)}'s options (the experiments that "
                    f"place the query); {args.experiment} runs unpartitioned operators")
        from replistream.partition import DEFAULT_BITS, node_parallelism_from_options
        from replistream.workloads import fig1_query

        bits = DEFAULT_BITS if args.bits is None else args.bits
        try:  # place's check and one-line messages, on the query every experiment runs (fig1): operators,
            # the entry points (entry=P) and the application (alerts=P)
            args.partitions = node_parallelism_from_options(args.parallelism, bits, fig1_query(n_servers=1))
        except ValueError as e:
            return str(e)
    if args.experiment == "trace":
        if not 1 <= args.servers <= 119:
            return f"--servers must be between 1 and 119 (the built-in cities), got {args.servers}"
        if not args.days > 0:
            return f"--days must be > 0, got {args.days:g}"
        if not args.step > 0:
            return f"--step must be > 0 seconds, got {args.step:g}"
    return None


def run(args) -> int:
    """Run the parsed ``sim`` command; returns the exit status."""
    problem = check(args)
    if problem:
        print(f"replistream sim {args.experiment}: error: {problem}", file=sys.stderr)
        return 2
    if args.experiment == "trace":
        return _trace(args)
    f5 = {k: getattr(args, k, None) for k in FIG5_OPTIONS}
    if args.experiment != "fig5" and any(v is not None for v in f5.values()):
        print(f"replistream sim {args.experiment}: --jobs, --resume, --trials, --hours, --kmax, --thetas, --volatility, "
              f"--damping, --create and --metric are fig5's options", file=sys.stderr)
        return 2
    if getattr(args, "partitions", None):  # checked by check(): {operator: p}, p >= 2
        f5.update(parallelism=args.partitions, bits=args.bits)
    from replistream.progress import Heartbeat

    # off a terminal the bars appear only as each simulated run ends: a line every 10 s meanwhile
    every = 10.0 if args.progress and not sys.stderr.isatty() else float("inf")
    with Heartbeat(lambda text: print(text, file=sys.stderr, flush=True), every=every) as hb:
        parts = "".join(f", {op} in {p} partitions" for op, p in (getattr(args, "partitions", None) or {}).items())
        hb.say(f"replistream sim {args.experiment} ({'quick' if args.quick else 'full'} scale, seed {args.seed}"
               f"{parts}) ...",
               phase=f"simulating {args.experiment}")
        data = run_experiment(args.experiment, quick=args.quick, seed=args.seed, out=args.out,
                              progress=args.progress, **f5)
    line = verdict(data)
    if args.json:
        print(json.dumps({"verdict": line, **data}, default=jsonable))
    else:
        print(line)  # first: the verdict beside the paper's claim, then the table
        print(table(data))
        if args.out:
            print(f"wrote {args.out}/{args.experiment}.png, .json, .csv")
    return 0


def _trace(args) -> int:
    import os

    from .traces import month_model, write_trace

    if not args.out:
        print("replistream sim trace: --out DIR is required", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"trace_{args.servers}servers_{args.days:g}days_seed{args.seed}.csv")
    rows = write_trace(month_model(args.servers, seed=args.seed), path, duration_s=args.days * 86400,
                       step_s=args.step)
    print(f"wrote {rows:,} rows to {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m replistream.sim <experiment> ...``: the ``sim`` subcommand on its own."""
    parser = argparse.ArgumentParser(prog="replistream")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(["sim", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)
