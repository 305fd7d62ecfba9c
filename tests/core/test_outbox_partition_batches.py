"""An outbox whose links carry partitions' shares flushes at ``max_batch`` tuples per partition,
not per outbox (engines/ray/channels.py ``Outbox._batch_bound``; issue #41): each flush is cut into
one share per partition, so with the outbox's bound alone a p-partition operator took p times the
calls of an unpartitioned one, each with 1/p of the tuples. No Ray: the outbox only queues here."""
import numpy as np

from replistream.engines.ray.channels import Link, Outbox
from replistream.schema import Punctuation

DTYPE = [("ts", "i8"), ("k", "i8")]


class EvenOdd:
    """A router of two partitions: even keys to 0, odd keys to 1; controls go to both."""
    partitions = 2

    def route(self, port, packet):
        parts = [[], []]
        for it in packet:
            if isinstance(it, np.ndarray):
                for q in (0, 1):
                    parts[q].append(it[it["k"] % 2 == q])
            else:
                parts[0].append(it)
                parts[1].append(it)
        return parts


def _batch(lo, n):
    b = np.zeros(n, dtype=DTYPE)
    b["ts"] = np.arange(lo, lo + n)
    b["k"] = np.arange(lo, lo + n)
    return b


def _queued(link):
    return [tuples for _, _, _, tuples in link.queue]


def test_shares_of_a_partitioned_downstream_are_max_batch_each():
    ob = Outbox("f#0", "a", None, 0.0, max_batch=100)
    router = EvenOdd()
    ob.links = [Link(f"g.{q}#{i}", "a", None, 0, i, router=router, partition=q) for q in (0, 1) for i in (0, 1)]
    ob.emit([_batch(0, 100)])
    assert ob.pending_tuples == 100 and all(not link.queue for link in ob.links)  # not yet: 50 a partition
    ob.emit([_batch(100, 100)])
    assert ob.pending_tuples == 0
    assert [_queued(link) for link in ob.links] == [[100]] * 4  # one share of 100 per replica
    ob.emit([_batch(200, 10), Punctuation(209)])  # a punctuation still flushes whatever is pending
    assert [_queued(link) for link in ob.links] == [[100, 5]] * 4


def test_an_unpartitioned_downstream_flushes_at_max_batch():  # (unchanged: the bound is max_batch)
    ob = Outbox("f#0", "a", None, 0.0, max_batch=100)
    ob.links = [Link(f"g#{i}", "a", None, 0, i) for i in (0, 1)]
    ob.emit([_batch(0, 100)])
    assert [_queued(link) for link in ob.links] == [[100]] * 2
