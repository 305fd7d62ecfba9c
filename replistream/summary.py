"""What ``wait()`` returns (issue #44): :class:`WaitSummary`, a run's state in one object.

``Deployment.wait()`` and a detached deployment's ``DeploymentClient.wait()`` return one: truthy
when the run completed (so ``assert dep.wait(60)`` and ``if not dep.wait(...)`` read as before),
with the tuples each application received, the dead letters and the faults masked (replicas that
died while the run went on).

>>> s = WaitSummary(True, {"alerts": 12, "per_server": 40}, dead_letters=1, faults_masked=2)
>>> bool(s), s.outputs["alerts"]
(True, 12)
>>> s
WaitSummary(complete; alerts: 12 tuples, per_server: 40 tuples; 1 dead letter; 2 faults masked)
"""
from __future__ import annotations

from typing import Any

__all__ = ["WaitSummary"]


class WaitSummary:
    """A run's state when ``wait()`` returned: ``complete`` (every application received the end
    of every stream), ``outputs`` (tuples per application so far), ``dead_letters`` (tuples set
    aside) and ``faults_masked`` (actors that died while the run went on). Truthy when complete.

    A deployment's summary counts its dead letters when ``dead_letters`` is first read (it asks
    the replicas, as ``collect()`` does), or before it is sent to another process.

    >>> bool(WaitSummary(False, {"out": 0}, dead_letters=0, faults_masked=0))
    False
    """

    def __init__(self, complete: bool, outputs: dict[str, int], dead_letters: int | None = None,
                 faults_masked: int = 0, source: Any = None):
        self.complete = bool(complete)
        self.outputs = dict(outputs)
        self.faults_masked = int(faults_masked)
        self._dead = dead_letters
        self._source = source

    @classmethod
    def of(cls, dep: Any, complete: bool) -> "WaitSummary":
        """The summary of deployment ``dep`` (what its ``wait()`` returns).

        >>> WaitSummary.of(dep, True)   # doctest: +SKIP
        WaitSummary(complete; out: 120 tuples; 0 dead letters; 1 fault masked)
        """
        outputs = {app: int(dep.delivered.count(app)) for app in dep.query.sinks}
        faults = sum(1 for e in list(dep.events) if e.get("event") == "dead")
        return cls(complete, outputs, None, faults, source=dep)

    @property
    def dead_letters(self) -> int:
        """Tuples set aside so far (every replica's, merged)."""
        if self._dead is None:
            self._dead = int(self._source.collect().dead_letter_count()) if self._source is not None else 0
        return self._dead

    def detached(self) -> "WaitSummary":
        """This summary with its dead letters counted now and no tie to the deployment, ready to be
        sent to another process (a detached deployment's host returns this: the counting, which
        asks every replica, runs in its call, not while Ray serializes the answer).

        >>> s = WaitSummary(True, {"out": 3}, dead_letters=0).detached()
        >>> s.dead_letters, s._source
        (0, None)
        """
        return WaitSummary(self.complete, self.outputs, self.dead_letters, self.faults_masked)

    def __bool__(self) -> bool:
        return self.complete

    def __eq__(self, other) -> bool:
        """Equal to ``True``/``False`` as its ``complete`` is (``dep.wait(60) is True`` was the old API; ``==`` still works)."""
        if isinstance(other, bool):
            return self.complete == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __getstate__(self) -> dict:
        return {"complete": self.complete, "outputs": self.outputs, "faults_masked": self.faults_masked,
                "_dead": self.dead_letters, "_source": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        apps = ", ".join(f"{a}: {n:,} tuple{'' if n == 1 else 's'}" for a, n in self.outputs.items())
        d, f = self.dead_letters, self.faults_masked
        return (f"WaitSummary({'complete' if self.complete else 'incomplete'}; {apps or 'no application'}; "
                f"{d:,} dead letter{'' if d == 1 else 's'}; {f} fault{'' if f == 1 else 's'} masked)")
