"""A ``like`` that jax cannot flatten (a dict whose keys mix ``int`` and ``str``, which jax cannot sort) is an
:class:`RequestError` naming the file and what to give instead, not jax's bare ``ValueError``."""

from __future__ import annotations

import io

import numpy as np
import pytest

import jaxstow
from jaxstow.errors import RequestError


@pytest.mark.parametrize("per_process", [False, True])
def test_a_like_with_int_and_str_keys_is_an_argument_error_naming_the_file(tmp_path, per_process):
    path = tmp_path / "state.jxs"
    tree = {"w": np.ones(2), "step": 3}
    if per_process:
        tree["loader"] = jaxstow.per_process({"epoch": 1})
    jaxstow.save(path, tree)
    like = {"w": np.zeros(2), "step": 0, 5: np.zeros(1)}  # a key added by position by mistake
    with pytest.raises(RequestError, match=r"state\.jxs: jax cannot flatten like .*keys of one type that sorts"):
        jaxstow.load(path, like=like, partial=True)
    with jaxstow.open(io.BytesIO(path.read_bytes())) as reader, pytest.raises(RequestError, match="cannot flatten"):
        reader.load(like=like, partial=True)
