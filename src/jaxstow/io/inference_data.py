"""Posterior samples to ArviZ, with ``chain`` and ``draw`` dimensions: an ``arviz.InferenceData`` (ArviZ 0.x) or an
``xarray.DataTree`` (ArviZ 1.x).

:func:`to_inference_data` (what the installed ArviZ works with) and :func:`to_datatree` (a ``DataTree`` with either) take what ``postprocess_save`` returns (a list with one result per chain, or one chain's
result), a :class:`~jaxstow.io.MemoryCollector`, or an HDF5 file written by :class:`~jaxstow.io.HDF5Collector`, and
stacks the chains itself, so that one chain's samples never pass for many chains. Each leaf of the sample becomes a
variable named by its dict keys joined with ``.`` (``"w"``, ``"layer.bias"``). See docs/sampling.md.

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
from jaxstow.errors import ArgumentError, CollectorError, JaxstowError, MissingDependencyError
from jaxstow.io.arviz_data import arviz_major, from_posterior, without_slashes
from jaxstow.io.dictionize import joined_names, pytree_dict_keys
from jaxstow.io.live import read_draws
from jaxstow.io.memory import MemoryCollector

__all__ = ["to_datatree", "to_inference_data"]

Chains = list[dict[str, np.ndarray]]


def to_inference_data(
    samples: Any,
    *,
    truncate: bool = False,
    coords: Mapping[str, Any] | None = None,
    dims: Mapping[str, Sequence[str]] | None = None,
) -> Any:
    """ArviZ's data whose ``posterior`` holds every chain's samples, shaped ``(chain, draw, ...)``.

    With ArviZ 0.x an ``arviz.InferenceData``, with ArviZ 1.x an ``xarray.DataTree`` (read alike, as ArviZ's functions
    take them); ``chain`` labels each chain by its id (``N`` of ``/chain~N``), in a list of results by its position.

    Args:
        samples: What ``postprocess_save`` returned (the list of all chains, or one chain's dict), a
            :class:`~jaxstow.io.MemoryCollector` (the chains of its run going on, and of runs over whose samples
            are still held), or the HDF5 file of an :class:`~jaxstow.io.HDF5Collector` (a path or an open
            ``h5py.File``; a run still going on is read as far as every chain has written).
        truncate: Cut every chain to the shortest, rather than raise.
        coords: Labels by dimension (``{"school": names}``), one per entry, for ``arviz.from_dict``.
        dims: The names of each variable's axes of a draw (``{"theta": ["school"]}``), for ``arviz.from_dict``.

    Raises:
        JaxstowError: The chains kept different numbers of samples, or a file's are of an ended and an unended run
            (without ``truncate`` either); other variables, or draws in other shapes or dtypes; or there are none.
        ArgumentError: ``samples`` is none of the above, or ``coords`` or ``dims`` do not fit the variables.
        CollectorError: A ``MemoryCollector`` whose runs are over, and whose samples nothing holds any more.

    >>> import numpy as np
    >>> from jaxstow import io
    >>> one_chain = {"sample_count": 4, "samples": {"theta": np.arange(4.0)}}
    >>> dict(io.to_inference_data(one_chain).posterior.sizes)
    {'chain': 1, 'draw': 4}
    """
    require("arviz", extra="arviz", purpose="to_inference_data")
    chains, ended, ids = _chains_of(samples)
    if not chains:
        raise JaxstowError("there are no chains to convert: the source holds no samples")
    if any(ended) and not all(ended) and not truncate:
        _refuse_runs_mixed(chains, ended, ids, file=str(getattr(samples, "filename", samples)))
    posterior = _stack(chains, ids, truncate=truncate or not all(ended))
    if coords is None or (isinstance(coords, Mapping) and "chain" not in coords):  # else checked as given
        coords = {"chain": np.asarray(ids, np.int64), **(coords or {})}
    return from_posterior(posterior, purpose="to_inference_data", coords=coords, dims=dims)


def to_datatree(
    samples: Any,
    *,
    truncate: bool = False,
    coords: Mapping[str, Any] | None = None,
    dims: Mapping[str, Sequence[str]] | None = None,
) -> Any:
    """An ``xarray.DataTree`` whose ``posterior`` holds every chain's samples, shaped ``(chain, draw, ...)``.

    What ArviZ 1.x works with, at either major version: with ArviZ 1.x what :func:`to_inference_data` returns, with
    ArviZ 0.x its ``InferenceData`` converted (``InferenceData.to_datatree``). Takes what :func:`to_inference_data`
    takes.

    Raises:
        MissingDependencyError: An ArviZ 0.x whose InferenceData does not convert to xarray's DataTree (older ArviZ
            or xarray), naming what to install; or no ArviZ.

    >>> import numpy as np
    >>> from jaxstow import io
    >>> tree = io.to_datatree({"sample_count": 4, "samples": {"theta": np.arange(4.0)}})
    >>> type(tree).__name__, dict(tree["posterior"].sizes)
    ('DataTree', {'chain': 1, 'draw': 4})
    """
    data = to_inference_data(samples, truncate=truncate, coords=coords, dims=dims)
    arviz = require("arviz", extra="arviz", purpose="to_datatree")
    if arviz_major(arviz) >= 1:
        return data
    slashed = {name: spelt for name, spelt in without_slashes(data.posterior.data_vars).items() if name != spelt}
    if slashed:  # a DataTree's variables may not hold a "/": spelt as ArviZ 1.x spells them
        data = data.rename_vars(slashed)
    convert = getattr(data, "to_datatree", None)
    try:
        tree = convert() if convert is not None else None
    except ImportError:  # an xarray without DataTree
        tree = None
    if type(tree).__module__.startswith("xarray."):
        return tree
    raise MissingDependencyError(
        f"to_datatree needs an InferenceData that converts to xarray's DataTree, which ArviZ {arviz.__version__} "
        "here does not: pip install --upgrade arviz 'xarray>=2024.11' (ArviZ 1.x holds a run in a DataTree)"
    )


def _chains_of(samples: Any) -> tuple[Chains, list[bool], list[int]]:
    """Every chain's variables (name -> array of draws), in chain order; whether each one's run has ended (one going
    on, or stopped by a failure, has not); the chains' ids (those the collector gave them, which its file keeps;
    positions in a list of results)."""
    if isinstance(samples, MemoryCollector):
        chains = samples.chains()
        if not chains and samples.chain_count:
            raise CollectorError(
                "the MemoryCollector keeps no samples of a run that ended: postprocess_save handed them over, and "
                "nothing holds them any more; pass what postprocess_save returns to to_inference_data instead"
            )
        return [_variables(samples.finished(chain)) for chain in chains], [True] * len(chains), chains
    if isinstance(samples, str | os.PathLike) or type(samples).__module__.startswith("h5py"):
        draws = read_draws(samples)
        return draws.chains, draws.ended, draws.ids
    if isinstance(samples, Mapping) and "samples" in samples:
        return [_counted(samples, 0)], [True], [0]
    if isinstance(samples, Sequence) and all(isinstance(chain, Mapping) and "samples" in chain for chain in samples):
        counted = [_counted(chain, number) for number, chain in enumerate(samples)]
        return counted, [True] * len(counted), list(range(len(samples)))
    raise ArgumentError(
        "to_inference_data takes what postprocess_save returns (a list of {'sample_count', 'samples'} per chain, or "
        f"one of them), a MemoryCollector or an HDF5Collector's file, not {type(samples).__name__}"
    )


def _refuse_runs_mixed(chains: Chains, ended: list[bool], ids: list[int], *, file: str) -> None:
    """A :class:`~jaxstow.errors.JaxstowError` for a file whose chains are of a run that ended and of one that has not
    (one that failed, or goes on): stacked, the ended chains would be cut to the others' draws, theirs mixed in."""
    counts = [len(next(iter(variables.values()))) if variables else 0 for variables in chains]
    unended = [f"{chain} ({count} draws)" for chain, count, done in zip(ids, counts, ended, strict=True) if not done]
    finished = [f"{chain} ({count})" for chain, count, done in zip(ids, counts, ended, strict=True) if done]
    raise JaxstowError(
        f"chains {', '.join(unended)} of {file} are of a run that has not ended (it failed or stopped, or goes on), "
        f"chains {', '.join(finished)} of one that ended: convert what that run's postprocess_save returned, or "
        "choose chains from io.read_draws(path); truncate=True takes them all, cut to the shortest",
        file=file,
    )


