"""A keyed count's state growing to many keys, in process (no Ray): what a batch of new keys costs.

    python bench/keyed_state.py                    # 1M keys, 88-byte tag, 1,000 new keys per punctuation
    python bench/keyed_state.py --keys 200000 --json out.json

A :class:`~replistream.operators.keyed.KeyedCountLogic` (``by="k"``, ``keep=("tag",)``, 2^12
bins, 112 bytes of state per key) is fed ``--keys`` distinct keys, ``--per`` new keys per
batch, each batch followed by a punctuation (so each is applied); then ``--steady``
punctuations of 200 random existing keys (the first 200 reported apart: they include putting
the rows in hash order once the state stopped growing); then a full checkpoint and one of 64
of the 4,096 bins. Process CPU seconds, so other load on the machine matters less. Run it
on two commits (``PYTHONPATH=<a worktree of the other commit>``) to compare layouts.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from replistream.operators.keyed import KeyedCountLogic
from replistream.schema import Punctuation, Schema


def run(keys: int, per: int, steady: int, seed: int = 0) -> dict:
    s = Schema({"k": "i8", "tag": "S88"})
    c = KeyedCountLogic("c", [s], by="k", keep=("tag",), bits=12, emit_keep=False)
    rng = np.random.default_rng(seed)
    order = rng.permutation(keys)
    ts, nid = 0, 0

    def feed(k: np.ndarray, tag: bytes) -> None:
        nonlocal ts, nid
        b = s.from_columns({"ts": np.full(len(k), ts), "k": k, "tag": np.full(len(k), tag * 88)},
                           ids=np.arange(nid, nid + len(k)))
        c.process(0, b)
        c.process(0, Punctuation(ts))
        ts, nid = ts + 1, nid + len(k)

    t0 = time.process_time()
    for i in range(0, keys, per):
        feed(order[i:i + per], b"x")
    load_s = time.process_time() - t0
    t0 = time.process_time()
    first = min(200, steady)
    for j in range(steady):
        if j == first:
            first_s, t0 = time.process_time() - t0, time.process_time()
        feed(rng.integers(0, keys, 200), b"y")
    rest_s = time.process_time() - t0
    t0 = time.process_time()
    c.checkpoint(12)
    full_s = time.process_time() - t0
    t0 = time.process_time()
    c.checkpoint(12, range(0, 4096, 64))
    some_s = time.process_time() - t0
    return {"keys": keys, "new_keys_per_punctuation": per, "load_cpu_s": round(load_s, 2),
            "load_keys_per_cpu_s": round(keys / load_s),
            "steady_first_ms_per_punctuation": round(1e3 * first_s / first, 3),
            "steady_ms_per_punctuation": round(1e3 * rest_s / max(1, steady - first), 3),
            "full_checkpoint_ms": round(1e3 * full_s, 1), "checkpoint_64_bins_ms": round(1e3 * some_s, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--per", type=int, default=1000, help="new keys per punctuation while loading")
    ap.add_argument("--steady", type=int, default=1200, help="punctuations of 200 existing keys afterwards")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.keys < 1 or a.per < 1 or a.steady < 1:
        ap.error("--keys, --per and --steady must be at least 1")
    r = run(a.keys, a.per, a.steady)
    print(f"load {r['keys']:,} keys, {r['new_keys_per_punctuation']:,} new per punctuation: {r['load_cpu_s']} s CPU "
          f"({r['load_keys_per_cpu_s']:,} keys/s); steady: first 200 punctuations "
          f"{r['steady_first_ms_per_punctuation']} ms each, then {r['steady_ms_per_punctuation']} ms; "
          f"full checkpoint {r['full_checkpoint_ms']} ms; 64 of 4,096 bins {r['checkpoint_64_bins_ms']} ms",
          file=sys.stdout)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(r, fh, indent=1)


if __name__ == "__main__":
    main()
