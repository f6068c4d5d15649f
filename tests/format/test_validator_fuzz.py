"""The header's one validator against the rules of the spec, entry by entry, over thousands of mutated headers.

:func:`~jaxstow._format.header.slot_table` (vectorised) decides whether a header's tensor table is valid;
:func:`~jaxstow._format.tensor_table.entry_slots` applies the rules of ``docs/format.md`` one entry at a time and is
what names the problem when the table is refused. Both must refuse exactly the same headers, and give the same
tensors for the others. Headers are mutated at random (seeded): offsets, shapes, dtypes, names, overlaps, holes, huge,
negative and non-integer numbers, entries of the wrong type, data after the last tensor, shapes at the bounds.

``JAXSTOW_FUZZ_HEADERS=200000`` runs more headers than the default.
"""

from __future__ import annotations

import copy
import io
import json
import os
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import jaxstow
from jaxstow._format.dtypes import MAX_ARRAY_BYTES, MAX_AXES, READ_CODES
from jaxstow._format.header import check_header, slot_table
from jaxstow._format.tensor_table import entry_slots
from jaxstow.errors import FormatError, JaxstowError
from reliability.forge import forge_native

HEADERS = int(os.environ.get("JAXSTOW_FUZZ_HEADERS", "10000"))
DATA_START = 4096
CODES = sorted(READ_CODES)
ITEMSIZE = {code: dtype.itemsize for code, dtype in READ_CODES.items()}
#: Numbers a field may be changed to: at and around every bound (int64, MAX_ARRAY_BYTES, zero), and not integers.
ODD_NUMBERS: list[Any] = [
    0, 1, -1, 2, 3, 7, 2**31, 2**32, 2**53 + 1, 2**61, 2**61 - 1, 2**62, 2**63 - 1, 2**63, 2**64, -(2**63), -(2**63) - 1,
    10**30, 1.0, 0.5, -0.0, float("inf"), True, False, None, "3", [3], {"n": 3},
]  # fmt: skip

Header = dict[str, Any]


def _odd(rng: random.Random, *more: Any) -> Any:
    """One of the odd numbers (or of ``more``), a copy of its own: a list in a header may be changed later."""
    return copy.deepcopy(rng.choice([*ODD_NUMBERS, *more]))


def valid_header(rng: random.Random) -> tuple[Header, int]:
    """A valid tensor table (its entries in random order, tiled in another) and the file size it fits."""
    count = rng.randint(0, 7)
    entries = []
    for i in range(count):
        code = rng.choice(CODES)
        shape = [rng.choice([0, 1, 1, 2, 3, 5]) for _ in range(rng.choice([0, 1, 1, 2, 2, 3, 4]))]
        entries.append(
            (f"t{i}" if rng.random() < 0.8 else rng.choice(["", "a/b", "é", "w@0:2", "__x__"]) + str(i), code, shape)
        )
    layout = entries[:]
    rng.shuffle(layout)
    offsets, at = {}, 0
    for name, code, shape in layout:
        nbytes = int(np.prod(shape, dtype=np.int64)) * ITEMSIZE[code]
        offsets[name] = [at, at + nbytes]
        at += nbytes
    header = {name: {"dtype": code, "shape": shape, "data_offsets": offsets[name]} for name, code, shape in entries}
    return header, DATA_START + at


def _entry(header: Header, rng: random.Random) -> Any:
    return header[rng.choice(list(header))] if header else None


def _set_field(header: Header, rng: random.Random) -> None:
    entry = _entry(header, rng)
    if isinstance(entry, dict):
        entry[rng.choice(["dtype", "shape", "data_offsets"])] = _odd(rng, "F32", "X64", [], [0, 0])


def _offset(header: Header, rng: random.Random) -> None:
    entry = _entry(header, rng)
    offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
    if isinstance(offsets, list) and offsets:
        i = rng.randrange(len(offsets))
        if rng.random() < 0.5 and isinstance(offsets[i], int):
            offsets[i] += rng.choice([-8, -2, -1, 1, 2, 4, 8])
        else:
            offsets[i] = _odd(rng)


def _offsets_length(header: Header, rng: random.Random) -> None:
    entry = _entry(header, rng)
    if isinstance(entry, dict) and isinstance(entry.get("data_offsets"), list):
        offsets = entry["data_offsets"]
        entry["data_offsets"] = rng.choice([offsets[:1], [*offsets, offsets[-1] if offsets else 0], [], offsets[::-1]])


def _swap_offsets(header: Header, rng: random.Random) -> None:
    if len(header) >= 2:
        a, b = rng.sample(list(header), 2)
        if isinstance(header[a], dict) and isinstance(header[b], dict):
            header[a]["data_offsets"], header[b]["data_offsets"] = (
                header[b].get("data_offsets"),
                header[a].get("data_offsets"),
            )


