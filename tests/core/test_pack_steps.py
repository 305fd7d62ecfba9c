"""A transfer's steps go to the sending peer packed (``pack_steps``): a fluid transfer at 2^12 bins
has 4,096 steps, and as a list of small arrays each array was a buffer of its own that the peer
deserialized on its data thread (about 11 ms quiet, the 20-80 ms gap with no output at a fluid
move's start on the loaded machine; docs/migration.md). Packed, the message has three buffers
whatever the number of steps, and unpacks to the same steps."""
from __future__ import annotations

import pickle

import numpy as np

from replistream.replica.transfer import pack_steps, plan_transfer, unpack_steps


def buffers(obj) -> int:
    """Out-of-band buffers pickle protocol 5 makes of ``obj`` (Ray's serializer makes the same)."""
    found = []
    pickle.dumps(obj, protocol=5, buffer_callback=found.append)
    return len(found)


def test_a_fluid_plan_packs_into_three_buffers_and_unpacks_to_the_same_steps():
    steps = list(enumerate(plan_transfer("fluid", bits=12)))
    packed = pack_steps(steps)
    assert buffers(steps) == 4096 and buffers(packed) == 3
    back = unpack_steps(pickle.loads(pickle.dumps(packed, protocol=5)))
    assert [i for i, _ in back] == list(range(4096))
    assert all(b.dtype == np.int64 and b.tolist() == [i] for i, b in back)


def test_uneven_steps_a_subset_and_none_round_trip():
    steps = [(0, np.array([3, 4, 5])), (2, [9]), (7, np.arange(10, 20))]
    back = unpack_steps(pack_steps(steps))
    assert [(i, b.tolist()) for i, b in back] == [(i, list(np.asarray(b))) for i, b in steps]
    assert unpack_steps(pack_steps([])) == []
    assert [(i, b.tolist()) for i, b in unpack_steps([(5, [1, 2])])] == [(5, [1, 2])]
