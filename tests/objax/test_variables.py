"""``jaxstow.objax`` with Objax's own modules: files Objax wrote, all-or-nothing loads, renaming, checkpoints."""

from __future__ import annotations

import io
import itertools
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import objax
import pytest

import jaxstow
from jaxstow import objax as objax_io
from jaxstow.errors import VariableMismatchError


def _mlp(hidden: int = 3, layers: int = 2) -> objax.Module:
    sizes = [2, *([hidden] * (layers - 1)), 4]
    return objax.nn.Sequential([objax.nn.Linear(n_in, n_out) for n_in, n_out in itertools.pairwise(sizes)])


def _values(module: objax.Module) -> dict[str, np.ndarray]:
    return {name: np.asarray(var.value) for name, var in module.vars().items()}


def _assert_same(a: objax.Module, b: objax.Module) -> None:
    want, got = _values(a), _values(b)
    assert want.keys() == got.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_a_file_objax_wrote_loads_into_objax_modules(tmp_path) -> None:
    source, target = _mlp(), _mlp()
    path = str(tmp_path / "objax.npz")
    objax.io.save_var_collection(path, source.vars())  # Objax's own writer: names plus 0, 1, ...
    with np.load(path) as archive:
        assert sorted(archive.files) == ["0", "1", "2", "3", "names"]
    objax_io.load_var_collection(path, target.vars())
    _assert_same(source, target)


def test_a_saved_collection_is_a_jaxstow_file_of_its_values_by_name(tmp_path) -> None:
    module = _mlp()
    path = tmp_path / "vars.jxs"
    objax_io.save_var_collection(path, module.vars())
    loaded = jaxstow.load(path, as_numpy=True)
    assert loaded.keys() == _values(module).keys()
    np.testing.assert_array_equal(loaded["(Sequential)[0](Linear).w"], _values(module)["(Sequential)[0](Linear).w"])


def test_a_model_with_its_optimizer_and_step_counter_round_trips() -> None:
    def trained(seed: int) -> objax.Module:
        objax.random.DEFAULT_GENERATOR.seed(seed)
        model = _mlp()
        opt = objax.optimizer.Adam(model.vars())
        opt.step.assign(jnp.asarray(seed + 7, jnp.uint32), check=False)
        return objax.ModuleList([model, opt])

    source, target = trained(1), trained(2)
    buffer = io.BytesIO()
    objax_io.save_var_collection(buffer, source.vars())
    buffer.seek(0)
    objax_io.load_var_collection(buffer, target.vars())
    _assert_same(source, target)
    assert target[1].step.value.dtype == jnp.uint32 and int(target[1].step.value) == 8


def test_a_failed_load_assigns_nothing_and_lists_every_problem() -> None:
    source, target = _mlp(hidden=3, layers=2), _mlp(hidden=5, layers=3)
    before = _values(target)
    buffer = io.BytesIO()
    objax_io.save_var_collection(buffer, source.vars())
    buffer.seek(0)
    with pytest.raises(VariableMismatchError) as caught:
        objax_io.load_var_collection(buffer, target.vars())
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, AssertionError)
    message = str(caught.value)
    assert message.startswith("<BytesIO> does not fit")
    assert "'(Sequential)[0](Linear).w': stored float32[2, 3], the variable holds float32[2, 5]" in message
    assert "'(Sequential)[2](Linear).b': no stored value" in message
    for name, value in _values(target).items():  # (Sequential)[1](Linear).b fits, and is not assigned either
        np.testing.assert_array_equal(value, before[name])


def test_a_variable_holding_no_array_is_named_not_an_attribute_error() -> None:
    class Holder:  # an object of no array value where the collection has a variable
        def __init__(self, value: object) -> None:
            self.value = value

        def assign(self, value: object, check: bool = True) -> None:
            self.value = value

    buffer = io.BytesIO()
    jaxstow.save(buffer, {"w": np.ones(2, np.float32)})
    buffer.seek(0)
    with pytest.raises(VariableMismatchError, match=r"'w': the variable holds str, not an array, to load into"):
        objax_io.load_var_collection(buffer, {"w": Holder("ones")})