def _shift_all(header: Header, rng: random.Random) -> None:
    """Every tensor moved by the same number of bytes: a hole at the start, or offsets below zero."""
    by = rng.choice([-4, -1, 1, 2, 8])
    for entry in header.values():
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if isinstance(offsets, list) and all(type(value) is int for value in offsets):
            entry["data_offsets"] = [value + by for value in offsets]


def _shape(header: Header, rng: random.Random) -> None:
    entry = _entry(header, rng)
    shape = entry.get("shape") if isinstance(entry, dict) else None
    if not isinstance(shape, list):
        return
    choice = rng.random()
    if choice < 0.3 and shape:
        i = rng.randrange(len(shape))
        shape[i] = shape[i] + rng.choice([-1, 1]) if isinstance(shape[i], int) and rng.random() < 0.5 else _odd(rng)
    elif choice < 0.45:
        shape.append(rng.choice([0, 1, 1, 2]))
    elif choice < 0.55 and shape:
        shape.pop()
    elif choice < 0.7:  # many axes, around MAX_AXES and numpy 2's 64
        entry["shape"] = [1] * rng.choice([MAX_AXES - 1, MAX_AXES, MAX_AXES + 1, 64, 65]) + shape
    else:
        entry["shape"] = rng.choice(["3", 3, None, {"0": 1}, [[1]], ""])


