"""bench/partitioned.py --intrinsic: the window's replica logic over the W2 stream, whole and routed
to partition cores in one process. Its figures are timings (not asserted here); what it must get
right is that the routed partitions together count every event the whole one counts."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "partitioned.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_partitioned", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("partitions", [2, 3])
def test_routed_partitions_count_every_event_once(bench, partitions):
    rec = bench.intrinsic(events=30_000, chunk=1_000, partitions=partitions, evict_mb=1, reps=1)
    assert rec["warm"]["counts_equal"] and rec["cold"]["counts_equal"], rec
    # 30 batches and the punctuations once whole; routed, each partition takes a share of every
    # batch (1,000 rows of 10,000 keys reach every partition) and every punctuation
    whole = rec["calls"]["1"]
    assert whole > 30 and rec["calls"][str(partitions)] == partitions * whole, rec
    assert rec["warm"][f"p{partitions}_s_per_million"] > 0
