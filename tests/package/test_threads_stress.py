"""Threads and processes that share jaxstow: first use from many threads at once, and readers racing a writer's keep
policy.

Names of functions and classes (``jax.nn.relu``, ``equinox.nn.MLP``, optax's states) are looked up in tables that
jaxstow builds on first use in a process, so every case that needs a fresh process runs in several processes of its
own, forked from a server that has imported jaxstow and looked up no name (``tests/support/forked.py``). The reader of a checkpoint directory races a real writer process whose ``keep_last=1`` deletes
each step as soon as the next one is committed.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time
import types
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import forked
import jax
import numpy as np
import pytest

import jaxstow
from jaxstow import CheckpointManager, KeepPolicy
from jaxstow.checkpoint.recovery import Restored
from jaxstow.errors import StepNotFoundError

RUNS = 5  # fresh processes per case
THREADS = 8

_MODELS = """
    import jax, numpy as np, equinox as eqx, optax, jaxstow

    @jaxstow.saveable(name="stress.swish")
    def swish(x):
        return x * jax.nn.sigmoid(x)

    def state(seed, activation=jax.nn.relu):
        \"\"\"An equinox MLP and its adam state, made by shape (nothing is compiled) and filled with seeded numbers.\"\"\"
        def make():
            model = eqx.nn.MLP(3, 2, 8, 2, activation=activation, key=jax.random.key(0))
            return {"model": model, "opt_state": optax.adam(1e-3).init(eqx.filter(model, eqx.is_array))}

        def fill(leaf):
            return rng.normal(size=leaf.shape).astype(leaf.dtype) if isinstance(leaf, jax.ShapeDtypeStruct) else leaf

        rng = np.random.default_rng(seed)
        return jax.tree.map(fill, eqx.filter_eval_shape(make))

    def check(restored, seed, activation=jax.nn.relu):
        expected = state(seed, activation)
        assert restored["model"].activation is activation
        assert jax.tree.structure(restored) == jax.tree.structure(expected)
        assert all(map(np.array_equal, jax.tree.leaves(restored), jax.tree.leaves(expected)))
"""

_SAVE = """
    import sys
    from jaxstow import CheckpointManager
    folder = sys.argv[1]
    jaxstow.save(f"{folder}/relu.jxs", state(0))
    jaxstow.save(f"{folder}/swish.jxs", state(1, swish))
    with CheckpointManager(f"{folder}/run") as manager:
        manager.save(1, state(2))
"""

_RESTORE = """
    import sys
    from jaxstow import CheckpointManager
    check(CheckpointManager(sys.argv[1] + "/run").restore(), 2)
    print("restored")
"""

# Every thread starts at once, in a process where no name has been looked up yet: half of them save first, half load
# first, and each then does the other and restores the checkpoint (whose items are restored on threads of their own).
_THREADS = """
    import os, sys, threading, traceback
    from concurrent.futures import ThreadPoolExecutor
    from jaxstow import CheckpointManager
    folder, threads = sys.argv[1], int(sys.argv[2])
    trees = [state(10 + index, swish) for index in range(threads)]
    start = threading.Barrier(threads)

    def save(index):
        path = f"{folder}/saved-{os.getpid()}-{index}.jxs"
        jaxstow.save(path, trees[index])
        check(jaxstow.load(path), 10 + index, swish)

    def load(index):
        check(jaxstow.load(f"{folder}/relu.jxs"), 0)
        check(jaxstow.load(f"{folder}/swish.jxs"), 1, swish)

    def work(index):
        start.wait()
        try:
            for step in (save, load) if index % 2 else (load, save):
                step(index)
            check(CheckpointManager(f"{folder}/run").restore(), 2)
        except BaseException:
            return traceback.format_exc()
        return None

    with ThreadPoolExecutor(threads) as pool:
        failures = [failure for failure in pool.map(work, range(threads)) if failure is not None]
    print(f"{len(failures)} of {threads} threads failed")
    for failure in failures:
        print(failure)
