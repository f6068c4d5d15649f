"""Arrays of a weak type (``jnp.asarray(2.0)``, a learning rate made from a Python float) promote as Python scalars
do: a bf16 array times one stays bf16. They come back weakly typed from every way of saving and restoring, so that
a resumed run computes in the dtypes the uninterrupted one did (and its jitted step is not compiled again)."""

from __future__ import annotations

import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxstow
from jaxstow._util import pinned
from jaxstow._write import host_budget
from jaxstow._write.encoded import encode_tree
from jaxstow.errors import FormatError


def _state() -> dict:
    return {
        "lr": jnp.asarray(1e-3),  # weak float32
        "count": jnp.asarray(7),  # weak int32
        "strong": jnp.asarray(1e-3, jnp.float32),
        "w": jnp.ones(4, jnp.bfloat16),
        "table": jnp.asarray([1.0, 2.0]) * jnp.asarray(3.0),  # strong: a weak array of shape (2,) below
        "weak_row": jnp.broadcast_to(jnp.asarray(2.0), (3,)),
    }


def _check(restored: dict) -> None:
    assert restored["lr"].weak_type and restored["count"].weak_type and restored["weak_row"].weak_type
    assert not restored["strong"].weak_type and not restored["table"].weak_type and not restored["w"].weak_type
    assert (restored["w"] * restored["lr"]).dtype == jnp.bfloat16  # a strong float32 would give float32
    assert (restored["w"] * restored["strong"]).dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(restored["lr"]), np.float32(1e-3))
    np.testing.assert_array_equal(np.asarray(restored["weak_row"]), np.full(3, 2.0, np.float32))
    assert int(restored["count"]) == 7


@pytest.mark.parametrize("pipeline", [False, True])
def test_a_file_gives_back_weakly_typed_arrays_as_such(tmp_path, pipeline):
    state = _state()
    assert state["weak_row"].weak_type
    jaxstow.save(tmp_path / "state.jxs", state)
    _check(jaxstow.load(tmp_path / "state.jxs", pipeline=pipeline))
    _check(jaxstow.load(tmp_path / "state.jxs", like=state, pipeline=pipeline))
    as_numpy = jaxstow.load(tmp_path / "state.jxs", as_numpy=True)
    assert type(as_numpy["lr"]) is np.ndarray and as_numpy["lr"].dtype == np.float32


def test_like_decides_the_weak_type_of_what_it_restores(tmp_path):
    # The file's weak lr restored into a strong template (eval_shape of a state made strong): strong, as like asks.
    jaxstow.save(tmp_path / "state.jxs", _state())
    strong = {name: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype) for name, leaf in _state().items()}
    restored = jaxstow.load(tmp_path / "state.jxs", like=strong)
    assert not any(leaf.weak_type for leaf in restored.values())
    assert (restored["w"] * restored["lr"]).dtype == jnp.float32
    weak = {name: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, weak_type=True) for name, leaf in _state().items()}
    assert all(leaf.weak_type for leaf in jaxstow.load(tmp_path / "state.jxs", like=weak).values())


def test_a_resumed_step_is_not_compiled_again_and_computes_in_the_same_dtypes(tmp_path):
    state = _state()
    step = jax.jit(lambda s: {**s, "w": s["w"] - s["lr"] * s["w"], "count": s["count"] + 1})
    before = step(state)
    with jaxstow.CheckpointManager(tmp_path / "run") as manager:
        manager.save(0, state)
        manager.wait()
        resumed = manager.restore(0)
    after = step(jax.device_put(resumed, jax.devices()[0]))
    assert after["w"].dtype == jnp.bfloat16 and after["count"].weak_type
    np.testing.assert_array_equal(np.asarray(after["w"]), np.asarray(before["w"]))
    _check(resumed)


@pytest.mark.parametrize("staging", ["pageable", "pinned_host"])
def test_arrays_fetched_from_an_accelerator_keep_their_weak_type(tmp_path, monkeypatch, staging):
    """The background save holds arrays on the host (or has its writer fetch them within a budget): numpy arrays,
    which have no weak type; the mark is taken from the caller's arrays."""
    monkeypatch.setattr(host_budget, "_HOST_PLATFORMS", frozenset())
    monkeypatch.setattr(host_budget, "_accelerators_present", lambda: True)
    if staging == "pinned_host":
        monkeypatch.setattr(pinned, "PINNED_PLATFORMS", pinned.PINNED_PLATFORMS | {"cpu"})
    for limit in (None, 64):
        with jaxstow.CheckpointManager(tmp_path / f"run-{limit}", host_memory_limit=limit) as manager:
            manager.save(0, _state())
            manager.save(1, _state(), copy=True)
            manager.wait()
            _check(manager.restore(0))
            _check(manager.restore(1))
        jaxstow.save(tmp_path / f"direct-{limit}.jxs", _state(), host_memory_limit=limit)
        _check(jaxstow.load(tmp_path / f"direct-{limit}.jxs"))


