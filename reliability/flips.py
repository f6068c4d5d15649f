"""Bit flips in ``.jxs`` files, ``.npz`` archives and checkpoint folders; each followed by a load or a restore."""

from __future__ import annotations

import io
import os
import random
import tempfile
from typing import Any

import numpy as np

import jaxstow
from reliability.outcomes import Result, attempt, flip, native_position, sample_tree, saved_bytes


def _flips(probe: str, suffix: str, trials: int, rng: random.Random) -> Result:
    original = saved_bytes(suffix, sample_tree())
    reference = jaxstow.load(io.BytesIO(original), as_numpy=True)
    result = Result(probe)
    for _ in range(trials):
        position = native_position(original, rng) if suffix == ".jxs" else rng.randrange(len(original))
        damaged = flip(original, position, rng.randrange(8))
        outcome, note = attempt(lambda data=damaged: jaxstow.load(io.BytesIO(data), as_numpy=True), reference)
        result.add(outcome, f"byte {position}: {note}")
    return result


def flips_native(trials: int, rng: random.Random) -> Result:
    """One flipped bit per trial in a native ``.jxs`` file (header, padding, length or data); then a load."""
    return _flips("bit flips in .jxs", ".jxs", trials, rng)


def flips_npz(trials: int, rng: random.Random) -> Result:
    """One flipped bit per trial anywhere in a jaxstow ``.npz`` archive; then a load."""
    return _flips("bit flips in .npz", ".npz", trials, rng)


def flips_checkpoint(trials: int, rng: random.Random) -> Result:
    """One flipped bit per trial in a step folder (its ``checkpoint.json`` or an item file); then a restore."""
    result = Result("bit flips in checkpoint folders")
    with tempfile.TemporaryDirectory() as root:
        items = {"params": sample_tree(), "opt": {"count": np.int32(4), "mu": np.ones(3, np.float32)}}
        with jaxstow.CheckpointManager(root) as manager:
            manager.save(5, items, metrics={"loss": 0.125}, metadata={"epoch": 2})

        def restore() -> Any:
            reader = jaxstow.CheckpointManager(root)
            return reader.restore(5, as_numpy=True), reader.metrics(5), reader.metadata(5), reader.steps()

        reference = restore()
        folder = os.path.join(root, "5")
        names = sorted(os.listdir(folder))
        originals = {name: open(os.path.join(folder, name), "rb").read() for name in names}  # noqa: SIM115
        for _ in range(trials):
            name = "checkpoint.json" if rng.random() < 0.4 else rng.choice(names)
            data = originals[name]
            position = rng.randrange(len(data)) if name.endswith(".json") else native_position(data, rng)
            with open(os.path.join(folder, name), "wb") as file:
                file.write(flip(data, position, rng.randrange(8)))
            outcome, note = attempt(restore, reference)
            result.add(outcome, f"{name} byte {position}: {note}")
            with open(os.path.join(folder, name), "wb") as file:
                file.write(data)
    return result
