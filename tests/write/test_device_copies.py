"""What a save holds on the device: no second copy of the arrays it saves (none within the host budget, one piece at a
time beyond it), and arrays donated to a jitted step as soon as the save returns are saved as they were, sharded
arrays and multi-item steps included. CPU arrays are taken down the accelerator's path (``as_if_on_an_accelerator``),
where jax deletes a donated array; the device's memory is then the process's, measured in fresh processes."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxstow
from jaxstow._util import pinned
from jaxstow._write import host_budget

_KIB = 1 << 10
_MIB = 1 << 20


def _device_bytes() -> int:
    """The bytes of the distinct buffers of every live jax array in device memory (an alias of a buffer counted once;
    copies in ``pinned_host`` memory are the host's)."""
    buffers = {}
    for array in jax.live_arrays():
        if not array.is_deleted() and array.sharding.memory_kind in (None, "device"):
            for shard in array.addressable_shards:
                buffers[shard.data.unsafe_buffer_pointer()] = shard.data.nbytes
    return sum(buffers.values())


class _Watching(io.BytesIO):
    """A sink that notes, at each write, how many bytes the live jax arrays hold."""

    def __init__(self) -> None:
        super().__init__()
        self.most = 0

    def write(self, data) -> int:
        self.most = max(self.most, _device_bytes())
        return super().write(data)


@pytest.mark.parametrize("limit", [None, 512 * _KIB], ids=["within the budget", "beyond the budget"])
def test_a_save_holds_no_second_copy_of_its_arrays_on_the_device(as_if_on_an_accelerator, limit):
    """Six arrays of 256 KiB (bf16 and f32), saved within the default budget and within 512 KiB (pieces of 128 KiB):
    while the file is written, the device holds the arrays and at most one piece more, never a copy of them."""
    tree = {
        f"w{i}": jnp.full((256, 512 if i % 2 else 256), i, jnp.bfloat16 if i % 2 else jnp.float32) for i in range(6)
    }
    jax.block_until_ready(tree)
    before = _device_bytes()
    sink = _Watching()
    jaxstow.save(sink, tree, host_memory_limit=limit)
    assert sink.most - before <= 128 * _KIB, (sink.most - before, before)
    restored = jaxstow.load(io.BytesIO(sink.getvalue()), as_numpy=True)
    for name, array in tree.items():
        np.testing.assert_array_equal(restored[name], np.asarray(array))


def _on_a_one_device_mesh(array: jax.Array) -> jax.Array:
    """``array`` laid out by a mesh of one device, as every array is under ``jax.set_mesh`` on one GPU."""
    mesh = jax.make_mesh((1,), ("data",), devices=jax.devices()[:1])
    return jax.device_put(array, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data")))


@pytest.mark.parametrize("place", [lambda array: array, _on_a_one_device_mesh], ids=["one device", "one-device mesh"])
def test_a_save_copies_to_the_host_through_the_devices_pinned_host_memory(tmp_path, monkeypatch, place):
    """Where the device has page-locked host memory (a GPU's transfers to it are direct, tens of GB/s, those to
    pageable memory a few), arrays fetched whole and pieces cut on the device alike are copied into it, whether
    the arrays lie on the device itself or on a mesh of that one device."""
    monkeypatch.setattr(host_budget, "_HOST_PLATFORMS", frozenset())
    monkeypatch.setattr(host_budget, "_accelerators_present", lambda: True)
    monkeypatch.setattr(pinned, "PINNED_PLATFORMS", pinned.PINNED_PLATFORMS | {"cpu"})
    kinds, real = [], host_budget._towards_host

    def watched(array):
        moved = real(array)
        kinds.append(moved.sharding.memory_kind)
        return moved

    monkeypatch.setattr(host_budget, "_towards_host", watched)
    tree = {"whole": jnp.arange(4096.0), "cut": jnp.arange(64 * 1024, dtype=jnp.float32).reshape(64, 1024)}
    tree = jax.tree.map(place, tree)
    jaxstow.save(tmp_path / "w.safetensors", tree, host_memory_limit=128 * _KIB)  # "cut" is 256 KiB: in pieces
    # (jax 0.4 gives a CPU device's pinned_host memory as unpinned_host)
    assert len(kinds) == 1 + 8 and set(kinds) <= {"pinned_host", "unpinned_host"}, kinds
    restored = jaxstow.load(tmp_path / "w.safetensors", as_numpy=True)
    for name, array in tree.items():
        np.testing.assert_array_equal(restored[name], np.asarray(array))


@pytest.mark.parametrize(
    ("shape", "dtype"), [((1 << 20,), jnp.bfloat16), ((4096, 1000), jnp.float32), ((3, 700, 1000), jnp.bfloat16)]
)
def test_a_piece_is_cut_on_the_device_with_no_buffer_but_itself(as_if_on_an_accelerator, shape, dtype):
    """The computation that cuts a piece (whole rows of the array) allocates the piece alone, as compiled for the
    device: no flat copy of the array."""
    source = jnp.ones(shape, dtype)
    tensor = host_budget.HostBudget(limit=1 * _MIB).defer(source, copy=False)
    start, stop = tensor._bounds[1]
    compiled = host_budget._rows.lower(
        source, start // tensor._row, lead=tensor._lead, count=(stop - start) // tensor._row
    ).compile()
    memory = compiled.memory_analysis()
    assert memory.output_size_in_bytes == (stop - start) * source.dtype.itemsize <= 256 * _KIB
    assert memory.temp_size_in_bytes == 0


_PEAK = """
import json, sys
import jax, jax.numpy as jnp, numpy as np
import jaxstow
from jaxstow._write import host_budget

host_budget._HOST_PLATFORMS = frozenset()  # the CPU's arrays taken down an accelerator's path
host_budget._accelerators_present = lambda: True

def peak_kib():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))

folder, limit_mib = sys.argv[1], sys.argv[2]
rows = [24576, 24576, 16384]  # 96, 96 and 64 MiB: the first two larger than a budget of 64 MiB
tree = {f"layer{i}": jnp.full((count, 1024), i, jnp.float32) for i, count in enumerate(rows)}
limit = None if limit_mib == "default" else int(limit_mib) << 20
manager = jaxstow.CheckpointManager(folder, host_memory_limit=limit)
manager.save(0, {"state": tree})  # jax, its threads, the programs that cut pieces and the lock settle first
manager.wait()
with open("/proc/self/clear_refs", "w") as refs:
    refs.write("5")  # the peak restarts from what is resident now, the tree included
before = peak_kib()
manager.save(1, {"state": tree})
manager.wait()
extra = (peak_kib() - before) / 1024
restored = manager.restore(1, as_numpy=True)["state"]
same = all(np.all(restored[f"layer{i}"] == i) for i in range(len(rows)))
print(json.dumps({"extra_mib": extra, "same": same}))
"""


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="measures the CPU taken as an accelerator")
@pytest.mark.parametrize("limit", ["default", "64"])
def test_a_save_from_an_accelerator_peaks_at_its_budget_not_at_a_copy(tmp_path, limit):
    """A 256 MiB tree on the (CPU taken as an) accelerator: within the default budget the device-to-host copies are
    views here and the save costs next to nothing; within 64 MiB, the arrays larger than the budget are cut in pieces
    on the device, and what the save holds is the budget's. A copy of the tree on the device, even for a moment,
    would cost 256 MiB more."""
    # glibc's malloc keeps freed blocks of a piece's size in its heap once it has freed one (its mmap threshold
    # adapts); a fixed threshold gives them back, so that the peak counts what the save holds, not what malloc keeps.
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_PEAK), str(tmp_path / limit), limit],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
        env={**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 * _MIB)},
    )
    measured = json.loads(result.stdout.splitlines()[-1])
    assert measured["same"]
    budget_mib = 0 if limit == "default" else int(limit)
    assert measured["extra_mib"] <= budget_mib + 8, measured