def _counted(chain: Mapping[str, Any], number: int) -> dict[str, np.ndarray]:
    """A chain's variables, its first ``sample_count`` rows where it gives one (rows past it are no draws: storage
    allocated for more samples than were kept); more than its rows is a :class:`~jaxstow.errors.JaxstowError`."""
    variables = _variables(chain["samples"])
    count = chain.get("sample_count")
    if count is None or not variables:
        return variables
    count = int(np.asarray(count))
    rows = min((len(values) for values in variables.values() if np.ndim(values)), default=count)
    if not 0 <= count <= rows:
        raise JaxstowError(f"chain {number} has sample_count {count}, but {rows} rows of samples: give the rows kept")
    return {name: values[:count] if np.ndim(values) else values for name, values in variables.items()}


def _variables(tree: Any) -> dict[str, np.ndarray]:
    """A chain's samples as variables named by their dict keys joined with ``.``; datasets are read whole."""
    names = joined_names(pytree_dict_keys(tree), ".")
    return {name: _read(leaf) for name, leaf in zip(names, jax.tree.leaves(tree), strict=True)}


def _read(leaf: Any) -> np.ndarray:
    """A leaf's values: an array, or an h5py dataset read whole while its file is open."""
    identifier = getattr(leaf, "id", None)
    if type(leaf).__module__.startswith("h5py") and identifier is not None and not identifier.valid:
        raise CollectorError(
            "the samples are datasets of an HDF5 file that was closed since (the HDF5Collector was given the open "
            "file): pass the file's path to to_inference_data, or call it before the file is closed"
        )
    return np.asarray(leaf[()])


