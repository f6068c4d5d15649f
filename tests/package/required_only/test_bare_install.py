"""``pip install jaxstow`` with its required dependencies only: the core, local checkpoints and the command line
work, and every feature of an extra says which extra to install.

These tests run in a venv of their own (``make test-bare``, part of ``make test``), where the optional packages are
truly absent; in a venv that has them, they are skipped.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import jax.numpy as jnp
import pytest

import jaxstow
from jaxstow.errors import MissingDependencyError

OPTIONAL = ["fsspec", "s3fs", "h5py", "rich", "tqdm", "torch", "arviz", "orbax", "flax", "equinox", "optax"]
present = [name for name in OPTIONAL if importlib.util.find_spec(name) is not None]
if present:
    pytest.skip(f"for a venv without the optional packages (this one has {present})", allow_module_level=True)


def jaxstow_command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jaxstow", *args], capture_output=True, text=True, timeout=120)


def test_save_load_open_and_a_local_checkpoint_folder(tmp_path):
    jaxstow.save(tmp_path / "model.jxs", {"w": jnp.arange(3.0), "depth": 2}, metadata={"epoch": 1})
    assert jaxstow.load(tmp_path / "model.jxs", as_numpy=True)["w"].tolist() == [0.0, 1.0, 2.0]
    assert jaxstow.load_metadata(tmp_path / "model.jxs") == {"epoch": 1}
    with jaxstow.open(tmp_path / "model.jxs") as reader:
        assert reader.info("w").shape == (3,)
    with jaxstow.CheckpointManager(tmp_path / "run", keep=jaxstow.KeepPolicy(keep_last=1)) as manager:
        manager.save(1, {"params": {"w": jnp.ones(2)}})
        manager.save(2, {"params": {"w": jnp.zeros(2)}})
    assert manager.steps() == [2]


def test_the_command_line_prints_plain_text(tmp_path):
    jaxstow.save(tmp_path / "a.jxs", {"w": jnp.ones(3)})
    jaxstow.save(tmp_path / "b.jxs", {"w": jnp.zeros(3)})
    with jaxstow.CheckpointManager(tmp_path / "run") as manager:
        manager.save(5, {"params": {"w": jnp.ones(2)}}, metrics={"loss": 0.5})
    inspect = jaxstow_command("inspect", str(tmp_path / "a.jxs"))
    assert inspect.returncode == 0 and "float32" in inspect.stdout, inspect.stderr
    assert jaxstow_command("verify", str(tmp_path / "run")).returncode == 0
    listing = jaxstow_command("ls", str(tmp_path / "run"))
    assert listing.returncode == 0 and "0.5" in listing.stdout, listing.stderr
    assert jaxstow_command("diff", str(tmp_path / "a.jxs"), str(tmp_path / "b.jxs")).returncode == 1


def test_features_of_extras_name_the_extra(tmp_path):
    with pytest.raises(MissingDependencyError, match=r"pip install 'jaxstow\[s3\]'"):
        jaxstow.load("s3://bucket/model.jxs")
    with pytest.raises(MissingDependencyError, match=r"pip install 'jaxstow\[fsspec\]'"):
        jaxstow.load("gs://bucket/model.jxs")
    with pytest.raises(MissingDependencyError, match=r"pip install 'jaxstow\[progress\]'"):
        jaxstow.save(tmp_path / "x.jxs", {"w": jnp.ones(2)}, progress=True)
    with pytest.raises(MissingDependencyError, match=r"pip install 'jaxstow\[h5py\]'"):
        jaxstow.io.HDF5Collector(None)
    url = jaxstow_command("inspect", "s3://bucket/model.jxs")
    assert url.returncode == 2 and "jaxstow[s3]" in url.stderr and "Traceback" not in url.stderr
    watched = jaxstow_command("watch", "--interval", "0.1", str(tmp_path / "run.h5"))  # no waiting for h5py
    assert watched.returncode == 2 and "jaxstow[h5py]" in watched.stderr and "Traceback" not in watched.stderr


def test_every_face_names_its_own_extra(tmp_path):
    import pickle
    import zipfile

    import numpy as np

    with pytest.raises(MissingDependencyError, match=r"pip install 'jaxstow\[equinox\]'"):
        jaxstow.train.EquinoxOptaxModule  # noqa: B018
    with pytest.raises(MissingDependencyError, match=r"jaxstow.io.blackjax.sample needs .* 'jaxstow\[blackjax\]'"):
        jaxstow.io.blackjax.sample(tmp_path / "run.h5", None, None, None, num_samples=1)
    with pytest.raises(MissingDependencyError, match=r"jaxstow.io.numpyro.run needs .* 'jaxstow\[numpyro\]'"):
        jaxstow.io.numpyro.run(None, tmp_path / "run.h5", None)
    with zipfile.ZipFile(tmp_path / "model.pt", "w") as archive:  # torch.save's layout, made without torch
        archive.writestr("model/data.pkl", pickle.dumps({}))
    with pytest.raises(MissingDependencyError, match=r"pip install 'jaxstow\[torch\]'"):
        jaxstow.load(tmp_path / "model.pt", from_format="torch")
    (tmp_path / "params.msgpack").write_bytes(b"\x81\xa1w\x01")  # flax.serialization.to_bytes({"w": 1})
    with pytest.raises(MissingDependencyError, match=r"pip install 'jaxstow\[flax\]'"):
        jaxstow.load(tmp_path / "params.msgpack", from_format="flax")
    (tmp_path / "orbax").mkdir()
    (tmp_path / "orbax" / "_METADATA").write_text("{}")
    with pytest.raises(MissingDependencyError, match=r"pip install 'jaxstow\[orbax\]'"):
        jaxstow.load(tmp_path / "orbax", from_format="orbax")
    with open(tmp_path / "model.eqx", "wb") as stream:  # equinox.tree_serialise_leaves of two arrays
        np.save(stream, np.ones(2))
        np.save(stream, np.zeros(3))
    with pytest.raises(MissingDependencyError, match=r"pip install 'jaxstow\[equinox\]'"):
        jaxstow.load(tmp_path / "model.eqx", like=(jnp.ones(2), jnp.zeros(3)), from_format="equinox")
    convert = jaxstow_command("convert", str(tmp_path / "model.pt"), str(tmp_path / "model.jxs"))
    assert convert.returncode == 2 and "jaxstow[torch]" in convert.stderr and "Traceback" not in convert.stderr
