"""The Fig. 1 scenario several simulator tests share: 10 servers, k = 2, 400 s of readings, the reference."""
from replistream.engines import run_reference
from replistream.network import default_servers
from replistream.workloads import fig1_inputs, fig1_query

SERVERS = default_servers(10)
NAMES = [s.name for s in SERVERS]
Q = fig1_query(4, window_s=10)
DATA = fig1_inputs(4, duration_s=400, period_s=10, seed=3)
REF = run_reference(Q, DATA)
# no two replicas on one server: there the per-packet engine's shared CPU queue is the only difference
PLAN = {"entry": NAMES[:2], "loads": NAMES[2:4], "pings": NAMES[4:6], "correlate": NAMES[6:8],
        "hot": NAMES[8:10], "alerts": [NAMES[0]]}
