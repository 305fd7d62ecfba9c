"""A windowed Join holding a large state: CPU per small batch (in process; a benchmark, not a test).

    python bench/join_state.py                 # 100k and 1M buffered tuples
    python bench/join_state.py --state 2000000

The left input is loaded with ``--state`` distinct keys (88-byte tag each) over 20 s of
event time in 1,000 batches, all inside the Join's 30-s window; then 10 s of steady
input: every 20 ms one batch of ``--batch`` random keys per input and a punctuation on
each. Reported: CPU milliseconds per steady batch (``time.process_time``), the
buffered tuples per side and the number of chunks the buffers hold. This is what a
replica's Join spends per arriving batch when its window holds that much, and what
bench/migration.py's Join move runs beside.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from replistream.operators.join import JoinLogic  # noqa: E402
from replistream.schema import Schema  # noqa: E402

L, R = Schema({"k": "i8", "tag": "S88"}), Schema({"k": "i8"})


def one(state: int, batch: int, seed: int = 0) -> dict:
    j = JoinLogic("j", [L, R], window=30_000_000, left_key="k", right_key="k")
    rng = np.random.default_rng(seed)
    t, idn, per = 0, 1, max(1, state // 1000)
    order = rng.permutation(state)
    for i in range(0, state, per):
        k = order[i:i + per]
        j.process(0, L.from_columns({"ts": np.full(len(k), t), "k": k, "tag": np.full(len(k), b"x" * 88)},
                                    ids=np.arange(idn, idn + len(k))))
        idn += len(k)
        t += 20_000
    t0, batches, outs = time.process_time(), 0, 0
    for _ in range(500):
        for port, schema in ((0, L), (1, R)):
            cols = {"ts": np.full(batch, t), "k": rng.integers(0, state, batch)}
            if port == 0:
                cols["tag"] = np.full(batch, b"x" * 88)
            outs += sum(len(o) for o in j.process(port, schema.from_columns(cols, ids=np.arange(idn, idn + batch)))
                        if hasattr(o, "dtype"))
            idn += batch
            batches += 1
        j.on_punctuation(0, t - 1)
        j.on_punctuation(1, t - 1)
        t += 20_000
    ms = 1e3 * (time.process_time() - t0) / batches
    return {"state": state, "batch": batch, "cpu_ms_per_batch": round(ms, 3), "buffered": list(j.buffered),
            "chunks": [len(b.chunks) for b in j.buffers], "outputs": outs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state", type=int, nargs="*", default=[100_000, 1_000_000])
    ap.add_argument("--batch", type=int, default=100)
    a = ap.parse_args()
    for s in a.state:
        print(json.dumps(one(s, a.batch)), flush=True)


if __name__ == "__main__":
    main()
