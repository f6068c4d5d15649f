"""``io.blackjax.sample``: the arguments it refuses before anything runs."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import pytest

from jaxstow import io
from jaxstow.errors import ArgumentError

blackjax = pytest.importorskip("blackjax")


@pytest.mark.parametrize("thin", [0, -1, 2.5, True, "2"])
def test_a_thin_that_is_no_count_of_at_least_one_is_refused(tmp_path, thin):
    walk = blackjax.rmh(lambda x: -0.5 * jnp.sum(x**2), blackjax.mcmc.random_walk.normal(jnp.ones(1)))
    with pytest.raises(ArgumentError, match=rf"thin must be an integer of at least 1 .*got {thin!r}"):
        io.blackjax.sample(
            str(tmp_path / "walk.h5"), walk, jnp.zeros((2, 1)), jax.random.key(0), num_samples=6, thin=thin
        )
    assert not os.listdir(tmp_path)
