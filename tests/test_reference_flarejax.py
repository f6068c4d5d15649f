"""FlareJax's documented serialization examples, run through ``jaxstow.save`` / ``jaxstow.load``.

The two examples come from FlareJax 0.4 (``pip install --no-deps flarejax``, with ``beartype`` and ``einops``): the
"Example" of its serialization guide (a ``flr.net.Sequential`` with a registered lambda activation) and the "Quick
Example" of its README (a lazily initialised ``Linear`` module registered with ``@flr.saveable("Example:Linear")``).
They are changed only in ``flr.save`` / ``flr.load`` / ``flr.saveable`` becoming ``jaxstow.save`` / ``jaxstow.load`` /
``jaxstow.saveable`` (whose arguments come in another order), and in the guide's ``flr.saveable()``, which registers
nothing, being given the activation and a name.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import jaxstow

flr = pytest.importorskip("flarejax")
jax = pytest.importorskip("jax")
jnp = jax.numpy
jnn = jax.nn
jrn = jax.random

key = jrn.PRNGKey(0)  # the README's Linear draws its weights from a global key


def test_the_serialization_guides_sequential_with_a_registered_activation(tmp_path: Path) -> None:
    key1, key2 = jrn.split(jrn.PRNGKey(1))
    x = jrn.normal(jrn.PRNGKey(2), (3, 784))

    # The guide's example, from here to the load.
    activation = lambda x: jnp.maximum(0, x)  # noqa: E731
    jaxstow.saveable(activation, name="guide.activation")

    model = flr.net.Sequential(flr.net.Linear(key1, 1024), activation, flr.net.Linear(key2, 10), jnn.softmax)
    model(jnp.zeros((1, 784)))  # initialize the model

    # save the model
    jaxstow.save(tmp_path / "model.npz", model)

    # load the model
    loaded = jaxstow.load(tmp_path / "model.npz")

    assert type(loaded) is flr.net.Sequential
    assert loaded.modules[1] is activation and loaded.modules[3] is jnn.softmax
    assert loaded.modules[0].dim == 1024 and loaded.modules[2].dim == 10
    np.testing.assert_array_equal(loaded(x), model(x))


def test_the_readmes_lazily_built_custom_module(tmp_path: Path) -> None:
    # The README's quick example, with its class registered under its own name.
    @jaxstow.saveable(name="Example:Linear")  # optional, make saveable
    class Linear(flr.Module):
        def __init__(self, key, dim: int):
            self.dim = dim
            self.w = None

        def __call__(self, x):
            # lazy initialization dependent on the input shape
            if self.w is None:
                self.w = jrn.normal(key, (x.shape[-1], self.dim))

            return x @ self.w

    layer = Linear(jrn.PRNGKey(0), 3)
    x = jnp.zeros((1, 4))

    # the model is initialized after the first call
    y = layer(x)
    assert layer.w.shape == (4, 3)

    jaxstow.save(tmp_path / "layer.jxs", layer)
    loaded = jaxstow.load(tmp_path / "layer.jxs")
    assert type(loaded) is Linear and loaded.dim == 3
    np.testing.assert_array_equal(loaded.w, layer.w)
    np.testing.assert_array_equal(loaded(x + 1.0), layer(x + 1.0))
    np.testing.assert_array_equal(loaded(x), y)


def test_a_flarejax_model_loads_in_a_fresh_process_that_only_imports_flarejax(tmp_path: Path) -> None:
    key1, key2 = jrn.split(jrn.PRNGKey(3))
    model = flr.net.Sequential(flr.net.Linear(key1, 8), jnn.relu, flr.net.Linear(key2, 2))
    x = jrn.normal(jrn.PRNGKey(4), (5, 3))
    np.save(tmp_path / "expected.npy", np.asarray(model(x)))
    np.save(tmp_path / "x.npy", np.asarray(x))
    jaxstow.save(tmp_path / "model.jxs", model)
    code = (
        "import sys, jax, numpy as np, flarejax, jaxstow\n"
        "folder = sys.argv[1]\n"
        "model = jaxstow.load(folder + '/model.jxs')\n"
        "np.testing.assert_array_equal(model(np.load(folder + '/x.npy')), np.load(folder + '/expected.npy'))\n"
        "first, activation, last = model.modules\n"
        "print(type(model).__name__, type(first).__name__, activation is jax.nn.relu, type(last).__name__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "Sequential Linear True Linear"
