"""The advice for a foreign file named ``.jxs`` converts it beside itself, not in place (which would replace it)."""

from __future__ import annotations

import forked_cli
import jax.numpy as jnp
import numpy as np
import pytest

import jaxstow

flax_serialization = pytest.importorskip("flax.serialization")


def test_the_advice_for_a_foreign_file_named_jxs_converts_it_beside_itself(tmp_path):
    source = tmp_path / "params.jxs"
    source.write_bytes(flax_serialization.to_bytes({"w": jnp.ones(3)}))
    with pytest.raises(jaxstow.errors.FormatError) as raised:
        jaxstow.load(source)
    assert f"`jaxstow convert {source} {tmp_path / 'params-jaxstow.jxs'}` converts it" in str(raised.value)
    done = forked_cli.jaxstow_command("convert", source, tmp_path / "params-jaxstow.jxs")
    assert done.returncode == 0, done.stderr
    np.testing.assert_array_equal(jaxstow.load(tmp_path / "params-jaxstow.jxs")["w"], np.ones(3, np.float32))


def test_a_foreign_file_named_jxs_converted_in_place_is_refused_naming_the_file_beside_it(tmp_path):
    source = tmp_path / "params.jxs"
    source.write_bytes(flax_serialization.to_bytes({"w": jnp.ones(3)}))
    before = source.read_bytes()
    done = forked_cli.jaxstow_command("convert", source, source)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"give another DST, such as {tmp_path / 'params-jaxstow.jxs'}" in done.stderr
    assert source.read_bytes() == before


@pytest.mark.parametrize("start", [b"\x85\xa3\xff\xfe\xfd", b"\x81\xa2\x01\x02", b"\x8f\xd9\x05abc"])
def test_bytes_that_only_begin_as_a_msgpack_dict_would_are_not_called_a_flax_file(tmp_path, start):
    # a map byte, then a string byte: 1 random file in 7 of those that start with a map byte was called flax's
    source = tmp_path / "random.bin"
    source.write_bytes(start + bytes(range(256)) * 4)
    done = forked_cli.jaxstow_command("inspect", source)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "flax" not in done.stderr, done.stderr
    flax_file = tmp_path / "params.msgpack"
    flax_file.write_bytes(flax_serialization.to_bytes({"Dense_0": {"kernel": jnp.ones(3)}}))
    assert "is a flax msgpack file" in forked_cli.jaxstow_command("inspect", flax_file).stderr
