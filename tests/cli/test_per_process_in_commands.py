"""A leaf saved with ``jaxstow.per_process`` (each process's value, a small file of its own inside the file) is a
leaf like the others for the command: ``verify`` reads it against its checksum, ``diff`` compares its values, and
``convert`` to a jaxstow file keeps it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import jaxstow
from jaxstow.cli import main


def _saved(path: Path, position: int) -> Path:
    jaxstow.save(path, {"w": np.ones(2, np.float32), "loader": jaxstow.per_process({"position": position})})
    return path


def test_verify_finds_a_damaged_per_process_value(tmp_path: Path, capsys) -> None:
    path = _saved(tmp_path / "m.jxs", 5)
    assert main(["verify", str(path)]) == 0
    data = bytearray(path.read_bytes())
    start = data.index(b"position")  # inside the per-process value's own file
    data[start] ^= 1
    path.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["verify", str(path)]) == 1
    assert "DAMAGED" in capsys.readouterr().out


def test_diff_compares_per_process_values(tmp_path: Path, capsys) -> None:
    a, b, c = _saved(tmp_path / "a.jxs", 5), _saved(tmp_path / "b.jxs", 999), _saved(tmp_path / "c.jxs", 5)
    assert main(["diff", str(a), str(b)]) == 1
    assert "loader" in capsys.readouterr().out
    assert main(["diff", str(a), str(c)]) == 0


def test_convert_in_place_keeps_a_per_process_leaf(tmp_path: Path) -> None:
    path = _saved(tmp_path / "m.jxs", 5)
    assert main(["convert", str(path), str(path), "--overwrite"]) == 0
    assert jaxstow.load(path, per_process="all")["loader"] == [{"position": 5}]
    assert main(["convert", str(path), str(tmp_path / "copy.jxs")]) == 0
    assert main(["verify", str(tmp_path / "copy.jxs")]) == 0
