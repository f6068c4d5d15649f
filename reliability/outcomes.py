"""What a probe's trial came to, and the trees, files and comparisons the probes share."""

from __future__ import annotations

import os
import random
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

import jaxstow
from jaxstow.errors import JaxstowError

_NOTES = 5


@dataclass
class Result:
    """The counts of one probe."""

    probe: str
    trials: int = 0
    detected: int = 0
    harmless: int = 0
    lost: int = 0
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None

    def add(self, outcome: str, note: str = "") -> None:
        self.trials += 1
        setattr(self, outcome, getattr(self, outcome) + 1)
        if outcome == "lost" and len(self.notes) < _NOTES:
            self.notes.append(note)


# -- comparing trees ------------------------------------------------------------------------------------------------


def same(a: Any, b: Any) -> bool:
    """Whether two trees are identical: the same structure and bit-identical leaves of the same types."""
    leaves_a, treedef_a = jax.tree_util.tree_flatten(a)
    leaves_b, treedef_b = jax.tree_util.tree_flatten(b)
    return treedef_a == treedef_b and all(_same_leaf(x, y) for x, y in zip(leaves_a, leaves_b, strict=True))


def _same_leaf(x: Any, y: Any) -> bool:
    if type(x) is not type(y):
        return False
    if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        return str(jax.random.key_impl(x)) == str(jax.random.key_impl(y)) and same(
            jax.random.key_data(x), jax.random.key_data(y)
        )
    if isinstance(x, np.ndarray | np.generic | jax.Array):
        return x.dtype == y.dtype and np.shape(x) == np.shape(y) and np.asarray(x).tobytes() == np.asarray(y).tobytes()
    if isinstance(x, float | complex):
        return repr(x) == repr(y)  # NaN equals NaN, -0.0 differs from 0.0
    return bool(x == y)


def sample_tree() -> dict[str, Any]:
    """A small tree with every kind of leaf: an equinox model, scalars, a string, a PRNG key, odd dtypes."""
    return {
        "model": eqx.nn.MLP(3, 2, 4, 2, activation=jax.nn.gelu, key=jax.random.key(0)),
        "step": 7,
        "lr": 0.125,
        "name": "run-1",
        "key": jax.random.key(3),
        "half": np.arange(6).astype(ml_dtypes.bfloat16),
        "flags": np.array([True, False, True]),
        "scale": np.float32(2.5),
    }


def attempt(load: Callable[[], Any], reference: Any) -> tuple[str, str]:
    """Run ``load``: a jaxstow error is *detected*, ``reference`` returned is *harmless*, anything else *lost*."""
    try:
        value = load()
    except JaxstowError:
        return "detected", ""
    except Exception as error:
        return "lost", f"{type(error).__name__}: {str(error)[:160]}"
    return ("harmless", "") if same(value, reference) else ("lost", "wrong data returned without an error")


def flip(data: bytes, position: int, bit: int) -> bytes:
    """``data`` with one bit changed."""
    flipped = bytearray(data)
    flipped[position] ^= 1 << bit
    return bytes(flipped)


def native_position(data: bytes, rng: random.Random) -> int:
    """A byte of a native file: the length, the header text, its padding or the data, weighted towards the header."""
    (length,) = np.frombuffer(data[:8], "<u8")
    text_end = 8 + len(data[8 : 8 + int(length)].rstrip(b" "))
    regions = [(0, 8, 1), (8, text_end, 5), (text_end, 8 + int(length), 1), (8 + int(length), len(data), 3)]
    regions = [region for region in regions if region[1] > region[0]]
    start, end, _ = rng.choices(regions, weights=[weight for _, _, weight in regions])[0]
    return rng.randrange(start, end)


def saved_bytes(suffix: str, tree: Any) -> bytes:
    """The bytes of ``tree`` saved to a file name ending in ``suffix`` (``.jxs`` or ``.npz``), with metadata."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, f"model{suffix}")
        jaxstow.save(path, tree, metadata={"epoch": 2, "note": "flips"})
        with open(path, "rb") as file:
            return file.read()


def attempt_any(load: Callable[[], Any]) -> tuple[str, str]:
    """A forged file has no true content: a tree is as good an answer as a jaxstow error; anything else is lost."""
    try:
        load()
    except JaxstowError:
        return "detected", ""
    except Exception as error:
        return "lost", f"{type(error).__name__}: {str(error)[:160]}"
    return "harmless", ""
