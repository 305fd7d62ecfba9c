"""Run the Fig. 1 query on Ray through a scripted failure scenario and plot latency.

Reads a scenario file (crash, slow server, cut link), replays monitoring readings
in real time with k=2 replicas over the emulated wide-area network, checks the
output against the ideal run, and saves a PNG of application latency over time
with the events marked.
Run: python examples/failure_injection.py [scenario.toml] [out.png] [--duration S]
"""
import argparse
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import replistream as rs  # noqa: E402
from replistream.testing import assert_same_output  # noqa: E402
from replistream.workloads import fig1_inputs, fig1_query  # noqa: E402

here = Path(__file__).parent
parser = argparse.ArgumentParser()
parser.add_argument("scenario", nargs="?", default=str(here / "scenario.toml"))
parser.add_argument("out", nargs="?", default="failure_injection.png")
parser.add_argument("--duration", type=float, default=12.0)
args = parser.parse_args()

servers = ["boston", "london", "tokyo", "saopaulo"]
query = fig1_query(n_servers=4, window_s=2.0, punctuate_s=0.5)
inputs = fig1_inputs(n_servers=4, duration_s=args.duration, period_s=0.25, seed=1, chunk=1)
scenario = rs.Scenario.from_file(args.scenario)
plan = {"entry": ["boston", "london"], "loads": ["london", "tokyo"], "pings": ["tokyo", "saopaulo"],
        "correlate": ["saopaulo", "london"], "hot": ["tokyo", "boston"], "alerts": ["boston"]}

started = time.time()


def say(text: str) -> None:  # progress on stderr
    print(f"{time.time() - started:6.1f} s  {text}", file=sys.stderr, flush=True)


last_said = started


def progress(counts) -> None:  # dep.run calls it as results arrive; a line every 3 s
    global last_said
    if time.time() - last_said >= 3.0:
        last_said = time.time()
        say(f"{counts.get('alerts', 0):,} alerts so far")


say(f"starting Ray and the replicas (k=2 on {', '.join(servers)}) ...")
with rs.deploy(query, servers=servers, k=2, placement=plan, network="geo-static", seed=1) as dep:
    say(f"replaying {args.duration:g} s of readings in real time through {len(scenario.events)} scripted events")
    result = dep.run(inputs, pace=1.0, scenario=scenario, timeout=120, progress=progress)
    t, latency = dep.latencies_ms("alerts")
    events = list(dep.events)

assert_same_output(rs.run_reference(query, inputs).outputs["alerts"], result.outputs["alerts"])
print(f"{len(result.outputs['alerts'])} alerts, identical to the ideal run, through:")
for ev in scenario.events:
    print(f"  t={ev.at:g}s {ev.action} {ev.server or ''}{ev.a or ''}{'-' + ev.b if ev.b else ''}")

def describe(ev) -> str:
    """A scenario event in words: what, where, and for how long."""
    where = ev.server or (f"{ev.a}-{ev.b}" if ev.a else f"{ev.operator}#{ev.replica}" if ev.operator else "")
    detail = f" x{ev.factor:g}" if getattr(ev, "factor", None) else f" +{ev.extra_ms:g} ms" if ev.extra_ms else ""
    lasting = f" for {ev.duration:g} s" if ev.duration else ""
    return f"{ev.action.replace('_', ' ')} {where}{detail}{lasting}"


fig, (strip, ax) = plt.subplots(2, 1, figsize=(10, 5), sharex=True, gridspec_kw={"height_ratios": [1, 4]})
ax.scatter(t, latency, s=5, alpha=0.5, color="#4477aa", label="alert (one point per tuple)")
colours = plt.get_cmap("Set2")
for i, ev in enumerate(scenario.events):
    c = colours(i % 8)
    if ev.duration:  # an event that lasts: a shaded span in both panels
        for a in (strip, ax):
            a.axvspan(ev.at, ev.at + ev.duration, color=c, alpha=0.35, linewidth=0)
    else:  # an instant (a kill): a line
        for a in (strip, ax):
            a.axvline(ev.at, color=c, linewidth=2)
    strip.text(ev.at, 0.8 - 0.3 * (i % 3), describe(ev), fontsize=8, va="center",
               bbox=dict(boxstyle="round,pad=0.2", fc="white", ec=c))
strip.set_ylim(0, 1)
strip.set_yticks([])
strip.set_title("Fig. 1 query, k=2, through a failure scenario: events above, alert latency below", fontsize=10)
ax.set_xlabel("time since start (s)")
ax.set_ylabel("end-to-end latency (ms)")
ax.set_ylim(bottom=0)
ax.legend(loc="upper left", fontsize=8)
ax.grid(True, alpha=0.3)
fig.tight_layout()
fig.savefig(args.out, dpi=120)
print(f"latency plot saved to {args.out}")
