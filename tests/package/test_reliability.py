"""A small slice of every probe of the reliability suite (``make reliability`` runs them at full size)."""

from __future__ import annotations

import random

import pytest

from reliability import probes
from reliability.folder_cases import CASES


@pytest.mark.parametrize(
    ("probe", "trials"),
    [
        (probes.flips_native, 150),
        (probes.flips_npz, 150),
        (probes.flips_checkpoint, 150),
        (probes.fuzzed_headers, 400),
        (probes.hostile_folders, len(CASES) + 10),  # every case once, and some twice
        (probes.odd_trees, 200),
        (probes.killed_saves, 3),
        (probes.killed_checkpoint_saves, 3),
        (probes.disk_full, 3),
        (probes.read_only_folders, 3),
        (probes.two_writers, 10),
    ],
    ids=lambda value: getattr(value, "__name__", ""),
)
def test_no_fault_is_lost(probe, trials):
    result = probe(trials, random.Random(2))
    if result.skipped:
        pytest.skip(result.skipped)
    assert result.trials >= trials
    assert result.lost == 0, result.notes
    assert result.detected + result.harmless == result.trials
