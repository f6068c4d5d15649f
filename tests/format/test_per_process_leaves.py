"""Per-process leaves in one process: :func:`jaxstow.per_process` values and stateful iterators, saved and restored
plain, their golden file, and what a damaged or misused one raises."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import xxhash
from memory_files import saved_in_memory

import jaxstow
from jaxstow import CheckpointManager
from jaxstow._format.per_process import check_per_process_entry
from jaxstow._format.tensor_reads import TensorSlot
from jaxstow.errors import ArgumentError, FormatError, JaxstowError, RequestError, StructureMismatchError
from reliability.forge import forge_native, split_native

GOLDEN = Path(__file__).parents[1] / "data" / "per_process_v4.jxs"


class Loader:
    """A data iterator with grain's protocol: its state is bytes."""

    def __init__(self, position: int) -> None:
        self.position = position

    def get_state(self) -> bytes:
        return b"position=%d" % self.position

    def set_state(self, state: bytes) -> None:
        self.position = int(state.split(b"=")[1])


def golden_tree() -> dict:
    return {
        "step": 3,
        "loader": jaxstow.per_process({"epoch": 1, "seen": np.arange(3, dtype=np.int32), "name": "shard-a"}),
        "it": Loader(42),
    }


def test_the_golden_file_loads_to_each_value_plain_and_the_writer_writes_its_bytes():
    restored = jaxstow.load(GOLDEN)
    assert restored["step"] == 3 and restored["it"] == b"position=42"
    assert restored["loader"]["epoch"] == 1 and restored["loader"]["name"] == "shard-a"
    np.testing.assert_array_equal(restored["loader"]["seen"], np.arange(3, dtype=np.int32))
    assert saved_in_memory(golden_tree()).getvalue() == GOLDEN.read_bytes(), "the bytes of a per-process leaf changed"


def test_a_live_iterator_in_like_takes_its_state_and_all_gives_a_list():
    live = Loader(0)
    like = {"step": 0, "loader": jaxstow.per_process(None), "it": live}
    restored = jaxstow.load(saved_in_memory(golden_tree()), like=like)
    assert restored["it"] is live and live.position == 42
    every = jaxstow.load(saved_in_memory(golden_tree()), per_process="all")
    assert every["it"] == [b"position=42"] and every["loader"][0]["epoch"] == 1


class ListLoader:
    """A data iterator whose state is a list (of its epoch and position)."""

    def __init__(self, epoch: int, position: int) -> None:
        self.state = [epoch, position]

    def get_state(self) -> list[int]:
        return list(self.state)

    def set_state(self, state: list[int]) -> None:
        self.state = list(state)


def test_a_live_iterator_whose_state_is_a_list_takes_it_and_all_gives_a_list_of_them():
    # A list was taken for the list of every process's values: the live iterator was left where it was, silently.
    live = ListLoader(0, 0)
    restored = jaxstow.load(saved_in_memory({"loader": ListLoader(2, 130)}), like={"loader": live})
    assert restored["loader"] is live and live.state == [2, 130]
    every = jaxstow.load(saved_in_memory({"loader": ListLoader(2, 130)}), like={"loader": live}, per_process="all")
    assert every["loader"] == [[2, 130]]


@pytest.mark.parametrize(
    ("leaf", "message"),
    [
        (ListLoader(1, 2), None),
        (Loader(3), None),
        (jaxstow.per_process({"child": Loader(5)}), r"holds Loader, itself a per-process value or a data iterator"),
        (jaxstow.per_process(memoryview(b"abc")), r"of type memoryview cannot be copied"),
    ],
    ids=["list-state", "bytes-state", "nested-iterator", "memoryview"],
)
def test_a_state_that_could_not_be_restored_is_refused_when_the_save_is_asked(tmp_path, leaf, message):
    # A nested iterator was saved and committed, then every restore of the step refused it: the step was lost.
    with CheckpointManager(tmp_path) as manager:
        if message is None:
            manager.save(1, {"loader": leaf})
        else:
            with pytest.raises(ArgumentError, match=message):
                manager.save(1, {"loader": leaf})
            with pytest.raises(JaxstowError, match=r"itself a per-process value|mutable buffer"):
                jaxstow.save(tmp_path / "loader.jxs", {"loader": leaf})


def test_a_plain_template_in_like_takes_the_value_leaf_by_leaf():
    buffer = io.BytesIO()
    jaxstow.save(buffer, {"w": np.ones(2), "loader": jaxstow.per_process({"epoch": 3, "seen": [1, 2]})})
    like = {"w": np.zeros(2), "loader": {"epoch": 0, "seen": [0, 0]}}
    restored = jaxstow.load(io.BytesIO(buffer.getvalue()), like=like)
    assert restored["loader"] == {"epoch": 3, "seen": [1, 2]}
    with pytest.raises(StructureMismatchError, match=r"the saved value has the leaves \['loader/epoch'"):
        jaxstow.load(io.BytesIO(buffer.getvalue()), like={"w": np.zeros(2), "loader": {"epoch": 0}})
    with pytest.raises(RequestError, match="a subtree of like cannot hold"):
        jaxstow.load(io.BytesIO(buffer.getvalue()), like=like, per_process="all")


