"""Bytes changed in place go through ``_storage.in_place.rewrite_range``: a range checked, changed, written, synced."""

from __future__ import annotations

from pathlib import Path

import pytest

from jaxstow._storage.in_place import rewrite_range
from jaxstow.errors import ArgumentError, FormatError, TruncatedFileError


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(range(32)))
    return path


def test_the_range_is_replaced_and_the_change_sees_the_old_bytes_and_the_size(data: Path) -> None:
    seen = []

    def change(old: bytes, size: int) -> bytes:
        seen.append((old, size))
        return b"\xff" * len(old)

    rewrite_range(str(data), 8, 4, change)
    assert seen == [(bytes(range(8, 12)), 32)]
    assert data.read_bytes() == bytes(range(8)) + b"\xff" * 4 + bytes(range(12, 32))


def _refuse(old: bytes, size: int) -> bytes:
    raise FormatError("has a range that does not check out", file="data.bin")


@pytest.mark.parametrize(
    ("offset", "length", "change", "error", "message"),
    [
        (30, 4, lambda old, size: old, TruncatedFileError, r"ends before the 4 bytes at offset 30 \(only 2 there\)"),
        (0, 4, lambda old, size: old + b"!", ArgumentError, r"5 bytes to write in place of 4 at offset 0"),
        (0, 4, _refuse, FormatError, r"does not check out"),
    ],
)
def test_nothing_is_written_when_the_range_or_the_change_is_wrong(data, offset, length, change, error, message) -> None:
    with pytest.raises(error, match=message):
        rewrite_range(str(data), offset, length, change)
    assert data.read_bytes() == bytes(range(32))