"""

_WRITER = """
    import os, sys, time, numpy as np
    from jaxstow import CheckpointManager, KeepPolicy
    folder, stop = sys.argv[1], sys.argv[2]
    with CheckpointManager(folder, keep=KeepPolicy(keep_last=1)) as manager:
        step = 1
        while not os.path.exists(stop):
            manager.save(step, {"a": np.full(4, step), "b": {"c": np.arange(step % 5)}, "n": step})
            step += 1
            time.sleep(0.002)  # a reader starved of the CPU by a loaded machine still gets a step between two saves
"""


def _python(code: str, *args: str) -> subprocess.Popen[str]:
    return forked.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _outputs(processes: list[subprocess.Popen[str]]) -> list[str]:
    """What each process printed; a process that failed fails the test with its error."""
    outputs = []
    for process in processes:
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-3000:]
        outputs.append(out)
    return outputs


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Models with functions and classes in their trees, and a checkpoint of a model and its optimiser state."""
    folder = tmp_path_factory.mktemp("models")
    _outputs([_python(_MODELS + _SAVE, str(folder))])
    return folder


def test_checkpoint_restores_without_template_in_fresh_processes(saved: Path) -> None:
    """``restore()`` of an equinox MLP and its optax state, with no template, restores its items on several threads,
    each the first to look up a name in its process."""
    outputs = _outputs([_python(_MODELS + _RESTORE, str(saved)) for _ in range(RUNS)])
    assert outputs == ["restored\n"] * RUNS


def test_threads_save_and_load_at_once_in_fresh_processes(saved: Path) -> None:
    outputs = _outputs([_python(_MODELS + _THREADS, str(saved), str(THREADS)) for _ in range(RUNS)])
    assert outputs == [f"0 of {THREADS} threads failed\n"] * RUNS, "\n".join(outputs)


def _state(step: int) -> dict:
    return {"a": np.full(4, step), "b": {"c": np.arange(step % 5)}, "n": step}


def test_reader_races_the_keep_policy_of_a_writer_process(tmp_path: Path) -> None:
    """A reader restores the newest step 1,000 times while a writer process saves with ``keep_last=1``, which
    deletes the step the reader chose as soon as the next one is committed: every restore is a whole, newest step."""
    folder, stop = str(tmp_path / "run"), str(tmp_path / "stop")
    writer = _python(_WRITER, folder, stop)
    try:
        reader = CheckpointManager(folder)
        deadline = time.monotonic() + 120
        while (reader.latest_step() or 0) < 3:
            assert writer.poll() is None and time.monotonic() < deadline, writer.communicate()[1][-3000:]
            time.sleep(0.05)
        first = reader.latest_step()
        failures = []
        for _ in range(1000):
            try:
                restored = reader.restore(as_numpy=True)
            except jaxstow.errors.JaxstowError as error:
                failures.append(str(error))
                continue
            step = reader.restored.step
            assert restored["n"] == step and (restored["a"] == step).all() and len(restored["b"]["c"]) == step % 5
        last = reader.latest_step()
    finally:
        Path(stop).touch()
    _outputs([writer])
    assert failures == []
    assert last - first >= 20, f"the writer saved only {last - first} steps meanwhile: the race was not run"


def _deleting_on_open(reader: CheckpointManager, writer: CheckpointManager, step: int, method: str) -> None:
    """Make the reader's store, the first time it reads ``method`` of ``step``, let the writer save the next step,
    whose keep policy (``keep_last=1``) deletes ``step``: a real deletion in the middle of a real read."""
    store = reader._store
    original = getattr(store, method)
    done = []

    def reading(name: str, *args: object, **kwargs: object) -> object:
        if name == str(step) and not done:
            done.append(step)
            writer.save(step + 1, _state(step + 1), metrics={"loss": 0.5})
            writer.wait()
        return original(name, *args, **kwargs)

    setattr(store, method, reading)


