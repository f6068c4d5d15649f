"""The requests a large read is cut into: every byte of every span read once, each request after a stretch's first
starting at a multiple of the piece size, and tensors read that way whatever lies between them."""

from __future__ import annotations

import numpy as np
import pytest

import jaxstow
from jaxstow._format import tensor_reads
from jaxstow._format.piece_cuts import GAP, piece_reads
from jaxstow._format.source import Parallel
from jaxstow._format.tensor_reads import read_tensors
from jaxstow._storage.opening import open_source


@pytest.mark.parametrize("seed", range(40))
def test_every_byte_of_every_span_is_read_once_and_requests_start_at_the_multiples(seed):
    rng = np.random.default_rng(seed)
    piece = int(rng.choice([64, 100, 4096]))
    spans, at = [], int(rng.integers(0, 3 * piece))
    for _ in range(int(rng.integers(1, 30))):
        at += int(rng.choice([0, 0, 0, 3, GAP, GAP + 1, -5]))  # next to each other, a little apart, far, overlapping
        size = int(rng.choice([0, 1, 7, piece // 3, piece, 5 * piece + 11]))
        spans.append((max(at, 0), size))
        at = max(at, 0) + size
    order = rng.permutation(len(spans))
    shuffled = [spans[i] for i in order]
    reads = piece_reads(shuffled, piece)
    filled = [np.zeros(size, np.int64) for _, size in shuffled]
    stretch_starts = set()
    for read in reads:
        assert read.segments, reads  # no request for nothing
        position = read.offset
        for index, start, size in read.segments:
            assert size > 0, read
            if index >= 0:
                assert shuffled[index][0] + start == position, read  # each segment where its bytes lie
                filled[index][start : start + size] += 1
            position += size
        if read.offset % piece:
            stretch_starts.add(read.offset)
        assert position - read.offset < 2 * piece, read  # a piece, and at most a quarter of one joined to it
    assert all((counts == 1).all() for counts in filled), (shuffled, reads)
    assert stretch_starts <= {start for start, size in shuffled if size}  # only where a stretch starts


def test_one_request_reads_the_end_of_a_span_and_the_start_of_the_next():
    reads = piece_reads([(4096, 10 << 20), ((10 << 20) + 4096, 10 << 20)], 8 << 20)
    assert [(read.offset, read.segments) for read in reads] == [
        (4096, ((0, 0, (8 << 20) - 4096),)),
        (8 << 20, ((0, (8 << 20) - 4096, (2 << 20) + 4096), (1, 0, (6 << 20) - 4096))),
        (16 << 20, ((1, (6 << 20) - 4096, (4 << 20) + 4096),)),
    ]


def test_tensors_apart_empty_and_together_are_read_with_their_digests(tmp_path, monkeypatch):
    """Pieces of 4 KiB over tensors of no bytes between large ones, padding between tensors, tensors far apart
    (those of a partial read), coalesced runs; every tensor and its digest as a read of its own gives them."""
    monkeypatch.setattr(tensor_reads, "_RUN", 3000)
    rng = np.random.default_rng(3)
    sizes = [0, 20_000, 0, 9000, 5, 3, 64, 0, 30_000, 1, 0]
    arrays = [rng.standard_normal(size).astype(np.float32) for size in sizes]
    gaps = [0, 8, 0, 0, 60, 0, 4, 0, 10_000, 12, 0]  # bytes before each: padding, or a tensor left out
    blob, offsets = bytearray(), []
    for gap, array in zip(gaps, arrays, strict=True):
        blob += bytes(rng.integers(0, 255, gap, np.uint8))
        offsets.append(len(blob))
        blob += array.tobytes()
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(blob))
    order = list(rng.permutation(len(arrays)))
    digests: list[str] = []
    source = open_source(path)
    source.parallel = Parallel(readers=3, piece=4096, threshold=0)
    try:
        got = read_tensors(
            source,
            [offsets[i] for i in order],
            [arrays[i].nbytes for i in order],
            [np.dtype(np.float32)] * len(order),
            [arrays[i].shape for i in order],
            digests,
        )
    finally:
        source.close()
    for k, i in enumerate(order):
        np.testing.assert_array_equal(got[k], arrays[i])
        assert digests[k] == jaxstow._format.checksum.checksum(arrays[i])


def test_a_file_on_an_fsspec_store_is_read_with_one_request_a_piece(tmp_path):
    """Leaves apart (a partial restore leaves the small ones out) and next to each other, on a store reached through
    fsspec: each piece one ranged request, the pieces side by side, every leaf as saved."""
    from fsspec.implementations.memory import MemoryFileSystem

    rng = np.random.default_rng(0)
    tree = {
        f"l{i}": {"big": rng.standard_normal(3 << 17, dtype=np.float32), "small": np.ones(256, np.float32)}
        for i in range(8)
    }
    url = f"memory://{tmp_path.name}/model.jxs"
    jaxstow.save(url, tree)
    asked: list[tuple[int, int]] = []
    original = MemoryFileSystem.cat_file

    def cat_file(self, path, start=None, end=None, **options):
        asked.append((start, end))
        return original(self, path, start=start, end=end, **options)

    MemoryFileSystem.cat_file = cat_file
    try:
        for select in ("*/big", None):
            asked.clear()
            got = jaxstow.load(url, as_numpy=True, transfer=jaxstow.Transfer(part_size=5 << 20), select=select)
            assert all(np.array_equal(got[k][name], tree[k][name]) for k in got for name in got[k])
            data = sorted(asked)[1:]  # after the header's request
            assert len(data) == 3, asked  # 12 MiB and 8 KiB from the header's end: pieces to 5 and 10 MiB, and on
            assert all(start % (5 << 20) == 0 for start, _ in data[1:]), asked
    finally:
        MemoryFileSystem.cat_file = original