@pytest.mark.parametrize("tiers", [False, True], ids=["one folder", "local tier"])
@pytest.mark.parametrize("limit", [None, 16 * _KIB], ids=["within the budget", "beyond the budget"])
def test_every_item_of_a_step_donated_right_after_the_save_is_saved_as_it_was(
    tmp_path, as_if_on_an_accelerator, limit, tiers
):
    """A step of several items: the budget counts them all before save returns, so that none is read after, even
    where each item is encoded once the one before it is written (a local tier)."""
    items = {"big": {"w": jnp.arange(1 << 21, dtype=jnp.float32)}}
    items |= {f"item{i}": {"w": jnp.arange(4096.0) + i, "key": jax.random.key(i)} for i in range(4)}
    expected = {name: np.array(item["w"]) for name, item in items.items()}
    step = jax.jit(
        lambda tree: jax.tree.map(lambda x: x * 0 - 7 if x.dtype == jnp.float32 else x, tree), donate_argnums=0
    )
    local = {"local_directory": tmp_path / "local"} if tiers else {}
    with jaxstow.CheckpointManager(tmp_path / "run", host_memory_limit=limit, **local) as manager:
        manager.save(0, items)
        items = step(items)
        manager.wait()
        restored = manager.restore(0, as_numpy=True)
    assert float(items["item0"]["w"][0]) == -7
    for name, array in expected.items():
        np.testing.assert_array_equal(restored[name]["w"], array)
    np.testing.assert_array_equal(jax.random.key_data(restored["item2"]["key"]), jax.random.key_data(jax.random.key(2)))


