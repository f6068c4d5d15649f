"""``io.numpyro.run`` against numpyro's own ``MCMC.run``: the same draws, bit for bit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io
from jaxstow.errors import ArgumentError, CheckpointError

numpyro = pytest.importorskip("numpyro")
dist = pytest.importorskip("numpyro.distributions")
infer = pytest.importorskip("numpyro.infer")

Y = jnp.array([1.0, 2.0, 0.5, 3.0])


def model(y: jax.Array) -> None:
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)


def hmc(model) -> object:
    """HMC with a fixed number of leapfrog steps: traced in a fraction of NUTS's time, and run by ``io.numpyro.run``
    as NUTS is (one kernel ``sample`` per step). NUTS itself is run against ``mcmc.run`` and its settings below."""
    return infer.HMC(model, num_steps=4, trajectory_length=None)


# Thinning with one draw left over, two left over and none; none; each on one chain (run unvectorized) and on two.
@pytest.mark.parametrize(
    ("thinning", "num_samples", "chains"), [(2, 11, 2), (3, 20, 1), (3, 3, 2), (1, 7, 2), (1, 7, 1)]
)
def test_thinning_keeps_the_draws_mcmc_run_keeps(tmp_path, thinning, num_samples, chains):
    # One chain's key is not split, as mcmc.run does not split it.
    def mcmc() -> object:
        return infer.MCMC(
            hmc(model),
            num_warmup=30,
            num_samples=num_samples,
            num_chains=chains,
            chain_method="vectorized",
            thinning=thinning,
            progress_bar=False,
        )

    reference = mcmc()
    reference.run(jax.random.key(1), y=Y)
    expected = np.asarray(reference.get_samples(group_by_chain=True)["mu"])
    draws = io.numpyro.run(mcmc(), str(tmp_path / "run.h5"), jax.random.key(1), model_kwargs={"y": Y})
    assert expected.shape == (chains, num_samples // thinning)
    if chains > 1:
        np.testing.assert_array_equal(draws["mu"], expected)
    else:  # numpyro runs one chain unvectorized, whose float rounding differs: the same draws, to rounding
        np.testing.assert_allclose(draws["mu"], expected, rtol=0.02)


def test_the_same_file_with_other_data_is_refused_not_answered_with_the_first_runs_draws(tmp_path):
    def mcmc() -> object:
        return infer.MCMC(hmc(model), num_warmup=10, num_samples=10, num_chains=2, progress_bar=False)

    path = tmp_path / "run.h5"
    first = io.numpyro.run(mcmc(), str(path), jax.random.key(0), model_args=(Y,))
    written = path.read_bytes()
    with pytest.raises(CheckpointError, match=r"run\.h5 holds a run started from other arrays \(data or initial"):
        io.numpyro.run(mcmc(), str(path), jax.random.key(0), model_args=(Y + 50,))
    assert path.read_bytes() == written
    again = io.numpyro.run(mcmc(), str(path), jax.random.key(0), model_args=(Y,))  # the same data: read back
    np.testing.assert_array_equal(again["mu"], first["mu"])


def test_the_same_file_with_another_model_is_refused(tmp_path):
    def tight(y: jax.Array) -> None:  # the model's prior changed between a kill and the restart
        mu = numpyro.sample("mu", dist.Normal(0.0, 0.01))
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=y)

    def mcmc(model) -> object:
        return infer.MCMC(hmc(model), num_warmup=10, num_samples=10, num_chains=2, progress_bar=False)

    path = tmp_path / "run.h5"
    io.numpyro.run(mcmc(model), str(path), jax.random.key(0), model_args=(Y,))
    written = path.read_bytes()
    with pytest.raises(CheckpointError, match=r"run\.h5 holds a run started with functions .* of other code or data"):
        io.numpyro.run(mcmc(tight), str(path), jax.random.key(0), model_args=(Y,))  # returned the old draws
    assert path.read_bytes() == written


def nuts_mcmc(**settings) -> object:
    return infer.MCMC(infer.NUTS(model, **settings), num_warmup=10, num_samples=10, num_chains=2, progress_bar=False)


@pytest.fixture(scope="module")
def nuts_run(tmp_path_factory) -> bytes:
    """The bytes of a file NUTS with numpyro's default settings ran into: one run for every case of settings."""
    path = tmp_path_factory.mktemp("nuts") / "run.h5"
    io.numpyro.run(nuts_mcmc(), str(path), jax.random.key(0), model_args=(Y,))
    return path.read_bytes()


@pytest.mark.parametrize("settings", [{"target_accept_prob": 0.99}, {"max_tree_depth": 2}, {"dense_mass": True}])
def test_the_same_file_with_other_kernel_settings_is_refused(tmp_path, nuts_run, settings):
    path = tmp_path / "run.h5"
    path.write_bytes(nuts_run)
    name, value = next(iter(settings.items()))
    with pytest.raises(CheckpointError, match=rf"run\.h5 holds a run started with settings=.*'{name}': {value}"):
        io.numpyro.run(nuts_mcmc(**settings), str(path), jax.random.key(0), model_args=(Y,))
    assert path.read_bytes() == nuts_run


