"""One ``io.save`` strategy used for many runs, as a sampler that runs in batches or a notebook that samples again uses
it: each run gets chains of its own, its samples are handed over whole, and the strategy and its collector keep none
of them, so that the process stays the size of one run and each run writes into memory the run before it touched.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap

import forked
import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io, scheduler
from jaxstow.cli import watch
from jaxstow.errors import CheckpointError, CollectorError
from jaxstow.io import batching, host_buffers
from jaxstow.io.live import read_draws

STEPS = 64
INFORMATION = scheduler.static_information(samples_collected=STEPS)


def _step(save, state, t):
    sample = {"w": jnp.sin(jnp.arange(300.0) + t), "t": t}
    return save(state, True, sample)[0], sample


def _compiled(save):
    return jax.jit(lambda state: jax.lax.scan(lambda s, t: _step(save, s, t), state, jnp.arange(float(STEPS))))


def _check(result, outputs):
    np.testing.assert_array_equal(np.asarray(result["samples"]["w"][:]), np.asarray(outputs["w"]))
    np.testing.assert_array_equal(np.asarray(result["samples"]["t"][:]), np.asarray(outputs["t"]))


_MANY_RUNS = """
import json, resource, sys
import jax, jax.numpy as jnp, numpy as np
from jaxstow import io, scheduler

kind, folder = sys.argv[1], sys.argv[2]
steps, width = 2000, 1000   # 8 MB of samples a run
collector = io.MemoryCollector() if kind == "memory" else io.HDF5Collector(folder + "/samples.h5")
init_save, save, postprocess_save = io.save(collector, block_size=256)
information = scheduler.static_information(samples_collected=steps)

def step(state, t):
    sample = {"w": jnp.cos(jnp.arange(float(width)) + t), "t": t}
    return save(state, True, sample)[0], None

run = jax.jit(lambda state: jax.lax.scan(step, state, jnp.arange(float(steps)))[0], donate_argnums=0)

def resident():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096

sizes, addresses = [], set()
for index in range(100):
    result = postprocess_save(run(init_save({"w": jnp.zeros(width), "t": 0.0}, None, information)), None)
    assert int(result["sample_count"]) == steps and list(result["samples"]["t"][[0, -1]]) == [0, steps - 1]
    addresses.add(result["samples"]["w"].__array_interface__["data"][0])
    del result
    sizes.append(resident())
print(json.dumps({"sizes": sizes, "addresses": len(addresses), "chains": collector.chain_count if kind == "memory" else None}))
"""


@pytest.mark.timeout(600)
@pytest.mark.parametrize("kind", ["memory", "hdf5"])
def test_a_strategy_used_for_100_runs_stays_the_size_of_one_run(kind, tmp_path) -> None:
    """Each run keeps 8 MB of samples and drops them: the process must not grow by a run's samples per run (800 MB
    over the runs), nor by a tenth of them."""
    ran = forked.run(
        [sys.executable, "-c", textwrap.dedent(_MANY_RUNS), kind, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert ran.returncode == 0, ran.stderr
    report = json.loads(ran.stdout.splitlines()[-1])
    sizes = report["sizes"]
    run_bytes = 2000 * 1000 * 4
    assert max(sizes[10:]) - sizes[10] < 3 * run_bytes, [size >> 20 for size in sizes]  # a leak: +720 MB by now
    assert sizes[-1] - sizes[10] < run_bytes // 10 * 9 + (8 << 20), [size >> 20 for size in sizes]
    if kind == "memory":
        assert report["addresses"] <= 2, "each run should write into the storage the run before gave back"
        assert report["chains"] == 100
    else:
        with h5py.File(tmp_path / "samples.h5", "r") as file:
            assert [file[f"chain~{chain}"].attrs["sample_count"] for chain in (0, 99)] == [2000, 2000]
            assert list(file["draws_done"][:]) == [2000] * 100


def test_each_run_of_a_reused_strategy_writes_into_the_memory_of_the_run_before() -> None:
    """The blocks are read in place from the run's buffer and copied into storage the run before gave back: a run
    first-touches none of its samples' pages (a fresh run would fault in every one of its 4 MB)."""
    host_buffers.release()
    init_save, save, postprocess_save = io.save(io.MemoryCollector(), block_size=256)
    steps = 4096
    information = scheduler.static_information(samples_collected=steps)

    def step(state, t):
        return save(state, True, {"w": jnp.arange(256.0) + t})[0], None

    run = jax.jit(lambda state: jax.lax.scan(step, state, jnp.arange(float(steps)))[0], donate_argnums=0)
    faults, addresses = [], set()
    for _ in range(5):
        state = init_save({"w": jnp.zeros(256)}, None, information)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        samples = postprocess_save(run(state), None)["samples"]["w"]
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        addresses.add(samples.__array_interface__["data"][0])
        np.testing.assert_array_equal(samples[:, 0], np.arange(steps, dtype=np.float32))
        del samples
    assert len(addresses) == 1
    pages = steps * 256 * 4 // 4096
    assert max(faults[2:]) < pages // 4, faults  # allocator noise only; a fresh copy of the samples is 1024 pages


