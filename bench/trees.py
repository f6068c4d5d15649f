"""The benchmark trees T1 and T2, shared by every benchmark script.

- T1: 64 float32 leaves, about 1.1 GB, shaped like a small transformer (an embedding, five blocks of attention, MLP and
  norms, a final norm), in nested dicts.
- T2: 10,000 float32 leaves of 1 to 4 KiB each in nested dicts (40 groups x 25 modules x 10 leaves).

Keys are strings at every level, so every peer format (flax msgpack, h5py groups, safetensors names) takes the trees as
they are. Leaves are ``jax.Array`` on the default device; the values are seeded, so a tree is the same in every process.

>>> tree = make_t2()
>>> len(jax.tree.leaves(tree)), tree_nbytes(tree)
(10000, 24576000)
"""

from __future__ import annotations

import jax
import numpy as np

__all__ = ["T1_LEAVES", "T2_LEAVES", "make_t1", "make_t2", "tree_nbytes"]

T1_LEAVES = 64
T2_LEAVES = 10_000

_MODEL, _HIDDEN, _VOCAB, _POSITIONS, _BLOCKS = 2048, 8192, 12_000, 1024, 5
_T2_GROUPS, _T2_MODULES = 40, 25
# Ten leaves per T2 module, cycling through 1, 1.5, 3 and 4 KiB of float32.
_T2_SHAPES: tuple[tuple[int, ...], ...] = (
    (256,),
    (16, 24),
    (24, 32),
    (32, 32),
    (256,),
    (16, 24),
    (24, 32),
    (32, 32),
    (256,),
    (32, 32),
)

Tree = dict[str, "Tree | jax.Array"]


def _aligned(shape: tuple[int, ...]) -> np.ndarray:
    """An uninitialised float32 array whose data is 64-byte aligned, so ``jax.device_put`` adopts it without a copy."""
    nbytes = int(np.prod(shape)) * 4
    raw = np.empty(nbytes + 64, dtype=np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start : start + nbytes].view(np.float32).reshape(shape)


def _normal(rng: np.random.Generator, shape: tuple[int, ...], scale: float = 0.02) -> jax.Array:
    array = _aligned(shape)
    rng.standard_normal(dtype=np.float32, out=array)
    array *= scale
    return jax.device_put(array)


def _constant(shape: tuple[int, ...], value: float) -> jax.Array:
    array = _aligned(shape)
    array.fill(value)
    return jax.device_put(array)


def _block(rng: np.random.Generator) -> Tree:
    attention = {name: {"kernel": _normal(rng, (_MODEL, _MODEL))} for name in ("query", "key", "value", "out")}
    mlp = {
        "up": {"kernel": _normal(rng, (_MODEL, _HIDDEN)), "bias": _constant((_HIDDEN,), 0.0)},
        "down": {"kernel": _normal(rng, (_HIDDEN, _MODEL)), "bias": _constant((_MODEL,), 0.0)},
    }
    norms = {
        name: {"scale": _constant((_MODEL,), 1.0), "bias": _constant((_MODEL,), 0.0)}
        for name in ("attention_norm", "mlp_norm")
    }
    return {"attention": attention, "mlp": mlp, **norms}


def make_t1(seed: int = 0) -> Tree:
    """T1: 64 float32 leaves, 1.11 GB (4 + 5 blocks x 12 leaves)."""
    rng = np.random.default_rng(seed)
    return {
        "embed": {"tokens": _normal(rng, (_VOCAB, _MODEL)), "positions": _normal(rng, (_POSITIONS, _MODEL))},
        "blocks": {f"{index}": _block(rng) for index in range(_BLOCKS)},
        "final_norm": {"scale": _constant((_MODEL,), 1.0), "bias": _constant((_MODEL,), 0.0)},
    }


def make_t2(seed: int = 0) -> Tree:
    """T2: 10,000 float32 leaves of 1 to 4 KiB, 24.6 MB, three levels of nested dicts."""
    rng = np.random.default_rng(seed)

    def module() -> Tree:
        return {
            f"param_{index}": jax.device_put(rng.standard_normal(shape, dtype=np.float32))
            for index, shape in enumerate(_T2_SHAPES)
        }

    return {f"group_{g:02d}": {f"module_{m:02d}": module() for m in range(_T2_MODULES)} for g in range(_T2_GROUPS)}


def tree_nbytes(tree: object) -> int:
    """The bytes of all array leaves of ``tree``."""
    return sum(int(leaf.nbytes) for leaf in jax.tree.leaves(tree))
