"""Every failure a user can cause is a jaxstow error: the public functions, fed bad inputs, raise only subclasses of
:class:`jaxstow.errors.JaxstowError` (some also subclass the builtin a caller may catch, such as
``FileNotFoundError``), each naming what was wrong."""

from __future__ import annotations

import io
import math
import os
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxstow
from jaxstow import CheckpointManager, KeepPolicy, scheduler, train
from jaxstow import io as jio
from jaxstow import objax as objax_io
from jaxstow.cli import main
from jaxstow.errors import JaxstowError, PathNotFoundError

Case = Callable[[Any], object]


@pytest.fixture
def where(tmp_path):
    """A folder with a saved file, a checkpoint folder of named items and a file that is not a jaxstow file."""
    jaxstow.save(tmp_path / "w.jxs", {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "step": 1})
    (tmp_path / "junk.bin").write_bytes(b"\x00" * 64)
    with CheckpointManager(tmp_path / "run", keep=KeepPolicy(keep_last=2)) as manager:
        manager.save(1, {"params": {"w": jnp.ones(3)}, "opt_state": {"mu": jnp.zeros(3)}})
    return tmp_path


def _manager(where):
    return CheckpointManager(where / "run", keep=KeepPolicy(keep_last=2))


def _with_manager(action: Callable[[CheckpointManager], object]) -> Case:
    def case(where):
        with _manager(where) as manager:
            return action(manager)

    return case


def _with_reader(action: Callable[[jaxstow.Reader], object]) -> Case:
    def case(where):
        with jaxstow.open(where / "w.jxs") as reader:
            return action(reader)

    return case


def _scan_without_solver_state(where):
    init_save, save, _ = jio.save(jio.MemoryCollector(save_dir=str(where / "chains")), checkpoint_every=2)
    state = init_save({"x": jnp.zeros(2)}, {"theta": jnp.zeros(2)}, scheduler.static_information(samples_collected=4))
    step = lambda state, i: save(state, True, {"x": jnp.full(2, i, jnp.float32)})  # noqa: E731 - no solver_state=
    return jax.lax.scan(step, state, jnp.arange(4.0))


def _holding_itself() -> dict:
    metadata: dict = {"run": "a"}
    metadata["self"] = metadata
    return metadata


def _nested(levels: int) -> list:
    tree: list = [1]
    for _ in range(levels):
        tree = [tree]
    return tree


def _like_on_an_abstract_mesh(where):
    rows = jax.sharding.NamedSharding(
        jax.make_mesh((2,), ("d",), devices=jax.devices()[:2]), jax.sharding.PartitionSpec("d")
    )
    w = jax.device_put(jnp.zeros((2, 3), jnp.float32), rows)
    return jaxstow.load(where / "w.jxs", like=jax.eval_shape(lambda: {"w": w, "step": 0}))  # shardings of no devices


def _closed(file: Any) -> Any:
    file.close()
    return file


