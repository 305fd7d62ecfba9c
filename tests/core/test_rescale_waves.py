"""A paced fluid rescale's waves (issue #41, replistream/engines/ray/rescale.py): each wave's steps
and the rescale's switch redrawn, without Ray. The waves together must move every bin once, each
at its own step's time, and route every tuple as one switch with those times would; the next wave's
gap follows how fast the last one's bins moved."""
from __future__ import annotations

from types import SimpleNamespace as NS

import numpy as np
import pytest

from replistream.engines.ray import rescale as rs
from replistream.partition import BinMap, Switch


def cut_all(old_p, p, bits, sizes, gap=1000):
    """Cut waves of ``sizes`` bins (the last takes the rest) as the control plane does, each at a
    T0 past the previous one's last step; returns the steps and the switch after each wave."""
    before = BinMap.even(old_p, bits)
    kept = {"from": old_p, "to": p, "paced": True, "bins_per_step": None, "strategy": "fluid", "gap_us": None}
    drawn, t0, steps, switches = None, 1_000_000, [], []
    for n in sizes:
        kept.update(wave_bins=n, wave_gap=gap)
        wave, mine, drawn = rs._cut_wave("op", before, drawn, kept, t0, bits)
        assert len(mine) == len(wave["bins"]) and all(len(m.bins) == 1 for m in mine)
        steps += mine
        switches.append(drawn)
        t0 = max(m.at for m in mine) + 250_000
        if not wave["left"]:
            break
    return before, steps, switches


@pytest.mark.parametrize("old_p,p", [(1, 2), (2, 4), (4, 2), (3, 1)])
def test_waves_move_every_bin_once_and_route_as_one_switch(old_p, p):
    bits = 6
    before, steps, switches = cut_all(old_p, p, bits, [5, 7, 3, 100])
    new = BinMap.even(p, bits)
    moved = sorted(b for m in steps for b in m.bins)
    assert moved == sorted(b for b, _, _ in before.moves(new))  # every moving bin, once
    assert len({m.id for m in steps}) == len(steps)
    final = switches[-1]
    assert final.partitions == p and np.array_equal(final.owner, new.owner)
    # one switch with each bin's own step time routes alike
    times = [(b, m.at) for m in steps for b in m.bins]
    one = Switch.between(before, new, times)
    assert np.array_equal(final.at, one.at) and np.array_equal(final.owner, one.owner)
    for m in steps:  # each step's bin passes between the partitions it names, at its time
        b = m.bins[0]
        assert before.owner[b] == m.src and new.owner[b] == m.dst and final.at[b] == m.at
    # an earlier wave's switch leaves the later waves' bins where they were, for ever
    first = switches[0]
    later = [b for m in steps[5:] for b in m.bins]
    assert (first.at[later] == Switch.NEVER).all() and np.array_equal(first.owner[later], before.owner[later])
    if p < old_p and len(switches) > 1:  # until the last wave, a leaving partition may still own bins
        assert first.partitions == old_p


def test_one_wave_when_not_paced_cuts_by_the_strategy():
    before = BinMap.even(1, 6)
    kept = {"from": 1, "to": 2, "paced": False, "bins_per_step": 8, "strategy": "batched", "gap_us": 500}
    wave, steps, sw = rs._cut_wave("op", before, None, kept, 10, 6)
    assert wave["left"] == 0 and len(steps) == 4 and [m.at for m in steps] == [10, 510, 1010, 1510]
    assert sw.partitions == 2


def test_the_next_gap_follows_how_fast_the_last_wave_moved():
    dep = NS(feeder=NS(pace=2.0))
    kept = {}
    # 32 bins due over 31 steps of 1 ms event time (15.5 ms of wall at pace 2), installed 0.05 s
    # after the first was due: kept up; the gap shrinks, never below GAP_US
    rs._pace_next(dep, kept, {"bins": 32, "gap_us": 1000, "due": 10.0, "done": 10.05})
    assert kept["wave_gap"] == rs.GAP_US
    # 32 bins due over 0.32 s installed 1.1 s after the first was due: they took (1.1 - slack) /
    # 0.32 times as long as the feed gave them; the next gap grows by that, times WAVE_HEADROOM
    rs._pace_next(dep, kept, {"bins": 32, "gap_us": 20_000, "due": 10.0, "done": 11.1})
    assert kept["wave_gap"] == round((1.1 - rs.WAVE_SLACK_S) / 0.32 * rs.WAVE_HEADROOM * 20_000)
    assert kept["wave_bins"] == int(rs.WAVE_S * 2.0 * 1e6 // kept["wave_gap"])
    # a wave a little behind (within WAVE_BEHIND) keeps its gap: noise does not ratchet it up
    rs._pace_next(dep, kept, {"bins": 100, "gap_us": 10_000, "due": 0.0, "done": 0.5 + rs.WAVE_SLACK_S + 0.02})
    assert kept["wave_gap"] == 10_000
    rs._pace_next(dep, kept, {"bins": 1, "gap_us": 1000, "due": 0.0, "done": 30.0})
    assert kept["wave_gap"] == 8000 and kept["wave_bins"] == 125
