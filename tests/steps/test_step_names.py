"""Step numbers in names and back: only the exact name the format makes of a number is that step."""

from __future__ import annotations

import pytest

from jaxstow._steps.names import StepNames
from jaxstow._storage.atomic import TEMPORARY_MARKER


@pytest.mark.parametrize("format", ["%d", "%010d.npz", "step_%08d", "%5d"])
def test_every_name_reads_back_as_its_step(format):
    names = StepNames(format)
    for step in (0, 1, 7, 42, 12345, 10**9):
        assert names.step(names.name(step)) == step


def test_only_the_exact_name_of_a_number_is_a_step():
    names = StepNames("%d")
    assert names.steps(["3", "10", "007", "+5", "-1", "5.0", "x5", " 5", "1e3", "", "checkpoint.json"]) == [3, 10]
    padded = StepNames("%010d.npz")
    assert padded.step("0000000042.npz") == 42
    assert padded.step("42.npz") is padded.step("00000000042.npz") is padded.step("0000000042.npy") is None
    spaced = StepNames("%5d")
    assert spaced.step("   42") == 42 and spaced.step("42") is None


def test_unfinished_writes_are_never_steps():
    names = StepNames("%d")
    assert names.step(f"7{TEMPORARY_MARKER}123-abcdef01-01234567") is None
    files = StepNames(f"%d{TEMPORARY_MARKER}")
    assert files.step(files.name(7)) is None  # a format that makes temporary names names no step at all


def test_steps_come_in_increasing_order():
    assert StepNames("%d").steps(["20", "3", "100", "0"]) == [0, 3, 20, 100]


@pytest.mark.parametrize("format", ["step", "%s", "%d-%d", "%f", "100%", "%x"])
def test_a_format_needs_exactly_one_integer_field(format):
    with pytest.raises(ValueError, match="exactly one integer field such as %d or %010d"):
        StepNames(format)
