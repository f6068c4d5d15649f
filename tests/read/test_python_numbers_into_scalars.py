"""Python numbers restored into the weakly typed scalars ``jax.eval_shape`` makes of them: with x64 off, a float beyond
float32's range is refused (it would become inf), as an int beyond int32 is, and the message says what to do."""

from __future__ import annotations

import io

import jax
import pytest

import jaxstow
from jaxstow.errors import StructureMismatchError


@pytest.mark.parametrize("number", [1e300, -1e39, complex(1.0, 1e300)])
def test_a_python_float_beyond_float32_is_refused_rather_than_made_infinite(number):
    buffer = io.BytesIO()
    jaxstow.save(buffer, {"clip": number, "lr": 0.25})
    buffer.seek(0)
    with jax.enable_x64(False):
        like = jax.eval_shape(lambda: {"clip": number, "lr": 0.25})
        with pytest.raises(StructureMismatchError) as caught:
            jaxstow.load(buffer, like=like)
        assert "the file holds a Python" in str(caught.value) and "turn x64 on" in str(caught.value)
        assert [problem.split(":")[0] for problem in caught.value.problems] == ["'clip'"]
        buffer.seek(0)
        assert jaxstow.load(buffer, like={"clip": number, "lr": like["lr"]}) == {"clip": number, "lr": 0.25}
    buffer.seek(0)
    with jax.enable_x64(True):
        restored = jaxstow.load(buffer, like=jax.eval_shape(lambda: {"clip": number, "lr": 0.25}))
        assert complex(restored["clip"]) == number and restored["clip"].weak_type
