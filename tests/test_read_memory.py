"""Restoring to ``jax.Array`` on CPU adopts the read buffers: memory peaks at the tree plus a little, never twice it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

_MEASURE = textwrap.dedent(
    """
    import resource, sys
    import jax, numpy as np, jaxstow

    path, mode = sys.argv[1], sys.argv[2]
    tree = {f"layer{i}": np.full((512, 1024), i, np.float32) for i in range(64)}  # 128 MiB
    jaxstow.save(path, tree)
    del tree
    jaxstow.load(path, select=["layer0"])  # every code path warmed up
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    restored = jaxstow.load(path, as_numpy=mode == "numpy")
    jax.block_until_ready(restored)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert all(float(restored[f"layer{i}"][3, 5]) == i for i in range(64))
    print(peak - base, sum(leaf.nbytes for leaf in jax.tree.leaves(restored)))
    """
)


@pytest.mark.parametrize("mode", ["jax", "numpy"])
def test_restore_memory_peaks_at_the_tree_plus_64_mib(tmp_path, mode):
    result = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(tmp_path / "tree.jxs"), mode], capture_output=True, text=True, check=True
    )
    grown, tree_bytes = map(int, result.stdout.split())
    assert tree_bytes == 128 << 20
    assert grown <= tree_bytes + (64 << 20), f"restoring {tree_bytes} bytes grew the process by {grown}"