def test_a_sharded_weakly_typed_array_keeps_its_type_and_sharding(tmp_path):
    mesh = jax.make_mesh((4,), ("x",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))
    weak = jax.device_put(jnp.broadcast_to(jnp.asarray(2.0), (8,)), sharding)
    assert weak.weak_type
    jaxstow.save(tmp_path / "sharded.jxs", {"weak": weak})
    restored = jaxstow.load(tmp_path / "sharded.jxs", sharding="saved")["weak"]
    assert restored.weak_type and restored.sharding.is_equivalent_to(sharding, 1)
    np.testing.assert_array_equal(np.asarray(restored), np.full(8, 2.0, np.float32))


@pytest.mark.parametrize("pipeline", [False, True])
def test_a_weakly_typed_array_restored_into_host_memory_stays_there_and_weak(tmp_path, pipeline):
    if "pinned_host" not in {memory.kind for memory in jax.devices()[0].addressable_memories()}:
        pytest.skip("this jax's devices have no pinned_host memory")
    host = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="pinned_host")
    jaxstow.save(tmp_path / "weak.jxs", {"scale": jnp.asarray(2.0), "w": jnp.ones(4)})
    restored = jaxstow.load(tmp_path / "weak.jxs", sharding=host, pipeline=pipeline)
    assert restored["scale"].weak_type and not restored["w"].weak_type
    assert {leaf.sharding.memory_kind for leaf in restored.values()} == {"pinned_host"}
    assert float(restored["scale"]) == 2.0


def test_a_cast_array_is_of_its_target_dtype_not_weak(tmp_path):
    jaxstow.save(tmp_path / "lr.jxs", {"lr": jnp.asarray(0.5)})
    like = {"lr": jax.ShapeDtypeStruct((), jnp.float64 if jax.config.jax_enable_x64 else jnp.bfloat16)}
    restored = jaxstow.load(tmp_path / "lr.jxs", like=like, cast=True)["lr"]
    assert restored.dtype == like["lr"].dtype and not restored.weak_type


def test_a_weak_mark_other_than_true_is_refused_naming_the_leaf(tmp_path):
    encoded = encode_tree({"lr": jnp.asarray(0.5), "w": jnp.ones(2)})
    assert encoded.leaves[0].entry["weak"] is True and "weak" not in encoded.leaves[1].entry
    encoded.leaves[0].entry["weak"] = 1
    with open(tmp_path / "lr.jxs", "wb") as file:
        encoded.write(file)
    with pytest.raises(FormatError, match="malformed weak 1") as caught:
        jaxstow.load(tmp_path / "lr.jxs")
    assert caught.value.path == "lr"


def test_a_weak_array_saved_with_64_bits_is_weak_when_read_with_them_off(tmp_path):
    # jax holds a weak float64 as a weak float32 with its 64-bit mode off: the restored one was a strong float32,
    # which made bf16 * lr a float32 and a jitted step compile again
    source = (
        "import sys, jax; jax.config.update('jax_enable_x64', True); import jax.numpy as jnp, jaxstow; "
        "state = {'lr': jnp.asarray(1.5), 'step': jnp.asarray(7)}; jaxstow.save(sys.argv[1] + '.jxs', state); "
        "manager = jaxstow.CheckpointManager(sys.argv[1]); manager.save(1, state); manager.close()"
    )
    subprocess.run([sys.executable, "-c", source, str(tmp_path / "x64")], check=True)
    restored = jaxstow.CheckpointManager(tmp_path / "x64").restore()
    for loaded in (jaxstow.load(tmp_path / "x64.jxs"), restored):
        assert (loaded["lr"].dtype, loaded["lr"].weak_type) == (jnp.float32, True)
        assert (loaded["step"].dtype, loaded["step"].weak_type) == (jnp.int32, True)
        assert (jnp.ones(2, jnp.bfloat16) * loaded["lr"]).dtype == jnp.bfloat16
