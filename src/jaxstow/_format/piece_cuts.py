"""Where large reads are cut into the requests a source serves at once: at the multiples of its piece size.

An object store keeps an object in the parts it was uploaded in, and a ranged GET that crosses a part's end for a
few bytes of the next makes the server open a second part. Measured on SeaweedFS, 64 GETs of 16 MiB from a 1 GiB
object written in parts of 16 MiB: 0.68-0.75 s and 0.86-0.97 server CPU-s at the parts' bounds, 0.82-0.98 s and
1.08-1.27 CPU-s shifted by 4 KiB (a file's header). So every request starts at a multiple of the piece size from the
source's start, and tensors that lie next to each other share requests: one request fills the end of one tensor's
buffer and the start of the next.

>>> from jaxstow._format.piece_cuts import piece_reads
>>> MiB = 1 << 20
>>> for read in piece_reads([(4096, 16 * MiB), (16 * MiB + 4096, 16 * MiB)], 16 * MiB):  # two leaves after a header
...     print(read.offset, read.segments)
4096 ((0, 0, 16773120),)
16777216 ((0, 16773120, 4096), (1, 0, 16777216))
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple

__all__ = ["GAP", "Piece", "piece_reads", "pieces_of"]

#: Spans at most this many bytes apart are read by the same requests, the bytes between them read and dropped:
#: the padding that aligns a tensor, or a small tensor left out of a partial restore.
GAP = 4096


class Piece(NamedTuple):
    """One request: the bytes at ``offset``, into ``segments`` one after another."""

    offset: int
    #: ``(span, start within the span, bytes)``; ``span`` is -1 for bytes between two spans, read and dropped.
    segments: tuple[tuple[int, int, int], ...]


def pieces_of(offset: int, length: int, piece: int) -> list[tuple[int, int]]:
    """Where a read of ``length`` bytes at ``offset`` is cut, as (start within the read, bytes) pairs.

    At the multiples of ``piece`` from the source's start, where an object store's parts and chunks begin, so that no
    request reads a part of the store's for a few bytes of it; a first or last piece under a quarter of ``piece`` is
    joined to the one next to it.

    >>> pieces_of(4096, 40 << 20, 16 << 20)  # a leaf after a file's header: 16 MiB - 4 KiB, 16 MiB, 8 MiB + 4 KiB
    [(0, 16773120), (16773120, 16777216), (33550336, 8392704)]
    >>> pieces_of(4096, 16 << 20, 16 << 20)  # 4 KiB past a part's end: one piece
    [(0, 16777216)]
    """
    cuts = list(range((offset // piece + 1) * piece, offset + length, piece))
    if cuts and cuts[0] - offset < piece // 4:
        del cuts[0]
    if cuts and offset + length - cuts[-1] < piece // 4:
        del cuts[-1]
    bounds = [offset, *cuts, offset + length]
    return [(start - offset, end - start) for start, end in itertools.pairwise(bounds)]


def piece_reads(spans: Sequence[tuple[int, int]], piece: int, *, gap: int = GAP) -> list[Piece]:
    """The requests that read ``spans`` (each ``(start, bytes)`` in the source), cut as :func:`pieces_of` cuts.

    Spans that follow each other at most ``gap`` bytes apart make one stretch, cut as one read; a span that starts
    before the one before it ends, or further than ``gap`` after, starts another. A span of no bytes is in no piece.
    """
    order = sorted((index for index in range(len(spans)) if spans[index][1] > 0), key=lambda index: spans[index][0])
    stretches: list[list[int]] = []
    for index in order:
        start = spans[index][0]
        if stretches:
            last = spans[stretches[-1][-1]]
            if 0 <= start - (last[0] + last[1]) <= gap:
                stretches[-1].append(index)
                continue
        stretches.append([index])
    return [read for stretch in stretches for read in _stretch_reads(spans, stretch, piece)]


def _stretch_reads(spans: Sequence[tuple[int, int]], stretch: list[int], piece: int) -> list[Piece]:
    """The requests of one stretch: the spans of ``stretch``, in order, with their gaps between them."""
    begin = spans[stretch[0]][0]
    end = spans[stretch[-1]][0] + spans[stretch[-1]][1]
    pieces: list[Piece] = []
    next_span = 0  # the first span of the stretch not read to its end yet
    for at, size in pieces_of(begin, end - begin, piece):
        low, high = begin + at, begin + at + size
        segments: list[tuple[int, int, int]] = []
        position = low
        while next_span < len(stretch):
            index = stretch[next_span]
            start, length = spans[index]
            if start >= high:
                break
            first, last = max(start, low), min(start + length, high)
            if first > position:
                segments.append((-1, 0, first - position))
            segments.append((index, first - start, last - first))
            position = last
            if last < start + length:
                break
            next_span += 1
        if segments:  # none where the piece lies within a gap (pieces smaller than a gap)
            pieces.append(Piece(low, tuple(segments)))
    return pieces