@pytest.mark.parametrize("form", ["path", "open file"])
def test_the_next_run_of_an_hdf5_collector_goes_on_in_its_file_with_chains_of_its_own(form, tmp_path) -> None:
    path = tmp_path / "samples.h5"
    file = h5py.File(path, "w", libver="latest") if form == "open file" else None
    collector = io.HDF5Collector(file if file is not None else path)
    init_save, save, postprocess_save = io.save(collector, block_size=16)
    run = _compiled(save)
    results, outputs = [], []
    for _ in range(3):
        final, kept = run(init_save({"w": jnp.zeros(300), "t": 0.0}, None, INFORMATION))
        results.append(postprocess_save(final, None))
        outputs.append(kept)
        if file is None:
            assert not os.path.exists(f"{path}.lock")  # closed between runs: another process may write it then
    for result, kept in zip(results, outputs, strict=True):
        _check(result, kept)
    if file is not None:
        file.close()
    with h5py.File(path, "r") as done:
        assert sorted(done) == ["chain~0", "chain~1", "chain~2", "draws_done"]
        assert list(done["draws_done"][:]) == [STEPS] * 3
        np.testing.assert_array_equal(done["chain~2/w"][:], np.asarray(outputs[2]["w"]))
    assert io.to_inference_data(path).posterior.sizes["chain"] == 3


def test_a_file_deleted_between_runs_is_started_anew_and_counts_the_chains_it_holds_only(tmp_path) -> None:
    """The next run goes on numbering its chains in the file made again; its /draws_done counted the earlier run's
    chain 0 ([64, 64]) that the file does not hold, and watch called its /chain~1 chain 0."""
    path = tmp_path / "samples.h5"
    init_save, save, postprocess_save = io.save(io.HDF5Collector(path), block_size=16)
    run = _compiled(save)
    postprocess_save(run(init_save({"w": jnp.zeros(300), "t": 0.0}, None, INFORMATION))[0], None)
    os.remove(path)
    final, kept = run(init_save({"w": jnp.zeros(300), "t": 0.0}, None, INFORMATION))
    _check(postprocess_save(final, None), kept)
    with h5py.File(path, "r") as done:
        assert sorted(done) == ["chain~1", "draws_done"]
        assert list(done["draws_done"][:]) == [0, STEPS]
    draws = read_draws(path)
    assert (draws.ids, draws.done, draws.finished) == ([1], [STEPS], True)
    assert watch.report(str(path))["chains"] == [{"chain": 1, "draws": STEPS, "finished": True}]
    posterior = io.to_inference_data(path).posterior
    np.testing.assert_array_equal(posterior["w"].values[0], np.asarray(kept["w"]))


def test_an_open_file_closed_by_the_user_between_runs_is_a_collector_error_saying_what_to_do(tmp_path) -> None:
    file = h5py.File(tmp_path / "samples.h5", "w", libver="latest")
    init_save, save, postprocess_save = io.save(io.HDF5Collector(file), block_size=16)
    final, kept = _compiled(save)(init_save({"w": jnp.zeros(300), "t": 0.0}, None, INFORMATION))
    postprocess_save(final, None)
    file.close()  # as jax_sgmc's examples do once a run is saved
    with pytest.raises(
        CollectorError, match=r"samples\.h5 given to HDF5Collector was closed.*give HDF5Collector the path"
    ):
        init_save({"w": jnp.zeros(300), "t": 0.0}, None, INFORMATION)
    with h5py.File(tmp_path / "samples.h5", "r") as done:  # the first run is intact
        np.testing.assert_array_equal(done["chain~0/w"][:], np.asarray(kept["w"]))


