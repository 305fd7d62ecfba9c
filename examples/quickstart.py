"""Deploy a replicated query on Ray from Python and read its results.

Every operator runs as k=2 replicas on distinct (emulated) servers; the
application gets exactly what one failure-free run would give.
Run: python examples/quickstart.py
"""
import replistream as rs

q = rs.Query("quickstart")
load = q.source("load", {"server": "i4", "cpu": "f8"}, punctuate_every=rs.seconds(1))
load.window(size=rs.seconds(5), by="server", aggs={"n": "count", "avg_cpu": ("cpu", "mean")}).sink("avg_load")
q.build()

readings = [{"ts": rs.millis(100 * i), "server": i % 3, "cpu": (i % 10) / 10} for i in range(300)]

with rs.deploy(q, servers=["boston", "london", "tokyo"], k=2, network="geo-static") as dep:
    result = dep.run({"load": readings})

ideal = rs.run_reference(q, {"load": readings})
print(result.outputs["avg_load"][["window_start", "server", "n", "avg_cpu"]])
same = sorted(result.outputs["avg_load"].tolist()) == sorted(ideal.outputs["avg_load"].tolist())
assert same, "replicated output differs from the ideal run"
print("identical to the ideal run")
