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
