"""A save's host-memory budget: arrays that cost host memory (on an accelerator, or numpy arrays to copy) are written
piece by piece within ``host_memory_limit``; the caller's arrays may change, or be donated, as soon as the save
returns; peak host memory is measured in fresh processes."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxstow
from jaxstow._write import host_budget
from jaxstow.errors import ArgumentError

_MIB = 1 << 20

_PEAK = """
import json, os, sys
import numpy as np
import jaxstow

def peak_kib():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))

folder, tree_mib, limit_mib = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rng = np.random.default_rng(0)
tree = {f"layer{i}": rng.standard_normal((tree_mib // 8) << 18, dtype=np.float32) for i in range(8)}
limit = None if limit_mib == "default" else int(limit_mib) << 20
manager = jaxstow.CheckpointManager(folder, host_memory_limit=limit)
manager.save(0, {"w": np.zeros(4)})  # jax, threads and the lock settle before the measure
manager.wait()
with open("/proc/self/clear_refs", "w") as refs:
    refs.write("5")  # the peak restarts from what is resident now
before = peak_kib()
manager.save(1, tree, copy=True)
for array in tree.values():
    array[:] = -1  # the caller changes its buffers as soon as the save returns
manager.wait()
extra = (peak_kib() - before) / 1024
restored = manager.restore(1, as_numpy=True)
rng = np.random.default_rng(0)
same = all(np.array_equal(restored[name], rng.standard_normal(array.size, dtype=np.float32))
           for name, array in tree.items())
print(json.dumps({"extra_mib": extra, "same": same}))
"""


def _peak(tmp_path, tree_mib: int, limit: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_PEAK), str(tmp_path / limit), str(tree_mib), limit],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return json.loads(result.stdout.splitlines()[-1])


def test_a_copying_save_holds_at_most_its_budget_on_the_host(tmp_path):
    budgeted = _peak(tmp_path, tree_mib=256, limit="32")
    unbounded = _peak(tmp_path, tree_mib=256, limit="default")
    assert budgeted["same"] and unbounded["same"], "a buffer changed after save returned reached the file"
    assert budgeted["extra_mib"] <= 32 + 8, budgeted  # the budget, and a piece the writer is done with
    assert unbounded["extra_mib"] >= 0.9 * 256, unbounded  # the whole tree copied when it fits the default budget


@pytest.fixture
def as_if_on_an_accelerator(monkeypatch):
    """CPU jax arrays taken down the path of accelerator arrays: fetched to the host in pieces by the writer."""
    monkeypatch.setattr(host_budget, "_HOST_PLATFORMS", frozenset())
    monkeypatch.setattr(host_budget, "_accelerators_present", lambda: True)


def test_arrays_donated_right_after_a_budgeted_save_are_saved_as_they_were(tmp_path, as_if_on_an_accelerator):
    params = {f"w{i}": jnp.arange(4096.0) + i for i in range(6)}  # 96 KiB, the budget 16 KiB
    expected = jax.tree.map(np.asarray, params)
    expected = jax.tree.map(np.copy, expected)
    step = jax.jit(lambda tree: jax.tree.map(lambda x: x * 0 - 7, tree), donate_argnums=0)
    with jaxstow.CheckpointManager(tmp_path, host_memory_limit=16 << 10) as manager:
        manager.save(0, params)
        params = step(params)
        manager.wait()
        restored = manager.restore(0, as_numpy=True)
    np.testing.assert_array_equal(params["w0"], np.full(4096, -7.0))
    for name, array in expected.items():
        np.testing.assert_array_equal(restored[name], array)


def test_arrays_donated_after_a_save_on_cpu_are_saved_as_they_were(tmp_path):
    params = {"w": jnp.arange(1 << 16, dtype=jnp.float32), "b": jnp.ones(3)}
    step = jax.jit(lambda tree: jax.tree.map(lambda x: x + 1, tree), donate_argnums=0)
    with jaxstow.CheckpointManager(tmp_path, host_memory_limit=1024) as manager:
        manager.save(0, params)
        params = step(params)
        manager.wait()
        restored = manager.restore(0, as_numpy=True)
    np.testing.assert_array_equal(restored["w"], np.arange(1 << 16, dtype=np.float32))
    np.testing.assert_array_equal(params["b"], np.full(3, 2.0))


class _Unseekable(io.RawIOBase):
    """A sink that cannot go back to its header, as an object store's upload."""

    def __init__(self) -> None:
        self.buffer = io.BytesIO()

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        return self.buffer.write(data)


@pytest.mark.parametrize("sink", [io.BytesIO, _Unseekable])
def test_a_save_in_pieces_is_checksummed_like_a_whole_one(sink, as_if_on_an_accelerator):
    tree = {"w": jnp.arange(10_000, dtype=jnp.bfloat16), "i": jnp.arange(999, dtype=jnp.int8), "n": 3}
    target = sink()
    jaxstow.save(target, tree, host_memory_limit=4096)
    whole = io.BytesIO()
    jaxstow.save(whole, tree)
    data = target.getvalue() if isinstance(target, io.BytesIO) else target.buffer.getvalue()
    assert data == whole.getvalue()
    restored = jaxstow.load(io.BytesIO(data))
    np.testing.assert_array_equal(np.asarray(restored["w"]), np.asarray(tree["w"]))


@pytest.mark.parametrize("limit", [0, -1, 1.5, True, "1G"])
def test_a_host_memory_limit_must_be_a_positive_number_of_bytes(tmp_path, limit):
    with pytest.raises(ArgumentError, match="host_memory_limit"):
        jaxstow.save(tmp_path / "a.safetensors", {"w": np.ones(2)}, host_memory_limit=limit)
    with pytest.raises(ArgumentError, match="host_memory_limit"):
        jaxstow.CheckpointManager(tmp_path / "run", host_memory_limit=limit)
