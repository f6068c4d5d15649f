"""CheckpointManager on real files: saving and restoring items, force, errors, reading while saving, progress."""

from __future__ import annotations

import collections
import json
import logging
import os

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxstow
from jaxstow import CheckpointManager, KeepPolicy
from jaxstow._storage.atomic import TEMPORARY_MARKER
from jaxstow.errors import ArgumentError, CheckpointError, StructureMismatchError


def _train_state(seed: int = 0) -> dict:
    model = eqx.nn.MLP(3, 2, 8, 2, key=jax.random.key(seed))
    optimizer = optax.adam(1e-3)
    return {
        "params": model,
        "opt_state": optimizer.init(eqx.filter(model, eqx.is_array)),
        "rng": jax.random.key(seed),
        "epoch": 7,
    }


def _assert_same(actual, expected) -> None:
    assert jax.tree.structure(actual) == jax.tree.structure(expected)
    for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected), strict=True):
        if isinstance(e, jax.Array) and jnp.issubdtype(e.dtype, jax.dtypes.prng_key):
            np.testing.assert_array_equal(jax.random.key_data(a), jax.random.key_data(e))
        elif isinstance(e, jax.Array | np.ndarray):
            assert a.dtype == e.dtype and a.shape == e.shape
            np.testing.assert_array_equal(np.asarray(a), np.asarray(e))
        else:
            assert a == e


def test_named_items_round_trip_without_target(tmp_path):
    state = _train_state()
    with CheckpointManager(tmp_path) as manager:
        manager.save(10, state, metrics={"loss": 0.5}, metadata={"lr": 1e-3, "note": "first"})
        restored = manager.restore()
        assert manager.steps() == [10] and manager.latest_step() == 10
        assert manager.metrics(10) == {"loss": 0.5}
        assert manager.metadata(10) == {"lr": 1e-3, "note": "first"}
        assert manager.items(10) == ["epoch", "opt_state", "params", "rng"]
    _assert_same(restored, state)
    assert isinstance(restored["params"], eqx.nn.MLP) and restored["params"].activation is jax.nn.relu
    # The layout: one jaxstow file per item, each loadable on its own, and checkpoint.json.
    files = sorted(os.listdir(tmp_path / "10"))
    assert files == ["checkpoint.json", *(f"{name}.safetensors" for name in ("epoch", "opt_state", "params", "rng"))]
    _assert_same(jaxstow.load(tmp_path / "10" / "params.safetensors"), state["params"])
    record = json.loads((tmp_path / "10" / "checkpoint.json").read_text())
    assert record["step"] == 10 and record["metrics"] == {"loss": 0.5} and record["single"] is False


def test_one_tree_round_trip_and_as_numpy(tmp_path):
    tree = [jnp.arange(4.0), (jnp.ones((2, 2), jnp.bfloat16), "label")]
    with CheckpointManager(tmp_path) as manager:
        manager.save(0, tree)
        assert manager.items(0) is None
        restored = manager.restore(0, as_numpy=True)
    assert isinstance(restored, list) and isinstance(restored[0], np.ndarray)
    assert restored[1][0].dtype == jnp.bfloat16 and restored[1][1] == "label"
    assert sorted(os.listdir(tmp_path / "0")) == ["checkpoint.json", "state.safetensors"]


def test_restore_with_like_fits_and_checks(tmp_path):
    state = _train_state(1)
    with CheckpointManager(tmp_path) as manager:
        manager.save(3, state)
        template = _train_state(2)
        restored = manager.restore(like=template)
        _assert_same(restored, state)
        # One item rebuilt from its file with None, one fitted.
        mixed = manager.restore(like={"params": template["params"], "opt_state": None, "rng": None, "epoch": 0})
        _assert_same(mixed["opt_state"], state["opt_state"])
        # A model of another shape: every mismatch listed, nothing loaded partially.
        other = eqx.nn.MLP(3, 2, 16, 2, key=jax.random.key(0))
        with pytest.raises(StructureMismatchError, match=r"params\.safetensors") as caught:
            manager.restore(like={**template, "params": other})
        assert any("layers/0/weight" in problem for problem in caught.value.problems)
        with pytest.raises(CheckpointError, match=r"no entry for \['rng'\]"):
            manager.restore(like={"params": template["params"], "opt_state": None, "epoch": None})
        with pytest.raises(TypeError, match="like must be a dict from item names"):
            manager.restore(like=template["params"])


