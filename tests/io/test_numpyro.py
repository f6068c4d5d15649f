"""``io.numpyro.run`` against numpyro's own ``MCMC.run``: the same draws, bit for bit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io

numpyro = pytest.importorskip("numpyro")
dist = pytest.importorskip("numpyro.distributions")
infer = pytest.importorskip("numpyro.infer")

Y = jnp.array([1.0, 2.0, 0.5, 3.0])


def model(y: jax.Array) -> None:
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


@pytest.mark.parametrize(("thinning", "num_samples"), [(2, 11), (3, 20), (3, 3), (1, 7)])
def test_thinning_keeps_the_draws_mcmc_run_keeps(tmp_path, thinning, num_samples):
    def mcmc() -> object:
        return infer.MCMC(
            infer.NUTS(model),
            num_warmup=30,
            num_samples=num_samples,
            num_chains=2,
            chain_method="vectorized",
            thinning=thinning,
            progress_bar=False,
        )

    reference = mcmc()
    reference.run(jax.random.key(1), y=Y)
    expected = np.asarray(reference.get_samples(group_by_chain=True)["mu"])
    draws = io.numpyro.run(mcmc(), str(tmp_path / "run.h5"), jax.random.key(1), model_kwargs={"y": Y})
    assert expected.shape == (2, num_samples // thinning)
    np.testing.assert_array_equal(draws["mu"], expected)