def _at_the_byte_bound(header: Header, rng: random.Random) -> None:
    """An empty tensor whose shape spans MAX_ARRAY_BYTES, or one byte more, with its axes of size 0 counted as 1:
    where a float product rounds."""
    code = rng.choice(CODES)
    itemsize = ITEMSIZE[code]
    fits = MAX_ARRAY_BYTES // itemsize
    big = rng.choice([fits, fits + 1, fits - 1, fits // 3, 2**62 // itemsize, (2**63 + itemsize - 1) // itemsize])
    choice = rng.random()
    if choice < 0.3:  # split over two axes, as a float product rounds each step
        root = max(1, int(big**0.5))
        dims = [root, big // root] if rng.random() < 0.5 else [root, -(-big // root)]
    elif choice < 0.7:  # a small factor and a large one, whose float product may round below the bound
        factor = rng.randint(2, 4000)
        dims = [factor, -(-big // factor) + rng.randint(-1, 2)]
    else:
        dims = [big]
    shape = [0, *dims] if rng.random() < 0.5 else [*dims, 0]
    rng.shuffle(shape)
    ends = [entry.get("data_offsets") for entry in header.values() if isinstance(entry, dict)]
    at = rng.choice([0, *[end[1] for end in ends if isinstance(end, list) and len(end) == 2 and type(end[1]) is int]])
    header[f"bound{len(header)}"] = {"dtype": code, "shape": shape, "data_offsets": [at, at]}


def _dtype(header: Header, rng: random.Random) -> None:
    entry = _entry(header, rng)
    if isinstance(entry, dict):
        entry["dtype"] = rng.choice([*CODES, "f32", "F31", "U4", "F8_E9M9", "F4", "", None, 4, ["F32"], {"F32": 1}])


def _entry_type(header: Header, rng: random.Random) -> None:
    if header:
        name = rng.choice(list(header))
        header[name] = rng.choice([None, 1, "F32", [], [header[name]], {}])


def _missing_or_extra_key(header: Header, rng: random.Random) -> None:
    entry = _entry(header, rng)
    if isinstance(entry, dict):
        if rng.random() < 0.5 and entry:
            del entry[rng.choice(list(entry))]
        else:
            entry[rng.choice(["extra", "dtype_", "offsets"])] = _odd(rng)


def _copy_entry(header: Header, rng: random.Random) -> None:
    """A second entry with the bytes of another (an overlap, or an empty tensor beside it)."""
    if header:
        name = rng.choice(list(header))
        header[name + "'"] = copy.deepcopy(header[name])


def _drop_entry(header: Header, rng: random.Random) -> None:
    if header:
        del header[rng.choice(list(header))]


def _empty_tensor(header: Header, rng: random.Random) -> None:
    """A tensor of no bytes, somewhere: at an edge of another, inside one, at or past the end."""
    at = rng.choice([0, 1, 2, 4, 8, 12, 10**6, 2**63 - 1])
    header[f"e{len(header)}"] = {"dtype": rng.choice(CODES), "shape": [0, rng.randint(0, 3)], "data_offsets": [at, at]}


MUTATIONS: list[Callable[[Header, random.Random], None]] = [
    _set_field, _offset, _offset, _offsets_length, _swap_offsets, _shift_all, _shape, _shape, _at_the_byte_bound,
    _dtype, _entry_type, _missing_or_extra_key, _copy_entry, _drop_entry, _empty_tensor,
]  # fmt: skip


def mutated(rng: random.Random) -> tuple[Header, int, list[str]]:
    """A header changed by none (a tenth of them) to three mutations, with the file size it is checked against."""
    header, size = valid_header(rng)
    done = []
    for _ in range(0 if rng.random() < 0.1 else rng.randint(1, 3)):
        mutation = rng.choice(MUTATIONS)
        mutation(header, rng)
        done.append(mutation.__name__)
    if rng.random() < 0.15:  # data after the last tensor, or too little
        size += rng.choice([-3, -1, 1, 2, 4096])
        done.append("size")
    return header, max(size, DATA_START), done


def decisions(header: Header, size: int) -> tuple[Any, Any]:
    """What the vectorised check and the entry-by-entry rules make of a header: the slots, or ``None`` / the error."""
    table = slot_table(header, data_start=DATA_START, file_size=size)
    try:
        slots: Any = entry_slots(header, data_start=DATA_START, file_size=size, file="f.jxs")
    except JaxstowError as error:
        slots = error
    return table, slots


def test_the_vectorised_check_refuses_exactly_what_the_entry_rules_refuse():
    rng = random.Random(31)
    outcomes: Counter[str] = Counter()
    refused_by: Counter[str] = Counter()
    for trial in range(HEADERS):
        header, size, done = mutated(rng)
        table, slots = decisions(header, size)
        context = f"trial {trial} ({done}): size {size}, header {json.dumps(header, default=repr)[:2000]}"
        if table is None:
            assert isinstance(slots, JaxstowError), f"refused by the vectorised check only: {context}"
            outcomes["refused"] += 1
            refused_by.update(done)
        else:
            assert not isinstance(slots, JaxstowError), f"refused by the entry rules only ({slots}): {context}"
            assert dict(table) == slots, context
            outcomes["accepted"] += 1
    # The mutations reach both outcomes, each a good share of the trials.
    assert outcomes["accepted"] > HEADERS // 10 and outcomes["refused"] > HEADERS // 3, outcomes
    assert set(refused_by) >= {mutation.__name__ for mutation in MUTATIONS} | {"size"}, refused_by


def test_at_the_byte_bound_the_decision_is_exact():
    """An empty float32 tensor spans its shape's bytes with axes of size 0 counted as 1: 2**61 - 1 elements fit
    MAX_ARRAY_BYTES, 2**61 do not, though as floats both products are 2**63."""

    def table(shape: list[int]) -> Any:
        header = {"w": {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]}}
        return slot_table(header, data_start=DATA_START, file_size=DATA_START)

    third = (2**61 - 2) // 3  # 3 * third * 4 == 2**63 - 8
    assert table([0, 2**61 - 1]) is not None and table([0, 2**61]) is None
    assert table([3, third, 0]) is not None and table([3, third + 1, 0]) is None
    header = {"w": {"dtype": "U8", "shape": [187, 49322845116870459, 0], "data_offsets": [0, 0]}}
    assert MAX_ARRAY_BYTES < 187 * 49322845116870459 and 187.0 * 49322845116870459.0 < 2.0**63  # rounded below
    assert slot_table(header, data_start=DATA_START, file_size=DATA_START) is None
    too_big = {"w": {"dtype": "F32", "shape": [0, 2**61], "data_offsets": [0, 0]}}
    with pytest.raises(FormatError, match=r"leaf 'w' of f.jxs: shape \[0, 2305843009213693952\] of float32 spans more"):
        check_header(too_big, data_start=DATA_START, file_size=DATA_START, file="f.jxs")


def test_a_refused_header_read_from_a_file_names_the_tensor_and_the_problem():
    """Through the reader: every refused table of the fuzz is an error naming the tensor the entry rules name."""
    rng = random.Random(7)
    checked = 0
    while checked < 150:
        header, size, _ = mutated(rng)
        if size - DATA_START > 1 << 16:
            continue
        table, slots = decisions(header, size)
        if table is not None:
            continue
        file = forge_native(header, None)
        data = bytes(size - DATA_START)
        with pytest.raises(JaxstowError) as raised:
            jaxstow.load(io.BytesIO(file + data))
        if b"Infinity" in file or b"NaN" in file:  # Python's JSON writes them; JSON has none: no valid header
            assert "is not valid JSON" in str(raised.value)
            continue
        if slots.path is not None:
            assert f"leaf {slots.path!r}"[:60] in str(raised.value), (str(raised.value), str(slots))
        checked += 1


def test_a_name_given_twice_is_refused_whether_or_not_its_entries_agree():
    """JSON parsers keep the last of two members of one name, as safetensors' own does: the header says two things of
    one tensor, or one thing twice, and is refused either way (tests/format/test_tensor_names.py)."""
    data = np.arange(4, dtype=np.float32).tobytes()
    entry = '{"dtype":"F32","shape":[%d],"data_offsets":[%d,%d]}'
    for text in [
        '{"w":' + entry % (2, 0, 8) + ',"w":' + entry % (2, 8, 16) + "}",
        '{"w":' + entry % (4, 0, 16) + ',"w":' + entry % (4, 0, 16) + "}",
    ]:
        padded = text.encode().ljust(DATA_START - 8)
        file = len(padded).to_bytes(8, "little") + padded + data
        with pytest.raises(FormatError, match=r"leaf 'w'.*lists 'w' twice"):
            jaxstow.load(io.BytesIO(file))
