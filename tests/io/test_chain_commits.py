"""The checkpoints of a step's chains, a file each (``MemoryCollector(save_dir=...)``), are committed together: a
process killed between two of their writes resumes every chain from one step, each with all its draws."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import forked
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io, scheduler
from jaxstow.io.chain_commits import commit_chains, settle

CHAINS, STEPS, EVERY = 3, 20, 5

RUN = """
import os, signal, sys
import jax, jax.numpy as jnp
from jaxstow import io, scheduler
import jaxstow.io.memory as memory

written, original = [], memory.write_checkpoint

def write(path, checkpoint, samples=None, **where):  # the process is killed after the given number of step 10's writes
    original(path, checkpoint, samples, **where)
    written.extend([path] if checkpoint.step == 10 else [])
    if len(written) == int(sys.argv[2]):
        os.kill(os.getpid(), signal.SIGKILL)

memory.write_checkpoint = write
"""


def _run(save_dir) -> tuple[list[int], list]:
    """The chains' run of ``STEPS`` draws, continued from their checkpoints as docs/sampling.md does."""
    init_save, save, postprocess_save = io.save(io.MemoryCollector(save_dir=save_dir), EVERY, block_size=2)
    information = scheduler.static_information(samples_collected=STEPS)
    states = jax.vmap(lambda _: init_save({"x": jnp.float32(0)}, {"t": jnp.int32(0)}, information))(jnp.arange(CHAINS))

    def chain(state, number, steps):
        def step(state, t):
            return save(state, True, {"x": (1000 * number + t).astype(jnp.float32)}, solver_state={"t": t})[0], None

        return jax.lax.scan(step, state, steps)[0]

    resumed = np.asarray(states.step).tolist()
    steps = jnp.arange(resumed[0], STEPS)
    return resumed, postprocess_save(jax.jit(jax.vmap(chain, in_axes=(0, 0, None)))(states, jnp.arange(CHAINS), steps))


@pytest.mark.parametrize("killed_after", [1, 2], ids=["one-of-three-written", "two-of-three-written"])
def test_a_kill_between_the_chains_checkpoint_writes_resumes_every_chain_from_one_step(tmp_path, killed_after):
    program = RUN + textwrap.dedent(f"""
        sys.path[:0] = [{os.path.dirname(__file__)!r}, {os.path.dirname(forked.__file__)!r}]  # this module's imports
        from test_chain_commits import _run
        _run(sys.argv[1])
    """)
    done = forked.run([sys.executable, "-c", program, str(tmp_path), str(killed_after)], timeout=300)
    assert done.returncode == -9
    resumed, results = _run(tmp_path)
    assert resumed == [5] * CHAINS  # step 10 was not complete: every chain goes on from step 5
    for number, result in enumerate(results):
        np.testing.assert_array_equal(result["samples"]["x"], 1000 * number + np.arange(STEPS, dtype=np.float32))
    assert sorted(os.listdir(tmp_path)) == [f"chain_{number}.npz" for number in range(CHAINS)]


def test_a_commit_cut_short_after_its_mark_is_finished_for_every_chain(tmp_path):
    paths = {chain: str(tmp_path / f"chain_{chain}.ckpt") for chain in (0, 1)}
    commit_chains(paths, lambda chain, path: Path(path).write_text(f"step 5 of {chain}"))
    for chain, path in paths.items():  # step 10 written, marked complete, and the process killed before the moves
        Path(path + ".next").write_text(f"step 10 of {chain}")
    (tmp_path / "chains_0-1.commit").write_text(json.dumps([0, 1]))
    for chain, path in paths.items():
        settle(chain, path)
        assert Path(path).read_text() == f"step 10 of {chain}" and not os.path.exists(path + ".next")


def test_a_commit_that_fills_the_disk_leaves_no_file_of_its_step_and_names_the_checkpoint(tmp_path):
    from tmpfs import small_tmpfs  # here: the killed runs import this module where tests/support is not on the path

    import jaxstow
    from jaxstow.errors import StorageError

    with small_tmpfs(tmp_path / "small", "1m") as disk:
        paths = {chain: str(disk / f"chain_{chain}.checkpoint.jxs") for chain in range(3)}
        commit_chains(paths, lambda chain, path: jaxstow.save(path, {"x": np.full(10, chain)}))  # the step before
        with pytest.raises(StorageError, match=rf"^{paths[2]}: cannot write it: no space left"):
            commit_chains(paths, lambda chain, path: jaxstow.save(path, {"x": np.full(40_000 * (chain + 1), chain)}))
        assert sorted(os.listdir(disk)) == sorted(os.path.basename(path) for path in paths.values())
        assert [jaxstow.load(path)["x"].tolist() for path in paths.values()] == [[chain] * 10 for chain in range(3)]
