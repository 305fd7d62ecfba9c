"""The data-path actors' garbage-collector settings (engines/ray/gcpause.py, issue #42): freezing
never keeps garbage for good. A pooled actor's earlier life (its state was frozen at its install,
and keyed state holds a reference cycle) must be collectable once the actor is set up again."""
from __future__ import annotations

import gc
import weakref

from replistream.engines.ray import gcpause


class _Cycle:
    def __init__(self):
        self.me = self  # a reference cycle, as KeyedState and its column view make


def test_a_pooled_life_frozen_at_install_is_freed_by_the_next_setup():
    try:
        life = _Cycle()
        ref = weakref.ref(life)
        gcpause.settle()  # an install freezes the state
        del life  # the deployment ends; reinit drops the attributes
        gcpause.thaw()
        gcpause.settle(collect=True)  # the next _setup
        assert ref() is None, "the earlier life's state stayed frozen"
    finally:
        gc.unfreeze()


def test_without_thawing_a_frozen_cycle_would_stay():
    """The negative control: what reinit's thaw prevents."""
    try:
        life = _Cycle()
        ref = weakref.ref(life)
        gcpause.settle()
        del life
        gcpause.settle(collect=True)
        assert ref() is not None
    finally:
        gc.unfreeze()
        gc.collect()


def test_a_setup_after_a_life_that_froze_nothing_more_keeps_the_frozen_generation():
    """A warm spare never fed froze nothing after its set-up: reinit does not thaw it, so the next
    set-up's full collection walks only the objects made since (the pause of taking a spare while
    data flows). A life that installed a state (froze more) is thawed, as before."""
    try:
        dropped = [[] for _ in range(100)]
        gcpause.settle(collect=True)  # a spare's set-up
        at_setup, size = gcpause.freezes(), gc.get_freeze_count()
        before = dict(gcpause.THAWS)
        del dropped  # frozen objects freed by reference counting: the permanent generation shrinks
        assert gc.get_freeze_count() < size
        assert gcpause.thaw(since=at_setup) is False  # still nothing frozen since the set-up
        assert gc.get_freeze_count() > 0
        life = _Cycle()
        ref = weakref.ref(life)
        gcpause.settle()  # a later install froze more: that life must be thawed
        del life
        assert gcpause.thaw(since=at_setup) is True
        gcpause.settle(collect=True)
        assert ref() is None
        assert gcpause.THAWS == {"thawed": before["thawed"] + 1, "kept": before["kept"] + 1}
    finally:
        gc.unfreeze()
