"""Progress bars: bytes done, rate and time left while saving; nothing drawn unless asked."""

import os

import jax.numpy as jnp
import numpy as np

import jaxstow
from jaxstow import progress


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
    frozen = jaxstow.snapshot.snapshot({"w": jnp.ones(5000), "b": jnp.zeros(3)})
    with progress.bar(frozen.nbytes, "saving", enabled=False) as bar:
        frozen.write(path, bar=bar)
    assert bar.done == os.path.getsize(path) > frozen.nbytes == 5003 * 4