def test_an_open_file_closed_by_the_user_before_postprocess_save_is_a_collector_error_saying_what_to_do(tmp_path):
    file = h5py.File(tmp_path / "samples.h5", "w", libver="latest")
    init_save, save, postprocess_save = io.save(io.HDF5Collector(file), block_size=16)
    final, _ = _compiled(save)(init_save({"w": jnp.zeros(300), "t": 0.0}, None, INFORMATION))
    file.close()  # too early: the run's last rows are still to be written
    with pytest.raises(
        CollectorError,
        match=r"samples\.h5 given to HDF5Collector was closed while its run went on: keep the file open until "
        r"postprocess_save returns, or give HDF5Collector the path",
    ):
        postprocess_save(final, None)


@pytest.mark.parametrize("replaced_by", ["another program's file", "a damaged file"])
def test_a_file_replaced_between_runs_is_refused_and_left_as_it_is(replaced_by, tmp_path) -> None:
    path = tmp_path / "samples.h5"
    init_save, save, postprocess_save = io.save(io.HDF5Collector(path), block_size=16)
    postprocess_save(_compiled(save)(init_save({"w": jnp.zeros(300), "t": 0.0}, None, INFORMATION))[0], None)
    if replaced_by == "a damaged file":
        os.truncate(path, 100)
        expected = r"samples\.h5 cannot be read as an HDF5 file \(.*\): the file is damaged.*move it away"
    else:
        path.unlink()
        with h5py.File(path, "w") as theirs:
            theirs["mine"] = np.arange(3)
        expected = r"samples\.h5 holds HDF5 data that no jaxstow collector wrote \(\['mine'\]\)"
    before = path.read_bytes()
    with pytest.raises(CollectorError, match=expected):
        init_save({"w": jnp.zeros(300), "t": 0.0}, None, INFORMATION)
    assert path.read_bytes() == before


def test_a_run_cut_short_after_a_finished_one_says_how_to_start_over(tmp_path) -> None:
    path = tmp_path / "samples.h5"
    information = scheduler.static_information(samples_collected=8)
    collector = io.HDF5Collector(path)
    init_save, save, postprocess_save = io.save(collector, checkpoint_every=2, block_size=2)
    step = lambda t, state: save(state, True, {"w": 1.0 * t}, solver_state=0.0)[0]  # noqa: E731
    run = jax.jit(lambda state: jax.lax.fori_loop(0, 4, step, state))
    postprocess_save(run(init_save({"w": 0.0}, 0.0, information)), None)  # chain~0, finished
    jax.block_until_ready(run(init_save({"w": 0.0}, 0.0, information)))  # chain~1: checkpointed, never finished
    collector.close()  # as a kill leaves it
    init_save, _, _ = io.save(io.HDF5Collector(path), checkpoint_every=2, block_size=2)  # the script run again
    expected = (
        r"finished run at /chain~0.*checkpoint holds \(\[1\]\); use another file, or delete .*samples\.h5 and its"
    )
    with pytest.raises(CollectorError, match=expected + r" checkpoint .*to start over"):
        init_save({"w": 0.0}, 0.0, information)


