"""The name policy: a file may name pure functions and classes, never anything that reads, writes, imports, runs
code or allocates on request, whichever library re-exports it."""

from __future__ import annotations

import os
import pickle
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxstow._names.policy import refusal


@pytest.mark.parametrize(
    ("name", "obj"),
    [
        ("jax.nn.relu", jax.nn.relu),
        ("jax.nn.gelu", jax.nn.gelu),
        ("jax.scipy.special.logsumexp", jax.scipy.special.logsumexp),
        ("numpy.tanh", np.tanh),
        ("jax.numpy.tanh", jnp.tanh),
        ("jax.numpy.sum", jnp.sum),
        ("numpy.einsum", np.einsum),
        ("jax.lax.dot_general", jax.lax.dot_general),
        ("numpy.float32", np.float32),
        ("jax.numpy.bfloat16", jnp.bfloat16),
        ("jax.tree_util.Partial", jax.tree_util.Partial),
    ],
)
def test_pure_functions_and_scalar_types_may_be_named(name, obj):
    assert refusal(name, obj) is None


@pytest.mark.parametrize(
    ("name", "obj", "reason"),
    [
        ("numpy.savetxt", np.savetxt, "is not an activation, an elementwise or reducing function or a scalar type"),
        ("numpy.fromfile", np.fromfile, "is not an activation"),
        ("numpy.memmap", np.memmap, "is not an activation"),
        ("jax.numpy.zeros", jnp.zeros, "is not an activation"),  # allocates by a size the file chose
        ("numpy.void", np.void, "is not an activation"),  # numpy.void(2**40): as many bytes
        ("numpy.bytes_", np.bytes_, "is not an activation"),
        ("numpy.object_", np.object_, "is not an activation"),
        ("jax.numpy.load", jnp.load, "is not an activation"),
        ("jax.lax.while_loop", jax.lax.while_loop, "is not an activation"),
        ("jax.lax.full", jax.lax.full, "is not an activation"),
        ("jax.nn.initializers.normal", jax.nn.initializers.normal, "is not an activation"),
        ("os.system", os.system, "comes from posix, which a file may never name"),
        ("numpy.anything", os.system, "comes from posix, which a file may never name"),  # re-exported: still refused
        ("pickle.loads", pickle.loads, "comes from _pickle"),
        ("jax.numpy.Popen", subprocess.Popen, "comes from subprocess"),
    ],
)
def test_what_reads_writes_runs_or_allocates_is_refused_with_the_reason(name, obj, reason):
    found = refusal(name, obj)
    assert found is not None and reason in found


def _defined_in(module: str):
    def function(x):
        return x

    function.__module__ = module
    return function


@pytest.mark.parametrize(
    ("name", "module", "word"),
    [
        ("equinox.tree_serialise_leaves", "equinox._serialisation", "serial"),
        ("flax.serialization.from_bytes", "flax.serialization", "serial"),
        ("optax.tree_utils.tree_print", "optax.tree_utils._tree_math", "print"),
        ("flax.linen.tabulate", "flax.linen.summary", "tabulate"),
        ("flax.io.exists", "flax.io", "io"),
        ("equinox.debug.breakpoint_if", "equinox.debug._breakpoints", "debug"),
    ],
)
def test_the_model_libraries_serialisation_file_and_debugging_helpers_are_refused(name, module, word):
    assert refusal(name, _defined_in(module)) == (
        f"{name} is a serialisation, file or debugging helper ({word!r}), which a file may never name"
    )


@pytest.mark.parametrize(
    ("name", "module", "word"),
    [
        ("flax.nnx.display", "flax.nnx.visualization", "display"),
        ("equinox._module._flatten.generate_flatten_functions", "equinox._module._flatten", "generate"),
        ("flax.configurations.bool_flag", "flax.configurations", "config"),
        ("flarejax.flr._module.dicts_to_object", "flarejax.flr._module", "dicts_to"),
        ("flax.linen.module._global_interceptor_stack", "flax.linen.module", "interceptor"),
    ],
)
def test_display_code_generation_and_global_settings_of_the_model_libraries_are_refused(name, module, word):
    assert f"({word!r})" in (refusal(name, _defined_in(module)) or "")


def test_a_short_harmful_word_counts_only_as_a_whole_word():
    """``io`` refuses ``flax.io`` but not ``scale_by_ratio``; longer words count anywhere (``load`` in ``loader``)."""
    assert refusal("optax.scale_by_ratio", _defined_in("optax._src.transform")) is None
    assert refusal("optax.scale_io_by", _defined_in("optax._src.transform")) is not None
    assert refusal("equinox.nn.MLP", _defined_in("equinox.nn._mlp")) is None
    assert refusal("equinox.checkpoint_loader", _defined_in("equinox._misc")) is not None


@pytest.mark.parametrize("name", ["jax.lax.psum_scatter_start", "jax.lax.all_gather_invariant", "jax.lax.pmax"])
def test_a_collective_of_jax_lax_is_refused_whichever_jax_added_it(name):
    found = refusal(name, _defined_in("jax._src.lax.parallel"))
    assert found is not None and "is not an activation" in found
