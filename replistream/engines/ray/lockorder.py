"""The lock order of each process of a deployment, checked (issue #40, point 5; docs/design.md,
"Lock order, per process").

Every lock of an actor is made here, with its name and its rank in its process's order (1 is
taken first). Normally these are Python's own locks. With ``REPLISTREAM_LOCK_ORDER=1`` in the
environment of the process (set before Ray starts, every actor's), each is an :class:`OrderedLock`
that records, per thread, the locks it holds: taking a lock of a lower rank than one held, or a
second lock of the same rank (two outboxes' locks at once), is a violation, recorded with the
thread's name. :func:`report` is what an actor's ``lock_order()`` returns; the test suite runs with
it on and checks every kind of actor (tests/ray/test_lock_order.py).

>>> lk = lock("ReplicaActor.lock", 1)
>>> with lk:
...     pass
>>> sorted(report())
['acquired', 'nested', 'on', 'violations']
"""
from __future__ import annotations

import os
import threading

__all__ = ["ENV", "OrderedLock", "lock", "rlock", "condition", "report", "enabled"]

#: The environment variable that turns the recording on (``"1"``), read when a lock is made.
ENV = "REPLISTREAM_LOCK_ORDER"


def enabled() -> bool:
    """True if this process records its lock order (:data:`ENV` is ``"1"``).

    >>> isinstance(enabled(), bool)
    True
    """
    return os.environ.get(ENV) == "1"


class _Recorder:
    """Per process: the locks each thread holds, the violations and the nestings seen."""

    def __init__(self):
        self.local = threading.local()
        self.guard = threading.Lock()
        self.violations: list[dict] = []
        self.nested: set[tuple[str, str]] = set()
        self.acquired = 0

    def held(self) -> list:
        if not hasattr(self.local, "held"):
            self.local.held = []
        return self.local.held

    def check(self, lk: "OrderedLock", held: list) -> None:
        bad = [h for h in held if h is not lk and h.rank >= lk.rank]
        with self.guard:
            self.acquired += 1
            for h in held:
                if h is not lk:
                    self.nested.add((h.name, lk.name))
            for h in bad[:1]:
                if len(self.violations) < 100:
                    self.violations.append({"held": h.name, "taken": lk.name, "thread": threading.current_thread().name,
                                            "why": "same rank" if h.rank == lk.rank else "taken after a later lock"})


_RECORDER = _Recorder()


class OrderedLock:
    """A lock that records the order its process takes locks in (see the module doc). Works as a
    ``threading.Lock`` (``reentrant=False``) or ``RLock``, and under a ``threading.Condition``.

    >>> lk = OrderedLock("EntryActor.lock", 1)
    >>> lk.acquire() and lk.locked(); lk.release()
    True
    """

    def __init__(self, name: str, rank: int, reentrant: bool = False):
        self.name, self.rank, self.reentrant = name, rank, reentrant
        self._inner = threading.RLock() if reentrant else threading.Lock()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        held = _RECORDER.held()
        if blocking:  # recorded before waiting: an order that deadlocks is still on record
            _RECORDER.check(self, held)
        ok = self._inner.acquire(blocking, timeout)
        if ok:
            held.append(self)
        return ok

    def release(self) -> None:
        held = _RECORDER.held()
        for i in range(len(held) - 1, -1, -1):
            if held[i] is self:
                del held[i]
                break
        self._inner.release()

    __enter__ = acquire

    def __exit__(self, *exc) -> None:
        self.release()

    def locked(self) -> bool:
        return self in _RECORDER.held() if self.reentrant else self._inner.locked()

    # what threading.Condition uses when its lock has them (wait releases the lock whole)
    def _is_owned(self) -> bool:
        return self in _RECORDER.held()

    def _release_save(self):
        held = _RECORDER.held()
        n = sum(1 for h in held if h is self)
        held[:] = [h for h in held if h is not self]
        return (self._inner._release_save() if self.reentrant else self._inner.release()), n

    def _acquire_restore(self, saved) -> None:
        state, n = saved
        if self.reentrant:
            self._inner._acquire_restore(state)
        else:
            self._inner.acquire()
        _RECORDER.held().extend([self] * n)


def lock(name: str, rank: int):
    """A ``threading.Lock``, recording its order when :func:`enabled` (rank 1: taken first).

    >>> with lock("SinkActor.lock", 1): pass
    """
    return OrderedLock(name, rank) if enabled() else threading.Lock()


def rlock(name: str, rank: int):
    """A ``threading.RLock``, recording its order when :func:`enabled`.

    >>> with rlock("Outbox.lock", 3): pass
    """
    return OrderedLock(name, rank, reentrant=True) if enabled() else threading.RLock()


def condition(lk) -> threading.Condition:
    """A ``threading.Condition`` over ``lk`` (one of :func:`lock` or :func:`rlock`).

    >>> cv = condition(rlock("Outbox.lock", 3))
    >>> with cv: cv.notify_all()
    """
    return threading.Condition(lk)


def report() -> dict:
    """This process's record: ``on`` (recording), ``acquired`` (blocking acquisitions checked),
    ``nested`` (``[held, taken]`` pairs seen: the check saw nesting), ``violations``.

    >>> report()["violations"]
    []
    """
    with _RECORDER.guard:
        return {"on": enabled(), "acquired": _RECORDER.acquired, "nested": sorted(map(list, _RECORDER.nested)),
                "violations": list(_RECORDER.violations)}
