"""The ready module interface for JAX: an equinox model trained by an optax optimiser."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import jax
from jax.tree_util import PyTreeDef

from jaxstow._format.keypaths import flatten_with_paths
from jaxstow._format.static_values import same_static, same_structure
from jaxstow._util.optional import require
from jaxstow.errors import CheckpointError, StructureMismatchError, excerpt
from jaxstow.train.module import ModuleInterface

# Missing, each is named with its extra, before the imports below fail with a bare ModuleNotFoundError.
require("equinox", extra="equinox", purpose="jaxstow.train.EquinoxOptaxModule")
require("optax", extra="optax", purpose="jaxstow.train.EquinoxOptaxModule")

import equinox as eqx  # noqa: E402
import optax  # noqa: E402

__all__ = ["EquinoxOptaxModule"]


@eqx.filter_jit
def _train_step(
    model: eqx.Module,
    opt_state: optax.OptState,
    batch: Any,
    optimizer: optax.GradientTransformation,
    loss_fn: Callable[[Any, Any], jax.Array],
) -> tuple[eqx.Module, optax.OptState, jax.Array]:
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, batch)
    updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    return eqx.apply_updates(model, updates), opt_state, loss


class EquinoxOptaxModule(ModuleInterface):
    """Trains an equinox model with an optax optimiser, minimising ``loss_fn(model, batch)``.

    The step is compiled once with ``equinox.filter_jit``. The state is ``{"model": ..., "opt_state": ...}``: the
    whole model with its hyperparameters and the optimiser's state, so a checkpoint restores both without a template.

    >>> import equinox as eqx, jax, jax.numpy as jnp, optax
    >>> from jaxstow.train import EquinoxOptaxModule
    >>> def loss_fn(model, batch):
    ...     x, y = batch
    ...     return jnp.mean((jax.vmap(model)(x) - y) ** 2)
    >>> x = jax.random.normal(jax.random.key(0), (8, 2))
    >>> def module(seed):
    ...     model = eqx.nn.Linear(2, 1, key=jax.random.key(seed))
    ...     return EquinoxOptaxModule(model, optax.adam(0.1), loss_fn, lambda epoch: [(x, x.sum(1, keepdims=True))])
    >>> trained = module(0)
    >>> (batch,) = trained.get_train_dataloader(None, batch_size=8)
    >>> losses = [trained.train_step(step, batch) for step in range(20)]
    >>> losses[-1] < losses[0] / 10
    True
    >>> resumed = module(1)  # another model, then the state of the trained one: the model and adam's moments
    >>> resumed.update_state(trained.get_state())
    >>> resumed.train_step(20, batch) == trained.train_step(20, batch)
    True
    """

    def __init__(
        self,
        model: eqx.Module,
        optimizer: optax.GradientTransformation,
        loss_fn: Callable[[Any, Any], jax.Array],
        data: Callable[[int], Iterable[Any]],
    ) -> None:
        """Initialise the optimiser's state for ``model``.

        Args:
            model: The equinox model.
            optimizer: The optax optimiser.
            loss_fn: ``loss_fn(model, batch)``, a scalar.
            data: ``data(epoch)``, the batches of an epoch; a function of the epoch alone, so that a resumed run
                repeats an uninterrupted one exactly.
        """
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.data = data
        self.epoch = 0
        self.opt_state = optimizer.init(eqx.filter(model, eqx.is_array))

    def on_begin_train_epoch(self, global_step: Any, epoch: int) -> None:
        """Note the epoch whose batches :meth:`get_train_dataloader` gives next."""
        self.epoch = epoch

    def get_train_dataloader(self, sampler: Any, batch_size: int) -> Iterable[Any]:
        """``data(epoch)`` of the current epoch (the batches are ``data``'s own; ``batch_size`` is not used)."""
        return self.data(self.epoch)

    def train_step(self, global_step: int, batch: Any, device: Any = None) -> float:
        """One gradient step of ``optimizer`` on ``loss_fn(model, batch)``; returns the loss before the step."""
        self.model, self.opt_state, loss = _train_step(self.model, self.opt_state, batch, self.optimizer, self.loss_fn)
        return float(loss)

    def get_state(self) -> dict[str, Any]:
        """``{"model": the model, "opt_state": the optimiser's state}``."""
        return {"model": self.model, "opt_state": self.opt_state}

    def update_state(self, state: dict[str, Any]) -> None:
        """Take the model and optimiser state of a checkpoint; their arrays must have this module's shapes and dtypes."""
        if not isinstance(state, dict) or not {"model", "opt_state"} <= set(state):
            found = sorted(map(str, state)) if isinstance(state, dict) else type(state).__name__
            raise CheckpointError(
                f"the checkpoint's module state holds {found}, not the 'model' and 'opt_state' of an "
                "EquinoxOptaxModule: resume from a file this module's Trainer wrote"
            )
        for name in ("model", "opt_state"):
            _check_same_arrays(name, getattr(self, name), state[name])
        self.model, self.opt_state = (_built_as(getattr(self, name), state[name]) for name in ("model", "opt_state"))


def _built_as(live: Any, loaded: Any) -> Any:
    """``loaded`` in the structure of ``live`` where the two are the same to a NaN: with the code's own static
    values, which jax compares by ``==`` (the gradients' NaN hyperparameter against the optimiser state's)."""
    leaves, structure = jax.tree_util.tree_flatten(loaded)
    ours: PyTreeDef = jax.tree_util.tree_structure(live)
    if structure == ours or not same_structure(structure, ours):
        return loaded
    return jax.tree_util.tree_unflatten(ours, leaves)


def _check_same_arrays(name: str, expected: Any, found: Any) -> None:
    """Raise if ``found`` is not built like ``expected``, with arrays of the same paths, shapes and dtypes."""
    expected_arrays, expected_structure = _arrays_by_path(expected)
    found_arrays, found_structure = _arrays_by_path(found)
    problems = [f"missing array {path}" for path in expected_arrays if path not in found_arrays]
    problems += [f"unexpected array {path}" for path in found_arrays if path not in expected_arrays]
    problems += [
        f"{path} is {found_arrays[path]}, expected {wanted}"
        for path, wanted in expected_arrays.items()
        if path in found_arrays and found_arrays[path] != wanted
    ]
    if not problems and not same_structure(found_structure, expected_structure):  # a NaN is itself
        problems.append("its static fields or hyperparameters differ")
    problems += _other_leaves_problems(expected, found) if not problems else []
    if problems:
        raise StructureMismatchError([f"the checkpoint's {name!r}: {problem}" for problem in problems])


def _other_leaves_problems(expected: Any, found: Any) -> list[str]:
    """The leaves other than arrays (an MLP's ``activation``, a ``Lambda``'s function) that differ: a resumed run
    would go on with the file's functions while the code asks for others."""
    expected_paths, expected_leaves, _ = flatten_with_paths(eqx.filter(expected, eqx.is_array, inverse=True))
    found_leaves = dict(zip(*flatten_with_paths(eqx.filter(found, eqx.is_array, inverse=True))[:2], strict=True))
    return [
        f"{path} is {_shown(found_leaves.get(path))} in the file, but {_shown(leaf)} in this module"
        for path, leaf in zip(expected_paths, expected_leaves, strict=True)
        if not same_static(leaf, found_leaves.get(path), uncomparable=False)
    ]


def _shown(leaf: Any) -> str:
    name = getattr(leaf, "__name__", None)
    return name if isinstance(name, str) and callable(leaf) else excerpt(leaf)


def _arrays_by_path(tree: Any) -> tuple[dict[str, str], Any]:
    paths, leaves, structure = flatten_with_paths(eqx.filter(tree, eqx.is_array))
    return {path: f"{leaf.dtype}{list(leaf.shape)}" for path, leaf in zip(paths, leaves, strict=True)}, structure
