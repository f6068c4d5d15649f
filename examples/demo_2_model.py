"""Save a whole equinox model, custom activation included, and load it in a fresh process with no template.

Run: python examples/demo_2_model.py
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import jaxstow


@jaxstow.saveable(name="demo.swish")
def swish(x: jax.Array) -> jax.Array:
    """The model's custom activation: registered by name, so a file can refer to it without code."""
    return x * jax.nn.sigmoid(x)


INPUTS = jnp.linspace(-2.0, 2.0, 4 * 3).reshape(4, 3)


def build_and_save(path: Path) -> np.ndarray:
    model = eqx.nn.MLP(
        3, 2, width_size=16, depth=2, activation=swish, final_activation=jax.nn.tanh, key=jax.random.key(0)
    )
    jaxstow.save(path, model, metadata={"description": "MLP 3-16-16-2, swish"})
    print(f"saved {type(model).__name__} (activation={model.activation.__name__}, depth={model.depth}) to {path}")
    print(f"  {path.stat().st_size} bytes, a safetensors file with the jaxstow manifest")
    return np.asarray(jax.vmap(model)(INPUTS))


def load_and_run(path: str, outputs_path: str) -> None:
    model = jaxstow.load(path)  # no template: the structure and hyperparameters come from the file
    assert model.activation is swish and model.final_activation is jax.nn.tanh
    name = model.activation.__name__
    print(f"  the child process loaded {type(model).__name__} with width {model.width_size} and activation {name}")
    jaxstow.save(outputs_path, jax.vmap(model)(INPUTS))


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.jxs"
        expected = build_and_save(path)
        print("loading it in a fresh Python process...")
        outputs_path = Path(folder) / "outputs.jxs"
        subprocess.run([sys.executable, __file__, "--load", str(path), str(outputs_path)], check=True)
        outputs = jaxstow.load(outputs_path, as_numpy=True)
        print(f"outputs match: {np.array_equal(outputs, expected)} (max difference {np.abs(outputs - expected).max()})")
        if not np.array_equal(outputs, expected):
            raise SystemExit("the loaded model computes something else")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--load":
        load_and_run(sys.argv[2], sys.argv[3])
    else:
        main()