def _stack(chains: Chains, ids: list[int], *, truncate: bool) -> dict[str, np.ndarray]:
    """The chains' variables stacked, each ``(chain, draw, ...)``; a mismatch names the chains by their ``ids``."""
    names = list(chains[0])
    if not names:
        raise JaxstowError("the samples hold no variables: there is nothing to convert")
    for chain, variables in zip(ids, chains, strict=True):
        if list(variables) != names:
            raise JaxstowError(
                f"chain {chain} has the variables {list(variables)}, but chain {ids[0]} has {names}: ArviZ needs the "
                "same variables in every chain, so convert the runs of each on their own (what postprocess_save "
                "returned)"
            )
    for name in names:
        dimension = _DIMENSION.fullmatch(name)
        if name in ("chain", "draw") or (dimension is not None and dimension[1] in names):
            raise JaxstowError(
                f"the variable {name!r} has the name of one of ArviZ's dimensions, which would hide it without a "
                "word: rename it in the samples (a dict key) before converting"
            )
        if any(variables[name].ndim == 0 for variables in chains):
            raise JaxstowError(
                f"the variable {name!r} is one value, not an array of draws: give each chain's samples as "
                "postprocess_save returns them, one row per draw"
            )
        shapes = [variables[name].shape[1:] for variables in chains]
        if len(set(shapes)) > 1:
            raise JaxstowError(
                f"the variable {name!r} has a draw of shape {shapes[0]} in chain {ids[0]} but "
                f"{_first_other(shapes, ids)}: ArviZ stacks the chains of a variable, so convert the runs of each shape "
                "on their own"
            )
        dtypes = [variables[name].dtype for variables in chains]
        if len(set(dtypes)) > 1:
            raise JaxstowError(
                f"the variable {name!r} has draws of {dtypes[0]} in chain {ids[0]} but {_first_other(dtypes, ids)}: "
                "ArviZ stacks the chains of a variable, which would turn every draw into "
                f"{np.result_type(*dtypes)} without a word, so convert the runs of each dtype on their own"
            )
    counts = [len(next(iter(variables.values()))) if variables else 0 for variables in chains]
    draws = min(counts)
    if len(set(counts)) > 1 and not truncate:
        raise JaxstowError(
            f"the chains kept different numbers of samples ({counts}); ArviZ needs as many draws in every chain: "
            f"pass truncate=True to keep the first {draws} of each"
        )
    return {name: np.stack([variables[name][:draws] for variables in chains]) for name in names}


#: ArviZ's name for an axis of a variable's draw (``theta_dim_0``), which a variable of that name would take over.
_DIMENSION = re.compile(r"(.+)_dim_\d+")


def _first_other(values: list[Any], ids: list[int]) -> str:
    """Which chain (of ``ids``) first has a value (a shape, a dtype) other than the first chain's, and that value."""
    chain = next(number for number, value in enumerate(values) if value != values[0])
    return f"{values[chain]} in chain {ids[chain]}"