def test_a_dtype_mismatch_is_refused() -> None:
    module = _mlp()
    buffer = io.BytesIO()
    jaxstow.save(buffer, {name: np.asarray(value, np.float16) for name, value in _values(module).items()})
    buffer.seek(0)
    with pytest.raises(VariableMismatchError, match=r"stored float16\[2, 3\], the variable holds float32\[2, 3\]"):
        objax_io.load_var_collection(buffer, module.vars())


def test_a_big_endian_variable_loads_back_what_it_saved() -> None:
    variable = objax.StateVar(np.arange(4, dtype=">f4"))
    buffer = io.BytesIO()
    objax_io.save_var_collection(buffer, {"w": variable})
    buffer.seek(0)
    variable.value = np.zeros(4, ">f4")
    objax_io.load_var_collection(buffer, {"w": variable})  # the file holds its little-endian equal
    np.testing.assert_array_equal(variable.value, np.arange(4))


def test_stored_variables_the_collection_lacks_are_ignored_and_names_are_renamed(tmp_path) -> None:
    big, small = _mlp(layers=3), _mlp(layers=3)
    path = tmp_path / "big.npz"
    objax_io.save_var_collection(path, big.vars().rename(objax.util.Renamer({"(Sequential)": "(Net)"})))
    part = objax.ModuleList([small[0]])  # one layer of three: the file's other layers are left alone
    objax_io.load_var_collection(path, part.vars(), renamer=objax.util.Renamer({"(Net)": "(ModuleList)"}))
    np.testing.assert_array_equal(small[0].w.value, big[0].w.value)
    assert not np.array_equal(small[1].w.value, big[1].w.value)


def test_a_file_that_is_no_variable_collection_is_refused(tmp_path) -> None:
    path = tmp_path / "tree.jxs"
    jaxstow.save(path, {"layer": {"w": jnp.ones(2)}})
    with pytest.raises(VariableMismatchError, match=r"(?s)tree\.jxs .*'layer': stored dict, not an array"):
        objax_io.load_var_collection(path, _mlp().vars())
    jaxstow.save(path, [jnp.ones(2)])
    with pytest.raises(VariableMismatchError, match=r"(?s)tree\.jxs .*the file holds no variable collection"):
        objax_io.load_var_collection(path, _mlp().vars())


def test_a_variable_holding_a_typed_prng_key_round_trips() -> None:
    class Var:
        def __init__(self, value):
            self.value = value

        def assign(self, value, check=True):
            self.value = value

    buffer = io.BytesIO()
    objax_io.save_var_collection(buffer, {"(Rng).key": Var(jax.random.key(7))})
    buffer.seek(0)
    target = {"(Rng).key": Var(jax.random.key(0))}
    objax_io.load_var_collection(buffer, target)
    assert jax.random.key_impl(target["(Rng).key"].value) == jax.random.key_impl(jax.random.key(7))
    np.testing.assert_array_equal(
        jax.random.key_data(target["(Rng).key"].value), jax.random.key_data(jax.random.key(7))
    )


def test_an_objax_archive_with_a_missing_value_is_refused(tmp_path) -> None:
    path = tmp_path / "broken.npz"
    np.savez(path, names=np.array(["(Linear).w", "(Linear).b"]), **{"0": np.ones((2, 4), np.float32)})
    with pytest.raises(VariableMismatchError, match="one array per name"):
        objax_io.load_var_collection(path, objax.nn.Linear(2, 4).vars())


class _Held:  # a variable holding a numpy array, as far as loading goes
    def __init__(self, value: np.ndarray) -> None:
        self.value = value

    def assign(self, value: np.ndarray, check: bool = True) -> None:
        self.value = value


