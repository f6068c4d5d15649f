"""jaxstow's uses of jax beyond its public API resolve on the installed jax, as ``_util.jax_compat`` says per version,
and a name that jax lacks is a loud error, never a silent fallback. Part of the core tests that the version matrix runs
at both ends of the supported jax versions."""

from __future__ import annotations

import dataclasses
import inspect
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow._coordination import Coordinator
from jaxstow._util import jax_compat
from jaxstow.errors import JaxstowError, MissingDependencyError
from jaxstow.io.host_block import send_block


@pytest.mark.parametrize("shim", jax_compat.SHIMS, ids=lambda shim: shim.name)
def test_each_name_resolves_on_the_installed_jax(shim: jax_compat.Shim) -> None:
    found = shim.resolve()
    if shim is jax_compat.DISTRIBUTED_CLIENT:
        assert found is None  # this process never called jax.distributed.initialize()
    else:
        assert callable(found)


def test_the_arguments_each_version_takes_are_those_of_the_installed_jax() -> None:
    """What the module says per jax version holds for the jax installed: the keywords it passes exist exactly from
    the version on which it passes them."""
    version = jax_compat.JAX_VERSION

    def parameters(shim: jax_compat.Shim) -> list[str]:
        return list(inspect.signature(shim.resolve()).parameters)

    assert ("cacheable" in parameters(jax_compat.REGISTER_LOWERING)) == (version >= (0, 7, 0))
    assert ("returns_token" in parameters(jax_compat.EMIT_PYTHON_CALLBACK)) == (version >= (0, 8, 2))
    assert len(parameters(jax_compat.CALLBACK_OP_SHARDING)) == (2 if version < (0, 5, 0) else 3)
    assert version >= (0, 4, 38)


def test_a_switch_in_range_takes_no_clamp_where_jax_allows_and_is_lax_switch_elsewhere(monkeypatch) -> None:
    in_range = jax.jit(lambda index, x: jax_compat.switch_in_range(index, [lambda x: x - 1, lambda x: x + 1], x))
    assert [int(in_range(jnp.int32(index), 10)) for index in (0, 1)] == [9, 11]
    text = in_range.lower(jnp.int32(1), 10).as_text()
    has_it = jax_compat.JAX_VERSION >= (0, 10)  # the versions it was checked on; jax 0.4.38 has no such name
    assert ("clamp" in text) != has_it
    missing = dataclasses.replace(jax_compat.SWITCH_IN_RANGE, attribute="no_such_name")
    monkeypatch.setattr(jax_compat, "SWITCH_IN_RANGE", missing)  # as on a jax without it
    clamped = jax.jit(lambda index, x: jax_compat.switch_in_range(index, [lambda x: x - 1, lambda x: x + 1], x))
    assert int(clamped(jnp.int32(1), 10)) == 11 and "clamp" in clamped.lower(jnp.int32(1), 10).as_text()


def _missing(name: str, purpose: str = ".*") -> str:
    version = re.escape(jax.__version__)
    return rf"^jax {version} has no {re.escape(name)}, which jaxstow uses {purpose}; .*with jax 0\.4\.38 to 0\.12"


def test_a_jit_that_saves_samples_fails_loudly_when_jax_cannot_pin_the_callback_to_one_device(monkeypatch) -> None:
    import jax._src.callback

    received = []

    def receive(numbers, *leaves):
        received.append(numbers)
        return np.zeros(numbers.shape[1:], np.int32)

    def send(x):
        return send_block(receive, jnp.arange(3), [x])

    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("chains",))  # sharded: the one case that needs the name
    sharded = jax.device_put(jnp.ones(2), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("chains")))
    monkeypatch.delattr(jax._src.callback, "_callback_op_sharding")
    with pytest.raises(MissingDependencyError, match=_missing("jax._src.callback._callback_op_sharding")) as raised:
        jax.jit(send)(sharded).block_until_ready()
    assert "once per device" in str(raised.value) and received == []
    monkeypatch.undo()
    assert int(jax.jit(send)(sharded)) == 0 and len(received) == 1  # the same jit, with the name back


def test_a_coordinator_of_a_distributed_run_fails_loudly_when_jax_has_no_client_to_reach(monkeypatch) -> None:
    import jax._src.distributed

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.delattr(jax._src.distributed, "global_state")
    with pytest.raises(MissingDependencyError, match=_missing("jax._src.distributed.global_state.client")):
        Coordinator("runs/a", timeout=60)


def test_a_missing_module_is_named_too() -> None:
    shim = jax_compat.Shim("jax._src.no_such_module", "thing", "for nothing")
    with pytest.raises(JaxstowError, match=_missing("jax._src.no_such_module.thing", "for nothing")):
        shim.resolve()


def test_a_vmapped_init_save_fails_loudly_when_jax_cannot_return_per_chain_states(monkeypatch) -> None:
    """jax's own vmap needs the name, so a jax that renamed it is stood for by a shim of a name that is not there."""
    from jaxstow import io

    collector = io.MemoryCollector()
    init_save, _, _ = io.save(collector)
    renamed = jax_compat.Shim("jax._src.interpreters.batching", "RenamedTracer", jax_compat.BATCH_TRACER.purpose)
    monkeypatch.setattr(jax_compat, "BATCH_TRACER", renamed)
    name = "jax._src.interpreters.batching.RenamedTracer"
    with pytest.raises(
        MissingDependencyError, match=_missing(name, "to return init_save's per-chain saving states .*")
    ):
        jax.vmap(lambda _: init_save({"x": jnp.zeros(2)}))(jnp.arange(3))
    assert collector.chain_count == 0  # refused before any chain was registered
    assert init_save({"x": jnp.zeros(2)}).chain_id.shape == ()  # outside vmap, the name is not needed
    monkeypatch.undo()
    states = jax.vmap(lambda _: init_save({"x": jnp.zeros(2)}))(jnp.arange(3))
    assert states.chain_id.tolist() == [1, 2, 3]
