"""Which process reads each shared box, what it sends, and the box read here when it does not come."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from jaxstow._read.broadcast import MIN_BYTES, exchange, readers
from jaxstow.errors import CheckpointError

ROWS = MIN_BYTES // 4 // 8  # boxes of 8 columns of float32: each exactly MIN_BYTES


class Device(NamedTuple):
    process_index: int
    id: int


class Placement:
    """Two boxes of rows, each on a device of every process (replicated over the processes)."""

    def __init__(self, processes: int) -> None:
        self.map = {
            Device(p, 2 * p + half): (slice(half * ROWS, (half + 1) * ROWS), slice(0, 8))
            for p in range(processes)
            for half in (0, 1)
        }

    def devices_indices_map(self, shape):
        return self.map


class Transport:
    """A transport whose messages from other processes never come; what it sends is kept."""

    def __init__(self, me: int) -> None:
        self.index, self.sent = me, []

    def send(self, to, tag, data):
        self.sent.append((to, tag, bytes(data)))

    def expect(self, source, tag, *, limit):
        return Never(source, tag)


class Never(NamedTuple):
    source: int
    tag: str

    def wait(self):
        raise CheckpointError(f"process {self.source} did not send {self.tag}")


def _readers(holders, **options):
    return {box: [(part, reader) for part, _, reader in parts] for box, parts in readers(holders, **options).items()}


def test_shared_boxes_are_read_in_ranges_by_turns_and_small_or_unshared_ones_as_before():
    holders = {((0, 4), (0, 2)): [0, 1], ((8, 9), (0, 2)): [1]}
    assert _readers(holders, min_bytes=0, itemsize=4) == {
        ((0, 4), (0, 2)): [(((0, 2), (0, 2)), 0), (((2, 4), (0, 2)), 1)]
    }
    assert _readers(holders, min_bytes=0, itemsize=4, turn=1) == {
        ((0, 4), (0, 2)): [(((0, 2), (0, 2)), 1), (((2, 4), (0, 2)), 0)]
    }
    assert _readers(holders, min_bytes=33, itemsize=4) == {}


def test_a_reader_sends_its_boxes_and_reads_here_the_ones_that_do_not_come():
    whole = np.arange(2 * ROWS * 8, dtype=np.float32).reshape(2 * ROWS, 8)
    read = []

    def reading(box):
        read.append(box)
        return whole[tuple(slice(*axis) for axis in box)]

    for me in (0, 1):
        transport = Transport(me)
        got = exchange(transport, "w", Placement(2), whole.shape, np.dtype(np.float32), reading)
        assert sorted(got) == [((0, ROWS), (0, 8)), ((ROWS, 2 * ROWS), (0, 8))]
        for box, array in got.items():
            np.testing.assert_array_equal(array, whole[tuple(slice(*axis) for axis in box)])
        assert [to for to, _, _ in transport.sent] == [1 - me] * 2  # a range of each box read here and sent
    assert len(read) == 8  # each process: its range of each box, and the range whose message never came
