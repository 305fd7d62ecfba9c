"""Operator logic: plain objects driven by every engine (docs/design.md, decision 2)."""
from .base import Item, NO_PUNCTUATION, OperatorLogic
from .stateless import FilterLogic, FlatMapLogic, MapLogic, UnionLogic

__all__ = ["Item", "NO_PUNCTUATION", "OperatorLogic", "FilterLogic", "FlatMapLogic", "MapLogic", "UnionLogic"]