@pytest.fixture
def race(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[CheckpointManager, CheckpointManager]]:
    """A writer with ``keep_last=1`` that has saved step 1, and a reader of its directory (local or ``memory://``)."""
    directory = str(tmp_path / "run") if request.param == "local" else f"memory://jaxstow-threads/{tmp_path.name}"
    with CheckpointManager(directory, keep=KeepPolicy(keep_last=1)) as writer:
        writer.save(1, _state(1), metrics={"loss": 1.0})
        writer.wait()
        yield writer, CheckpointManager(directory)


@pytest.mark.parametrize("race", ["local", "memory"], indirect=True)
@pytest.mark.parametrize("method", ["read_marker", "source"])
def test_newest_step_deleted_while_read_gives_way_to_the_next(race, method: str) -> None:
    writer, reader = race
    _deleting_on_open(reader, writer, 1, method)
    restored = reader.restore(as_numpy=True)
    assert reader.restored.step == 2 and restored["n"] == 2 and reader.steps() == [2]


@pytest.mark.parametrize("race", ["local", "memory"], indirect=True)
@pytest.mark.parametrize("method", ["read_marker", "source"])
def test_named_step_deleted_while_read_is_not_found(race, method: str) -> None:
    writer, reader = race
    _deleting_on_open(reader, writer, 1, method)
    with pytest.raises(StepNotFoundError) as raised:
        reader.restore(1)
    message = str(raised.value)
    assert f"step 1 is not in {reader.directory} any more" in message and "committed steps are [2]" in message
    assert "missing" not in message and "damage" not in message and "corrupt" not in message


def test_named_step_that_is_gone_is_not_found(tmp_path: Path) -> None:
    with CheckpointManager(tmp_path, keep=KeepPolicy(keep_last=1)) as manager:
        manager.save(1, _state(1))
        manager.save(2, _state(2))
        expected = rf"^step 1 is not in {re.escape(str(tmp_path))}; its committed steps are \[2\]$"
        with pytest.raises(StepNotFoundError, match=expected):
            manager.restore(1)
        with pytest.raises(LookupError, match=expected):
            manager.metrics(1)


@pytest.mark.parametrize("race", ["local"], indirect=True)
@pytest.mark.parametrize("check", ["best_step", "damaged_steps", "latest_intact_step", "fallback"])
def test_step_by_step_reads_pass_over_a_step_deleted_while_read(race, check: str) -> None:
    """Reads that go through the steps one by one take a step deleted meanwhile for neither an error nor damage."""
    writer, reader = race
    _deleting_on_open(reader, writer, 1, "read_marker")
    if check == "best_step":
        assert reader.best_step("loss") is None  # step 1 is gone, and step 2 was not there when the steps were listed
    elif check == "damaged_steps":
        assert reader.damaged_steps() == {}
    elif check == "latest_intact_step":
        assert reader.latest_intact_step() == 2
    else:
        assert reader.restore(fallback=True)["n"] == 2 and reader.restored == Restored(2, {})
    assert reader.steps() == [2]


def test_tables_of_a_module_being_imported_are_built_again() -> None:
    """Tables built while a module of a known library was still being imported (by another thread) are stale once
    it is done, even though no module was added since."""
    from jaxstow._names import registry

    module = types.ModuleType("equinox._being_imported")
    module.__spec__ = types.SimpleNamespace(_initializing=True)  # type: ignore[assignment]
    tables = registry._Tables(len(sys.modules), (module,), {}, {}, {}, {})
    assert not tables.current()
    module.__spec__._initializing = False
    assert tables.current()


def test_registry_tables_are_built_once_for_threads_at_once() -> None:
    """Threads asking for a name while the tables are stale all get complete tables, built by one of them."""
    from jaxstow._names import registry

    index = registry._LibraryIndex()
    builds = []
    build = index._build

    def counted() -> registry._Tables:
        builds.append(1)
        time.sleep(0.05)  # the others arrive while it builds
        return build()

    index._build = counted  # type: ignore[method-assign]
    with ThreadPoolExecutor(THREADS) as pool:
        tables = list(pool.map(lambda _: index.tables(), range(THREADS)))
    assert len(builds) == 1
    assert all(found.by_name["jax.nn.relu"] is jax.nn.relu for found in tables)