def test_numpy_variables_of_64_bits_get_their_values_whole() -> None:
    buffer = io.BytesIO()  # jax (x64 off) narrowed them: 2**40 + 5 became 5, 1e300 became inf
    objax_io.save_var_collection(buffer, {"step": _Held(np.array([2**40 + 5])), "acc": _Held(np.array([1e300]))})
    buffer.seek(0)
    fresh = {"step": _Held(np.zeros(1, np.int64)), "acc": _Held(np.zeros(1, np.float64))}
    objax_io.load_var_collection(buffer, fresh)
    assert fresh["step"].value.dtype == np.int64 and fresh["step"].value.tolist() == [2**40 + 5]
    assert fresh["acc"].value.tolist() == [1e300]


@pytest.mark.parametrize("layout", ["jaxstow", "objax"])
def test_a_weakly_typed_variable_stays_weakly_typed_and_a_strong_one_strong(tmp_path, layout) -> None:
    # a scale held as jnp.asarray(2.0) came back strongly typed: bf16 activations times it turned float32
    path = str(tmp_path / "vars.npz")
    saved = {"scale": objax.StateVar(jnp.asarray(2.0)), "bias": objax.TrainVar(jnp.zeros(2, jnp.float32))}
    if layout == "jaxstow":
        objax_io.save_var_collection(path, saved)
    else:
        objax.io.save_var_collection(path, objax.VarCollection(saved))
    fresh = {"scale": objax.StateVar(jnp.asarray(1.0)), "bias": objax.TrainVar(jnp.ones(2, jnp.float32))}
    objax_io.load_var_collection(path, fresh)
    assert fresh["scale"].value.weak_type and float(fresh["scale"].value) == 2.0
    assert (jnp.ones(2, jnp.bfloat16) * fresh["scale"].value).dtype == jnp.bfloat16
    assert not fresh["bias"].value.weak_type and fresh["bias"].value.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("layout", ["jaxstow", "objax"])
def test_a_file_object_at_the_first_of_two_archives_is_refused_not_read_as_the_second(layout, tmp_path) -> None:
    layer, parts = objax.nn.Linear(2, 2), []
    for scale in (1.0, 2.0):  # zipfile finds an archive from its end: the second, from the first's position
        path = tmp_path / f"{scale}.npz"
        if layout == "objax":
            np.savez(path, names=np.array(["(Linear).w"]), **{"0": np.full((2, 2), scale, np.float32)})
        else:
            jaxstow.save(path, {"(Linear).w": np.full((2, 2), scale, np.float32)})
        parts.append(path.read_bytes())
    with pytest.raises(jaxstow.errors.FormatError, match="holds other data before the npz archive"):
        objax_io.load_var_collection(io.BytesIO(b"".join(parts)), {"(Linear).w": layer.w})


def test_an_objax_archive_is_checked_before_anything_is_allocated(tmp_path) -> None:
    path = tmp_path / "hostile.npz"
    np.savez(path, names=np.array(["(Linear).w"]), **{"0": np.ones((2, 2), np.float32)})
    data = path.read_bytes().replace(b"'shape': (2, 2)", b"'shape': (9, 9)")  # no more bytes than (2, 2)
    path.write_bytes(data)
    with pytest.raises(jaxstow.errors.CorruptFileError, match=r"the npy header promises|Bad CRC-32"):
        objax_io.load_var_collection(path, {"(Linear).w": objax.nn.Linear(2, 2).w})
    np.savez(path, names=np.array(["(Linear).w"]), **{"0": np.array([None, 1], object)})
    with pytest.raises(jaxstow.errors.FormatError, match="object arrays are never loaded"):
        objax_io.load_var_collection(path, {"(Linear).w": objax.nn.Linear(2, 2).w})


def test_two_stored_variables_under_one_name_are_refused_and_nothing_is_assigned(tmp_path) -> None:
    layer = objax.nn.Linear(2, 2)
    before = np.asarray(layer.w.value)
    path = tmp_path / "two.jxs"
    objax_io.save_var_collection(path, {"(Enc).w": objax.TrainVar(jnp.ones((2, 2))), "(Dec).w": layer.w})
    with pytest.raises(VariableMismatchError, match=r"'\(Linear\).w': two stored variables are renamed to it"):
        objax_io.load_var_collection(path, layer.vars(), renamer=lambda name: "(Linear)." + name.split(".")[-1])
    path = tmp_path / "twice.npz"
    np.savez(path, names=np.array(["(Linear).w", "(Linear).w"]), **{"0": np.ones((2, 2), np.float32), "1": before})
    with pytest.raises(VariableMismatchError, match=r"'\(Linear\).w': named twice"):
        objax_io.load_var_collection(path, layer.vars())
    np.testing.assert_array_equal(layer.w.value, before)


