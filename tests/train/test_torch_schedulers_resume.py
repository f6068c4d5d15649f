"""A ``TorchModule`` whose schedulers are made in ``get_optimizers_schedulers``, PyMarlin's place for them, resumes.

torch's schedulers add settings to the optimiser's groups (``initial_lr``; OneCycleLR's ``max_lr`` and more). The
trainer loads the module's state before it asks for the schedulers, so the optimiser it loads into has none of them
yet: the resume was refused as "the state of another optimiser", and such a run could never be resumed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jaxstow import train

torch = pytest.importorskip("torch")

SCHEDULERS = {
    "StepLR": lambda optimizer: torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5),
    "OneCycleLR": lambda optimizer: torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.2, total_steps=8),
}


def _trainer(folder: Path, epochs: int, scheduler: str) -> train.Trainer:
    def loss_fn(model: Any, batch: Any) -> Any:
        x, y = batch
        return torch.nn.functional.mse_loss(model(x), y)

    def data(epoch: int) -> list[Any]:
        x = torch.randn(2, 8, 3, generator=torch.Generator().manual_seed(epoch))
        return list(zip(x, x.sum(-1, keepdim=True), strict=True))

    class Module(train.TorchModule):
        def get_optimizers_schedulers(self, estimated_global_steps_per_epoch: int, epochs: int) -> Any:
            return [], [SCHEDULERS[scheduler](self.optimizer)]

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    module = Module(model, torch.optim.AdamW(model.parameters(), lr=0.1), loss_fn, data)
    arguments = train.DefaultCheckpointerArguments(save_dir=folder, model_state_save_dir=folder, load_dir=folder)
    return train.Trainer(module, train.TrainerArguments(epochs=epochs, checkpointer_args=arguments))


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_a_run_whose_schedulers_the_module_makes_resumes_like_an_uninterrupted_one(tmp_path: Path, scheduler: str):
    uninterrupted = _trainer(tmp_path / "uninterrupted", 4, scheduler).train()
    assert sorted(_trainer(tmp_path / "resumed", 2, scheduler).train()) == [0, 1]
    resumed = _trainer(tmp_path / "resumed", 4, scheduler).train()
    assert resumed == {epoch: uninterrupted[epoch] for epoch in (2, 3)}
