"""Build a query, run it once ideally and once replicated (k=3, random crashes), compare.

Run: python examples/quickstart_core.py
"""
import replistream as rs
from replistream.testing import assert_same_output, run_replicated

q = rs.Query("monitor")
load = q.source("load", {"server": "i4", "cpu": "f8"}, punctuate_every=rs.seconds(1))
ping = q.source("ping", {"src": "i4", "rtt_ms": "f8"}, punctuate_every=rs.seconds(1))
(load.join(ping, window=rs.seconds(10), left_key="server", right_key="src")
     .filter(lambda b: b["cpu"] > 0.5)
     .sink("alerts"))
(load.window(size=rs.seconds(60), slide=rs.seconds(10), by="server",
             aggs={"n": "count", "avg_cpu": ("cpu", "mean")})
     .sink("load_per_minute"))
q.build()

inputs = {
    "load": [{"ts": rs.seconds(t), "server": t % 3, "cpu": (t % 7) / 7} for t in range(120)],
    "ping": [{"ts": rs.seconds(t) + 1, "src": t % 3, "rtt_ms": 20.0 + t} for t in range(120)],
}
ideal = rs.run_reference(q, inputs)
replicated = run_replicated(q, inputs, k=3, seed=7, crash=True)
for app in q.sinks:
    assert_same_output(ideal.outputs[app], replicated.outputs[app])
    print(f"{app}: {len(replicated.outputs[app])} tuples, identical to the ideal run")
print(q.describe())
print(ideal.outputs["load_per_minute"][["window_start", "server", "n", "avg_cpu"]][:3])