CASES: dict[str, Case] = {
    # jaxstow.save / load / load_metadata / open
    "save into a missing folder": lambda w: jaxstow.save(w / "no" / "such" / "x.jxs", {"a": 1}),
    "save onto a folder": lambda w: jaxstow.save(w / "run", {"a": 1}),
    "save a set": lambda w: jaxstow.save(w / "x.jxs", {"a": {1, 2}}),
    "save NaN metadata": lambda w: jaxstow.save(w / "x.jxs", {"a": 1}, metadata={"loss": math.nan}),
    "save metadata that is no dict": lambda w: jaxstow.save(w / "x.jxs", {"a": 1}, metadata=["epoch", 3]),
    "save to a number": lambda w: jaxstow.save(3, {"a": 1}),
    "load a missing file": lambda w: jaxstow.load(w / "nope.jxs"),
    "load a folder": lambda w: jaxstow.load(w / "run"),
    "load junk": lambda w: jaxstow.load(w / "junk.bin"),
    "load a number": lambda w: jaxstow.load(42),
    "load a text-mode file": lambda w: jaxstow.load(open(w / "w.jxs")),  # noqa: SIM115
    "load a closed file": lambda w: jaxstow.load(_closed(open(w / "w.jxs", "rb"))),  # noqa: SIM115
    "load from a pipe": lambda w: jaxstow.load(os.fdopen(os.pipe()[0], "rb")),
    "objax: save arrays that are no variables": lambda w: objax_io.save_var_collection(w / "v.jxs", {"w": np.ones(2)}),
    "objax: a renamer that is a dict": lambda w: objax_io.load_var_collection(w / "w.jxs", {}, renamer={"w": "v"}),
    "objax: load variables from a pipe": lambda w: objax_io.load_var_collection(os.fdopen(os.pipe()[0], "rb"), {}),
    "save to a closed file": lambda w: jaxstow.save(_closed(io.BytesIO()), {"a": 1}),
    "save to a text-mode file": lambda w: jaxstow.save(io.StringIO(), {"a": 1}),
    "save metadata that holds itself": lambda w: jaxstow.save(w / "m.jxs", {"a": 1}, metadata=_holding_itself()),
    "save a tree 1000 levels deep": lambda w: jaxstow.save(w / "m.jxs", _nested(1000)),
    "manager onto a file of a URL": lambda w: (  # its steps went under the object's key, where no reader looks
        jaxstow.save("memory://jaxstow-sweep/model.jxs", {"a": 1}),
        CheckpointManager("memory://jaxstow-sweep/model.jxs").save(1, {"a": 1}),
    ),
    "save onto a folder of a URL": lambda w: (  # the file was moved into the folder, and the save said nothing
        jaxstow.save("memory://jaxstow-sweep/folder/inside.jxs", {"a": 1}),
        jaxstow.save("memory://jaxstow-sweep/folder", {"a": 1}),
    ),
    "save an npz leaf of too long a name": lambda w: jaxstow.save(w / "m.npz", {"x" * 70000: np.ones(1)}),
    "save a dict key of 5000 digits": lambda w: jaxstow.save(w / "m.jxs", {10**5000: np.ones(1), 1: np.ones(1)}),
    "read a list of leaves by index": lambda w: jaxstow.open(w / "w.jxs")[["w", "step"]],
    "load into the wrong structure": lambda w: jaxstow.load(w / "w.jxs", like={"v": np.zeros(2)}),
    "load with a lossy cast": lambda w: jaxstow.load(w / "w.jxs", like={"w": np.zeros((2, 3), np.int8), "step": 0}),
    "load with a wrong select": lambda w: jaxstow.load(w / "w.jxs", select=5),
    "load with a select matching nothing": lambda w: jaxstow.load(w / "w.jxs", select=["nothing/**"]),
    "load with an unknown option": lambda w: jaxstow.load(w / "w.jxs", as_nunpy=True),
    "load with a sharding that is none": lambda w: jaxstow.load(w / "w.jxs", sharding="everywhere"),
    "load onto the abstract mesh of eval_shape": _like_on_an_abstract_mesh,
    "load_metadata of a missing file": lambda w: jaxstow.load_metadata(w / "nope.jxs"),
    "open a missing file": lambda w: jaxstow.open(w / "nope.jxs"),
    "open a missing URL": lambda w: jaxstow.open("memory://jaxstow-sweep/nope.jxs"),
    "open with storage options for a path": lambda w: jaxstow.open(w / "w.jxs", storage_options={"anon": True}),
    "mmap a file object": lambda w: jaxstow.open(io.BytesIO((w / "w.jxs").read_bytes()), mmap=True),
    # Reader methods
    "reader: a missing leaf": _with_reader(lambda r: r["nothing"]),
    "reader: info of a missing leaf": _with_reader(lambda r: r.info("nothing")),
    "reader: an index out of bounds": _with_reader(lambda r: r.read("w", np.s_[5, 0])),
    "reader: an index that is no index": _with_reader(lambda r: r.read("w", "rows")),
    "reader: a slice of a value": _with_reader(lambda r: r.read("step", np.s_[0])),
    "reader: load into the wrong structure": _with_reader(lambda r: r.load({"w": np.zeros(1)})),
    # CheckpointManager
    "manager: negative keep_last": lambda w: CheckpointManager(w / "other", keep=KeepPolicy(keep_last=-1)),
    "manager: keep_best without a metric": lambda w: CheckpointManager(w / "other", keep=KeepPolicy(keep_best=1)),
    "manager: an unknown mode": lambda w: CheckpointManager(
        w / "other", keep=KeepPolicy(keep_best=1, metric="loss", mode="median")
    ),
    "manager: storage options for a path": lambda w: CheckpointManager(w / "other", storage_options={"anon": True}),
    "manager: a file as its folder": lambda w: CheckpointManager(w / "w.jxs").save(1, {"a": jnp.ones(1)}),
    "manager: metrics that are no dict": _with_manager(lambda m: m.save(5, {"a": jnp.ones(1)}, metrics=[0.1])),
    "manager: a metric that is no number": _with_manager(
        lambda m: m.save(5, {"a": jnp.ones(1)}, metrics={"loss": "low"})
    ),
    "manager: an item name that is no file name": _with_manager(lambda m: m.save(5, {"a/b": jnp.ones(1)})),
    "manager: saving a step again": _with_manager(lambda m: m.save(1, {"params": {"w": jnp.ones(3)}})),
    "manager: a set in the tree": _with_manager(lambda m: (m.save(5, {"a": {1, 2}}), m.wait())),
    "manager: restore a missing step": _with_manager(lambda m: m.restore(99)),
    "manager: metadata that holds itself": _with_manager(lambda m: m.save(5, {"a": 1}, metadata=_holding_itself())),
    "manager: metadata of a huge integer": _with_manager(lambda m: m.save(5, {"a": 1}, metadata={"n": 10**5000})),
    "manager: a tree 1000 levels deep": _with_manager(lambda m: m.save(5, {"a": _nested(1000)})),
    "manager: items as one string": _with_manager(lambda m: m.restore(items="params")),
    "manager: an unknown item": _with_manager(lambda m: m.restore(items=["nothing"])),
    "manager: like that is no dict": _with_manager(lambda m: m.restore(like=[1, 2])),
    "manager: like with items not restored": _with_manager(
        lambda m: m.restore(like={"params": {"w": jnp.ones(3)}, "ema": {"mu": jnp.ones(3)}}, items=["params"])
    ),
    "manager: delete a missing step": _with_manager(lambda m: m.delete(99)),
    "manager: metadata of a missing step": _with_manager(lambda m: m.metadata(99)),
    "manager: save after close": lambda w: (lambda m: (m.close(), m.save(7, {"a": jnp.ones(1)})))(_manager(w)),
    # io: saving strategies and collectors
    "io.save: negative checkpoint_every": lambda w: jio.save(checkpoint_every=-1),
    "io.save: empty blocks": lambda w: jio.save(block_size=0),
    "io.save: no solver_state to checkpoint": _scan_without_solver_state,
    "io.save: keep of the wrong shape": lambda w: (
        lambda init, save, post: save(init({"x": jnp.zeros(1)}), jnp.ones(3, bool), {"x": jnp.zeros(1)})
    )(*jio.save()),
    "io.no_save: keep of the wrong shape": lambda w: (
        lambda init, save, post: save(init({"x": jnp.zeros(1)}), jnp.ones(3, bool), {"x": jnp.zeros(1)})
    )(*jio.no_save()),
    "io: an HDF5 collector of a number": lambda w: jio.HDF5Collector(5),
    "io: an HDF5 collector of a folder": lambda w: jio.HDF5Collector(w),
    "io: samples_collected below 0": lambda w: scheduler.static_information(samples_collected=-1),
    "io: samples_collected a bool": lambda w: scheduler.static_information(samples_collected=True),
    "io: to_inference_data of a number": lambda w: jio.to_inference_data(5),
    # train
    "train: period 0": lambda w: train.DefaultCheckpointer(train.DefaultCheckpointerArguments(period=0)),
    "train: load_filename of no file": lambda w: train.DefaultCheckpointer(
        train.DefaultCheckpointerArguments(load_dir=str(w), load_filename="nope.jxs")
    ).load(),
    # objax
    "objax: a Checkpoint restoring no collection": lambda w: objax_io.Checkpoint(str(w / "objax"), 2).restore(5),
    "objax: load_var_collection of a missing file": lambda w: objax_io.load_var_collection(w / "nope.npz", {}),
    # names
    "saveable: a lambda without a name": lambda w: jaxstow.saveable(lambda x: x),
    "saveable: an empty name": lambda w: jaxstow.saveable(jax.nn.relu, name=""),
}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("case", CASES)
def test_only_jaxstow_errors_come_out(where, case):
    with pytest.raises(JaxstowError) as raised:
        CASES[case](where)
    message = str(raised.value)
    assert message and "Traceback" not in message