def test_a_template_leaf_that_asks_for_something_else_than_the_saved_leaf_is_refused():
    import jax

    buffer = io.BytesIO()
    saved = {"epoch": np.int64(2), "pos": np.arange(3, dtype=np.int32), "name": "train"}
    jaxstow.save(buffer, {"loader": jaxstow.per_process(saved)})
    right = {"epoch": 0, "pos": jax.ShapeDtypeStruct((3,), np.int32), "name": ""}
    restored = jaxstow.load(io.BytesIO(buffer.getvalue()), like={"loader": right})["loader"]
    assert restored["epoch"] == 2 and restored["name"] == "train" and isinstance(restored["pos"], jax.Array)
    wrong = {"epoch": jax.ShapeDtypeStruct((), np.float32), "pos": np.zeros(5, np.float32), "name": 7}
    with pytest.raises(StructureMismatchError) as caught:
        jaxstow.load(io.BytesIO(buffer.getvalue()), like={"loader": wrong})
    assert caught.value.problems == [
        "'loader/epoch': the saved value is int64[], like has float32[]",
        "'loader/name': the saved value is str 'train', like has int 7",
        "'loader/pos': the saved value is int32[3], like has float32[5]",
    ]


def test_the_value_is_taken_when_the_save_is_asked_for(tmp_path):
    loader, state = Loader(1), {"epoch": 1}
    with jaxstow.CheckpointManager(tmp_path / "run") as manager:
        manager.save(1, {"it": loader, "state": jaxstow.per_process(state)})
        loader.position, state["epoch"] = 2, 2  # while the save may still be writing
        manager.wait()
        assert manager.restore(1) == {"it": b"position=1", "state": {"epoch": 1}}
        with jaxstow.open(tmp_path / "run" / "1" / "it.safetensors") as reader:
            assert reader.info(reader.paths[0]).kind == "per_process"


def test_a_bad_choice_and_a_damaged_count_are_refused(tmp_path):
    with pytest.raises(ArgumentError, match="per_process= takes 'own' or 'all'"):
        jaxstow.load(saved_in_memory(golden_tree()), per_process="mine")
    damaged = tmp_path / "damaged.jxs"
    data = GOLDEN.read_bytes()
    entry = rb"\"processes\":1,\"process\":0"
    assert data.count(entry) == 2
    damaged.write_bytes(data.replace(entry, entry[:-1] + b"5", 1))
    with pytest.raises(FormatError, match="checksum"):
        jaxstow.load(damaged)
    slot = TensorSlot.at("loader", np.dtype(np.uint8), (64,), 0)
    with pytest.raises(FormatError, match=r"0 <= process < processes\), not 1 and 5"):
        check_per_process_entry({"path": "loader", "processes": 1, "process": 5}, slot, file="f.jxs")
    with pytest.raises(FormatError, match="one-dimensional U8 tensor"):
        check_per_process_entry({"path": "loader", "processes": 2, "process": 1}, None, file="f.jxs")
    with pytest.raises(RequestError, match="restore it with load"):
        jaxstow.open(GOLDEN)["loader"]


def test_a_grain_iterator_is_saved_per_process_and_set_back():
    grain = pytest.importorskip("grain")
    iterator = iter(grain.MapDataset.range(10).to_iter_dataset())
    assert [next(iterator), next(iterator)] == [0, 1]
    saved = saved_in_memory({"data": iterator})
    fresh = iter(grain.MapDataset.range(10).to_iter_dataset())
    assert jaxstow.load(saved, like={"data": fresh})["data"] is fresh
    assert next(fresh) == 2


def test_none_or_a_template_in_a_per_process_values_place_restores_it_nested_or_at_the_root(tmp_path):
    """docs/scaling.md: that place in like may hold per_process(...), None, or a template of the value."""
    value = {"epoch": 3, "seen": [1, 2]}
    template = {"epoch": 0, "seen": [0, 0]}
    with jaxstow.CheckpointManager(tmp_path / "run") as manager:
        manager.save(1, {"data": {"rng": jaxstow.per_process(value)}, "w": np.ones(2)})
        manager.wait()
        for place in (jaxstow.per_process(None), None, template):
            restored = manager.restore(like={"data": {"rng": place}, "w": np.zeros(2)})
            assert restored["data"]["rng"] == value
    path = tmp_path / "root.jxs"
    jaxstow.save(path, jaxstow.per_process(value))
    for like in (jaxstow.per_process(None), template, template):  # the same file again: its header cached
        assert jaxstow.load(path, like=like) == value


