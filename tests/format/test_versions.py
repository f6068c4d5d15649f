"""Files of every format version load, and what each version adds holds: ``tests/data/format_v*.*`` are the golden
files (see ``test_golden.py``, which loads each to its tree); here a damaged byte in each must be caught, the
files written now are version 4 with a manifest of columns, version 3 headers hold no plain metadata keys, and a
newer version is named as newer, never as damage.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from format_trees import assert_same

import jaxstow
from jaxstow._format.manifest import FORMAT_VERSION
from jaxstow.errors import CorruptFileError, FormatError, NewerFormatError
from reliability.forge import forge_native, split_native

DATA = Path(__file__).parents[1] / "data"
GOLDEN = sorted(path.name for path in DATA.glob("format_v*.*"))


@pytest.mark.parametrize("name", GOLDEN)
def test_a_flipped_data_byte_of_a_golden_file_is_caught(tmp_path, name):
    damaged = tmp_path / name
    shutil.copy(DATA / name, damaged)
    data = bytearray(damaged.read_bytes())
    if name.endswith(".jxs"):
        data[-2] ^= 0x10  # the last tensor's bytes
    else:
        start = data.index(b"params/w.npy")
        data[start + 200] ^= 0x10
    damaged.write_bytes(bytes(data))
    with pytest.raises((CorruptFileError, FormatError)):
        jaxstow.load(damaged, as_numpy=True)


def test_the_files_written_now_are_version_4_and_smaller_per_leaf(tmp_path):
    tree = {f"layer_{i:03d}": {"w": np.full((4, 4), i, np.float32), "b": np.zeros(4, np.float32)} for i in range(200)}
    jaxstow.save(tmp_path / "now.jxs", tree)
    _, text, _ = split_native((tmp_path / "now.jxs").read_bytes())
    assert text is not None
    manifest = json.loads(text)
    assert manifest["version"] == 4
    assert len(text) < 60 * 400  # about one path and one checksum per leaf, not an object per leaf
    assert_same(jaxstow.load(tmp_path / "now.jxs", as_numpy=True), tree)


def test_a_version_3_file_keeps_its_header_and_a_plain_key_in_it_is_damage(tmp_path):
    from safetensors import safe_open

    path = DATA / "format_v3.jxs"
    with safe_open(str(path), "np") as file:
        assert set(file.metadata()) == {"jaxstow", "jaxstow_header_xxh3"}  # version 3 wrote no plain keys
    tensors, text, data = split_native(path.read_bytes())
    assert text is not None and json.loads(text)["version"] == 3
    forged = forge_native(tensors, text, data, plain={"note": "written by format version 3"})
    with pytest.raises(CorruptFileError, match=r"metadata keys .* are not jaxstow's"):
        jaxstow.load(io.BytesIO(forged))


def test_a_newer_version_with_keys_this_one_does_not_know_is_newer_not_corrupt():
    tensors, text, data = split_native((DATA / "format_v3.jxs").read_bytes())
    assert text is not None
    manifest = json.loads(text)
    manifest["version"] = FORMAT_VERSION + 1
    forged = forge_native(tensors, json.dumps(manifest), data, plain={"jaxstow_future": "1", "epoch": "3"})
    with pytest.raises(NewerFormatError, match=f"format {FORMAT_VERSION + 1} is newer than this jaxstow"):
        jaxstow.load(io.BytesIO(forged))