def test_a_missing_file_is_still_a_file_not_found_error(where):
    with pytest.raises(FileNotFoundError) as raised:
        jaxstow.load(where / "nope.jxs")
    assert isinstance(raised.value, PathNotFoundError) and raised.value.filename == str(where / "nope.jxs")


def test_the_messages_say_what_to_do(where):
    with pytest.raises(JaxstowError, match="solver_state="):
        _scan_without_solver_state(where)
    with pytest.raises(JaxstowError, match=r"like=\{'params': \.\.\.\}"):
        CASES["manager: like with items not restored"](where)


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", "{w}/nope.jxs"],
        ["inspect", "{w}/junk.bin"],
        ["verify", "{w}/nope"],
        ["diff", "{w}/w.jxs", "{w}/junk.bin"],
        ["ls", "{w}/w.jxs"],
        ["convert", "{w}/nope.jxs", "{w}/out.jxs"],
        ["inspect", "memory://jaxstow-sweep/nope.jxs"],
    ],
)
def test_the_command_line_answers_with_status_2(where, argv, capsys):
    assert main([arg.format(w=where) for arg in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"jaxstow {argv[0]}: ")


def test_cases_leave_no_files_behind(where):
    before = sorted(os.listdir(where))
    for case in ("save into a missing folder", "save onto a folder", "save a set"):
        with pytest.raises(JaxstowError):
            CASES[case](where)
    assert sorted(os.listdir(where)) == before
