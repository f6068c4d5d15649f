"""A reader in the middle of a read while the file's run starts over (the same code run again without a checkpoint,
or a user's ``h5py.File(path, "w")`` that HDF5 does not lock): it gets one run whole, the old or the new, never the
new run's rows under the old run's counts.

The reader is a real process (forked from a server that has imported jaxstow), held between reading the counts and
reading the rows they count (its ``_locate`` wrapped to wait for a signal file) while this process starts the run
over; rows are ``sign * k``, the old run's positive and the new run's negative, so that every row tells which run it
is from.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import warnings

import forked
import h5py
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io

WIDTH = 8

_READER = """
import json, os, sys, time
from jaxstow.io import live

path, go = sys.argv[1], sys.argv[2]
located = live._locate

def held(file, *, name):
    found = located(file, name=name)
    if not os.path.exists(go + ".held"):  # the first read only
        open(go + ".held", "w").close()
        while not os.path.exists(go):
            time.sleep(0.01)
    return found

live._locate = held
draws = live.read_draws(path)
rows = draws.chains[0]["w"][:, 0]
print(json.dumps({"done": draws.done, "finished": draws.finished, "rows": rows.tolist()}))
"""


def _run(collector: io.HDF5Collector, sign: float, steps: int) -> None:
    init_save, save, postprocess_save = io.save(collector, block_size=256)
    state = init_save({"w": jnp.zeros(WIDTH)}, None, io.scheduler.static_information(samples_collected=steps))

    def step(state, k):
        return save(state, True, {"w": jnp.full(WIDTH, sign * k)})[0], None

    postprocess_save(jax.jit(lambda s: jax.lax.scan(step, s, jnp.arange(float(steps)))[0])(state), None)


def _start_over(form: str, path: str, sign: float, steps: int) -> None:
    if form == "path":
        _run(io.HDF5Collector(path), sign, steps)
        return
    with warnings.catch_warnings(), h5py.File(path, "w", libver="latest", locking=False) as file:
        _run(io.HDF5Collector(file), sign, steps)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("old", "new"), [(4000, 2000), (2000, 4000)])
@pytest.mark.parametrize("form", ["path", "h5py.File without HDF5's lock"])
def test_a_reader_caught_by_a_start_over_gets_one_run_whole(form, old, new, tmp_path) -> None:
    path, go = str(tmp_path / "samples.h5"), str(tmp_path / "go")
    _start_over(form, path, 1.0, old)
    reader = forked.Popen([sys.executable, "-c", textwrap.dedent(_READER), path, go], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(go + ".held"):
            assert reader.poll() is None and time.monotonic() < deadline, "the reader did not start its read"
            time.sleep(0.01)
        _start_over(form, path, -1.0, new)  # while the reader holds the old run's counts
    finally:
        open(go, "w").close()
        output, _ = reader.communicate(timeout=60)
    assert reader.returncode == 0
    read = json.loads(output)
    whole = {old: np.arange(old, dtype=np.float32), new: -np.arange(new, dtype=np.float32)}
    assert read["finished"] and read["done"] in ([old], [new]), read["done"]
    expected = whole[old] if read["done"] == [old] and read["rows"][-1] > 0 else whole[new]
    np.testing.assert_array_equal(np.asarray(read["rows"], np.float32), expected)


def test_a_run_that_starts_over_puts_a_new_file_in_the_old_ones_place(tmp_path) -> None:
    """A reader that has the old file open keeps it whole: the file is replaced, not emptied in place."""
    path = str(tmp_path / "samples.h5")
    _run(io.HDF5Collector(path), 1.0, 300)
    with open(path, "rb") as held:
        before = os.fstat(held.fileno())
        _run(io.HDF5Collector(path), -1.0, 200)
        assert os.stat(path).st_ino != before.st_ino
        assert os.fstat(held.fileno()).st_size == before.st_size
    assert not [name for name in os.listdir(tmp_path) if name != "samples.h5"]
    with h5py.File(path, "r") as file:
        np.testing.assert_array_equal(file["chain~0/w"][:, 0], -np.arange(200, dtype=np.float32))


def test_reading_the_file_in_the_process_that_writes_it_says_where_to_read_it(tmp_path) -> None:
    # HDF5 opens a file once per process, with its first opening's flags: h5py's OSError about locking flags.
    from jaxstow import scheduler
    from jaxstow.errors import CollectorError
    from jaxstow.io.live import read_draws

    path = tmp_path / "samples.h5"
    init_save, save, postprocess_save = io.save(io.HDF5Collector(path), block_size=2)
    state = init_save({"x": jnp.zeros(())}, None, scheduler.static_information(samples_collected=None))
    state = jax.lax.scan(lambda state, t: (save(state, True, {"x": t})[0], None), state, jnp.arange(5.0))[0]
    for read in (read_draws, io.to_inference_data):
        with pytest.raises(CollectorError, match=r"open for writing in this process .* read it from another process"):
            read(str(path))
    assert postprocess_save(state, None)["samples"]["x"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert read_draws(str(path)).done == [5]
