"""Progress bars: bytes done, rate and time left while saving; nothing drawn unless asked."""

import os

import jax.numpy as jnp
import numpy as np

import jaxstow
from jaxstow._util import progress


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
