"""Where ``like``'s restored leaves land, over four CPU devices (tests/conftest.py): Python scalars restored into the
weakly typed 0-d arrays ``jax.eval_shape`` makes of them where ``sharding=`` says, as every restored array does, and
``like``'s numpy leaves too; with ``as_numpy=True``, nowhere, whatever shardings ``like`` holds."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

import jaxstow
from jaxstow.errors import ShardingError


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "state.jxs"
    jaxstow.save(path, {"lr": 0.5, "w": np.arange(4.0, dtype=np.float32)})
    return path


def _like(sharding=None):
    return {
        "lr": jax.ShapeDtypeStruct((), jnp.float32, weak_type=True, sharding=sharding),
        "w": jax.ShapeDtypeStruct((4,), jnp.float32),
    }


@pytest.mark.parametrize("spec_form", ["one", "tree", "function"])
def test_sharding_places_a_python_scalar_as_it_places_the_arrays(saved, spec_form):
    replicated = NamedSharding(jax.make_mesh((4,), ("x",)), P())
    spec = {
        "one": replicated,
        "tree": {"lr": replicated, "w": replicated},
        "function": lambda path, shape, dtype: replicated,
    }[spec_form]
    on_device_1 = SingleDeviceSharding(jax.devices()[1])
    restored = jaxstow.load(saved, like=_like(on_device_1), sharding=spec)  # sharding= wins over like's
    assert restored["lr"].sharding == replicated == restored["w"].sharding
    assert float(restored["lr"]) == 0.5 and restored["lr"].weak_type
    assert jax.jit(lambda lr, w: lr * w)(restored["lr"], restored["w"]).tolist() == [0.0, 0.5, 1.0, 1.5]


def test_a_python_scalar_lands_on_the_device_sharding_names(saved):
    device = jax.devices()[2]
    restored = jaxstow.load(saved, like=_like(), sharding=device)
    assert restored["lr"].devices() == {device} == restored["w"].devices()


def test_a_sharding_that_cannot_hold_a_python_scalar_is_refused_naming_it(saved):
    rows = NamedSharding(jax.make_mesh((4,), ("x",)), P("x"))
    with pytest.raises(ShardingError, match=r"leaf 'lr' of .*state.jxs: shape \[\] cannot be laid out"):
        jaxstow.load(saved, like=_like(), sharding=rows)


def test_as_numpy_takes_a_like_whose_shardings_name_an_abstract_mesh(saved):
    # as_numpy=True places nothing: like's shardings (from jax.eval_shape under a mesh) are no reason to refuse,
    # and sharding= (the advice given) is refused with as_numpy=True
    abstract = NamedSharding(jax.make_mesh((4,), ("x",)).abstract_mesh, P())
    like = {**_like(abstract), "w": jax.ShapeDtypeStruct((4,), jnp.float32, sharding=abstract)}
    restored = jaxstow.load(saved, like=like, as_numpy=True)
    assert type(restored["lr"]) is np.ndarray and float(restored["lr"]) == 0.5
    assert type(restored["w"]) is np.ndarray and restored["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(ShardingError, match=r"leaf '(lr|w)' of .*state.jxs: its sharding .* has an abstract mesh"):
        jaxstow.load(saved, like=like)


@pytest.mark.parametrize("through", ["load", "manager"])
def test_sharding_places_the_numpy_leaves_of_like_and_refuses_one_that_cannot_hold_them(tmp_path, through):
    # like from a model set up with numpy: sharding= still says where each array lands, and is checked to fit
    weights = np.arange(24, dtype=np.float32).reshape(6, 4)
    like = {"step": np.int32(0), "w": np.zeros((6, 4), np.float32)}
    if through == "load":
        jaxstow.save(tmp_path / "state.jxs", {"step": np.int32(7), "w": weights})
        restore = lambda **options: jaxstow.load(tmp_path / "state.jxs", like=like, **options)  # noqa: E731
    else:
        manager = jaxstow.CheckpointManager(tmp_path / "run")
        manager.save(7, {"step": np.int32(7), "w": weights})
        manager.wait()
        restore = lambda **options: manager.restore(7, like=like, **options)  # noqa: E731
    mesh = jax.make_mesh((4,), ("x",))
    columns = NamedSharding(mesh, P(None, "x"))
    restored = restore(sharding={"step": None, "w": columns})
    assert isinstance(restored["w"], jax.Array) and restored["w"].sharding == columns
    assert np.array_equal(restored["w"], weights) and int(restored["step"]) == 7
    with pytest.raises(ShardingError, match=r"(leaf 'w' of .*|w\.safetensors): shape \[6, 4\] cannot be laid out"):
        restore(sharding={"step": None, "w": NamedSharding(mesh, P("x"))})  # 6 rows over 4 devices
    untouched = restore()  # without sharding=, numpy leaves of like come back as numpy arrays
    assert type(untouched["w"]) is np.ndarray and type(untouched["step"]) is np.int32


def _unfixed(kind: str) -> NamedSharding:
    """A sharding that leaves an array's layout to a computation: an axis unconstrained, or values not reduced."""
    if kind == "unconstrained":
        if not hasattr(P, "UNCONSTRAINED"):
            pytest.skip("this jax has no unconstrained axes")
        auto = jax.make_mesh((4,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
        return NamedSharding(auto, P(P.UNCONSTRAINED))
    try:
        return NamedSharding(jax.make_mesh((4,), ("x",)), P(None, unreduced={"x"}))
    except (TypeError, ValueError):
        pytest.skip("this jax has no unreduced axes")


@pytest.mark.parametrize("kind", ["unconstrained", "unreduced"])
@pytest.mark.parametrize("given", ["like", "sharding"])
def test_a_sharding_that_leaves_the_layout_open_is_refused_naming_the_leaf(saved, kind, given):
    # jax.device_put's KeyError: UNCONSTRAINED, or its NotImplementedError, came out after the leaf was read
    sharding = _unfixed(kind)
    like = {**_like(), "w": jax.ShapeDtypeStruct((4,), jnp.float32, sharding=sharding)}
    arguments = {"like": like} if given == "like" else {"like": _like(), "sharding": sharding}
    with pytest.raises(ShardingError, match=r"leaf '(w|lr)' of .*state.jxs: its sharding .* leaves its layout to"):
        jaxstow.load(saved, **arguments)


def test_a_weakly_typed_leaf_lands_on_its_likes_sharding_as_given(tmp_path):
    # Its sharding came back P('x', None) for a like's P('x'): the same layout, but not == the like's sharding.
    jaxstow.save(tmp_path / "w.jxs", {"w": np.arange(16, dtype=np.float32).reshape(4, 4)})
    sharding = NamedSharding(jax.make_mesh((4,), ("x",)), P("x"))
    for weak in (False, True):
        like = {"w": jax.ShapeDtypeStruct((4, 4), jnp.float32, weak_type=weak, sharding=sharding)}
        restored = jaxstow.load(tmp_path / "w.jxs", like=like)["w"]
        assert restored.sharding == sharding and restored.weak_type == weak
        assert restored.tolist() == np.arange(16, dtype=np.float32).reshape(4, 4).tolist()
