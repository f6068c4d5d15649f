"""``io.blackjax.sample``: the arguments it refuses before anything runs, and a file of a run from other positions."""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import pytest

from jaxstow import io
from jaxstow.errors import ArgumentError, CheckpointError, StructureMismatchError

blackjax = pytest.importorskip("blackjax")


@pytest.mark.parametrize("thin", [0, -1, 2.5, True, "2"])
def test_a_thin_that_is_no_count_of_at_least_one_is_refused(tmp_path, thin):
    walk = blackjax.rmh(lambda x: -0.5 * jnp.sum(x**2), blackjax.mcmc.random_walk.normal(jnp.ones(1)))
    with pytest.raises(ArgumentError, match=rf"thin must be an integer of at least 1 .*got {thin!r}"):
        io.blackjax.sample(
            str(tmp_path / "walk.h5"), walk, jnp.zeros((2, 1)), jax.random.key(0), num_samples=6, thin=thin
        )
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize("warmup", [False, True])
def test_something_that_is_no_algorithm_is_refused_before_anything_runs(tmp_path, warmup):
    logdensity = lambda x: -0.5 * jnp.sum(x**2)  # noqa: E731
    adaptation = blackjax.window_adaptation(blackjax.nuts, logdensity) if warmup else None
    with pytest.raises(ArgumentError, match="algorithm must be a blackjax SamplingAlgorithm"):
        io.blackjax.sample(
            str(tmp_path / "run.h5"), object(), jnp.zeros((2, 1)), jax.random.key(0), num_samples=6,
            warmup=adaptation, num_warmup=5,
        )  # fmt: skip
    assert not os.listdir(tmp_path)


def test_the_same_file_from_other_positions_is_refused_not_answered_with_the_first_runs_draws(tmp_path):
    walk = blackjax.rmh(lambda x: -0.5 * jnp.sum(x**2), blackjax.mcmc.random_walk.normal(jnp.ones(1)))
    path = str(tmp_path / "walk.h5")
    first = io.blackjax.sample(path, walk, jnp.zeros((2, 1)), jax.random.key(0), num_samples=6)
    with pytest.raises(CheckpointError, match="holds a run started from other arrays"):
        io.blackjax.sample(path, walk, jnp.full((2, 1), 50.0), jax.random.key(0), num_samples=6)
    again = io.blackjax.sample(path, walk, jnp.zeros((2, 1)), jax.random.key(0), num_samples=6)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), again, first))


def test_a_run_continued_with_another_step_size_or_adaptation_setting_is_refused(tmp_path):
    def logdensity(x):
        return -0.5 * jnp.sum(x**2)

    path = str(tmp_path / "mala.h5")
    first = io.blackjax.sample(
        path, blackjax.mala(logdensity, step_size=0.1), jnp.zeros((2, 1)), jax.random.key(0), num_samples=4
    )
    with pytest.raises(CheckpointError, match="made with other settings") as caught:
        io.blackjax.sample(
            path, blackjax.mala(logdensity, step_size=0.5), jnp.zeros((2, 1)), jax.random.key(0), num_samples=4
        )
    assert caught.value.path == "algorithm_settings"
    again = io.blackjax.sample(
        path, blackjax.mala(logdensity, step_size=0.1), jnp.zeros((2, 1)), jax.random.key(0), num_samples=4
    )
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), again, first))

    adapted = str(tmp_path / "adapted.h5")

    def run(target: float, doublings: int):
        return io.blackjax.sample(
            adapted,
            functools.partial(blackjax.nuts, logdensity, max_num_doublings=doublings),
            jnp.zeros((2, 1)),
            jax.random.key(0),
            num_samples=4,
            warmup=blackjax.window_adaptation(blackjax.nuts, logdensity, target_acceptance_rate=target),
            num_warmup=10,
        )

    run(0.8, 5)
    for target, doublings in [(0.95, 5), (0.8, 3)]:
        with pytest.raises(CheckpointError, match="made with other settings"):
            run(target, doublings)


def test_a_run_continued_with_another_algorithm_of_the_same_settings_is_refused(tmp_path):
    def logdensity(x):
        return -0.5 * jnp.sum(x**2)

    path, mass = str(tmp_path / "swap.h5"), jnp.ones(1)
    io.blackjax.sample(path, blackjax.nuts(logdensity, 0.1, mass), jnp.zeros((2, 1)), jax.random.key(0), num_samples=4)
    with pytest.raises(CheckpointError, match="made with other settings"):
        io.blackjax.sample(
            path, blackjax.hmc(logdensity, 0.1, mass, 10), jnp.zeros((2, 1)), jax.random.key(0), num_samples=4
        )


