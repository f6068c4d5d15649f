"""Restoring to ``jax.Array`` on CPU adopts the read buffers: memory peaks at the tree plus a little, never twice it.

The file is written by the test; a fresh process restores it, taking its baseline (the kernel's high-water mark of
its resident set, ``VmHWM``) after its imports and a small warm-up read, before the restore, so that nothing the
writing allocated hides the restore's peak. ``VmHWM`` belongs to the process's own memory since its ``exec``;
``ru_maxrss`` would not do: it starts at what the parent held when it forked the process.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import jaxstow

LAYERS = 64
TREE_BYTES = 128 << 20

_MEASURE = textwrap.dedent(
    """
    import sys
    import jax, jaxstow

    def high_water():
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))

    path, mode = sys.argv[1], sys.argv[2]
    jax.block_until_ready(jaxstow.load(path, select=["layer0"], as_numpy=mode == "numpy"))  # every code path warmed up
    base = high_water()
    restored = jaxstow.load(path, as_numpy=mode == "numpy")
    jax.block_until_ready(restored)
    peak = high_water()
    assert all(float(restored[f"layer{i}"][3, 5]) == i for i in range(len(restored)))
    print(peak - base, sum(leaf.nbytes for leaf in jax.tree.leaves(restored)))
    """
)


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("memory") / "tree.jxs")
    jaxstow.save(path, {f"layer{i}": np.full((512, 1024), i, np.float32) for i in range(LAYERS)})
    return path


@pytest.mark.parametrize("mode", ["jax", "numpy"])
def test_restore_memory_peaks_at_the_tree_plus_64_mib(saved, mode):
    result = subprocess.run([sys.executable, "-c", _MEASURE, saved, mode], capture_output=True, text=True, check=True)
    grown, tree_bytes = map(int, result.stdout.split())
    assert tree_bytes == TREE_BYTES
    # The restored tree is resident, so the measure sees at least most of it: a baseline taken too late would not.
    assert grown >= 0.9 * tree_bytes, f"restoring {tree_bytes} bytes grew the process by only {grown}"
    assert grown <= tree_bytes + (64 << 20), f"restoring {tree_bytes} bytes grew the process by {grown}"
