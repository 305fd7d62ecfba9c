"""An entry replica's input log answers its peers (Hwang §III: entry points hold input for their
peers): ``EntryActor.input_chunks`` returns the chunks it holds, waits for chunks still on their way
to it (woken when one is logged, not by polling), and answers None at once for a chunk it took and
no longer holds, or at its deadline. Run in process on the actor's own methods, without Ray."""
from __future__ import annotations

import threading
import types

from replistream.engines.ray import lockorder
from replistream.engines.ray.actors import EntryActor

Entry = EntryActor.__ray_metadata__.modified_class


def replica(wait_s: float, expected: int = 0):
    """The state ``input_chunks`` and ``_log_input`` use, of one entry replica of source ``s``."""
    r = types.SimpleNamespace(PEER_WAIT_S=wait_s, input_log={"s": {}}, expected={"s": expected})
    r.log_lock = lockorder.lock("EntryActor.log_lock", 2)
    r.log_grew = lockorder.condition(r.log_lock)
    return r


def log(r, seq, keep_from=0):
    Entry._log_input(r, "s", seq, (f"chunk {seq}", None), keep_from)


def test_held_chunks_are_given_in_order():
    r = replica(5.0, expected=3)
    for seq in range(3):
        log(r, seq)
    assert Entry.input_chunks(r, "s", 1, 3) == [("chunk 1", None), ("chunk 2", None)]


def test_a_chunk_on_its_way_is_waited_for_and_given_once_logged():
    r = replica(60.0, expected=2)
    for seq in range(2):
        log(r, seq)
    asked = threading.Event()
    got = []

    def ask():
        asked.set()
        got.append(Entry.input_chunks(r, "s", 0, 3))

    t = threading.Thread(target=ask)
    t.start()
    asked.wait(10)
    r.expected["s"] = 3  # (raised before the chunk is logged, as _take does)
    log(r, 2)
    t.join(30)
    assert not t.is_alive() and got == [[("chunk 0", None), ("chunk 1", None), ("chunk 2", None)]]


def test_a_chunk_taken_and_trimmed_is_never_waited_for():
    r = replica(60.0, expected=5)
    for seq in range(5):
        log(r, seq, keep_from=3)  # chunks 0-2 trimmed: no peer lacks them any more
    assert Entry.input_chunks(r, "s", 1, 5) is None  # (at once: with a 60 s deadline this would hang)


def test_a_chunk_that_never_comes_gives_none_at_the_deadline():
    r = replica(0.2, expected=1)
    log(r, 0)
    assert Entry.input_chunks(r, "s", 0, 2) is None
