"""The custom checkpointer of PyMarlin's checkpointing guide, run against jaxstow.

The classes below are the guide's code (its longer comments shortened), changed only in the imports and in
``jaxstow.save`` / ``jaxstow.load`` taking the place of ``torch.save`` / ``torch.load`` (whose arguments come in the
other order, and which need no ``map_location``).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import jaxstow
from jaxstow.train import AbstractCheckpointer, Checkpoint, SingleProcess, TorchModule, Trainer, TrainerArguments

if importlib.util.find_spec("torch") is None:
    pytest.skip("needs torch", allow_module_level=True)


def _module_interface() -> TorchModule:
    import torch

    def loss_fn(model: Any, batch: Any) -> Any:
        x, y = batch
        return torch.nn.functional.mse_loss(model(x), y)

    def data(epoch: int) -> list[Any]:
        x = torch.randn(2, 8, 3, generator=torch.Generator().manual_seed(epoch))
        return list(zip(x, x.sum(dim=-1, keepdim=True), strict=True))

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    return TorchModule(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), loss_fn, data)


def test_the_guides_custom_checkpointer_saves_every_fifth_epoch_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    module_interface = _module_interface()
    trainer_backend = SingleProcess()
    trainer_args = TrainerArguments(epochs=6)

    # From here to the end of the guide's example, only torch.save and torch.load are replaced.
    # Implement a dataclass for custom checkpointer arguments
    @dataclass
    class MyCheckpointerArguments:
        # Args for custom checkpointer class.
        checkpoint: bool = True
        save_dir: str = os.path.join(os.getcwd(), "checkpoints")
        model_state_save_dir: str = os.path.join(os.getcwd(), "checkpoints")
        load_dir: str = None
        load_filename: str = None
        file_prefix: str = "checkpoint"
        file_ext: str = "pt"

    # Implement AbstractCheckpointer
    class MyCheckpointer(AbstractCheckpointer):
        def __init__(self, args):
            # Initialize checkpointer by passing along args for user configurations
            # such as directory to load or save checkpoints, flags, etc.
            self.args = args

        def save(self, checkpoint_state, index, force=False):
            # Where to save the checkpoint:
            path = os.path.join(self.args.save_dir, f"{self.args.file_prefix}_{index}.{self.args.file_ext}")
            # Custom logic for when to save a checkpoint here
            # When to save the checkpoint:
            if index % 5 == 0:
                # How to save the checkpoint:
                jaxstow.save(path, checkpoint_state)

        def save_model(self, model_state, index):
            # Trainer will call this at the end of training.
            if self.args.checkpoint and self.args.model_state_save_dir:
                path = os.path.join(
                    self.args.model_state_save_dir, f"{self.args.file_prefix}_model_{index}.{self.args.file_ext}"
                )
                jaxstow.save(path, model_state)

        def load(self):
            # Implements logic to load a checkpointed file. Always called
            # upon initialization of Trainer.
            if self.args.load_dir and self.args.load_filename:
                path = os.path.join(self.args.load_dir, self.args.load_filename)
                return jaxstow.load(path)
            else:
                self.logger.warning("No checkpointer loaded, check load_fir and load_filename are set.")
                return Checkpoint()

    # Create instance of custom checkpointer
    my_args = MyCheckpointerArguments()
    my_checkpointer = MyCheckpointer(my_args)

    # Pass along custom checkpointer to Trainer
    trainer = Trainer(
        module=module_interface, trainer_backend=trainer_backend, args=trainer_args, checkpointer=my_checkpointer
    )
    # End of the guide's example.

    assert sorted(trainer.train()) == [0, 1, 2, 3, 4, 5]
    folder = tmp_path / "checkpoints"
    assert sorted(os.listdir(folder)) == ["checkpoint_0.pt", "checkpoint_5.pt", "checkpoint_model_5.pt"]
    assert (folder / "checkpoint_5.pt").read_bytes()[8:9] == b"{"  # a safetensors header, not a pickle

    resumed_args = MyCheckpointerArguments(load_dir=str(folder), load_filename="checkpoint_5.pt")
    resumed = Trainer(_module_interface(), TrainerArguments(epochs=8), checkpointer=MyCheckpointer(resumed_args))
    assert resumed.last_epoch == 5
    for name, tensor in resumed.module.model.state_dict().items():
        np.testing.assert_array_equal(tensor.numpy(), trainer.module.model.state_dict()[name].numpy())
    assert sorted(resumed.train()) == [6, 7]


def test_the_guides_trainer_get_state_that_adds_its_arguments_saves_and_resumes(tmp_path: Path) -> None:
    from jaxstow.train import DefaultCheckpointer, DefaultCheckpointerArguments

    class MyTrainer(Trainer):  # the guide's example of Trainer.get_state
        def __init__(self, module, args, trainer_backend, checkpointer):
            super().__init__(module, args, trainer_backend, checkpointer)

        def get_state(self) -> dict:
            state_dict = {
                "last_epoch": self.last_epoch,
                "optimizers": [optimizer.state_dict() for optimizer in self.optimizers],
                "schedulers": [scheduler.state_dict() for scheduler in self.schedulers],
                "args": self.args,  # Adding something else we want to save
            }
            return state_dict

    folder = str(tmp_path)
    checkpoints = DefaultCheckpointerArguments(save_dir=folder, model_state_save_dir=folder, load_dir=folder)
    args = TrainerArguments(epochs=2, checkpointer_args=checkpoints)
    MyTrainer(_module_interface(), args, SingleProcess(), DefaultCheckpointer(checkpoints)).train()
    assert jaxstow.load(tmp_path / "checkpoint_1.jxs").trainer_state["args"] == args
    resumed = MyTrainer(
        _module_interface(), TrainerArguments(epochs=3), SingleProcess(), DefaultCheckpointer(checkpoints)
    )
    assert resumed.last_epoch == 1