def test_a_live_iterator_keeps_its_state_when_a_steps_restore_fails(tmp_path):
    with jaxstow.CheckpointManager(tmp_path / "run") as manager:
        manager.save(1, {"data": Loader(1), "params": {"w": np.ones(2)}})
        manager.save(2, {"data": Loader(42), "params": {"w": np.ones(2)}})
    live = Loader(7)
    with pytest.raises(StructureMismatchError), jaxstow.CheckpointManager(tmp_path / "run") as manager:
        manager.restore(like={"data": live, "params": {"w": np.ones(3)}})  # the data item is restored, params not
    assert live.position == 7
    damaged = tmp_path / "run" / "2" / "params.safetensors"
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 0xFF
    damaged.write_bytes(bytes(data))
    with pytest.raises(JaxstowError, match="checksum mismatch"), jaxstow.CheckpointManager(tmp_path / "run") as manager:
        manager.restore(like={"data": live, "params": {"w": np.ones(2)}})
    assert live.position == 7
    with jaxstow.CheckpointManager(tmp_path / "run") as manager:
        manager.restore(like={"data": live, "params": {"w": np.ones(2)}}, fallback=True)
    assert live.position == 1  # the step before the damaged one's


def test_a_live_iterator_keeps_its_state_when_a_later_leaf_of_one_tree_fails(tmp_path):
    # a one-tree step and a file: the iterator took the saved state, then a per-process template that does not fit
    # failed the restore, and a caller going on skipped the batches between
    tree = {"it": Loader(7), "rng": jaxstow.per_process({"seed": 1, "counter": 5}), "w": np.ones(2)}
    jaxstow.save(tmp_path / "state.jxs", tree)
    with jaxstow.CheckpointManager(tmp_path / "run") as manager:
        manager.save(1, (tree,))  # a tuple: one tree, not named items
    live = Loader(2)
    like = {"it": live, "rng": {"seed": 0}, "w": np.zeros(2)}  # its template lacks 'counter'
    with pytest.raises(StructureMismatchError):
        jaxstow.load(tmp_path / "state.jxs", like=like)
    assert live.position == 2
    with pytest.raises(StructureMismatchError), jaxstow.CheckpointManager(tmp_path / "run") as manager:
        manager.restore(like=(like,))
    assert live.position == 2
    jaxstow.load(tmp_path / "state.jxs", like={**like, "rng": None})
    assert live.position == 7


@pytest.mark.parametrize("claimed", [3, 20_000_000, 10**18])
def test_a_per_process_leaf_claiming_more_processes_than_it_holds_is_refused_at_once(tmp_path, claimed):
    """The count of processes comes from the file: no range of it is made, and the error names a few missing."""
    jaxstow.save(tmp_path / "step.jxs", {"w": np.ones(3), "it": jaxstow.per_process({"position": 7})})
    tensors, text, data = split_native((tmp_path / "step.jxs").read_bytes())
    manifest = json.loads(text or "")
    (detail,) = [detail for detail in manifest["details"].values() if "processes" in detail]
    detail["processes"] = claimed
    (tmp_path / "forged.jxs").write_bytes(forge_native(tensors, json.dumps(manifest), data))
    with pytest.raises(
        FormatError, match=r"holds no value of the processes 1, 2[0-9, .]* of the \d+ that saved it"
    ) as error:
        jaxstow.load(tmp_path / "forged.jxs", as_numpy=True)
    assert len(str(error.value)) < 400


@pytest.mark.parametrize("damage", ["flipped", "garbage"])
def test_verify_opens_each_processs_value_as_a_load_does_and_names_its_damage(tmp_path, damage):
    """A per-process value is a file of its own, in a tensor whose checksum the forger fixed up: verify called the
    file intact where load found it damaged."""
    from forked_cli import jaxstow_command

    inner = io.BytesIO()
    jaxstow.save(inner, {"position": np.arange(1000)})  # the value as a process saves it
    value = bytearray(inner.getvalue())
    if damage == "flipped":
        value[-9] ^= 1  # a byte of the position's data: its own checksum no longer holds
    else:
        value = bytearray(b"\0" * 100)
    jaxstow.save(tmp_path / "step.jxs", {"w": np.ones(3), "it": jaxstow.per_process({"position": np.arange(1000)})})
    tensors, text, data = split_native((tmp_path / "step.jxs").read_bytes())
    manifest = json.loads(text or "")
    begin, end = tensors["it"]["data_offsets"]
    assert end == len(data)  # the last tensor: its bytes are replaced, and no other moves
    tensors["it"].update(shape=[len(value)], data_offsets=[begin, begin + len(value)])
    index = [path for path, kind in zip(manifest["paths"], manifest["kinds"], strict=True) if kind != "v"].index("it")
    manifest["xxh3"][index] = xxhash.xxh3_64_hexdigest(bytes(value))
    forged = tmp_path / "forged.jxs"
    forged.write_bytes(forge_native(tensors, json.dumps(manifest), data[:begin] + bytes(value)))
    with pytest.raises(FormatError):
        jaxstow.load(forged, as_numpy=True)
    verified = jaxstow_command("verify", str(forged))
    assert verified.returncode == 1 and "DAMAGED" in verified.stdout, verified.stdout + verified.stderr
    assert "leaf 'it' of" in verified.stdout and "process 0's value" in verified.stdout
    assert jaxstow_command("verify", str(tmp_path / "step.jxs")).returncode == 0
