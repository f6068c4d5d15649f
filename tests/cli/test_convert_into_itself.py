"""``jaxstow convert`` given its source as destination, as the advice for a foreign file named ``.jxs`` once read:
refused, the source as it was; the advice names another file."""

from __future__ import annotations

import forked_cli
import jax.numpy as jnp
import numpy as np
import pytest

import jaxstow

flax_serialization = pytest.importorskip("flax.serialization")


@pytest.mark.parametrize("spelled", ["params.jxs", "./params.jxs"])
def test_a_file_converted_into_itself_is_refused_and_left_as_it_was(tmp_path, spelled):
    source = tmp_path / "params.jxs"  # a flax msgpack file, named as jaxstow's files are
    source.write_bytes(flax_serialization.to_bytes({"dense": {"kernel": jnp.arange(6.0).reshape(2, 3)}}))
    before = source.read_bytes()
    done = forked_cli.jaxstow_command("convert", "params.jxs", spelled, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip() == (
        f"jaxstow convert: {spelled} is params.jxs itself, which its conversion would replace: give another destination"
    )
    assert source.read_bytes() == before


def test_the_advice_for_a_foreign_file_named_jxs_converts_it_beside_itself(tmp_path):
    source = tmp_path / "params.jxs"
    source.write_bytes(flax_serialization.to_bytes({"w": jnp.ones(3)}))
    with pytest.raises(jaxstow.errors.FormatError) as raised:
        jaxstow.load(source)
    assert f"`jaxstow convert {source} {tmp_path / 'params-jaxstow.jxs'}` converts it" in str(raised.value)
    done = forked_cli.jaxstow_command("convert", source, tmp_path / "params-jaxstow.jxs")
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(jaxstow.load(tmp_path / "params-jaxstow.jxs")["w"], np.ones(3, np.float32))
