"""A load inside ``jax.jit``, ``vmap`` or ``grad`` is refused: the file's arrays would be baked into the trace as
constants, and a later file never read again. Outside a transformation, and under ``ensure_compile_time_eval``, it
loads as ever."""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxstow
from jaxstow.checkpoint import CheckpointManager
from jaxstow.errors import RequestError

LIKE = {"w": jax.ShapeDtypeStruct((3,), jnp.float32)}


@pytest.fixture
def path(tmp_path):
    path = str(tmp_path / "w.jxs")
    jaxstow.save(path, {"w": np.full(3, 1.0, np.float32)})
    return path


@pytest.mark.parametrize("like", [None, LIKE], ids=["rebuilt", "like"])
@pytest.mark.parametrize(
    "transform",
    [jax.jit, jax.vmap, jax.grad, lambda f: lambda x: jax.eval_shape(f, x)],
    ids=["jit", "vmap", "grad", "eval_shape"],
)
def test_a_load_inside_a_transformation_is_refused_naming_the_file(path, like, transform):
    def f(x):
        return jnp.sum(jaxstow.load(path, like=like)["w"] * x)

    with pytest.raises(RequestError, match=r"w\.jxs: a file cannot be loaded inside jax\.jit/vmap/grad"):
        transform(f)(jnp.ones(3) if transform is jax.vmap else 1.0)


def test_a_jitted_function_fed_the_loaded_arrays_sees_a_newer_file(path):
    predict = jax.jit(lambda w, x: w * x)
    assert predict(jaxstow.load(path, like=LIKE)["w"], 1.0).tolist() == [1.0] * 3
    jaxstow.save(path, {"w": np.full(3, 2.0, np.float32)})
    assert predict(jaxstow.load(path, like=LIKE)["w"], 1.0).tolist() == [2.0] * 3
    with jax.ensure_compile_time_eval():
        assert jaxstow.load(path)["w"].tolist() == [2.0] * 3


def test_a_checkpoint_restore_inside_jit_is_refused(tmp_path):
    with CheckpointManager(tmp_path) as manager:
        manager.save(1, {"w": jnp.ones(2)})
        manager.wait()
        with pytest.raises(RequestError, match=r"cannot be loaded inside jax\.jit"):
            jax.jit(lambda: manager.restore()["w"])()
        assert manager.restore()["w"].tolist() == [1.0, 1.0]


def test_telling_a_trace_apart_is_a_few_calls():
    from jaxstow._read.restore import refuse_while_tracing

    refuse_while_tracing("w.jxs")  # outside a transformation: nothing to refuse; what it looks up is cached now
    calls: list[str] = []
    sys.setprofile(lambda frame, event, arg: calls.append(frame.f_code.co_name) if event == "call" else None)
    try:
        refuse_while_tracing("w.jxs")
    finally:
        sys.setprofile(None)
    assert len(calls) <= 4, calls  # itself, jax's current trace and the trace's own accessor: nothing that walks


@pytest.mark.parametrize("read", [lambda reader: reader["w"], lambda reader: reader.read("w", np.s_[0:2])])
def test_a_readers_leaf_read_inside_jit_is_refused_as_a_load_is(path, read):
    with jaxstow.open(path) as reader:
        with pytest.raises(RequestError, match=r"leaf 'w' of .*w\.jxs: a leaf cannot be read inside jax\.jit"):
            jax.jit(lambda x: jnp.sum(read(reader)) * x)(1.0)
        assert np.asarray(read(reader)).tolist()[:2] == [1.0, 1.0]  # outside, as ever
