"""Entry partitions on Ray (issue #41, point 4): ``deploy(parallelism={"entry": p})`` runs the
entry points as ``p`` partitions of ``k`` replicas (``entry.P#R``); the one feeder hands each
chunk of a source (a Parquet file's chunk read by a Ray task, or an in-memory chunk) to the
replicas of one partition only, with the state an unpartitioned entry point would be in before
it. Output, ids and dead letters (late and malformed rows, each once) equal the reference run's;
a killed entry partition replica is masked by its partition's peer, and is repaired from it.
The cases are the in-process ones (tests/engines/test_entry_partitions.py)."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import ray

from replistream import deploy, seconds
from replistream.sources import Call, KillReplica
from replistream.testing import assert_same_output, run_reference

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engines"))
from test_entry_partitions import files_case, letters, memory_case  # noqa: E402

pytestmark = [pytest.mark.usefixtures("ray_session")]

SERVERS = ["boston", "london", "tokyo"]


def same_run(ref, res) -> None:
    assert res.complete
    for app in ref.outputs:
        assert len(ref.outputs[app])
        assert_same_output(ref.outputs[app], res.outputs[app])
    assert letters(res) == letters(ref)


def entry_rows(dep) -> dict[str, int]:
    """Rows each entry replica took (emitted, late or malformed), per replica label."""
    return {label: sum(e["tuples_out"] + e["late"] + e["malformed"]
                       for e in ray.get(h.stats.remote(), timeout=60)["entries"].values())
            for label, h in dep.handles.items() if label.startswith("entry")}


def test_parquet_files_and_memory_sources_split_between_entry_partitions_match_the_reference(tmp_path):
    q, data = files_case(str(tmp_path))
    ref = run_reference(q, data)
    with deploy(q, servers=SERVERS, k=1, network="zero", parallelism={"entry": 3}) as dep:
        res = dep.run(data, timeout=120)
        rows = entry_rows(dep)
    same_run(ref, res)
    total = sum(d["n"] for d in ref.outputs["counts"]) + sum(x.count for x in ref.dead_letters)
    assert sorted(rows) == ["entry.0#0", "entry.1#0", "entry.2#0"]
    assert all(0 < n < total for n in rows.values()) and sum(rows.values()) == total  # each chunk read once

    q, data = memory_case()
    ref = run_reference(q, data, on_malformed="dead_letter")
    with deploy(q, servers=SERVERS, k=2, network="zero", parallelism={"entry": 2}) as dep:
        assert sorted(h for h in dep.handles if h.startswith("entry")) == \
            ["entry.0#0", "entry.0#1", "entry.1#0", "entry.1#1"]
        assert dep.partitions("entry") == 2
        for what, says in [(lambda: dep.kill_replica("entry", 0), "name one of them: entry.0, entry.1"),
                           (lambda: dep.rescale("w", 2), "beside entry partitions (entry: 2)")]:
            # (changes of the running query work beside entry partitions: tests/ray/test_changes_partitions_ray.py)
            with pytest.raises(ValueError) as e:
                what()
            assert says in str(e.value) and "\n" not in str(e.value)
        res = dep.run(data, timeout=120)
    same_run(ref, res)


def test_a_killed_entry_partition_replica_is_masked_and_repaired_from_its_partition():
    q, data = memory_case()
    ref = run_reference(q, data, on_malformed="dead_letter")

    def repaired(d, label="entry.1#0", deadline_s=120):
        end = time.time() + deadline_s
        while not any(r["replica"] == label and r.get("repaired") for r in d.repairs):
            assert time.time() < end, f"{label} was not repaired: {d.repairs}"
            d.check_failures()
            time.sleep(0.05)

    a = list(data["a"])
    a.insert(4, KillReplica("entry.1", 0))
    a.insert(8, Call(repaired))
    a.insert(12, KillReplica("entry.0", 1))  # partition 0 goes on with entry.0#0 alone
    with deploy(q, servers=SERVERS, k=2, network="zero", repair=True, parallelism={"entry": 2}) as dep:
        res = dep.run({**data, "a": a}, timeout=180)
        done = [r for r in dep.repairs if r.get("repaired")]
        assert done[0]["replica"] == "entry.1#0" and done[0]["new"] == "entry.1#2", dep.repairs
        ev = [e for e in dep.events if e.get("event") == "entry_repaired"]
        assert ev and ev[0]["from"] == "entry.1#1"  # from its own partition's peer
    same_run(ref, res)


def test_a_stopped_entry_partition_replica_catches_up_from_its_partition_peer():
    """entry.1#1 stops answering: the feeder stops sending it partition 1's chunks, entry.1#0 keeps
    them (keep_from), and once resumed it takes them from entry.1#0 (catch_up), not from partition 0."""
    import threading

    from replistream.sources import StopReplica, inject_at
    from test_entry_peers import inputs, query, skips

    q, data = query(), inputs()
    ref = run_reference(q, data)
    resumed = threading.Event()

    def resume_once_skipped(dep):
        def go():
            deadline = time.time() + 60
            while not skips(dep, "entry.1#1", "skipped") and time.time() < deadline:
                time.sleep(0.02)
            dep.resume_replica("entry.1", 1)
            resumed.set()
        threading.Thread(target=go, daemon=True).start()  # the feeder thread must go on meanwhile

    data["s"] = inject_at(data["s"], seconds(4), StopReplica("entry.1", 1))
    data["s"] = inject_at(data["s"], seconds(4), Call(resume_once_skipped))
    with deploy(q, servers=SERVERS, k=2, suspect_after_s=0.5, fail_after_s=120.0, parallelism={"entry": 2}) as dep:
        dep.feeder.max_lag = 2  # a few queued calls, then the feeder stops sending to it
        res = dep.run(data, pace=4.0, timeout=120)
        assert resumed.wait(60) and skips(dep, "entry.1#1", "skipped"), dep.feeder.skips
        deadline = time.time() + 60
        while not skips(dep, "entry.1#1", "caught up"):
            assert time.time() < deadline, (dep.feeder.skips, dep.feeder.error)
            time.sleep(0.05)
        st = {lb: ray.get(dep.topology.handle(lb).stats.remote(), timeout=30) for lb in ("entry.1#0", "entry.1#1")}
        assert st["entry.1#1"]["recovered_chunks"] > 0
        assert st["entry.1#1"]["entries"] == st["entry.1#0"]["entries"]  # the same chunks, partly from its peer
        assert not [e for e in dep.events if e.get("event") in ("declared_failed", "dead")]
    same_run(ref, res)
