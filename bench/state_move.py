"""A fluid rescale's steps inside the keyed state, in process (no Ray): the longest single call on
the giving and on the taking side. A benchmark, not a test.

    python bench/state_move.py                          # 4M keys, 2^12 bins, 1 -> 2, 20 bins a punctuation
    python bench/state_move.py --keys 1000000 --per-punct 100 --out docs/experiments/x.json

A :class:`~replistream.operators.keyed.KeyedCountLogic` (``by="k"``, 2^``--bits`` bins) is loaded
with ``--keys`` keys, each once, in batches of 20,000 (the load of ``bench/rescale.py --op count``).
Then the bins a 1 -> 2 rescale moves (:func:`~replistream.partition.assign_bins`) go one by one, in
bin order, as the replicas of a fluid rescale move them (replistream/replica/rescale.py): at each
punctuation the giving logic checkpoints the ``--per-punct`` bins whose steps it passed and drops
them (``drop_bins``); the taking logic installs them (``_install_tables``); then each side
processes a batch of ``--batch`` tuples of random keys of the bins it owns, and the punctuation.
One step per millisecond of event time gives ``--per-punct`` = the punctuation interval in ms
(100 at ``bench/rescale.py``'s default, 20 with ``--punctuate-ms 20``).

Reported per side: the longest calls (ms, wall time of this one thread) with the punctuation they
came at, the median call, and the process time of the whole move. A call much longer than the
median is a pause of that replica's data path during the move: a result of any key waits for it.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.benchrecord import record, write  # noqa: E402


def run(keys: int, bits: int, per_punct: int, batch: int, seed: int = 5) -> dict:
    from replistream.operators.keyed import KeyedCountLogic
    from replistream.operators.base import bin_of
    from replistream.partition import assign_bins
    from replistream.schema import Punctuation, Schema

    s = Schema({"k": "i8"})
    giver, taker = (KeyedCountLogic(n, [s], by="k", bits=bits) for n in ("giver", "taker"))
    rng = np.random.default_rng(seed)
    order = rng.permutation(keys).astype(np.int64)
    ts, next_id = 0, 1
    for a in range(0, keys, 20_000):  # the load: every key once
        k = order[a:a + 20_000]
        ts += 1
        giver.process(0, s.from_columns({"ts": np.full(len(k), ts), "k": k}, ids=np.arange(next_id, next_id + len(k))))
        next_id += len(k)
        giver.process(0, Punctuation(ts))
    taker.process(0, Punctuation(ts))
    # each key's bin, and the bins that move (1 -> 2: those partition 1 owns at 2 partitions)
    key_bin = bin_of(giver.key_hash(s.from_columns({"ts": np.zeros(keys, "i8"), "k": np.arange(keys)})), bits)
    moving = np.flatnonzero(assign_bins(1 << bits, 2) == 1)
    owner = np.zeros(1 << bits, dtype=np.int64)  # 0: the giver, 1: the taker
    calls = {"giver": [], "taker": []}
    cpu0 = time.process_time()
    for p, a in enumerate(range(0, len(moving), per_punct)):
        bins = moving[a:a + per_punct]
        t = time.perf_counter()
        given = giver.checkpoint(bits, bins)
        giver.drop_bins(bits, bins)
        calls["giver"].append((time.perf_counter() - t, p, "give"))
        t = time.perf_counter()
        taker._install_tables(given.tables)
        calls["taker"].append((time.perf_counter() - t, p, "install"))
        owner[bins] = 1
        ts += 1
        for side, logic in ((0, giver), (1, taker)):
            pool = np.flatnonzero(owner[key_bin] == side)
            k = pool[rng.integers(0, len(pool), batch)]
            t = time.perf_counter()
            logic.process(0, s.from_columns({"ts": np.full(batch, ts), "k": k}, ids=np.arange(next_id, next_id + batch)))
            logic.process(0, Punctuation(ts))
            calls["giver" if side == 0 else "taker"].append((time.perf_counter() - t, p, "batch"))
            next_id += batch
    cpu = time.process_time() - cpu0
    # what each side holds: every key once, on its bin's side, and every tuple counted
    every = np.arange(1 << bits)
    (gh, gc, _), (th, tc, _) = giver.state.snapshot(every, bits), taker.state.snapshot(every, bits)
    exact = (len(gh) + len(th) == keys and not owner[bin_of(gh, bits)].any() and owner[bin_of(th, bits)].all()
             and int(gc["count"].sum() + tc["count"].sum()) == keys + 2 * batch * (p + 1))
    out = {"keys": keys, "bits": bits, "per_punct": per_punct, "batch": batch, "punctuations": p + 1,
           "exact": bool(exact), "cpu_s": round(cpu, 3)}
    for side, cs in calls.items():
        cs.sort(reverse=True)
        out[side] = {"longest_ms": [[round(d * 1000, 1), p, what] for d, p, what in cs[:5]],
                     "median_ms": round(float(np.median([d for d, _, _ in cs])) * 1000, 2)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=4_000_000)
    ap.add_argument("--bits", type=int, default=12)
    ap.add_argument("--per-punct", type=int, default=20, help="bins moved at each punctuation (steps per punctuation)")
    ap.add_argument("--batch", type=int, default=200, help="tuples each side processes between two punctuations")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.keys < 1 or not 0 <= args.bits <= 24 or args.per_punct < 1 or args.batch < 1:
        ap.error("--keys, --per-punct and --batch must be positive and --bits in 0..24")
    print(f"loading {args.keys:,} keys, then moving half of {1 << args.bits} bins, {args.per_punct} a punctuation ...",
          file=sys.stderr)
    res = run(args.keys, args.bits, args.per_punct, args.batch)
    for side in ("giver", "taker"):
        longest = ", ".join(f"{d} ms ({what} at punctuation {p})" for d, p, what in res[side]["longest_ms"][:3])
        print(f"{side}: median call {res[side]['median_ms']} ms; longest {longest}")
    print(f"process time of the move: {res['cpu_s']} s over {res['punctuations']} punctuations")
    if not res["exact"]:
        print("NOT EXACT: a key lost, on the wrong side, or a tuple not counted", file=sys.stderr)
    write(args.out, record("quiet", **res))
    return 0 if res["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
