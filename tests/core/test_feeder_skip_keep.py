"""An entry replica the feeder skips while pushes to it are still queued (it stopped answering)
lacks the chunks from the first unanswered push on, not only those never sent to it: its peers
keep that far back, so its catch-up finds them whether the queued pushes ran first or not
(a clean-clone run saw ``entry#1: chunks 44..52 of 's' are held by no live peer``: skipped at
chunk 53 with pushes 44..52 queued, its peer had trimmed them). No Ray: fake replicas."""
from __future__ import annotations

import itertools

import numpy as np

from replistream.engines.ray.feeder import KEEP_CHUNKS, Feeder

_ids = itertools.count()


class _Method:
    def __init__(self, calls):
        self.calls = calls

    def remote(self, *args):
        self.calls.append(args)
        return f"ref{next(_ids)}"  # (an answer never comes: nothing reaps it here)


class _Replica:
    def __init__(self):
        self.pushes: list = []
        self.push_chunk = _Method(self.pushes)
        self.catch_up = _Method([])


class _Topology:
    def __init__(self, labels):
        self.handles = {lb: _Replica() for lb in labels}

    def running(self, group=None):
        return list(self.handles.items())

    def is_running(self, label):
        return label in self.handles

    def handle(self, label):
        return self.handles[label]


def _chunk(seq):
    return {"ts": np.array([seq], dtype=np.int64), "k": np.array([seq])}


def test_a_replica_skipped_with_pushes_queued_lacks_from_the_first_of_them():
    topo = _Topology(["entry#0", "entry#1"])
    silent: set[str] = set()
    f = Feeder(topo, on_start=print, on_sentinel=print, on_entry_failed=print, suspected=silent.__contains__)
    f.sources, f.seqs, f.t0, f.max_lag = ["s"], {"s": 0}, 0.0, 4
    stopped_at = 30
    for seq in range(stopped_at + 9):  # entry#1 answers up to chunk 29, then its pushes queue
        f.seqs["s"] = seq
        f._send_to("entry", "s", seq, _chunk(seq), None)
        f._forget(f.inflight["entry#0"])  # entry#0 answers each at once
        if seq < stopped_at:
            f._forget(f.inflight["entry#1"])
    assert len(f.inflight["entry#1"]) == 9 and len(f.pushed) == 9
    silent.add("entry#1")  # now suspected: the next chunk skips it
    f.seqs["s"] = seq = stopped_at + 9
    f._send_to("entry", "s", seq, _chunk(seq), None)
    assert f.skipped["entry#1"] == {"s": stopped_at}  # (39 without looking at its queued pushes)
    keep = topo.handles["entry#0"].pushes[-1][3]
    assert keep == stopped_at, keep  # its peer keeps chunks 30.. for it
    assert [p[1] for p in topo.handles["entry#1"].pushes][-1] == seq - 1  # nothing more was sent to it
    # once nobody lacks anything, a peer keeps only the last KEEP_CHUNKS
    f.skipped.clear()
    silent.clear()
    f._forget(f.inflight["entry#1"])
    f._forget(f.inflight["entry#0"])
    assert not f.pushed
    f.seqs["s"] = seq = seq + 1
    f._send_to("entry", "s", seq, _chunk(seq), None)
    assert topo.handles["entry#0"].pushes[-1][3] == seq - KEEP_CHUNKS + 1
