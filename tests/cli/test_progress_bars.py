"""``--progress`` on every command that reads or writes arrays (``verify``, ``convert``, ``diff``, ``export``): a bar
of the bytes on stderr when asked, nothing drawn otherwise, the output the same."""

from __future__ import annotations

import forked_cli
import numpy as np

import jaxstow


def test_diff_and_export_draw_the_bytes_they_read_and_write(tmp_path):
    a, b, hf = tmp_path / "a.jxs", tmp_path / "b.jxs", tmp_path / "hf"
    jaxstow.save(a, {"w": np.ones(1 << 18, np.float32), "b": np.zeros(3, np.float32)})
    jaxstow.save(b, {"w": np.ones(1 << 18, np.float32), "b": np.ones(3, np.float32)})
    quiet = forked_cli.jaxstow_command("diff", a, b)
    drawn = forked_cli.jaxstow_command("diff", a, b, "--progress")
    assert (quiet.returncode, drawn.returncode, quiet.stderr) == (1, 1, ""), quiet.stderr + drawn.stderr
    assert f"comparing {a} and {b}" in drawn.stderr and "2.10M/2.10M" in drawn.stderr  # both files' arrays
    assert drawn.stdout == quiet.stdout
    done = forked_cli.jaxstow_command("export", a, hf, "--progress", "--max-shard-size", "1MB")
    assert done.returncode == 0, done.stderr
    assert f"exporting {hf}" in done.stderr and "100%" in done.stderr
    assert done.stdout == f"{a} -> {hf}: 2 tensors, 1.05 MB in 2 files\n"
    np.testing.assert_array_equal(jaxstow.load(hf, as_numpy=True)["w"], np.ones(1 << 18, np.float32))
    quiet = forked_cli.jaxstow_command("export", a, tmp_path / "hf2")
    assert (quiet.returncode, quiet.stderr) == (0, "")
