"""Options and constructors given values they do not take: an ``ArgumentError`` naming the option, never a value
taken for True because it is not empty (``pipeline="no"`` turned the pipeline on) nor Python's own error."""

from __future__ import annotations

import io

import numpy as np
import pytest

import jaxstow
from jaxstow.errors import ArgumentError


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "model.jxs"
    jaxstow.save(path, {"w": np.arange(3.0)})
    return path


@pytest.mark.parametrize("option", ["as_numpy", "partial", "cast", "progress", "pipeline"])
@pytest.mark.parametrize("value", ["no", 1, 0, [], "False"])
def test_a_switch_given_anything_but_true_or_false_is_refused(saved, option, value):
    like = {"w": np.zeros(3)} if option in ("partial", "cast") else None
    with pytest.raises(ArgumentError, match=f"{option}= takes True or False, not "):
        jaxstow.load(saved, like, **{option: value})
    with jaxstow.open(saved) as reader, pytest.raises(ArgumentError, match=f"{option}= takes True or False"):
        reader.load(like, **{option: value})


def test_numpy_booleans_and_pipeline_none_are_taken(saved):
    assert isinstance(jaxstow.load(saved, as_numpy=np.True_)["w"], np.ndarray)
    restored = jaxstow.load(saved, pipeline=None)  # None: the default of the platform
    np.testing.assert_array_equal(np.asarray(restored["w"]), np.arange(3.0))
    np.testing.assert_array_equal(jaxstow.load(saved, pipeline=np.False_, as_numpy=True)["w"], np.arange(3.0))


@pytest.mark.parametrize("source", ["model.jxs", io.BytesIO()])
def test_a_reader_is_made_by_open_and_its_constructor_says_so(source):
    with pytest.raises(ArgumentError, match=r"a Reader is made by jaxstow\.open\(.*\), not by jaxstow\.Reader"):
        jaxstow.Reader(source)


@pytest.mark.parametrize("value", ["false", "no", 1])
def test_mmap_given_anything_but_true_or_false_is_refused(saved, value):
    with pytest.raises(ArgumentError, match="mmap= takes True or False"):
        jaxstow.open(saved, mmap=value)


def test_a_cast_within_range_raises_no_warning_of_numpy(tmp_path):
    import warnings

    import ml_dtypes

    path = tmp_path / "big.jxs"
    jaxstow.save(path, {"w": np.array([3e38, -3e38, 1.0], np.float32)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        restored = jaxstow.load(path, like={"w": np.zeros(3, ml_dtypes.bfloat16)}, cast=True)
    assert restored["w"].dtype == ml_dtypes.bfloat16 and float(restored["w"][2]) == 1.0


@pytest.mark.parametrize(
    "options", [{}, {"select": "z"}, {"like": {"u8": np.zeros(3, np.uint8), "z": np.zeros(3, complex)}}]
)
def test_a_leaf_stored_as_raw_bytes_at_an_odd_offset_comes_back_aligned(tmp_path, options):
    tree = {"u8": np.arange(3, dtype=np.uint8), "z": np.array([1 + 2j, 3 - 4j, 5j])}  # complex128: raw bytes
    jaxstow.save(tmp_path / "odd.jxs", tree)
    restored = jaxstow.load(tmp_path / "odd.jxs", as_numpy=True, **options)
    assert restored["z"].flags.aligned
    np.testing.assert_array_equal(restored["z"], tree["z"])