def test_partial_items(tmp_path):
    state = _train_state()
    with CheckpointManager(tmp_path) as manager:
        manager.save(1, state)
        only = manager.restore(items=["params", "epoch"])
        assert sorted(only) == ["epoch", "params"] and only["epoch"] == 7
        fitted = manager.restore(items=["params"], like={"params": _train_state(5)["params"]})
        _assert_same(fitted["params"], state["params"])
        whole = manager.restore(items=["params"], like=_train_state(5))  # the whole state as like: its params used
        assert sorted(whole) == ["params"]  # was "it has entries for ['epoch', ...], which are not restored"
        _assert_same(whole["params"], state["params"])
        with pytest.raises(CheckpointError, match=r"entries for \['ema'\], which are not restored") as refused:
            manager.restore(items=["params"], like={**_train_state(5), "ema": None})  # no item of the step
        assert "items=[...]" not in str(refused.value)  # given already
        with pytest.raises(
            CheckpointError, match=r"no item \['ema'\] \(its items: \['epoch', 'opt_state', 'params', 'rng'\]"
        ):
            manager.restore(items=["ema"])
        with pytest.raises(TypeError, match=r"a list of item names, such as \['params'\]"):
            manager.restore(items="params")
        for twice in (["epoch", "epoch"], ["params", "params"]):  # a value item's step was called damaged
            with pytest.raises(ArgumentError, match=r"items names \['.*'\] twice: name each item once"):
                manager.restore(items=twice, fallback=True)
        manager.save(2, jnp.ones(2))
        with pytest.raises(CheckpointError, match="saved as one tree"):
            manager.restore(2, items=["state"])


def test_a_selection_of_keys_holding_wildcard_characters_restores_those_keys(tmp_path):
    # Each item was given the leaves chosen as patterns of [c] classes, which select does not know: another leaf came
    # back ('a*' asked, 'a[*]' given), or none.
    with CheckpointManager(tmp_path) as manager:
        manager.save(1, {"params": {"a*": np.full(1, 3.0), "a[*]": np.full(1, 4.0), "attn[0]": np.full(1, 1.0)}})
        assert manager.restore(select=["params/a?"]) == {"params": {"a*": np.full(1, 3.0)}}
        restored = manager.restore(select=["params/**"])["params"]
    assert {key: float(value[0]) for key, value in restored.items()} == {"a*": 3.0, "a[*]": 4.0, "attn[0]": 1.0}


def test_a_sharding_dict_keyed_by_no_item_is_refused_naming_the_items(tmp_path):
    with CheckpointManager(tmp_path) as manager:
        manager.save(1, {"params": {"w": np.arange(4.0)}, "opt": {"mu": np.zeros(2)}})
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        with pytest.raises(
            jaxstow.errors.ShardingError, match=r"keyed by 'parms', .*\(its items are 'opt', 'params'\)"
        ):
            manager.restore(sharding={"parms": device})  # a typo placed 'params' on the default device, silently
        assert manager.restore(sharding={"params": device}, items=["params"])["params"]["w"].sharding == device


def test_a_sharding_function_sees_the_paths_load_gives_and_is_named_when_it_fails(tmp_path):
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    seen = []

    def by_path(path, shape, dtype):
        seen.append(path)
        return device if path in ("w", "p/b") else None  # a rule written against load's paths

    with CheckpointManager(tmp_path) as manager:
        manager.save(1, {"w": np.ones(4, np.float32), "p": {"b": np.zeros(2, np.float32)}})  # 'w': one array
        restored = manager.restore(sharding=by_path)
        assert sorted(seen) == ["p/b", "w"]  # never 'w/', which no rule of load's paths matches
        assert restored["w"].sharding == device and restored["p"]["b"].sharding == device

        def takes_one(path):
            return None

        with pytest.raises(jaxstow.errors.ShardingError, match=r"the sharding function <function .*takes_one at"):
            manager.restore(sharding=takes_one)


def test_restore_onto_a_device_and_a_sharding(tmp_path):
    device = jax.devices()[0]
    with CheckpointManager(tmp_path) as manager:
        manager.save(0, {"w": jnp.ones((4, 2)), "n": 3})
        on_device = manager.restore(sharding=device)
        sharding = jax.sharding.SingleDeviceSharding(device)
        on_sharding = manager.restore(sharding=sharding)
    for restored in (on_device, on_sharding):
        assert isinstance(restored["w"], jax.Array) and restored["w"].sharding == sharding
        assert restored["n"] == 3


