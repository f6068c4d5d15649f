"""``postprocess_save`` given the saving state that a run was given with ``donate_argnums`` (the docs' pattern for
reusing a strategy), not the one it returned: jax's ``RuntimeError: Array has been deleted`` before; an
:class:`ArgumentError` that says what happened now, the run's own state then getting every sample."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow import io, scheduler
from jaxstow.errors import ArgumentError

STEPS = 8
INFORMATION = scheduler.static_information(samples_collected=STEPS)
STEPS_OF = jnp.arange(float(STEPS))


@pytest.mark.parametrize("strategy", ["save", "no_save"])
def test_a_state_donated_to_the_run_is_refused_naming_the_donation(strategy) -> None:
    init_save, save, postprocess_save = io.save(io.MemoryCollector()) if strategy == "save" else io.no_save()
    step = lambda s, t: (save(s, True, {"w": t})[0], None)  # noqa: E731
    run = jax.jit(lambda state: jax.lax.scan(step, state, STEPS_OF)[0], donate_argnums=0)
    state = init_save({"w": 0.0}, None, INFORMATION)
    final = run(state)
    with pytest.raises(ArgumentError, match=r"arrays are gone: donated to a run \(donate_argnums\)"):
        postprocess_save(state, None)
    np.testing.assert_array_equal(postprocess_save(final, None)["samples"]["w"], np.arange(STEPS, dtype=np.float32))
