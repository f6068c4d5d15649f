"""FlareJax's documented serialization examples, run through ``jaxstow.save`` / ``jaxstow.load``.

The two examples come from FlareJax 0.4 (``pip install --no-deps flarejax``, with ``beartype`` and ``einops``): the
"Quick Example" of its README (a lazily initialised ``Linear`` module registered with ``@flr.saveable("Example:Linear")``
and saved with ``flr.save(layer, "model.npz")``) and the "Example" of its serialization guide (a ``flr.net.Sequential``
with a lambda activation, saved with ``flr.save("model.npz", model)``). Each is copied as FlareJax documents it, with
``flr.save`` / ``flr.load`` / ``flr.saveable`` becoming ``jaxstow.save`` / ``jaxstow.load`` / ``jaxstow.saveable`` and
the names the examples use without defining them (``key``, ``key1``, ``key2``, ``model``'s input) set up first. The
README's optimisation snippet is left out: it trains an undefined ``model`` with ``flr.train``, which FlareJax 0.4 does
not have, and saves nothing. The guide's ``flr.saveable()`` registers nothing (FlareJax itself raises ``TypeError`` on
it, and its ``save`` refuses the unregistered lambda as jaxstow does), so the port gives the call what it needs: the
activation and a name.
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

PRNGKeyArray = pytest.importorskip("jaxtyping").PRNGKeyArray

key = jrn.PRNGKey(0)  # the README's Linear draws its weights from a global key


def test_the_readmes_lazily_built_custom_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)

    # The README's quick example, as it stands.
    @jaxstow.saveable("Example:Linear")  # optional, make saveable
    class Linear(flr.Module):
        def __init__(self, key: PRNGKeyArray, dim: int):
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

    original = layer
    jaxstow.save(layer, "model.npz")

    # load the model
    layer = jaxstow.load("model.npz")
    assert isinstance(layer, Linear)

    # What the README leaves unsaid: the loaded layer is the saved one.
    assert type(layer) is Linear and layer.dim == 3
    np.testing.assert_array_equal(layer.w, original.w)
    np.testing.assert_array_equal(layer(x + 1.0), original(x + 1.0))
    np.testing.assert_array_equal(layer(x), y)


def test_the_serialization_guides_sequential_with_a_registered_activation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    key1, key2 = jrn.split(jrn.PRNGKey(1))

    # The guide's example, as it stands but for the registration (see above).
    activation = lambda x: jnp.maximum(0, x)  # noqa: E731
    jaxstow.saveable(activation, name="guide.activation")

    model = flr.net.Sequential(flr.net.Linear(key1, 1024), activation, flr.net.Linear(key2, 10), jnn.softmax)
    model(jnp.zeros((1, 784)))  # initialize the model

    # save the model
    jaxstow.save("model.npz", model)

    # load the model
    saved, model = model, jaxstow.load("model.npz")

    # What the guide leaves unsaid: the loaded model is the saved one.
    x = jrn.normal(jrn.PRNGKey(2), (3, 784))
    assert type(model) is flr.net.Sequential
    assert model.modules[1] is activation and model.modules[3] is jnn.softmax
    assert model.modules[0].dim == 1024 and model.modules[2].dim == 10
    np.testing.assert_array_equal(model(x), saved(x))


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