def test_the_checkpoint_keeps_the_latest_and_restores_any(tmp_path, capsys) -> None:
    modules = [_mlp() for _ in range(4)]
    ckpt = objax_io.Checkpoint(tmp_path, keep_ckpts=2)
    for idx, module in enumerate(modules[:3], start=1):
        ckpt.save(module.vars(), idx)
    assert sorted(name for name in os.listdir(tmp_path / "ckpt") if name.endswith(".npz")) == [
        "0000000002.npz",
        "0000000003.npz",
    ]
    target = modules[3]
    assert ckpt.restore(target.vars()) == (3, os.path.join(tmp_path, "ckpt", "0000000003.npz"))
    _assert_same(modules[2], target)
    assert ckpt.restore(target.vars(), idx=2)[0] == 2
    _assert_same(modules[1], target)
    assert capsys.readouterr().out.splitlines()[0] == f"Resuming from {tmp_path}/ckpt/0000000003.npz"
    assert ckpt.checkpoint_idx("/runs/ckpt/0000000042.npz") == 42
    with pytest.raises(FileNotFoundError, match="no checkpoint 1 here"):
        ckpt.restore(target.vars(), idx=1)


def test_an_empty_checkpoint_folder_restores_nothing(tmp_path, capsys) -> None:
    module = _mlp()
    before = _values(module)
    assert objax_io.Checkpoint(tmp_path, keep_ckpts=2).restore(module.vars()) == (0, "")
    assert capsys.readouterr().out == "No checkpoints found. Skipping restoring variables.\n"
    after = _values(module)
    assert all(np.array_equal(after[name], before[name]) for name in before)
    with pytest.raises(TypeError, match="variable collection"):
        objax_io.Checkpoint(tmp_path, keep_ckpts=2, verbose=False).save(module, 1)


def test_a_file_name_in_folders_not_made_yet_makes_them_as_objax_does(tmp_path) -> None:
    module = _mlp()
    objax_io.save_var_collection(str(tmp_path / "deep" / "sub" / "net.npz"), module.vars())
    objax_io.load_var_collection(str(tmp_path / "deep" / "sub" / "net.npz"), module.vars())
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(jaxstow.errors.NotAFolderError):
        objax_io.save_var_collection(str(tmp_path / "file" / "net.npz"), module.vars())


def test_a_file_whose_dict_keys_are_no_names_is_refused_naming_the_file(tmp_path) -> None:
    jaxstow.save(tmp_path / "ints.jxs", {0: np.ones(3, np.float32)})
    with pytest.raises(VariableMismatchError, match=r"ints\.jxs does not fit .*\n  - 0: a key of the file's dict that"):
        objax_io.load_var_collection(str(tmp_path / "ints.jxs"), {"0": objax.StateVar(np.zeros(3, np.float32))})


@pytest.mark.parametrize(
    ("vc", "found"),
    [
        ({"(Linear).w": objax.StateVar(jnp.ones(2)), 0: objax.StateVar(jnp.ones(1))}, "the name 0"),
        (
            {"(Linear).w": objax.StateVar(jnp.ones(2)), "(Linear).steps": objax.StateVar(3)},
            "'(Linear).steps' holding int",
        ),
        (
            {"(Linear).w": objax.StateVar(jnp.ones(2)), "(Linear).cfg": objax.StateVar(None)},
            "'(Linear).cfg' holding NoneType",
        ),
    ],
    ids=["int-name", "int-value", "none-value"],
)
def test_a_collection_load_var_collection_could_not_read_back_is_refused_by_the_save(tmp_path, vc, found) -> None:
    path = tmp_path / "net.npz"
    objax_io.save_var_collection(path, _mlp().vars())
    before = path.read_bytes()
    with pytest.raises(
        jaxstow.errors.ArgumentError,
        match=rf"net\.npz: save_var_collection saves arrays under str names, which load_var_collection reads back; "
        rf"vc has {re.escape(found)}: pass module\.vars\(\)",
    ):
        objax_io.save_var_collection(path, vc)
    assert path.read_bytes() == before  # the earlier save is still there


