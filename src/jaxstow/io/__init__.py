"""Save and checkpoint chains: samples leave a jit-compiled loop for the host, in blocks.
A face: it imports the core (``jaxstow._*``) and no other face.

Saving consists of two parts. A *data collector* serializes the samples and writes them to disk and/or keeps them
in memory (:class:`MemoryCollector`, :class:`HDF5Collector`, or any :class:`DataCollector` of your own). A
*saving strategy* connects it to the jit-compiled function: :func:`save` streams the kept samples to the collector,
:func:`no_save` keeps them in device memory instead. Both return ``(init_save, save, postprocess_save)``.

>>> import jax, jax.numpy as jnp
>>> from jaxstow import io
>>> init_save, save, postprocess_save = io.save(io.MemoryCollector())
>>> states = [init_save({"x": jnp.zeros(())}, None, io.scheduler.static_information(samples_collected=None))
...           for chain in range(2)]
>>> states = jax.tree.map(lambda *s: jnp.stack(s), *states)
>>> keep = jnp.array([[True, True, False], [False, True, False]])    # per chain, per step
>>> def run(state, keep):
...     def step(state, i):
...         return save(state, keep[i], {"x": i.astype(jnp.float32)})
...     return jax.lax.scan(step, state, jnp.arange(3))[0]
>>> [chain["samples"]["x"] for chain in postprocess_save(jax.jit(jax.vmap(run))(states, keep), None)]
[array([0., 1.], dtype=float32), array([1.], dtype=float32)]
"""

from typing import Any

from jaxstow._util.deprecation import moved
from jaxstow.errors import CollectorError, SampleCountError
from jaxstow.io import blackjax, host_buffers, numpyro, scheduler
from jaxstow.io.collector import ChainCheckpoint, DataCollector, DataLoader
from jaxstow.io.dictionize import dict_to_pytree, pytree_dict_keys, pytree_to_dict, register_dictionize_rule
from jaxstow.io.hdf5 import HDF5Collector
from jaxstow.io.inference_data import to_datatree, to_inference_data
from jaxstow.io.memory import MemoryCollector
from jaxstow.io.no_save import DeviceSamples, no_save
from jaxstow.io.runs import run_chains
from jaxstow.io.saving import Saving, SavingState, save
from jaxstow.io.swmr import LiveReadWarning

__all__ = [
    "ChainCheckpoint",
    "CollectorError",
    "DataCollector",
    "DataLoader",
    "DeviceSamples",
    "HDF5Collector",
    "LiveReadWarning",
    "MemoryCollector",
    "SampleCountError",
    "Saving",
    "SavingState",
    "blackjax",
    "dict_to_pytree",
    "host_buffers",
    "no_save",
    "numpyro",
    "pytree_dict_keys",
    "pytree_to_dict",
    "register_dictionize_rule",
    "run_chains",
    "save",
    "scheduler",
    "to_datatree",
    "to_inference_data",
]


def __getattr__(name: str) -> Any:
    if name == "Checkpoint":
        return moved("jaxstow.io.Checkpoint", "jaxstow.io", "ChainCheckpoint")
    raise AttributeError(f"module 'jaxstow.io' has no attribute {name!r}")