def test_a_logdensity_holding_arrays_of_objects_or_an_empty_cell_runs(tmp_path):
    import numpy as np

    labels = {"names": np.array(["a", "b"], dtype=object), "y": np.ones(3)}

    def logdensity(x):
        if x is None:  # never: the cell of `later` stays empty while the run is set up
            return later
        return -0.5 * jnp.sum(x**2) * labels["y"].sum()

    draws = io.blackjax.sample(
        str(tmp_path / "objects.h5"),
        blackjax.mala(logdensity, 0.1),
        jnp.zeros((2, 1)),
        jax.random.key(0),
        num_samples=4,
    )
    assert draws["position"].shape == (2, 4, 1)
    later = None  # the cell logdensity holds stays empty until here


@pytest.mark.parametrize(
    ("name", "value"), [("num_samples", 2.5), ("num_samples", -1), ("num_samples", "10"), ("num_warmup", 1.5)]
)
def test_a_count_of_steps_that_is_no_integer_is_refused(tmp_path, name, value):
    walk = blackjax.rmh(lambda x: -0.5 * jnp.sum(x**2), blackjax.mcmc.random_walk.normal(jnp.ones(1)))
    counts = {"num_samples": 6, "num_warmup": 0, name: value}
    with pytest.raises(ArgumentError, match=rf"{name} must be an integer of at least 0, got {value!r}"):
        io.blackjax.sample(str(tmp_path / "walk.h5"), walk, jnp.zeros((2, 1)), jax.random.key(0), **counts)
    assert not os.listdir(tmp_path)


def test_a_run_continued_with_another_chain_count_or_shape_names_what_differs(tmp_path):
    path = str(tmp_path / "run.h5")
    mala = blackjax.mala(lambda p: -0.5 * jnp.sum(p["x"] ** 2), 0.1)

    def go(positions):
        return io.blackjax.sample(path, mala, positions, jax.random.key(0), num_samples=20, checkpoint_every=10)

    go({"x": jnp.zeros((2, 3))})
    with pytest.raises(CheckpointError, match=r"holds a run started with chains=2, but this call gives chains=3"):
        go({"x": jnp.zeros((3, 3))})
    with pytest.raises(StructureMismatchError, match=r"/chain~0/x: the file holds float32\[20, 3\], the run samples"):
        go({"x": jnp.zeros((2, 4))})


def test_a_run_continued_with_other_data_read_from_the_script_is_refused(tmp_path):
    # The docs' example: data at the top of the script, read by logdensity. Changed between a kill and the restart,
    # the run went on (two posteriors' draws mixed), and a finished run returned the old draws.
    namespace: dict = {"jnp": jnp, "y": jnp.array([28.0, 8.0])}
    exec("def logdensity(mu):\n    return -0.5 * jnp.sum((y - mu) ** 2)", namespace)  # a module's global
    walk = blackjax.mala(namespace["logdensity"], step_size=0.1)
    path = str(tmp_path / "schools.h5")
    first = io.blackjax.sample(path, walk, jnp.zeros((2, 1)), jax.random.key(0), num_samples=4)
    namespace["y"] = jnp.array([500.0, 8.0])
    with pytest.raises(CheckpointError, match=r"with functions \(a log density, a model, step_args or draw\) of other"):
        io.blackjax.sample(path, walk, jnp.zeros((2, 1)), jax.random.key(0), num_samples=4)
    namespace["y"] = jnp.array([28.0, 8.0])  # the data it was started with: the run is read back
    again = io.blackjax.sample(path, walk, jnp.zeros((2, 1)), jax.random.key(0), num_samples=4)
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), again, first))


class _Model:
    """A model object whose method is the log density, its data an attribute."""

    def __init__(self, y: jax.Array) -> None:
        self.y = y

    def logdensity(self, mu: jax.Array) -> jax.Array:
        return -0.5 * jnp.sum((self.y - mu) ** 2)


def test_a_run_whose_log_density_is_a_method_counts_its_objects_data(tmp_path):
    path = str(tmp_path / "model.h5")

    def sample(model: _Model) -> dict:
        walk = blackjax.mala(model.logdensity, step_size=0.1)
        return io.blackjax.sample(path, walk, jnp.zeros((2, 1)), jax.random.key(0), num_samples=4)

    first = sample(_Model(jnp.array([28.0, 8.0])))
    with pytest.raises(CheckpointError, match=r"with functions \(a log density, a model, step_args or draw\) of other"):
        sample(_Model(jnp.array([500.0, 8.0])))
    again = sample(_Model(jnp.array([28.0, 8.0])))  # the same data in another object: read back
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), again, first))
