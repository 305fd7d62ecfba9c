"""bench/state_move.py: a fluid 1 -> 2 of a keyed count's state between a giving and a taking
logic, in process. Its figures are timings (not asserted here); what it must get right is the
move itself: every key once, on its bin's side, every tuple counted."""
from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "state_move.py"


def test_the_replayed_move_keeps_every_key_and_count():
    spec = importlib.util.spec_from_file_location("bench_state_move", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rec = mod.run(keys=30_000, bits=8, per_punct=5, batch=50)
    assert rec["exact"] and rec["punctuations"] == 128 // 5 + 1, rec
    for side in ("giver", "taker"):
        assert len(rec[side]["longest_ms"]) == 5 and rec[side]["median_ms"] > 0
