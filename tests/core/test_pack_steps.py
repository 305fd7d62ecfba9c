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


def test_a_rescales_moves_pack_and_a_taking_replica_numbers_them_in_one_pass():
    """``pack_moves``: 2,048 fluid steps of a 1 -> 2 rescale at 2^12 bins come back equal; the
    taking replica's ``Moves.add`` numbers them in order and maps each bin to its step."""
    from replistream.partition import BinMap
    from replistream.replica.rescale import Moves, pack_moves, plan_steps, unpack_moves

    steps, _ = plan_steps("per_key", BinMap.even(1, bits=12), BinMap.even(2, bits=12), 10 ** 9, "fluid", None, 10_000)
    assert len(steps) == 2048 and unpack_moves(pickle.loads(pickle.dumps(pack_moves(steps)))) == steps
    assert buffers(steps) == 0 and buffers(pack_moves(steps)) == 3  # (dataclasses: pickled one by one)
    taking = Moves(unpack_moves(pack_moves(steps)), partition=1)
    assert taking._bin_step.shape == (1, 4096)
    bins = np.array([m.bins[0] for m in steps])
    assert taking._bin_step[0, bins].tolist() == list(range(2048)) and (np.delete(taking._bin_step[0], bins) == -1).all()
    assert taking._step_at.tolist() == [m.at for m in steps] and len(Moves(steps, partition=0).take) == 0


def test_a_bin_taken_twice_gets_a_second_row_as_before():
    """A bin given away and taken back (fewer partitions after more): its second step goes into a
    second row, whether both come in one call or two."""
    from replistream.replica.rescale import Move, Moves

    a, b = Move("r@1/0", "w", 10, (1, 2), 2, 0, 1), Move("r@2/0", "w", 20, (2,), 2, 0, 1)
    for calls in ([[a, b]], [[a], [b]]):
        m = Moves(partition=1)
        for c in calls:
            m.add(c)
        assert m._bin_step.tolist() == [[-1, 0, 0, -1], [-1, -1, 1, -1]], calls
        assert m._step_at.tolist() == [10, 20] and m._num == {"r@1/0": 0, "r@2/0": 1}
