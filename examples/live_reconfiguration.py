"""Change a running replicated query without losing a tuple (Bartnik et al. 2019; Megaphone 2019).

The Fig. 1 monitoring query runs on Ray with k=2 replicas per operator. While
readings stream in, the deployment

* replaces the alert filter's function (from the current logical time p on),
* adds a per-server load aggregate with its own application, and
* moves a replica of the stateful Join to another server, its state moving
  bin by bin ("fluid") from a live peer that keeps serving meanwhile.

Each change takes effect at a logical time carried by a marker, so the output
equals a reference run of the changed query (``dep.query``) exactly.
Run: python examples/live_reconfiguration.py [--duration S] [--strategy fluid|batched|all-at-once]
The same script is ``replistream reconfigure``; its code is
``replistream.demos.live_reconfiguration``.
"""
import argparse
import sys

from replistream.demos import live_reconfiguration

parser = argparse.ArgumentParser()
parser.add_argument("--duration", type=float, default=12.0, help="seconds of readings (default 12)")
parser.add_argument("--strategy", default="fluid", choices=["all-at-once", "batched", "fluid"])
args = parser.parse_args()

report = live_reconfiguration(duration_s=args.duration, strategy=args.strategy,
                              say=lambda text: print(text, file=sys.stderr, flush=True))  # progress
for change in report["changes"]:
    print(f"{change['change']:>16} at logical time {change['p'] / 1e6:.3f} s: {change['text']}")
move = report["move"]
print(f"{'move_replica':>16}: correlate#0 -> {move['new_replicas']} on {move['server']}, {move['strategy']} "
      f"transfer, {move['apply_seconds']} s")
for app, a in report["applications"].items():
    print(f"{app:>16}: {a['outputs']} outputs, reference {a['reference_outputs']}, lost {a['lost']}, "
          f"duplicates {a['duplicates']}")
assert report["matches_reference"], "the reconfigured run differs from the reference run of the changed query"
print("every application is identical to the ideal run of the changed query (its reference run)")
