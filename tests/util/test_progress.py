"""Progress bars: bytes done, rate and time left while saving; nothing drawn unless asked; every write counted;
a bar that cannot be drawn names the extra that draws it."""

import io
import os
import sys

import jax.numpy as jnp
import numpy as np
import pytest

import jaxstow
from jaxstow._util import progress
from jaxstow.errors import MissingDependencyError


def test_save_draws_bytes_rate_and_time_left(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    jaxstow.save("big.jxs", {"w": jnp.ones((1024, 1024))}, progress=True)
    drawn = capsys.readouterr().err  # tqdm draws on stderr
    assert "saving big.jxs" in drawn
    assert "/4.19M" in drawn  # the total, in decimal units
    assert "B/s]" in drawn and "<" in drawn  # a rate and an estimate of the time left
    np.testing.assert_array_equal(jaxstow.load("big.jxs", as_numpy=True)["w"], np.ones((1024, 1024)))


def test_save_is_silent_by_default(tmp_path, capsys):
    jaxstow.save(tmp_path / "w.npz", {"w": jnp.ones(10)})
    assert capsys.readouterr() == ("", "")


def test_counted_writes_add_up_to_the_file(tmp_path):
    path = tmp_path / "w.jxs"
    encoded = jaxstow._write.encoded.encode_tree({"w": jnp.ones(5000), "b": jnp.zeros(3)})
    with progress.bar(encoded.nbytes, "saving", enabled=False) as bar:
        encoded.write(path, bar=bar)
    assert bar.done == os.path.getsize(path) > encoded.nbytes == 5003 * 4


def test_load_draws_the_bytes_read(tmp_path, capsys):
    jaxstow.save(tmp_path / "big.jxs", {"w": jnp.ones((1024, 1024)), "b": jnp.zeros(3)})
    capsys.readouterr()
    restored = jaxstow.load(tmp_path / "big.jxs", progress=True)
    drawn = capsys.readouterr().err
    assert "loading" in drawn and "4.19M/4.19M" in drawn and "B/s]" in drawn
    assert restored["w"].shape == (1024, 1024)


def test_checkpoint_restores_draw_when_the_manager_does(tmp_path, capsys):
    with jaxstow.CheckpointManager(tmp_path / "run", progress=True) as manager:
        manager.save(1, {"params": {"w": jnp.ones((512, 512))}})
        manager.wait()
        capsys.readouterr()
        manager.restore()
    assert "1.05M/1.05M" in capsys.readouterr().err


def test_counted_writes_count_what_the_file_took_or_all_of_it_when_it_does_not_say():
    class Unsaid(io.RawIOBase):
        def writable(self):
            return True

        def write(self, data):
            return None  # as some file objects do

    with progress.bar(10, "saving", enabled=False) as bytes_done:
        buffer = io.BytesIO()
        sink = progress.counted(buffer, bytes_done)
        assert sink.write(b"hello") == 5 and sink.write(memoryview(b"abc")) == 3
        assert progress.counted(Unsaid(), bytes_done).write(np.zeros(2, np.float32)) == 8
    assert bytes_done.done == 16 and buffer.getvalue() == b"helloabc"


def test_a_bar_without_tqdm_says_which_extra_draws_it_and_an_undrawn_one_needs_none(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)
    with pytest.raises(
        MissingDependencyError, match=r"a progress bar needs .* tqdm: pip install 'jaxstow\[progress\]'"
    ):
        progress.bar(10, "saving", enabled=True).__enter__()
    with progress.bar(10, "saving", enabled=False) as bytes_done:
        bytes_done.update(10)
    assert bytes_done.done == 10


def test_a_drawn_bar_ends_at_what_was_done_when_headers_add_to_the_total(capsys):
    with progress.bar(1000, "saving x.jxs", enabled=True) as bytes_done:
        bytes_done.update(1100)  # the arrays' bytes were the total; the header came on top
    assert "1.10k/1.10k" in capsys.readouterr().err


def test_byte_counts_for_people():
    counts = [0, 999, 1000, 1_500_000, 2_000_000_000, 5 * 10**12]
    assert [progress.format_bytes(count) for count in counts] == [
        "0 B",
        "999 B",
        "1.00 kB",
        "1.50 MB",
        "2.00 GB",
        "5000.00 GB",
    ]