@pytest.mark.parametrize("limit", [None, 16 * _KIB], ids=["within the budget", "beyond the budget"])
@pytest.mark.parametrize("accelerator", [False, True], ids=["cpu", "as if on an accelerator"])
def test_sharded_arrays_donated_right_after_a_save_are_saved_as_they_were(tmp_path, monkeypatch, accelerator, limit):
    """Sharded arrays, split or replicated: on the host a view of each shard keeps a donation from reusing it; on an
    accelerator each shard is brought to the host within the budget, and the save returns once the rest fits in it.
    The item before them takes a while to write."""
    if accelerator:
        monkeypatch.setattr(host_budget, "_HOST_PLATFORMS", frozenset())
        monkeypatch.setattr(host_budget, "_accelerators_present", lambda: True)
    mesh = jax.make_mesh((len(jax.devices()),), ("x",))
    split, copied = (jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*axes)) for axes in (("x",), ()))

    def made(value: float) -> dict[str, jax.Array]:
        return {
            "split": jax.device_put(jnp.arange(1 << 16, dtype=jnp.float32) + value, split),
            "copied": jax.device_put(jnp.arange(1 << 14, dtype=jnp.float32) - value, copied),
        }

    items = {"first": {"w": np.ones(64 * _MIB, np.uint8)}, "sharded": made(0)}
    step = jax.jit(lambda tree: jax.tree.map(lambda x: x * 0 - 7, tree), donate_argnums=0)
    jax.block_until_ready(step(made(1)))  # compiled now
    local = jaxstow.LocalTier(tmp_path / "local")
    with jaxstow.CheckpointManager(tmp_path / "run", local=local, host_memory_limit=limit) as manager:
        manager.save(0, items)
        items["sharded"] = step(items["sharded"])
        manager.wait()
        restored = manager.restore(0, as_numpy=True)
    assert np.all(np.asarray(items["sharded"]["split"]) == -7)
    np.testing.assert_array_equal(restored["sharded"]["split"], np.arange(1 << 16, dtype=np.float32))
    np.testing.assert_array_equal(restored["sharded"]["copied"], np.arange(1 << 14, dtype=np.float32))


def test_sharded_arrays_deleted_right_after_an_asynchronous_save_are_saved_as_they_were(tmp_path):
    """``save`` returns once the arrays are held: the caller may then delete them (``x.delete()``, as a loop that frees
    its device memory does), and the writer, still busy with the item before them, saves them as they were."""
    mesh = jax.make_mesh((len(jax.devices()),), ("x",))
    split, copied = (jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*axes)) for axes in (("x",), ()))
    items = {
        "first": {"w": np.ones(64 * _MIB, np.uint8)},
        "sharded": {
            "split": jax.device_put(jnp.arange(1 << 16, dtype=jnp.float32), split),
            "replicated": jax.device_put(jnp.arange(1 << 10, dtype=jnp.int32), copied),
        },
    }
    with jaxstow.CheckpointManager(tmp_path / "run") as manager:
        manager.save(0, items)
        for array in jax.tree.leaves(items["sharded"]):
            array.delete()
        jax.block_until_ready([jnp.full(1 << 16, -7.0) for _ in range(8)])  # new arrays, where the deleted ones were
        manager.wait()
        restored = manager.restore(0, as_numpy=True)
    np.testing.assert_array_equal(restored["sharded"]["split"], np.arange(1 << 16, dtype=np.float32))
    np.testing.assert_array_equal(restored["sharded"]["replicated"], np.arange(1 << 10, dtype=np.int32))