def test_existing_step_needs_force_which_replaces_it(tmp_path):
    with CheckpointManager(tmp_path) as manager:
        manager.save(5, {"w": jnp.zeros(3)}, metrics={"loss": 2.0})
        manager.wait()
        with pytest.raises(CheckpointError, match=r"step 5 already exists in .*; pass force=True to replace it"):
            manager.save(5, {"w": jnp.ones(3)})
        np.testing.assert_array_equal(manager.restore(5)["w"], np.zeros(3))
        manager.save(5, {"w": jnp.ones(3), "b": jnp.ones(1)}, metrics={"loss": 1.0}, force=True)
        assert manager.steps() == [5] and manager.metrics(5) == {"loss": 1.0}
        restored = manager.restore(5)
    np.testing.assert_array_equal(restored["w"], np.ones(3))
    assert sorted(restored) == ["b", "w"]
    assert not [name for name in os.listdir(tmp_path) if TEMPORARY_MARKER in name]


def test_flags_read_from_a_config_file_as_strings_are_refused_and_the_step_stays(tmp_path):
    config = {"force": "false", "copy": "no", "fallback": "False"}  # as a YAML or argparse string arrives
    with CheckpointManager(tmp_path) as manager:
        manager.save(5, {"w": jnp.zeros(3)})
        with pytest.raises(TypeError, match=r"force must be True or False, not 'false'"):
            manager.save(5, {"w": jnp.ones(3)}, force=config["force"])  # was taken for True: step 5 replaced
        with pytest.raises(TypeError, match=r"copy must be True or False, not 'no'"):
            manager.save(6, {"w": jnp.ones(3)}, copy=config["copy"])
        with pytest.raises(TypeError, match=r"fallback must be True or False, not 'False'"):
            manager.restore(fallback=config["fallback"])
        assert manager.steps() == [5]
        np.testing.assert_array_equal(manager.restore(5)["w"], np.zeros(3))


def test_a_closed_manager_reads_a_step_another_manager_replaced(tmp_path):
    # While it held the lock it kept the records it had read; once closed, another manager may replace a step.
    with CheckpointManager(tmp_path) as first:
        for step in (1, 2):
            first.save(step, {"w": np.full(2, step)}, metrics={"loss": float(step)})
        assert first.metrics(2) == {"loss": 2.0}
    with CheckpointManager(tmp_path) as second:
        second.save(2, {"w": np.full(2, 22)}, metrics={"loss": 0.5}, force=True)
    assert first.metrics(2) == {"loss": 0.5} and first.best_step("loss") == 2
    restored = first.restore(fallback=True)
    assert first.restored is not None and (first.restored.step, first.restored.skipped) == (2, {})
    np.testing.assert_array_equal(restored["w"], [22, 22])


def test_an_ordered_dict_is_one_tree_and_keeps_its_order(tmp_path):
    # As named items it came back a plain dict in sorted order: its leaves, paired by position, swapped.
    state = collections.OrderedDict([("weights", np.full(2, 7.0, np.float32)), ("bias", np.zeros(2, np.float32))])
    with CheckpointManager(tmp_path) as manager:
        manager.save(1, state)
        for restored in (manager.restore(), manager.restore(like=state)):
            assert type(restored) is collections.OrderedDict and list(restored) == ["weights", "bias"]
            assert jax.tree.structure(restored) == jax.tree.structure(state)
            np.testing.assert_array_equal(jax.tree.leaves(restored)[0], [7.0, 7.0])


def test_delete(tmp_path):
    with CheckpointManager(tmp_path, keep=KeepPolicy(keep_last=5)) as manager:
        for step in range(3):
            manager.save(step, {"w": jnp.full(1, step)})
        manager.delete(1)
        assert manager.steps() == [0, 2]
        with pytest.raises(CheckpointError, match=r"step 1 is not in .*; its committed steps are \[0, 2\]"):
            manager.delete(1)
    assert sorted(os.listdir(tmp_path)) == ["0", "2"]


