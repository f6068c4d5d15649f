"""The ready module interface for PyTorch: an ``nn.Module`` trained by a ``torch.optim`` optimiser.

Nothing here imports torch: the module only calls methods of the objects it is given, so ``import jaxstow.train``
works without torch installed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from jaxstow.errors import StructureMismatchError
from jaxstow.train.module import ModuleInterface

__all__ = ["TorchModule"]


class TorchModule(ModuleInterface):
    """Trains a torch ``nn.Module`` with a ``torch.optim`` optimiser, minimising ``loss_fn(model, batch)``.

    The state is ``{"model": model.state_dict(), "optimizer": optimizer.state_dict()}``; jaxstow saves its tensors
    without pickle and loads them back as tensors.

    >>> import torch
    >>> from jaxstow.train import TorchModule
    >>> _ = torch.manual_seed(0)
    >>> model = torch.nn.Linear(2, 1)
    >>> def loss_fn(model, batch):
    ...     x, y = batch
    ...     return torch.nn.functional.mse_loss(model(x), y)
    >>> def data(epoch):
    ...     x = torch.randn(8, 2, generator=torch.Generator().manual_seed(epoch))
    ...     return [(x, x.sum(dim=1, keepdim=True))]
    >>> module = TorchModule(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn, data)
    >>> losses = []
    >>> for epoch in range(20):
    ...     module.on_begin_train_epoch(global_step=epoch, epoch=epoch)
    ...     losses += [module.train_step(epoch, batch) for batch in module.get_train_dataloader(None, batch_size=8)]
    >>> losses[-1] < losses[0] / 10
    True
    >>> sorted(module.get_state())
    ['model', 'optimizer']
    """

    def __init__(
        self,
        model: Any,
        optimizer: Any,
        loss_fn: Callable[[Any, Any], Any],
        data: Callable[[int], Iterable[Any]],
    ) -> None:
        """Take the model, its optimiser, its loss and its data.

        Args:
            model: The ``torch.nn.Module``.
            optimizer: A ``torch.optim`` optimiser of its parameters.
            loss_fn: ``loss_fn(model, batch)``, a scalar tensor.
            data: ``data(epoch)``, the batches of an epoch; a function of the epoch alone (seed any shuffling with
                the epoch), so that a resumed run repeats an uninterrupted one exactly.
        """
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.data = data
        self.epoch = 0

    def on_begin_train_epoch(self, global_step: Any, epoch: int) -> None:
        """Note the epoch whose batches :meth:`get_train_dataloader` gives next."""
        self.epoch = epoch

    def get_train_dataloader(self, sampler: Any, batch_size: int) -> Iterable[Any]:
        """``data(epoch)`` of the current epoch (the batches are ``data``'s own; ``batch_size`` is not used)."""
        return self.data(self.epoch)

    def train_step(self, global_step: int, batch: Any, device: Any = None) -> float:
        """Zero the gradients, back-propagate ``loss_fn(model, batch)`` and step the optimiser; returns the loss."""
        self.optimizer.zero_grad()
        loss = self.loss_fn(self.model, batch)
        loss.backward()
        self.optimizer.step()
        return float(loss.item())

    def get_state(self) -> dict[str, Any]:
        """``{"model": the model's state dict, "optimizer": the optimiser's state dict}``."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def update_state(self, state: dict[str, Any]) -> None:
        """Load the model's and the optimiser's state dicts, the model's tensors checked first: their names, shapes
        and dtypes (torch's ``load_state_dict`` would cast another dtype silently).

        Raises:
            StructureMismatchError: The state does not fit the model or its optimiser.
        """
        problems = _tensor_problems(self.model.state_dict(), state.get("model") if isinstance(state, Mapping) else None)
        if problems:
            raise StructureMismatchError([f"the checkpoint's 'model': {problem}" for problem in problems])
        if problem := _optimizer_problem(self.optimizer, state.get("optimizer")):
            raise StructureMismatchError([f"the checkpoint's 'optimizer': {problem}"])
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        except (KeyError, RuntimeError, TypeError, ValueError) as error:
            raise StructureMismatchError([f"the checkpoint's state does not fit the module: {error}"]) from None


#: The settings torch's learning-rate schedulers add to an optimiser's groups (OneCycleLR all of them).
_SCHEDULERS_SETTINGS = frozenset({"initial_lr", "max_lr", "min_lr", "max_momentum", "base_momentum"})


def _optimizer_problem(optimizer: Any, found: Any) -> str | None:
    """How the state dict ``found`` is not one of ``optimizer``'s kind: its groups' settings are another
    optimiser's (Adam's ``betas`` where SGD has ``momentum``), which torch loads and the first step then fails on."""
    groups = found.get("param_groups") if isinstance(found, Mapping) else None
    if not isinstance(groups, list) or not all(isinstance(group, Mapping) for group in groups):
        return f"an optimiser's state dict, not {type(found).__name__}"
    # Settings the file lacks may be a later torch's, which load_state_dict fills in; settings it has more are not,
    # but for those torch's learning-rate schedulers add, which one made after the resume loads it adds again.
    wanted = set().union(*(set(group) for group in optimizer.state_dict()["param_groups"]), _SCHEDULERS_SETTINGS)
    extra = sorted(set().union(*(set(group) for group in groups)) - wanted)
    if extra:
        return (
            f"its groups have the settings {extra}, which {type(optimizer).__name__}'s lack: it holds the state of "
            "another optimiser; resume with the optimiser it was saved with"
        )
    return None


def _tensor_problems(expected: Mapping[str, Any], found: Any) -> list[str]:
    """How the state dict ``found`` differs from ``expected`` in its tensors' names, shapes and dtypes."""
    if not isinstance(found, Mapping):
        return [f"a state dict, not {type(found).__name__}"]
    problems = [f"missing tensor {name!r}" for name in expected if name not in found]
    problems += [f"unexpected tensor {name!r}" for name in found if name not in expected]
    for name, tensor in expected.items():
        if name in found and _described(found[name]) != _described(tensor):
            problems.append(f"{name!r} is {_described(found[name])}, the model's is {_described(tensor)}")
    return problems


def _described(tensor: Any) -> str:
    shape, dtype = getattr(tensor, "shape", None), getattr(tensor, "dtype", None)
    if shape is None or dtype is None:
        return f"a {type(tensor).__name__}"
    return f"{str(dtype).removeprefix('torch.')}{list(shape)}"
