"""The three functions of ``io.save`` and ``io.no_save`` called as a user porting from jax_sgmc may call them by
mistake: an :class:`~jaxstow.errors.ArgumentError` that says what they take, never Python's bare ``TypeError`` or
``AttributeError``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from jaxstow import io, scheduler
from jaxstow.errors import ArgumentError, CollectorError

INFORMATION = scheduler.static_information(samples_collected=4)
STRATEGIES = {"save": lambda: io.save(io.MemoryCollector()), "no_save": io.no_save}


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_a_misspelt_or_missing_argument_of_save_or_postprocess_save_names_what_they_take(strategy) -> None:
    init_save, save, postprocess_save = STRATEGIES[strategy]()
    state = init_save({"x": jnp.zeros(())}, None, INFORMATION)
    with pytest.raises(ArgumentError, match=r"save\(\) got an unexpected keyword argument 'solver' .*solver_state"):
        save(state, True, {"x": 1.0}, solver={"x": 1.0})
    with pytest.raises(ArgumentError, match=r"save\(\) missing a required argument: 'sample'; it takes saving_state"):
        jax.jit(lambda state: save(state, True))(state)
    with pytest.raises(ArgumentError, match=r"postprocess_save\(\) got an unexpected keyword argument 'chain'"):
        postprocess_save(state, chain=0)
    state, _ = save(state, True, {"x": 1.0})
    assert postprocess_save(state, None)["samples"]["x"].tolist() == [1.0]


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_what_save_returns_given_as_the_state_says_to_take_its_first_element(strategy) -> None:
    init_save, save, postprocess_save = STRATEGIES[strategy]()
    returned = save(init_save({"x": jnp.zeros(())}, None, INFORMATION), True, {"x": 1.0})
    for call in (lambda: save(returned, True, {"x": 2.0}), lambda: postprocess_save(returned, None)):
        with pytest.raises(ArgumentError, match=r"given what save returns, .*saving_state, _ = save\("):
            call()
    assert postprocess_save(returned[0], None)["samples"]["x"].tolist() == [1.0]


def test_no_saves_init_save_given_a_number_as_static_information_names_what_it_takes() -> None:
    init_save = io.no_save()[0]
    with pytest.raises(ArgumentError, match=r"static_information must be scheduler\.static_information\(.*not 4"):
        init_save({"x": jnp.zeros(())}, None, 4)


def test_no_saves_init_save_given_more_room_than_the_device_holds_says_to_stream_the_samples() -> None:
    """A terabyte of room: jax's ``JaxRuntimeError: RESOURCE_EXHAUSTED`` before."""
    information = scheduler.static_information(samples_collected=10**12)
    with pytest.raises(
        ArgumentError, match=r"samples_collected=1000000000000 .* more than the device can hold.*io\.save"
    ):
        io.no_save()[0]({"x": jnp.float32(0)}, None, information)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("jit", [False, True])
def test_a_sample_leaf_that_is_no_array_nor_number_is_named(strategy, jit) -> None:
    init_save, save, _ = STRATEGIES[strategy]()
    state = init_save({"x": jnp.zeros(()), "name": jnp.zeros(())}, None, INFORMATION)

    def run(state):
        return save(state, True, {"x": 1.0, "name": "chain a"})[0]

    with pytest.raises(ArgumentError, match=r"sample leaf 'name' is 'chain a': samples and states hold arrays"):
        (jax.jit(run) if jit else run)(state)


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda: scheduler.static_information(samples_collected=100, thinning=10), "keyword argument 'thinning'"),
        (lambda: scheduler.static_information(100, 10), "too many positional arguments"),
    ],
)
def test_static_information_given_what_it_does_not_take_names_what_it_takes(make, problem) -> None:
    with pytest.raises(ArgumentError, match=rf"static_information\(\) .*{problem}.*; it takes samples_collected"):
        make()
    assert scheduler.static_information(100)._replace(samples_collected=5).samples_collected == 5


@pytest.mark.parametrize("shared", [True, False], ids=["one collector", "a collector each"])
def test_a_state_given_to_the_postprocess_save_of_another_strategy_is_refused_and_its_samples_kept(shared) -> None:
    collector = io.MemoryCollector()
    first = io.save(collector)
    second = io.save(collector if shared else io.MemoryCollector())
    state = first[0]({"x": jnp.zeros(())}, None, INFORMATION)
    state = jax.jit(lambda s: jax.lax.scan(lambda s, t: first[1](s, True, {"x": t}), s, jnp.arange(4.0))[0])(state)
    second[0]({"x": jnp.zeros(())}, None, INFORMATION)  # the other strategy's run, going on
    with pytest.raises(ArgumentError, match=r"another io\.save strategy made: give it to the postprocess_save"):
        second[2](state, None)
    assert first[2](state, None)["samples"]["x"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_postprocess_save_called_twice_on_one_state_says_its_samples_came_back_the_first_time() -> None:
    init_save, save, postprocess_save = io.save(io.MemoryCollector())
    state, _ = save(init_save({"x": jnp.zeros(())}, None, INFORMATION), True, {"x": 1.0})
    first = postprocess_save(state, None)
    with pytest.raises(CollectorError, match=r"returns its samples once \(keep what it returned the first time\)"):
        postprocess_save(state, None)
    assert first["samples"]["x"].tolist() == [1.0]
