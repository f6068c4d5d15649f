"""A save by several processes within the host budget: every process's shards come to the host piece by piece, the
part of a shared shard (one that several processes hold) that a process writes too, and the prints that the holders
of a shared shard compare are read piece by piece; measured in a real ``jax.distributed`` run of two processes
(``tests/distributed/budget_worker.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from distributed_runs import launch, reports

from jaxstow._format.checksum import checksum
from jaxstow._format.replicas import replica_print
from jaxstow._write import host_budget

_KIB = 1 << 10
WORKER = Path(__file__).parents[1] / "distributed" / "budget_worker.py"


@pytest.mark.parametrize(
    ("shape", "within"),
    [((64, 1024), (slice(32, 64), slice(None))), ((1, 96, 700), (slice(None), slice(0, 48), slice(None)))],
)
def test_the_part_of_a_shard_a_process_writes_comes_in_pieces_cut_on_its_device(as_if_on_an_accelerator, shape, within):
    """A process's half of a shard of 256 KiB, under a budget of 64 KiB: pieces of whole rows of the half, each cut on
    the device by a computation whose only buffer is the piece; the bytes are the half's."""
    source = jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape)
    budget = host_budget.HostBudget(limit=64 * _KIB)
    tensor = budget.defer(source, copy=False, within=within)
    assert tensor is not None and tensor.shape == np.asarray(source)[within].shape
    pieces = [np.array(piece) for piece in tensor.written()]
    assert len(pieces) > 1 and max(piece.nbytes for piece in pieces) <= 16 * _KIB
    expected = np.ascontiguousarray(np.asarray(source)[within])
    np.testing.assert_array_equal(np.concatenate(pieces), expected.reshape(-1))
    assert tensor.digest() == checksum(expected)
    assert budget.peak <= 64 * _KIB and budget.fetched.is_set()
    start, stop = tensor._bounds[1]
    cut = host_budget._rows.lower(
        source, start // tensor._row, lead=tensor._lead, count=(stop - start) // tensor._row, within=tensor._within
    ).compile()
    memory = cut.memory_analysis()
    assert memory.output_size_in_bytes == (stop - start) * 4 and memory.temp_size_in_bytes == 0


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((1000,), jnp.float32), ((3, 70, 1000), jnp.bfloat16), ((257, 129), jnp.int32), ((5, 7), jnp.int8)],
)
def test_a_shared_shard_printed_piece_by_piece_prints_as_its_host_copy(
    as_if_on_an_accelerator, monkeypatch, shape, dtype
):
    """The print the holders of a shard compare, read from the device in pieces of a 4 KiB budget (windows that
    start inside an element too), or at once within a large one, is the one of its bytes on the host: holders of
    either kind compare alike."""
    source = (jax.random.normal(jax.random.key(0), shape) * 100).astype(dtype)
    budget = host_budget.HostBudget(limit=4 * _KIB)
    brought = []
    towards_host = host_budget._towards_host
    monkeypatch.setattr(host_budget, "_towards_host", lambda array: brought.append(array.nbytes) or towards_host(array))
    printed = budget.replica_print(source)
    assert printed == replica_print(np.asarray(source))
    assert 0 < max(brought) <= budget.piece_bytes, brought
    brought.clear()
    assert host_budget.HostBudget().replica_print(source) == printed  # the default budget: in one piece
    assert sum(brought) <= 2 * min(source.nbytes, 64 * _KIB), brought  # the bytes printed, not a piece's worth
    assert budget.replica_print(source.at[(0,) * len(shape)].add(1)) != printed
    assert host_budget.HostBudget(limit=4 * _KIB).replica_print(np.ones(3)) is None  # on the host: read there


def test_every_process_of_a_save_holds_at_most_its_budget(tmp_path):
    """Two processes save 64 MiB split over their devices and 2 parameters of 8 MiB copied on each within 8 MiB,
    then make the next step's arrays in place of these (the storage slower than that): each holds at most the
    budget. Reading its shards whole held all 48 MiB in the second process, and the copies the processes compare,
    whole (16 MiB), in the first."""
    env = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}  # freed pieces go back to the system, not to malloc's heap
    found = reports(launch(WORKER, 2, lambda index, port: [str(index), "2", str(port), str(tmp_path), "8"], env=env))
    for report in found:
        assert report["same"], report
        assert report["extra_mib"] <= 8 + 4, report  # the budget, and the interpreter's own allocations
    assert json.loads((tmp_path / "1" / "checkpoint.json").read_text())
