"""Bob Jenkins' lookup3 hash (``hashlittle``): HDF5's checksum of its metadata, a superblock's among them.

>>> hex(lookup3(b"Four score and seven years ago"))
'0x17770551'
"""

from __future__ import annotations

import struct

__all__ = ["lookup3"]

_MASK = 0xFFFFFFFF


def _rotate(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (32 - bits))) & _MASK


def lookup3(data: bytes, initial: int = 0) -> int:
    """The lookup3 hash of ``data``, from ``initial``."""
    state = [(0xDEADBEEF + len(data) + initial) & _MASK] * 3  # a, b, c
    rest = len(data)
    position = 0
    while rest > 12:
        _add(state, struct.unpack_from("<3I", data, position))
        for index, bits in enumerate((4, 6, 8, 16, 19, 4)):  # mix(a, b, c)
            target, source = index % 3, (index + 2) % 3
            state[target] = ((state[target] - state[source]) & _MASK) ^ _rotate(state[source], bits)
            state[source] = (state[source] + state[(target + 1) % 3]) & _MASK
        rest -= 12
        position += 12
    if rest == 0:
        return state[2]
    _add(state, struct.unpack("<3I", data[position:] + bytes(12 - rest)))
    for index, bits in enumerate((14, 11, 25, 16, 4, 14, 24)):  # final(a, b, c)
        target = (2 + index) % 3
        source = (target + 2) % 3
        state[target] = ((state[target] ^ state[source]) - _rotate(state[source], bits)) & _MASK
    return state[2]


def _add(state: list[int], words: tuple[int, ...]) -> None:
    for index, word in enumerate(words):
        state[index] = (state[index] + word) & _MASK
