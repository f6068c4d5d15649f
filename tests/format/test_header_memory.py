"""A long header made of JSON objects and arrays (a Python object of 60 bytes or more for each 3 bytes of text) is
refused before it is parsed, with memory of a few times its length; one whose strings hold such text is read.

Memory is measured in a fresh process (the kernel's high-water mark of its resident set, ``VmHWM``, from after its
imports and a warm-up load), as in tests/read/test_memory_peak.py.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import jaxstow
from jaxstow.errors import FormatError

_MEASURE = textwrap.dedent(
    """
    import sys
    import jaxstow

    def high_water():
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))

    small, hostile = sys.argv[1], sys.argv[2]
    jaxstow.load(small, as_numpy=True)  # every code path warmed up
    base = high_water()
    try:
        jaxstow.load(hostile, as_numpy=True)
    except jaxstow.errors.FormatError as error:
        print(high_water() - base, str(error).replace(chr(10), " "))
    """
)


def _safetensors(path, header: bytes, data: bytes = b"") -> None:
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header + data)


def _entry(data: bytes) -> bytes:
    return b'"w":{"dtype":"U8","shape":[%d],"data_offsets":[0,%d]}' % (len(data), len(data))


@pytest.mark.parametrize("filler", [b"[]", b'{"a":{}}'])
def test_a_header_of_4_mib_of_arrays_and_objects_is_refused_with_memory_of_a_few_times_its_length(tmp_path, filler):
    small, hostile = tmp_path / "small.safetensors", tmp_path / "hostile.safetensors"
    _safetensors(small, b"{" + _entry(b"1") + b"}", b"1")
    header = b'{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":[' + b",".join(
        [filler] * ((4 << 20) // (len(filler) + 1))
    )
    _safetensors(hostile, header + b"]}}", b"1")
    command = [sys.executable, "-c", _MEASURE, str(small), str(hostile)]
    grown, message = subprocess.run(command, capture_output=True, text=True, check=True).stdout.split(" ", 1)
    assert f"{hostile}: the header's" in message and "JSON objects and arrays, more than the" in message
    assert "refused before it is parsed" in message
    assert int(grown) < 4 * len(header), f"refusing a header of {len(header)} bytes grew the process by {grown}"


def test_a_long_header_whose_strings_spell_arrays_and_objects_is_read(tmp_path):
    path = tmp_path / "spelled.safetensors"
    note = json.dumps("[{\\" + '"[]' * (100 << 10)).encode()  # an escaped backslash, then escaped quotes
    _safetensors(path, b"{" + _entry(b"12") + b',"__metadata__":{"note":' + note + b"}}", b"12")
    with jaxstow.open(path) as reader:
        assert reader.metadata["note"] == json.loads(note)
    np.testing.assert_array_equal(jaxstow.load(path, as_numpy=True)["w"], np.frombuffer(b"12", np.uint8))


def test_a_long_header_of_more_arrays_than_it_may_hold_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "arrays.safetensors"
    _safetensors(path, b"{" + _entry(b"1")[:-1] + b',"x":[' + b",".join([b"[]"] * 30_000) + b"]}}", b"1")
    with pytest.raises(FormatError, match="JSON objects and arrays, more than the") as caught:
        jaxstow.open(path)
    assert str(path) in str(caught.value)
