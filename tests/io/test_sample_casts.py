"""A saved value of no dtype of its own (a Python number, a weakly typed array) takes the dtype its leaf was declared
with, but only where that dtype holds it: a value of a wider kind, or a Python number out of the dtype's range, is an
:class:`~jaxstow.errors.ArgumentError` naming the leaf and both dtypes, never a sample silently rounded, flipped or
turned infinite. A
traced value (under jit, a fori_loop index) has no value to check, so its leaf's dtype must hold every value of its own
dtype, or it is refused when traced."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io, scheduler
from jaxstow.errors import ArgumentError, JaxstowError

INFORMATION = scheduler.static_information(samples_collected=4)


STRATEGIES = {"save": lambda: io.save(io.MemoryCollector()), "no_save": io.no_save}


def _saved(init, value, *, jit: bool, strategy: str = "save"):
    """The samples of a run that saves ``value`` twice into the leaf ``x`` declared as ``init``."""
    init_save, save, postprocess_save = STRATEGIES[strategy]()
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


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize(
    ("init", "value", "named"),
    [
        (jnp.int8(0), jnp.asarray(300), "a weakly typed int32 holding 300, which its dtype int8"),
        (jnp.float16(0), jnp.asarray(70000.0), "a weakly typed float32 holding 70000.0, which its dtype float16"),
        (jnp.uint8(0), jnp.asarray(-1), "a weakly typed int32 holding -1, which its dtype uint8"),
        (
            jnp.int16(0),
            jnp.broadcast_to(jnp.asarray(40000), (2,)),
            "a weakly typed int32 holding 40000, which its dtype int16",
        ),
    ],
)
@pytest.mark.parametrize("jit", [False, True])
def test_a_concrete_weak_array_out_of_its_leafs_range_is_refused(init, value, named, jit, strategy):
    init = jnp.zeros(np.shape(value), init.dtype)
    with pytest.raises(ArgumentError, match=rf"sample leaf 'x' is {named} cannot hold: .*init it as 0\.0"):
        _saved(init, value, jit=jit, strategy=strategy)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize(
    ("dtype", "value"),
    [
        (jnp.int8, lambda: jnp.asarray(300)),
        (jnp.int16, lambda: jnp.asarray(3) * 2),
        (jnp.uint8, lambda: jnp.asarray(-1)),
        (jnp.uint16, lambda: jnp.asarray(1) + 1),
        (jnp.uint32, lambda: jnp.asarray(1) + 1),
        (jnp.float16, lambda: jnp.asarray(1) + 1),
        (jnp.float16, lambda: jnp.asarray(70000.0)),
        (jnp.float16, lambda: jnp.asarray(1.0) * 2.5),
    ],
)
def test_a_traced_weak_value_its_leaf_cannot_hold_every_value_of_is_refused(dtype, value, strategy):
    weak = jnp.result_type(value())
    with pytest.raises(
        ArgumentError,
        match=rf"sample leaf 'x' is a weakly typed {weak} computed under .* its dtype {jnp.dtype(dtype)} cannot hold "
        rf"every {weak}, .*value\.astype\(jnp\.{jnp.dtype(dtype)}\).*init it as jnp\.{weak}\(0\)",
    ):
        _saved(jnp.zeros((), dtype), value, jit=True, strategy=strategy)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_fori_loop_index_is_refused_from_an_int16_leaf_not_wrapped(strategy):
    init_save, save, _ = STRATEGIES[strategy]()
    state = init_save({"i": jnp.int16(0)}, None, INFORMATION)
    run = jax.jit(lambda s: jax.lax.fori_loop(32766, 32770, lambda i, s: save(s, True, {"i": i})[0], s))
    with pytest.raises(ArgumentError, match=r"sample leaf 'i' is a weakly typed int32 .* int16 cannot hold every"):
        run(state)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_fori_loop_index_is_saved_into_an_int32_leaf_or_cast_by_the_caller(strategy):
    for init, cast in ((jnp.int32(0), lambda i: i), (jnp.int16(0), lambda i: i.astype(jnp.int16))):
        init_save, save, postprocess_save = STRATEGIES[strategy]()
        state = init_save({"i": init}, None, INFORMATION)
        run = jax.jit(
            lambda s, save=save, cast=cast: jax.lax.fori_loop(3, 7, lambda i, s: save(s, True, {"i": cast(i)})[0], s)
        )
        saved = postprocess_save(run(state), None)["samples"]["i"]
        assert saved.dtype == init.dtype
        np.testing.assert_array_equal(saved, np.arange(3, 7, dtype=init.dtype))


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize(
    ("init", "value", "expected"),
    [
        (0.0, 0.5, np.float32(0.5)),
        (jnp.bfloat16(0), 0.5, jnp.bfloat16(0.5)),
        (jnp.bfloat16(0), lambda: jnp.asarray(2.0), jnp.bfloat16(2.0)),
        (jnp.bfloat16(0), jnp.asarray(2.0), jnp.bfloat16(2.0)),
        (jnp.bfloat16(0), lambda: jnp.asarray(3e38) * 1.1, jnp.bfloat16(3.3e38)),
        (jnp.bfloat16(0), lambda: jnp.asarray(7) * 2, jnp.bfloat16(14)),
        (0.0, lambda: jnp.asarray(7) * 2, np.float32(14)),
        (0.0, lambda: jnp.asarray(2**24 + 1), np.float32(2**24)),
        (0j, lambda: jnp.asarray(1.5) * 2, np.complex64(3)),
        (0, lambda: jnp.asarray(7) * 2, np.int32(14)),
        (jnp.int8(0), jnp.asarray(-128), np.int8(-128)),
        (jnp.uint8(0), jnp.asarray(255), np.uint8(255)),
        (jnp.float16(0), jnp.asarray(1.0) * 2.5, np.float16(2.5)),
        (jnp.float16(0), jnp.asarray(65504.0), np.float16(65504)),
    ],
)
@pytest.mark.parametrize("jit", [False, True])
def test_a_weak_value_its_leaf_holds_is_saved_exactly(init, value, expected, jit, strategy):
    saved = _saved(init, value, jit=jit, strategy=strategy)
    expected = np.asarray(expected)
    assert saved.dtype == expected.dtype
    np.testing.assert_array_equal(np.asarray(saved), np.stack([expected, expected]))


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize(
    ("init", "value", "named"),
    [
        (np.int64(0), np.int64(2**40), "a numpy int64 holding 1099511627776, which its dtype int32"),
        (np.zeros(2, np.int64), np.array([5, -(2**40)]), "a numpy int64 holding -1099511627776, which its dtype int32"),
        (np.uint64(0), np.uint64(2**63), "a numpy uint64 holding 9223372036854775808, which its dtype uint32"),
        (np.zeros(1), np.array([1e300]), "a numpy float64 holding 1e\\+300, which its dtype float32"),
    ],
)
@pytest.mark.parametrize("jit", [False, True])
def test_a_numpy_64_bit_value_out_of_32_bits_is_refused_with_x64_off(init, value, named, jit, strategy):
    with pytest.raises(ArgumentError, match=rf"sample leaf 'x' is {named} cannot hold .*jax_enable_x64"):
        _saved(init, value, jit=jit, strategy=strategy)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_numpy_64_bit_value_within_32_bits_is_saved_exactly_with_x64_off(strategy):
    saved = _saved(np.zeros(2, np.int64), np.array([7, -(2**31)]), jit=True, strategy=strategy)
    np.testing.assert_array_equal(np.asarray(saved), [[7, -(2**31)], [7, -(2**31)]])


@pytest.mark.parametrize("strategy", ["save", "no_save"])
def test_a_value_of_another_dtype_is_refused_with_the_conversion_that_saves_it(strategy):
    """A float64 computed where a float32 was declared (jax_enable_x64 on), here a bfloat16 into a float32 leaf."""
    value = jnp.bfloat16(1.5)
    with pytest.raises(ArgumentError, match=r"is bfloat16\[\], expected float32\[\].*value\.astype\(jnp\.float32\)"):
        _saved(jnp.float32(0), value, jit=True, strategy=strategy)
    np.testing.assert_array_equal(_saved(jnp.float32(0), value.astype(jnp.float32), jit=True, strategy=strategy), 1.5)


@pytest.mark.parametrize("collector", ["memory", "hdf5"])
def test_chains_of_other_dtypes_stacked_into_one_state_are_refused_not_cast(tmp_path, collector):
    # The states stacked as the docs say: the buffer took float32, chain 1's int8 layout cast its samples to
    # [1, 101, -54, 46] in memory and [1, 101, 127, 127] in a file, where the loop produced [1, 101.5, 202, 302.5].
    pytest.importorskip("h5py")
    made = io.MemoryCollector() if collector == "memory" else io.HDF5Collector(str(tmp_path / "samples.h5"))
    init_save, save, postprocess_save = io.save(made, block_size=2)
    information = scheduler.static_information()
    first = init_save({"x": jnp.zeros((), jnp.float32)}, None, information)
    second = init_save({"x": jnp.zeros((), jnp.int8)}, None, information)
    states = jax.tree.map(lambda *chains: jnp.stack(chains), first, second)

    def run(state, shift):
        return jax.lax.scan(lambda state, t: save(state, True, {"x": t * 100.5 + shift}), state, jnp.arange(4.0))[0]

    with pytest.raises(JaxstowError, match=r"chain 1: block for leaf 'x' holds float32 values, .* was given int8 ones"):
        postprocess_save(jax.jit(jax.vmap(run))(states, jnp.arange(2.0)), None)
