"""What the batched simulator's epoch length costs: Fig. 5's static min-cost deployment (10 of
30 servers monitored, seed 0) simulated for ``--hours`` with each ``--batch`` epoch length,
process CPU per run (docs/experiments.md, "A month of Fig. 5").

    python bench/sim_epochs.py --hours 2 --batch 10 60 600
"""
from __future__ import annotations

import argparse
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hours", type=float, default=2.0)
    ap.add_argument("--kmax", type=int, default=3)
    ap.add_argument("--batch", type=float, nargs="+", default=[10.0, 60.0, 600.0], metavar="S",
                    help="epoch lengths (simulated s), one run each")
    a = ap.parse_args(argv)
    if a.hours <= 0 or any(b <= 0 for b in a.batch):
        print(f"sim_epochs.py: error: --hours and --batch must be > 0, got {a.hours} and {a.batch}", file=sys.stderr)
        return 2
    from replistream.placement import min_cost
    from replistream.sim import Simulator
    from replistream.sim.experiments import FIG5_CHUNK, fig1_setting

    st = fig1_setting(30, 10, a.hours * 3600.0, seed=0, chunk=FIG5_CHUNK)
    plan = min_cost(st.problem, a.kmax).plan()
    for b in a.batch:
        c0 = time.process_time()
        res = Simulator(st.query, plan, st.network, sources=st.sources, batch_s=b).run(st.inputs)
        cpu = time.process_time() - c0
        epochs = a.hours * 3600.0 / b
        print(f"epoch {b:g} s: {cpu:.2f} s of CPU for {epochs:,.0f} epochs ({1e3 * cpu / epochs:.1f} ms each), "
              f"complete={res.complete}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