def test_one_mcmc_object_serves_mcmc_run_and_several_files(tmp_path):
    mcmc = infer.MCMC(
        infer.NUTS(model), num_warmup=10, num_samples=10, num_chains=2, chain_method="vectorized", progress_bar=False
    )
    mcmc.run(jax.random.key(0), Y)
    theirs = mcmc.get_samples(group_by_chain=True)["mu"]
    for name in ("a.h5", "b.h5"):
        ours = io.numpyro.run(mcmc, str(tmp_path / name), jax.random.key(0), model_args=(Y,))
        np.testing.assert_array_equal(ours["mu"], theirs)
    mcmc.run(jax.random.key(0), Y)  # numpyro's own run still works after ours
    np.testing.assert_array_equal(mcmc.get_samples(group_by_chain=True)["mu"], theirs)


def test_kernels_and_keys_it_cannot_run_as_mcmc_run_are_refused_before_the_run(tmp_path):
    sa = infer.MCMC(infer.SA(model), num_warmup=10, num_samples=10, num_chains=2, progress_bar=False)
    with pytest.raises(ArgumentError, match=r"runs numpyro's HMC and NUTS kernels, .* not SA: run SA with mcmc\.run"):
        io.numpyro.run(sa, str(tmp_path / "sa.h5"), jax.random.key(0), model_args=(Y,))
    nuts = infer.MCMC(infer.NUTS(model), num_warmup=10, num_samples=10, num_chains=2, progress_bar=False)
    with pytest.raises(ArgumentError, match=r"takes a threefry2x32 key \(jax\.random\.key\(seed\)\), not one of rbg"):
        io.numpyro.run(nuts, str(tmp_path / "rbg.h5"), jax.random.key(0, impl="rbg"), model_args=(Y,))
    assert not list(tmp_path.iterdir())


def test_sites_named_with_a_slash_keep_numpyros_names(tmp_path):
    # numpyro.handlers.scope names sites 'group/mu': a '/' made a group of the file, read back as 'group.mu'.
    def inner() -> None:
        numpyro.sample("mu", dist.Normal(0.0, 1.0))

    def scoped() -> None:
        numpyro.sample("group", dist.Normal(0.0, 1.0))
        numpyro.handlers.scope(inner, prefix="group")()
        numpyro.sample("group.nu", dist.Normal(0.0, 1.0))

    def mcmc() -> object:
        return infer.MCMC(
            hmc(scoped), num_warmup=5, num_samples=4, num_chains=2, chain_method="vectorized", progress_bar=False
        )

    reference = mcmc()
    reference.run(jax.random.key(0))
    expected = reference.get_samples(group_by_chain=True)
    draws = io.numpyro.run(mcmc(), str(tmp_path / "run.h5"), jax.random.key(0))
    assert sorted(draws) == sorted(expected) == ["group", "group.nu", "group/mu"]
    for site, values in expected.items():
        np.testing.assert_array_equal(draws[site], values)
    arviz = pytest.importorskip("arviz")
    posterior = io.to_inference_data(str(tmp_path / "run.h5")).posterior  # the same names in ArviZ 0.x
    name = "group/mu" if int(arviz.__version__.split(".")[0]) == 0 else "group%2Fmu"  # 1.x's DataTree takes no "/"
    assert sorted(posterior.data_vars) == sorted(["group", "group.nu", name])
    np.testing.assert_array_equal(posterior[name], expected["group/mu"])


def test_data_in_a_pandas_dataframe_counts_by_its_values(tmp_path):
    pandas = pytest.importorskip("pandas")

    def frame_model(frame) -> None:
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        numpyro.sample("y", dist.Normal(mu, 1.0), obs=jnp.asarray(frame["y"].to_numpy()))

    def mcmc() -> object:
        return infer.MCMC(hmc(frame_model), num_warmup=10, num_samples=10, num_chains=2, progress_bar=False)

    path = str(tmp_path / "run.h5")
    first = io.numpyro.run(mcmc(), path, jax.random.key(0), model_args=(pandas.DataFrame({"y": np.asarray(Y)}),))
    with pytest.raises(CheckpointError, match=r"holds a run started from other arrays"):
        io.numpyro.run(mcmc(), path, jax.random.key(0), model_args=(pandas.DataFrame({"y": np.asarray(Y) + 100}),))
    again = io.numpyro.run(mcmc(), path, jax.random.key(0), model_args=(pandas.DataFrame({"y": np.asarray(Y)}),))
    np.testing.assert_array_equal(again["mu"], first["mu"])
