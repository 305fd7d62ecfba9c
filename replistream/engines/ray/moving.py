"""A replica's side of a rescale (issue #41; Megaphone §3.3): the steps it gives or takes bins in,
the state it sends, the state it installs, and for a partition that a rescale to fewer partitions
retires, its close (:meth:`MovingBins.close_partition`). The protocol and why it is exact:
:mod:`replistream.replica.rescale`; the control plane's side: :mod:`.rescale`.

>>> ray.get(replica.add_moves.remote(steps, {1: [("agg.1#0", handle)]}))   # doctest: +SKIP
True
"""
from __future__ import annotations

import ray

from ...replica.rescale import Moves, unpack_moves
from ...schema import END, Punctuation

__all__ = ["MovingBins"]


class MovingBins:
    """Mixed into :class:`~.actors.ReplicaActor`: the methods of a rescale's steps (under the
    actor's ``lock``, like its data path)."""

    def add_moves(self, steps, targets: dict) -> bool:
        """Take part in rescale steps ``steps`` (:class:`~replistream.replica.rescale.Move`, or
        :func:`~replistream.replica.rescale.pack_moves` of them: the form to send): give the bins
        of those whose ``src`` is this replica's partition, take those whose ``dst`` is.
        ``targets``: ``{partition: [(label, handle), ...]}``, where a given step's state goes (every
        replica of the taking partition: each installs the first copy it gets)."""
        steps = unpack_moves(steps)  # (before the lock)
        with self.lock:
            if self.core is None:
                raise RuntimeError(f"{self.label} is waiting for its own state; it cannot take part in a rescale")
            if self.core.moves is None:
                self.core.moves = Moves(partition=self.partition)
            self.core.moves.add(steps)
            self._move_targets = {**getattr(self, "_move_targets", {}), **{int(p): list(t) for p, t in targets.items()}}
            self._move_refs = getattr(self, "_move_refs", [])
            self._ship_moves()
        return True

    def move_in(self, steps: list) -> int:
        """Install the state of each ``(step ids, state)`` of ``steps`` (steps given at once by a
        replica of the giving partition; a second copy is ignored) and process what waited for
        them. Returns the tuples emitted."""
        with self.lock:
            if self.core is None or self.core.moves is None:
                raise RuntimeError(f"{self.label} takes part in no rescale (steps {[i for i, _ in steps][:3]})")
            out = self.core.moves.install_many(self.core, steps)
            self._emit(self.out, out)
            self._ship_moves()
        self.out.wait_for_room()
        return sum(len(it) for it in out if hasattr(it, "dtype"))

    def close_partition(self, after: int) -> bool:
        """This replica's partition is retired (a rescale to fewer partitions, :mod:`.rescale`):
        once its logic's watermark has reached ``after`` (the last step's time: every bin given,
        every output of its windows emitted, nothing later routed here), it sends ``END`` on its
        output (every downstream duplicate filter then stops waiting for its partition: the
        punctuation of a partition's channels is the largest, :meth:`~replistream.operators.dupfilter.DuplicateFilter.on_punctuation`)
        and ignores any further input (tuples at or before ``after``, late everywhere). Returns
        True once closed, False while its watermark is below ``after`` (ask again).

        >>> ray.get(replica.close_partition.remote(41_000_000), timeout=30)   # doctest: +SKIP
        True
        """
        with self.lock:
            if self.closed_partition:
                return True
            if self.core is None:
                return False
            m = self.core.moves
            if self.core.logic.watermark < int(after) or (m is not None and (m.give or m.take)):
                return False
            self.closed_partition = True
            self._emit(self.out, [Punctuation(END)])
        self.out.flush()
        return True

    def moves_status(self) -> dict:
        """``{"given": n, "installed": n, "give": [ids left], "take": [ids left], "waiting": n,
        "blocked_at": t or None, "send_errors": [...]}``: the steps done here and those left. The
        sends checked in one ``ray.wait``, outside the lock (the data path never waits on this)."""
        refs = list(getattr(self, "_move_refs", []))
        errors = []
        if refs:
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            for ref in done:
                try:
                    ray.get(ref, timeout=0)  # (ready: returned by the wait above)
                except Exception as e:  # the taking replica died: its peers took the copy too
                    errors.append(f"{type(e).__name__}: {e}"[:200])
            gone = set(done)
            with self.lock:
                self._move_refs = [r for r in self._move_refs if r not in gone]
        with self.lock:
            m = None if self.core is None else self.core.moves
            if m is None:
                return {"given": 0, "installed": 0, "give": [], "take": [], "waiting": 0, "blocked_at": None,
                        "send_errors": errors}
            return {"given": len(m.given), "installed": len(m.installed), "give": [s.id for s in m.give],
                    "take": sorted(m.take), "waiting": m.waiting, "blocked_at": m.blocked_at, "send_errors": errors}

    def _ship_moves(self) -> None:
        """Send the state of every step given since the last call to every replica of its taking
        partition (under ``lock``; not awaited: :meth:`moves_status` reports a send that failed)."""
        moves = self.core.moves if self.core is not None else None
        if moves is None or not moves.shipped:
            return
        per_dst: dict[int, list] = {}  # one call per taking replica for every step given since
        for group, state in moves.shipped:
            per_dst.setdefault(int(group[0].dst), []).append((tuple(m.id for m in group), state))
        for dst, batch in per_dst.items():
            for label, h in self._move_targets.get(dst, []):
                try:
                    self._move_refs.append(h.move_in.remote(batch))
                except Exception as e:  # a handle of a dead actor: its peers get the copy
                    self.dropped.append({"from": self.label, "to": label, "reason": f"moves to {dst}: {e!r}"[:200]})
        moves.shipped.clear()