def test_a_collector_whose_file_another_process_took_between_runs_names_it(tmp_path) -> None:
    path = tmp_path / "samples.h5"
    init_save, save, postprocess_save = io.save(io.HDF5Collector(path), block_size=16)
    postprocess_save(_compiled(save)(init_save({"w": jnp.zeros(300), "t": 0.0}, None, INFORMATION))[0], None)
    taking = forked.Popen(
        [sys.executable, "-c", f"import sys, time; from jaxstow import io; w = io.HDF5Collector({str(path)!r}); "
         "print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert taking.stdout is not None and taking.stdout.readline().strip() == "held"
        with pytest.raises(CheckpointError, match=rf"{path.name} is being written by another run \(process"):
            init_save({"w": jnp.zeros(300), "t": 0.0}, None, INFORMATION)
    finally:
        taking.kill()
        taking.wait()


def test_a_jit_compiled_init_save_called_again_is_refused_and_the_first_run_is_kept() -> None:
    """init_save inside jit registers its chains when traced: a second call of the compiled function would write into
    the chains of the first run, whose samples the caller holds."""
    collector = io.MemoryCollector()
    init_save, save, postprocess_save = io.save(collector, block_size=16)

    @jax.jit
    def run(offset):
        state = init_save({"w": jnp.zeros(300), "t": 0.0}, None, INFORMATION)
        return jax.lax.scan(lambda s, t: _step(save, s, t + offset), state, jnp.arange(float(STEPS)))

    first, kept = run(0.0)
    held = postprocess_save(first, None)
    again, _ = run(100.0)
    with pytest.raises(CollectorError, match=r"chain 0 of this run ran already.*call init_save for every run, outside"):
        postprocess_save(again, None)
    _check(held, kept)  # the second run wrote nothing into the first run's samples
    outside = init_save({"w": jnp.zeros(300), "t": 0.0}, None, INFORMATION)  # the way: a state per run
    final, kept = _compiled(save)(outside)
    _check(postprocess_save(final, None), kept)
    assert collector.chain_count == 2


def test_a_subclass_that_stores_blocks_its_own_way_gets_copies_it_may_keep_on_every_run() -> None:
    class Keeping(io.MemoryCollector):
        """Keeps the arrays it is handed, as the DataCollector contract allows."""

        def __init__(self) -> None:
            super().__init__()
            self.kept: list[np.ndarray] = []

        def save(self, chain_id, first, values):
            self.kept.append(values[0])  # the leaf "t"
            super().save(chain_id, first, values)

    collector = Keeping()
    init_save, save, postprocess_save = io.save(collector, block_size=16)
    run = _compiled(save)
    for _ in range(2):
        final, kept = run(init_save({"w": jnp.zeros(300), "t": 0.0}, None, INFORMATION))
        _check(postprocess_save(final, None), kept)
    blocks = np.concatenate(collector.kept)  # had they been views of the run's buffer, the last block everywhere
    np.testing.assert_array_equal(blocks, np.tile(np.arange(STEPS, dtype=np.float32), 2))


def _run_of(init_save, save, postprocess_save, width, collected, steps=16):
    """A run of samples of ``width`` float32 numbers; its blocks' shape, and its samples against the scan's."""
    state = init_save({"w": jnp.zeros(width)}, None, scheduler.static_information(samples_collected=collected))
    rows, *sample = state.buffer["w"].shape  # a ring of two blocks
    shape = (rows // 2, *sample)

    def step(state, t):
        sample = {"w": jnp.full(width, t)}
        return save(state, True, sample)[0], sample

    state, outputs = jax.jit(lambda state: jax.lax.scan(step, state, jnp.arange(float(steps))))(state)
    np.testing.assert_array_equal(postprocess_save(state, None)["samples"]["w"][:], outputs["w"])
    return shape


def test_each_run_of_a_reused_strategy_gets_blocks_of_its_own_samples_size() -> None:
    reused = io.save(io.MemoryCollector())
    assert _run_of(*reused, width=1, collected=None) == (1 << 16, 1)  # scalars: the most rows a block takes
    second = _run_of(*reused, width=1024, collected=16)  # 4 KiB samples, 16 of them
    assert second == _run_of(*io.save(io.MemoryCollector()), width=1024, collected=16)
    assert int(np.prod(second)) * 4 <= batching.BLOCK_BYTES
    big = _run_of(*reused, width=1 << 16, collected=None, steps=20)  # 256 KiB samples: 4 to a block of 1 MiB
    assert big == (4, 1 << 16)


def test_a_block_size_given_serves_every_run_and_the_chains_of_one_run_share_theirs() -> None:
    fixed = io.save(io.MemoryCollector(), block_size=8)
    assert _run_of(*fixed, width=1, collected=None) == (8, 1)
    assert _run_of(*fixed, width=1024, collected=16) == (8, 1024)
    init_save, save, postprocess_save = io.save(io.MemoryCollector())
    states = [  # chains of one run, registered one by one with counts of their own: their states stack
        init_save({"w": jnp.zeros(3)}, None, scheduler.static_information(samples_collected=count))
        for count in (4096, 64)
    ]
    assert states[0].buffer["w"].shape == states[1].buffer["w"].shape
    state = jax.tree.map(lambda *leaves: jnp.stack(leaves), *states)
    state = jax.jit(jax.vmap(lambda s: save(s, True, {"w": jnp.ones(3)})[0]))(state)
    assert [int(result["sample_count"]) for result in postprocess_save(state, None)] == [1, 1]


def test_a_state_given_to_another_strategys_save_reaches_its_own_collector():
    """Two strategies alive at once: the first's state passed to the second's save by mistake. Its samples reach its
    own collector all the same, and none of them the other's."""
    information = scheduler.static_information(samples_collected=None)
    init_a, _, post_a = io.save(io.MemoryCollector(), block_size=2)
    init_b, save_b, post_b = io.save(io.MemoryCollector(), block_size=2)

    def run(state):
        return jax.lax.scan(
            lambda s, i: (save_b(s, True, {"x": i.astype(jnp.float32)})[0], None), state, jnp.arange(5)
        )[0]

    earlier = jax.jit(run)(init_b({"x": jnp.float32(0)}, None, information))
    state = jax.jit(run)(init_a({"x": jnp.float32(0)}, None, information))  # a's state, b's save
    np.testing.assert_array_equal(post_b(earlier, None)["samples"]["x"], np.arange(5))
    np.testing.assert_array_equal(post_a(state, None)["samples"]["x"], np.arange(5))


def test_a_collector_of_jax_sgmcs_interface_that_gives_a_finished_chains_id_again_gets_the_new_runs_samples():
    """A collector written to jax_sgmc's interface, one sample a call, whose ids restart once a run's chains are handed
    over: the second run, chain 0 again, got none of its samples (its sample_count 8)."""

    class Rows(io.DataCollector):
        def __init__(self) -> None:
            self.rows: dict[int, list[np.ndarray]] = {}

        def register_data_loader(self, data_loader): ...
        def checkpoint(self, chain_id, state): ...
        def finalize(self, chain_id): ...
        def resume(self):
            return {}

        def register_chain(self, init_sample=None, init_checkpoint=None, static_information=None):
            chain_id = len(self.rows)  # the first id free
            self.rows[chain_id] = []
            return chain_id

        def save(self, chain_id, values):
            self.rows[chain_id].append(np.array(values[1]))  # the leaf "w"

        def finished(self, chain_id):
            return np.array(self.rows.pop(chain_id))

    init_save, save, postprocess_save = io.save(Rows(), block_size=16)
    run = jax.jit(lambda state, offset: jax.lax.scan(lambda s, t: _step(save, s, t + offset), state, jnp.arange(8.0)))
    for offset in (0.0, 100.0):  # each run's samples its own: none of the run before
        final, kept = run(init_save({"w": jnp.zeros(300), "t": 0.0}, None, INFORMATION), offset)
        np.testing.assert_array_equal(postprocess_save(final, None)["samples"], np.asarray(kept["w"]))


@pytest.mark.parametrize("meanwhile", ["deleted", "replaced by another run's file", "replaced by other HDF5 data"])
def test_a_file_deleted_or_replaced_before_postprocess_save_is_a_collector_error_saying_so(meanwhile, tmp_path):
    """The collector given a path writes the run into the file it opened, then reads the samples back from the path:
    a file in its place since gave the samples of another file's chain 0 or h5py's KeyError, and none a "no such
    file" that said nothing of what happened."""
    path = tmp_path / "samples.h5"
    init_save, save, postprocess_save = io.save(io.HDF5Collector(path), block_size=16)
    final, _ = _compiled(save)(init_save({"w": jnp.zeros(300), "t": 0.0}, None, INFORMATION))
    jax.block_until_ready(final)
    path.unlink()
    if meanwhile == "replaced by another run's file":  # its chain 0 has the samples' structure
        with h5py.File(path, "w") as theirs:
            theirs.attrs["jaxstow_run_id"] = "0" * 32
            theirs["chain~0/w"] = np.ones((STEPS, 300), np.float32)
            theirs["chain~0/t"] = np.ones(STEPS, np.float32)
    elif meanwhile == "replaced by other HDF5 data":
        with h5py.File(path, "w") as theirs:
            theirs["mine"] = np.arange(3)
    before = path.read_bytes() if path.exists() else None
    expected = r"samples\.h5 was deleted or replaced before postprocess_save returned.*keep the file until"
    with pytest.raises(CollectorError, match=expected):
        postprocess_save(final, None)
    assert (path.read_bytes() if path.exists() else None) == before
