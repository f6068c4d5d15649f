"""Posterior samples to ArviZ: an ``arviz.InferenceData`` with ``chain`` and ``draw`` dimensions.

:func:`to_inference_data` takes what ``postprocess_save`` returns (a list with one result per chain, or one chain's
result), a :class:`~jaxstow.io.MemoryCollector`, or an HDF5 file written by :class:`~jaxstow.io.HDF5Collector`, and
stacks the chains itself, so that one chain's samples never pass for many chains. Each leaf of the sample becomes a
variable named by its dict keys joined with ``.`` (``"w"``, ``"layer.bias"``).

>>> import jax, jax.numpy as jnp
>>> from jaxstow import io
>>> init_save, save, postprocess_save = io.save(io.MemoryCollector())
>>> states = [init_save({"w": jnp.zeros(2)}, None, io.scheduler.static_information(samples_collected=5))
...           for chain in range(3)]
>>> states = jax.tree.map(lambda *s: jnp.stack(s), *states)
>>> def run(state, offset):
...     step = lambda state, i: save(state, True, {"w": jnp.full(2, offset + i, jnp.float32)})
...     return jax.lax.scan(step, state, jnp.arange(5.0))[0]
>>> idata = io.to_inference_data(postprocess_save(jax.vmap(run)(states, jnp.arange(3.0)), None))
>>> dict(idata.posterior.sizes)
{'chain': 3, 'draw': 5, 'w_dim_0': 2}
>>> idata.posterior["w"].values[2, :, 0]
array([2., 3., 4., 5., 6.], dtype=float32)
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np

from jaxstow._util.optional import require
from jaxstow.errors import ArgumentError, FormatError, JaxstowError
from jaxstow.io.dictionize import pytree_dict_keys
from jaxstow.io.memory import MemoryCollector

__all__ = ["to_inference_data"]

_CHAIN_GROUP = re.compile(r"chain~(\d+)")

Chains = list[dict[str, np.ndarray]]


def to_inference_data(
    samples: Any,
    *,
    truncate: bool = False,
    coords: Mapping[str, Any] | None = None,
    dims: Mapping[str, Sequence[str]] | None = None,
) -> Any:
    """An ``arviz.InferenceData`` whose ``posterior`` holds every chain's samples, shaped ``(chain, draw, ...)``.

    ``samples`` is what ``postprocess_save`` returned (the list of all chains, or one chain's dict), a
    :class:`~jaxstow.io.MemoryCollector`, or an HDF5 file written by :class:`~jaxstow.io.HDF5Collector` (a path or an
    open ``h5py.File``). Chains that kept different numbers of samples raise an error, unless ``truncate=True`` cuts
    every chain to the shortest. ``coords`` and ``dims`` go to ``arviz.from_dict``.

    >>> import numpy as np
    >>> from jaxstow import io
    >>> one_chain = {"sample_count": 4, "samples": {"theta": np.arange(4.0)}}
    >>> dict(io.to_inference_data(one_chain).posterior.sizes)
    {'chain': 1, 'draw': 4}
    """
    arviz = require("arviz", extra="arviz", purpose="to_inference_data")
    chains = _chains_of(samples)
    if not chains:
        raise JaxstowError("there are no chains to convert: the source holds no samples")
    posterior = _stack(chains, truncate=truncate)
    return arviz.from_dict(
        posterior=posterior,
        coords=dict(coords) if coords is not None else None,
        dims={name: list(names) for name, names in dims.items()} if dims is not None else None,
    )


def _chains_of(samples: Any) -> Chains:
    """Every chain's variables (name -> array of draws), in chain order."""
    if isinstance(samples, MemoryCollector):
        return [_variables(samples.finished(chain)) for chain in range(samples.chain_count)]
    if isinstance(samples, str | os.PathLike):
        h5py = require("h5py", extra="h5py", purpose=f"reading the samples of {os.fspath(samples)}")
        with h5py.File(samples, "r") as file:
            return _hdf5_chains(file, name=os.fspath(samples))
    if type(samples).__module__.startswith("h5py"):
        return _hdf5_chains(samples, name=str(getattr(samples, "filename", samples)))
    if isinstance(samples, Mapping) and "samples" in samples:
        return [_variables(samples["samples"])]
    if isinstance(samples, Sequence) and all(isinstance(chain, Mapping) and "samples" in chain for chain in samples):
        return [_variables(chain["samples"]) for chain in samples]
    raise ArgumentError(
        "to_inference_data takes what postprocess_save returns (a list of {'sample_count', 'samples'} per chain, or "
        f"one of them), a MemoryCollector or an HDF5Collector's file, not {type(samples).__name__}"
    )


def _variables(tree: Any) -> dict[str, np.ndarray]:
    """A chain's samples as variables named by their dict keys joined with ``.``; datasets are read whole."""
    names = [".".join(str(key) for key in keys) for keys in pytree_dict_keys(tree)]
    return {name: np.asarray(leaf[()]) for name, leaf in zip(names, jax.tree.leaves(tree), strict=True)}


def _hdf5_chains(file: Any, *, name: str) -> Chains:
    """The chains of an HDF5Collector's file: its ``/chain~{id}`` groups, in the order of their ids."""
    import h5py

    groups = sorted(
        (int(match.group(1)), group)
        for key, group in file.items()
        if (match := _CHAIN_GROUP.fullmatch(key)) and isinstance(group, h5py.Group)
    )
    if not groups:
        raise FormatError("holds no /chain~{id} group: it was not written by an HDF5Collector", file=name)
    chains = []
    for chain, group in groups:
        variables: dict[str, np.ndarray] = {}

        def collect(path: str, item: Any, variables: dict[str, np.ndarray] = variables) -> None:
            if isinstance(item, h5py.Dataset):
                variables[path.replace("/", ".")] = item[()]

        group.visititems(collect)
        count = group.attrs.get("sample_count")
        if count is None:
            raise FormatError(
                f"chain {chain} has no sample_count: its run did not finish (postprocess_save was not called)",
                file=name,
                path=group.name,
            )
        chains.append({key: value[: int(count)] for key, value in variables.items()})
    return chains


def _stack(chains: Chains, *, truncate: bool) -> dict[str, np.ndarray]:
    names = list(chains[0])
    for chain, variables in enumerate(chains):
        if list(variables) != names:
            raise JaxstowError(f"chain {chain} has the variables {list(variables)}, but chain 0 has {names}")
    counts = [len(next(iter(variables.values()))) if variables else 0 for variables in chains]
    draws = min(counts)
    if len(set(counts)) > 1 and not truncate:
        raise JaxstowError(
            f"the chains kept different numbers of samples ({counts}); ArviZ needs as many draws in every chain: "
            f"pass truncate=True to keep the first {draws} of each"
        )
    return {name: np.stack([variables[name][:draws] for variables in chains]) for name in names}
