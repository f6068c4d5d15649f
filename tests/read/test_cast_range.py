"""``cast=True`` between floats keeps every value or is refused: a finite value outside the target's finite range
(inf, NaN or a clipped value), a negative one for a type without a sign, an inf or NaN where the target has none, each
named with its leaf, the values' range and the target's. Rounding within the range is what a cast does."""

from __future__ import annotations

import io

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jaxstow
from jaxstow._read.targets import cast_values
from jaxstow.errors import RequestError

W = np.array([1e5, -70000.0, 300.0, -1.5, 0.25], np.float32)
E8M0 = getattr(ml_dtypes, "float8_e8m0fnu", None)  # ml_dtypes 0.5 on
E2M1 = getattr(ml_dtypes, "float4_e2m1fn", None)
NEEDS_MX = pytest.mark.skipif(E8M0 is None or E2M1 is None, reason="needs ml_dtypes >= 0.5 (float8_e8m0fnu)")


def _load(array, dtype, **options):
    buffer = io.BytesIO()
    jaxstow.save(buffer, {"params": {"w": array}})
    buffer.seek(0)
    like = {"params": {"w": jax.ShapeDtypeStruct(array.shape, dtype)}}
    return jaxstow.load(buffer, like=like, cast=True, **options)["params"]["w"]


@pytest.mark.parametrize("as_numpy", [True, False], ids=["numpy", "jax"])
@pytest.mark.parametrize(
    ("dtype", "held"),
    [
        (jnp.float16, "from -65504.0 to 65504.0"),
        (jnp.float8_e4m3fn, "from -448.0 to 448.0"),
        (jnp.float8_e5m2, "from -57344.0 to 57344.0"),
        pytest.param(E8M0, "only positive values", marks=NEEDS_MX, id="float8_e8m0fnu"),
        pytest.param(E2M1, "from -6.0 to 6.0", marks=NEEDS_MX, id="float4_e2m1fn"),
    ],
)
def test_finite_values_out_of_the_targets_range_are_refused_with_both_ranges(dtype, held, as_numpy):
    with pytest.raises(RequestError, match="leaf 'params/w'") as caught:
        _load(W, dtype, as_numpy=as_numpy)
    message = str(caught.value)
    assert "values from -70000.0 to 100000.0" in message and held in message
    assert "restore it as float32 or a wider float" in message


@NEEDS_MX
def test_a_negative_value_or_zero_is_refused_for_a_type_without_sign_or_zero():
    for values in ([-1.5, 2.0], [0.0, 2.0]):
        with pytest.raises(RequestError, match="float8_e8m0fnu holds only positive values"):
            _load(np.array(values, np.float32), E8M0, as_numpy=True)


@pytest.mark.parametrize(
    ("special", "dtype"), [(np.inf, jnp.float8_e4m3fn), pytest.param(np.nan, E2M1, marks=NEEDS_MX, id="nan-e2m1")]
)
def test_inf_or_nan_is_refused_where_the_target_has_none(special, dtype):
    with pytest.raises(RequestError, match="its inf or NaN into other values"):
        _load(np.array([special, 1.0], np.float32), dtype)


def test_values_in_range_are_rounded_and_specials_kept_where_the_target_has_them():
    assert _load(W[2:], jnp.float8_e4m3fn, as_numpy=True).astype(np.float32).tolist() == [288.0, -1.5, 0.25]
    assert _load(W, jnp.bfloat16).astype(jnp.float32).tolist() == [99840.0, -70144.0, 300.0, -1.5, 0.25]
    kept = _load(np.array([np.inf, -np.inf, np.nan], np.float32), jnp.float16, as_numpy=True)
    assert np.isposinf(kept[0]) and np.isneginf(kept[1]) and np.isnan(kept[2])
    if E8M0 is not None:
        assert _load(np.array([0.5, 4.0], np.float32), E8M0).astype(jnp.float32).tolist() == [0.5, 4.0]
    assert _load(W, jnp.float64).tolist() == W.tolist()  # wider: nothing to check


def test_complex_parts_are_checked_too():
    with pytest.raises(RequestError, match="complex64 holds finite values"):
        _load(np.array([1e300 + 1j], np.complex128), jnp.complex64)
    assert _load(np.array([1.5 - 2j], np.complex128), jnp.complex64).tolist() == [1.5 - 2j]


def test_cast_values_checks_jax_arrays_on_their_device():
    assert cast_values(jnp.array([1.0, 2.0]), np.dtype(jnp.float8_e4m3fn)).dtype == jnp.float8_e4m3fn
    with pytest.raises(RequestError, match=r"leaf 'w' of f\.jxs"):
        cast_values(jnp.array([1e5]), np.dtype(jnp.float16), file="f.jxs", path="w")


@NEEDS_MX
@pytest.mark.parametrize("as_numpy", [True, False], ids=["numpy", "jax"])
@pytest.mark.parametrize(
    ("source", "target", "values"),
    [
        (ml_dtypes.float8_e4m3fn, "e8m0", [2.0, 0.5, 4.0]),
        ("e8m0", ml_dtypes.float8_e5m2, [2.0, 0.5, 4.0]),
        ("e8m0", "e2m1", [2.0, 0.5, 4.0]),
        (ml_dtypes.uint2, ml_dtypes.int4, [0, 1, 3]),
    ],
    ids=["e4m3-e8m0", "e8m0-e5m2", "e8m0-e2m1", "uint2-int4"],
)
def test_casts_numpy_has_no_rule_for_go_through_float32(source, target, values, as_numpy):
    # numpy refused them with a bare TypeError ("Cannot cast array data ... according to the rule 'unsafe'").
    source, target = ({"e8m0": E8M0, "e2m1": E2M1}.get(kind, kind) for kind in (source, target))
    restored = _load(np.array(values, np.float32).astype(source), np.dtype(target), as_numpy=as_numpy)
    assert restored.dtype == np.dtype(target) and np.asarray(restored).astype(np.float32).tolist() == values


def test_a_refused_cast_warns_of_nothing_first():
    # numpy's RuntimeWarning "overflow encountered in cast" came before the RequestError: under -W error, instead.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RequestError, match="into inf or NaN"):
            _load(np.array([1e39, 1.0]), np.dtype(np.float32), as_numpy=True)
