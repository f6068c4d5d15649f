"""Which process reads each shared box, and how the ranges are packed, gathered in chunks and put back in place:
several processes simulated by threads, each with an exchange of its own, their gathers met in one place. The real
collectives across real processes are tested in tests/checkpoint/test_replicas.py."""

from __future__ import annotations

import threading
from typing import NamedTuple

import numpy as np
import pytest

from jaxstow._format.tensor_reads import aligned_empty
from jaxstow._read.broadcast import Exchange, Pending, readers


class Device(NamedTuple):
    process_index: int
    id: int


class Placement:
    """Boxes (tuples of slices) held by devices: ``{device: index}`` as jax's shardings give it."""

    def __init__(self, indices: dict[Device, tuple[slice, ...]]) -> None:
        self.indices = indices

    def devices_indices_map(self, shape):
        return self.indices


class Collectives:
    """The gathers of simulated processes: each call of a group meets the same call of the group's other members."""

    def __init__(self) -> None:
        self.condition = threading.Condition()
        self.rows: dict[tuple, dict[int, np.ndarray]] = {}
        self.calls: dict[tuple[int, tuple[int, ...]], int] = {}
        self.lengths: list[int] = []

    def gather_for(self, me: int):
        def gather(group: tuple[int, ...], row: np.ndarray) -> np.ndarray:
            with self.condition:
                number = self.calls.get((me, group), 0)
                self.calls[(me, group)] = number + 1
                rows = self.rows.setdefault((group, number), {})
                rows[me] = row.copy()
                self.lengths.append(row.size)
                self.condition.notify_all()
                assert self.condition.wait_for(lambda: len(rows) == len(group), timeout=10), (group, rows.keys())
                assert len({found.size for found in rows.values()}) == 1, "rows of one gather differ in length"
                return np.stack([rows[member] for member in group])

        return gather


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


# ``rows``: two halves of rows, each held by two of the four processes ({0, 2} and {1, 3}); ``wide``: three rows
# replicated on every process, so its ranges are cut along the columns (strided in the box); ``rep``: replicated on
# processes 0, 1 and 2 only, of an odd size; ``small``: replicated, below ``min_bytes``, read by every holder;
# ``exact``: on processes 0, 1 and 3, a range of 64 KiB each, the only one of its group: sent as read.
ROWS = np.arange(64 * 1037, dtype=np.float32).reshape(64, 1037)
WIDE = np.arange(3 * 40_001, dtype=np.int16).reshape(3, 40_001)
REP = np.random.default_rng(1).standard_normal((401, 301)).astype(np.float64)
SMALL = np.arange(6, dtype=np.uint8)
EXACT = np.random.default_rng(2).standard_normal((3, 16384)).astype(np.float32)  # three ranges of 64 KiB
EVERYTHING = (slice(None), slice(None))
LEAVES = {
    "rows": (
        ROWS,
        {Device(p, p): (slice(0, 32) if p % 2 == 0 else slice(32, 64), slice(None)) for p in range(4)},
    ),
    "wide": (WIDE, {Device(p, p): EVERYTHING for p in range(4)}),
    "rep": (REP, {Device(p, p): EVERYTHING for p in range(3)}),
    "small": (SMALL, {Device(p, p): (slice(None),) for p in range(4)}),
    "exact": (EXACT, {Device(p, p): EVERYTHING for p in (0, 1, 3)}),
}


def _run(processes: int, leaves, *, chunk_bytes: int):
    """Every simulated process shares every leaf (reading its ranges), then delivers; what each got, read and
    passed through barriers."""
    collectives = Collectives()
    got, reads, barriers, digests, errors = {}, {}, {}, {}, []

    def process(me: int) -> None:
        try:
            exchange = Exchange(chunk_bytes=chunk_bytes, min_bytes=64, me=me, gather=collectives.gather_for(me))
            reads[me], barriers[me] = [], []
            tree = {}
            for name, (value, indices) in leaves.items():

                def read(box, value=value, name=name):
                    reads[me].append((name, box))
                    part = value[tuple(slice(*axis) for axis in box)]
                    aligned = aligned_empty(part.nbytes).view(part.dtype).reshape(part.shape)  # as reads are
                    aligned[...] = part
                    return aligned

                boxes = exchange.share(f"1/f:{name}", Placement(indices), value.shape, value.dtype, read)
                tree[name] = Pending(name, lambda boxes=boxes: boxes, shape=value.shape, sharding=Placement(indices))
            digests[me] = exchange.digest()
            got[me] = exchange.deliver(tree, barriers[me].append)
        except BaseException as error:
            errors.append(error)
            raise

    threads = [threading.Thread(target=process, args=(me,)) for me in range(processes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    return got, reads, barriers, digests, collectives


@pytest.mark.parametrize("chunk_bytes", [1 << 30, 3 * (64 << 10)])
def test_every_holder_gets_each_shared_box_exact_and_each_range_is_read_once(chunk_bytes):
    got, reads, barriers, digests, collectives = _run(4, LEAVES, chunk_bytes=chunk_bytes)
    for me in range(4):
        for name, (value, indices) in LEAVES.items():
            held = [device for device in indices if device.process_index == me]  # one box per device here
            if name == "small":  # below min_bytes: not shared, so nothing to gather
                assert got[me][name] == {}
                continue
            assert len(got[me][name]) == len(held)
            for box, array in got[me][name].items():
                np.testing.assert_array_equal(array, value[tuple(slice(*axis) for axis in box)])
    read = [(name, box) for me in range(4) for name, box in reads[me]]
    assert len(read) == len(set(read)), "a range read twice"
    for name, (value, _) in LEAVES.items():
        if name != "small":
            assert sum(np.prod([b - a for a, b in box]) for found, box in read if found == name) == value.size
    assert len(set(digests.values())) == 1
    assert len({len(found) for found in barriers.values()}) == 1  # every process passes every barrier
    # The groups in waves that share no process: (0, 1, 2), then (0, 1, 2, 3), then (0, 1, 3), then (0, 2) and
    # (1, 3) at once; every wave after the first, and every chunk of a group after its first, behind a barrier.
    if chunk_bytes < 1 << 30:  # rows of 50 to 330 KiB per process, gathered 64 KiB at a time
        assert len(barriers[0]) > 3 and max(collectives.lengths) <= 64 << 10
    else:
        assert barriers[0] == ["chunk0.1", "chunk0.2", "chunk0.3"]


def test_processes_that_restore_other_leaves_expect_other_ranges():
    exchanges = [Exchange(me=me, min_bytes=0, gather=None) for me in range(2)]  # type: ignore[arg-type]
    placement = Placement({Device(p, p): EVERYTHING for p in range(2)})
    for me, exchange in enumerate(exchanges):
        shape = (8, 4) if me == 0 else (8, 5)
        exchange.share("1/f:w", placement, shape, np.dtype(np.float32), lambda box: np.zeros([b - a for a, b in box]))
    assert exchanges[0].digest() != exchanges[1].digest()