def test_weights_saved_apart_are_refused_by_a_model_that_ties_them_unless_one_is_chosen(tmp_path) -> None:
    untied = objax.nn.Sequential([objax.nn.Linear(2, 2), objax.functional.relu, objax.nn.Linear(2, 2)])
    path = tmp_path / "untied.npz"
    objax_io.save_var_collection(path, untied.vars())
    layer = objax.nn.Linear(2, 2)
    tied = objax.nn.Sequential([layer, objax.functional.relu, layer])  # one layer under two names
    before = np.asarray(layer.w.value)
    with pytest.raises(
        VariableMismatchError, match=r"one variable here \(tied weights\), but the file holds different"
    ):
        objax_io.load_var_collection(path, tied.vars())
    np.testing.assert_array_equal(layer.w.value, before)
    objax_io.load_var_collection(path, tied.vars(), renamer=lambda name: name.replace("[2]", "[9]"))  # the first
    np.testing.assert_array_equal(layer.w.value, untied[0].w.value)
    objax_io.save_var_collection(path, tied.vars())  # saved tied: one value per variable, which loads back
    objax_io.load_var_collection(path, tied.vars())


@pytest.mark.parametrize("target", ["path", "file object"])
def test_a_collection_whose_values_end_as_a_zip_archive_ends_loads_back(tmp_path, target) -> None:
    # 101010256 is b"PK\x05\x06", the start of a zip archive's last record: found in the last 64 KiB of a file saved
    # here, it took the file for a zip archive, and the load raised zipfile's BadZipFile.
    ids = np.array([7, 101010256, 3, 1, 4, 1, 5, 9], np.int32)
    saved = {"(Model).w": objax.TrainVar(jnp.ones((4, 4))), "(Model).ids": objax.StateVar(jnp.asarray(ids))}
    file = str(tmp_path / "model.safetensors") if target == "path" else io.BytesIO()
    objax_io.save_var_collection(file, saved)
    if isinstance(file, io.BytesIO):
        file.seek(0)
    fresh = {"(Model).w": objax.TrainVar(jnp.zeros((4, 4))), "(Model).ids": objax.StateVar(jnp.zeros(8, jnp.int32))}
    objax_io.load_var_collection(file, fresh)
    np.testing.assert_array_equal(fresh["(Model).ids"].value, ids)


def test_an_objax_archive_with_a_damaged_central_directory_is_corrupt_not_a_zipfile_error(tmp_path) -> None:
    path = tmp_path / "objax.npz"
    np.savez(path, names=np.array(["(Linear).w"]), **{"0": np.ones((2, 2), np.float32)})
    path.write_bytes(path.read_bytes().replace(b"PK\x01\x02", b"PK\x01\x03", 1))
    with pytest.raises(jaxstow.errors.CorruptFileError, match="not a readable zip archive") as raised:
        objax_io.load_var_collection(path, {"(Linear).w": objax.nn.Linear(2, 2).w})
    assert raised.value.file == str(path)


def test_a_file_object_past_an_objax_archive_loads_what_was_saved_there(tmp_path) -> None:
    # The archive before the position was found from the file's end, and its layout read at the position.
    buffer = io.BytesIO()
    np.savez(buffer, names=np.array(["w"]), **{"0": np.full(3, 1.0, np.float32)})
    start = buffer.tell()
    objax_io.save_var_collection(buffer, {"w": objax.TrainVar(jnp.full(3, 2.0))})
    buffer.seek(start)
    fresh = {"w": objax.TrainVar(jnp.zeros(3))}
    objax_io.load_var_collection(buffer, fresh)
    assert fresh["w"].value.tolist() == [2.0, 2.0, 2.0] and buffer.tell() == start