def test_missing_steps_and_bad_arguments(tmp_path):
    with CheckpointManager(tmp_path / "run") as manager:
        assert manager.steps() == [] and manager.latest_step() is None
        with pytest.raises(CheckpointError, match="holds no committed step"):
            manager.restore()
        manager.save(1, {"w": jnp.ones(1)})
        with pytest.raises(CheckpointError, match=r"step 4 is not in .*; its committed steps are \[1\]"):
            manager.restore(4)
        with pytest.raises(TypeError, match="a step must be a non-negative integer"):
            manager.save(-1, {"w": jnp.ones(1)})
        with pytest.raises(ValueError, match=r"\['a/b'\] do not"):
            manager.save(2, {"a/b": jnp.ones(1)})
        with pytest.raises(TypeError, match="metric 'loss' of step 2 must be a number"):
            manager.save(2, {"w": jnp.ones(1)}, metrics={"loss": "low"})
        with pytest.raises(TypeError, match="metadata of step 2 must be a JSON-able dict"):
            manager.save(2, {"w": jnp.ones(1)}, metadata={"f": print})
        with pytest.raises(ValueError, match="keep_best ranks steps by a metric"):
            CheckpointManager(tmp_path, keep=KeepPolicy(keep_best=2))
        with pytest.raises(ValueError, match="keep_last must be a positive integer"):
            CheckpointManager(tmp_path, keep=KeepPolicy(keep_last=0))
    with pytest.raises(CheckpointError, match="is closed"):
        manager.save(9, {"w": jnp.ones(1)})


def test_a_manager_given_a_checkpoint_file_says_it_takes_a_folder(tmp_path):
    jaxstow.save(tmp_path / "model.jxs", {"w": np.ones(2)})
    manager = CheckpointManager(tmp_path / "model.jxs")  # a file, where the folder of a run's steps belongs
    with pytest.raises(NotADirectoryError, match=r"model\.jxs: is a file, not a folder .*jaxstow\.load reads a file"):
        manager.latest_step()
    with pytest.raises(NotADirectoryError, match=r"model\.jxs/run: cannot be a folder: a part of its path is a file"):
        CheckpointManager(tmp_path / "model.jxs" / "run").save(1, {"w": np.ones(2)})
    np.testing.assert_array_equal(jaxstow.load(tmp_path / "model.jxs")["w"], np.ones(2))


def test_damaged_record_is_named(tmp_path):
    with CheckpointManager(tmp_path) as manager:
        manager.save(3, {"w": jnp.ones(1)})
    (tmp_path / "3" / "checkpoint.json").write_text('{"step": 3, "files": {"w": "../../etc/passwd"}}')
    with pytest.raises(jaxstow.errors.FormatError, match=r"3/checkpoint\.json: record version None"):
        CheckpointManager(tmp_path).restore()
    (tmp_path / "3" / "checkpoint.json").write_text(
        '{"record_version": 1, "step": 3, "time": 0, "single": false, "files": {"w": "../../etc/passwd"}}'
    )
    with pytest.raises(jaxstow.errors.FormatError, match="lacks a field or has one of the wrong type"):
        CheckpointManager(tmp_path).restore()


def test_non_finite_metrics_are_kept_as_null(tmp_path):
    with CheckpointManager(tmp_path) as manager:
        manager.save(0, {"w": jnp.ones(1)}, metrics={"loss": float("nan"), "acc": np.float32(0.5), "n": jnp.array(3)})
        assert manager.metrics(0) == {"loss": None, "acc": 0.5, "n": 3.0}


def test_reads_wait_for_the_save_in_flight(tmp_path):
    big = {"w": jnp.ones((2048, 2048))}
    with CheckpointManager(tmp_path) as manager:
        for step in range(3):
            manager.save(step, big)
            assert manager.latest_step() == step
            np.testing.assert_array_equal(manager.restore(step, as_numpy=True)["w"][:2, :2], np.ones((2, 2)))


def test_synchronous_saves_which_a_deprecated_shortcut_still_makes(tmp_path):
    with (
        pytest.warns(DeprecationWarning, match=r"CheckpointManager\(async_save=False\) is deprecated: saves run in"),
        CheckpointManager(tmp_path, keep=KeepPolicy(keep_last=1), async_save=False) as manager,
    ):
        manager.save(0, {"w": jnp.ones(2)})
        assert os.path.isfile(tmp_path / "0" / "checkpoint.json")
        with pytest.raises(jaxstow.errors.UnsaveableObjectError, match="cannot save leaf 'f'"):
            manager.save(1, {"w": {"f": lambda x: x}})
        assert manager.steps() == [0]


