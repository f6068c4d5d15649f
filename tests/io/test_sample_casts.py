"""A saved value of no dtype of its own (a Python number, a weakly typed array) takes the dtype its leaf was declared
with, but only where that dtype holds it: a value of a wider kind, or a Python number out of the dtype's range, is an
:class:`~jaxstow.errors.ArgumentError` naming the leaf and both dtypes, never a sample silently rounded, flipped or
turned infinite."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io, scheduler
from jaxstow.errors import ArgumentError

INFORMATION = scheduler.static_information(samples_collected=4)


def _saved(init, value, *, jit: bool):
    """The samples of a run that saves ``value`` twice into the leaf ``x`` declared as ``init``."""
    init_save, save, postprocess_save = io.save(io.MemoryCollector())
    state = init_save({"x": init}, None, INFORMATION)

    def run(state):
        for _ in range(2):
            state, _ = save(state, True, {"x": value() if callable(value) else value})
        return state

    return postprocess_save(jax.jit(run)(state) if jit else run(state), None)["samples"]["x"]


@pytest.mark.parametrize(
    ("init", "value", "named"),
    [
        (0, 2.9, "the Python float 2.9, which its dtype int32"),
        (False, 0.25, "the Python float 0.25, which its dtype bool"),
        (False, 1, "the Python int 1, which its dtype bool"),
        (0.0, 1 + 2j, r"the Python complex \(1\+2j\), which its dtype float32"),
        (jnp.float16(0), 70000.0, "the Python float 70000.0, which its dtype float16"),
        (jnp.int8(0), 300, "the Python int 300, which its dtype int8"),
        (jnp.uint8(0), -1, "the Python int -1, which its dtype uint8"),
        (0, lambda: jnp.asarray(1.0) * 2.9, "a weakly typed float32, which its dtype int32"),
    ],
)
@pytest.mark.parametrize("jit", [False, True])
def test_a_value_its_leaf_cannot_hold_is_refused(init, value, named, jit):
    with pytest.raises(ArgumentError, match=rf"sample leaf 'x' is {named} cannot hold: .*init it as 0\.0"):
        _saved(init, value, jit=jit)


@pytest.mark.parametrize(
    ("init", "value", "expected"),
    [
        (0.0, 3, np.float32(3)),
        (jnp.float16(0), 2.5, np.float16(2.5)),
        (jnp.float16(0), lambda: jnp.asarray(1.0) * 2.5, np.float16(2.5)),
        (0, True, np.int32(1)),
        (jnp.int8(0), -128, np.int8(-128)),
        (0j, 2.0, np.complex64(2)),
        (0.0, float("inf"), np.float32(np.inf)),
    ],
)
def test_a_value_its_leaf_holds_is_saved_in_the_leafs_dtype(init, value, expected):
    saved = _saved(init, value, jit=True)
    assert saved.dtype == expected.dtype
    np.testing.assert_array_equal(saved, [expected, expected])