def test_donated_buffers_are_saved_as_they_were(tmp_path):
    """Arrays are held on the host at save time, so donating them right after a save cannot change the file."""

    def update(state: dict) -> dict:
        return {"w": state["w"] * 2.0 + 1.0, "rng": jax.random.split(state["rng"])[0]}

    donating = jax.jit(update, donate_argnums=0)
    state = {"w": jnp.ones((512, 512)), "rng": jax.random.key(0)}
    with CheckpointManager(tmp_path) as manager:
        for step in range(4):
            manager.save(step, state)
            state = donating(state)
        restored = [manager.restore(step) for step in range(4)]
    expected = {"w": jnp.ones((512, 512)), "rng": jax.random.key(0)}
    for step in range(4):
        _assert_same(restored[step], expected)
        expected = update(expected)


def test_copy_protects_numpy_buffers_changed_in_place(tmp_path):
    buffer = np.zeros((1024, 256), np.float32)
    with CheckpointManager(tmp_path) as manager:
        manager.save(0, {"w": buffer}, copy=True)
        buffer += 1  # changed while the save may still be running
        manager.wait()
        np.testing.assert_array_equal(manager.restore(0, as_numpy=True)["w"], np.zeros((1024, 256)))


def test_progress_is_logged_and_drawn(tmp_path, caplog, capsys):
    pytest.importorskip("tqdm")
    with (
        caplog.at_level(logging.INFO, logger="jaxstow"),
        CheckpointManager(tmp_path, keep=KeepPolicy(keep_last=1), progress=True) as manager,
    ):
        manager.save(0, {"w": jnp.ones(1000)})
        manager.save(1, {"w": jnp.ones(1000)})
    messages = [record.getMessage() for record in caplog.records]
    assert any("step 0 of" in message and "saving 4.00 kB of arrays" in message for message in messages)
    assert any("step 1 of" in message and "written in" in message for message in messages)
    assert any("deleted step 0 (keep policy)" in message for message in messages)
    assert "step 1 of" in capsys.readouterr().err  # tqdm draws on stderr


def test_fsspec_file_url_is_a_local_path(tmp_path):
    with CheckpointManager(f"file://{tmp_path}") as manager:
        manager.save(1, {"w": jnp.ones(1)})
    assert os.path.isfile(tmp_path / "1" / "checkpoint.json")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("a.b", r"may hold only letters, digits, '_' and '-'; \['a\.b'\] do not"),
        ("k" * 300, r"300 characters are more than the 200 an item name may have"),
    ],
)
def test_item_names_that_cannot_be_file_names_are_refused_at_the_call(tmp_path, name, message):
    with CheckpointManager(tmp_path / "run") as manager:
        with pytest.raises(ArgumentError, match=message):
            manager.save(1, {name: np.ones(2), "w": np.ones(2)})
        manager.save(1, {"k" * 200: np.ones(2)})  # the longest
    assert CheckpointManager(tmp_path / "run").steps() == [1]


def test_a_partial_restore_leaves_the_items_like_lacks_unread_and_lists_every_missing_leaf(tmp_path):
    spec = jax.ShapeDtypeStruct
    state = {"params": {"w": jnp.arange(4.0), "b": jnp.ones(3)}, "opt": {"mu": jnp.zeros(4)}}
    with CheckpointManager(tmp_path / "run") as manager:
        manager.save(1, state)
        manager.wait()
        restored = manager.restore(like={"params": {"w": spec((4,), jnp.float32)}}, partial=True)
        assert list(restored) == ["params"] and list(restored["params"]) == ["w"]  # as jaxstow.load of one file
        with pytest.raises(CheckpointError, match=r"it has no entry for \['opt'\]"):
            manager.restore(like={"params": {"w": spec((4,), jnp.float32)}})  # without partial: every item
        wanted = {
            "params": {"w": spec((4,), jnp.float32), "zz": spec((1,), jnp.float32)},
            "opt": {"mu": spec((4,), jnp.float32), "nu": spec((4,), jnp.float32)},
        }
        with pytest.raises(StructureMismatchError) as caught:
            manager.restore(like=wanted, partial=True)
    assert caught.value.problems == [
        "'opt/nu': missing from the file (expected float32[4])",
        "'params/zz': missing from the file (expected float32[1])",
    ]
