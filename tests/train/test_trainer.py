"""Trainer: when it calls its checkpointer, what it restores, and what it refuses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from jaxstow.train import (
    AbstractCheckpointer,
    Checkpoint,
    DefaultCheckpointer,
    DefaultCheckpointerArguments,
    ModuleInterface,
    SingleProcess,
    Trainer,
    TrainerArguments,
)

NO_OPTIMIZERS = {"optimizers": [], "schedulers": []}


class Counter(ModuleInterface):
    """A module interface without arrays: counts its steps; the loss of a step is the count after it."""

    def __init__(self, count: int = 0, batches: int = 2) -> None:
        self.count, self.batches = count, batches

    def get_train_dataloader(self, sampler: Any, batch_size: int) -> range:
        return range(self.batches)

    def train_step(self, global_step: int, batch: int, device: Any) -> float:
        self.count += 1
        return float(self.count)

    def get_state(self) -> dict[str, int]:
        return {"count": self.count}

    def update_state(self, state: dict[str, int]) -> None:
        self.count = state["count"]


class Recorder(AbstractCheckpointer):
    """Records every call the trainer makes and resumes from a given checkpoint."""

    def __init__(self, resume: Any = None) -> None:
        self.resume = Checkpoint() if resume is None else resume
        self.calls: list[tuple[Any, ...]] = []

    def save(self, checkpoint_state: Checkpoint, index: int, force: bool = False) -> None:
        assert checkpoint_state.trainer_state == {"last_epoch": index, **NO_OPTIMIZERS}
        self.calls.append(("save", index, force, checkpoint_state.module_interface_state["count"]))

    def save_model(self, model_state: Any, index: int) -> None:
        self.calls.append(("save_model", index, model_state["count"]))

    def load(self) -> Any:
        self.calls.append(("load",))
        return self.resume


def test_train_saves_after_every_epoch_then_forces_a_save_and_saves_the_model() -> None:
    recorder = Recorder()
    trainer = Trainer(Counter(), TrainerArguments(epochs=3), checkpointer=recorder)
    assert recorder.calls == [("load",)]
    assert trainer.train() == {0: [[1.0, 2.0]], 1: [[3.0, 4.0]], 2: [[5.0, 6.0]]}
    assert recorder.calls[1:] == [
        ("save", 0, False, 2),
        ("save", 1, False, 4),
        ("save", 2, False, 6),
        ("save", 2, True, 6),
        ("save_model", 2, 6),
    ]


def test_construction_restores_the_module_the_trainer_and_the_backend() -> None:
    resume = Checkpoint({"count": 7}, {"last_epoch": 2}, {"global_step": 6})
    recorder = Recorder(resume)
    trainer = Trainer(Counter(), TrainerArguments(epochs=5), checkpointer=recorder)
    assert (trainer.module.count, trainer.last_epoch, trainer.trainer_backend.get_state()) == (7, 2, {"global_step": 6})
    assert trainer.train() == {3: [[8.0, 9.0]], 4: [[10.0, 11.0]]}
    assert recorder.calls[1:] == [
        ("save", 3, False, 9),
        ("save", 4, False, 11),
        ("save", 4, True, 11),
        ("save_model", 4, 11),
    ]
    assert trainer.trainer_backend.get_state() == {"global_step": 10}


def test_states_a_checkpoint_does_not_hold_are_left_alone() -> None:
    trainer = Trainer(Counter(count=100), TrainerArguments(epochs=2), checkpointer=Recorder(Checkpoint()))
    assert (trainer.module.count, trainer.last_epoch, trainer.trainer_backend.get_state()) == (
        100,
        -1,
        {"global_step": 0},
    )


def test_a_finished_run_trains_and_saves_nothing() -> None:
    recorder = Recorder(Checkpoint(trainer_state={"last_epoch": 4}))
    assert Trainer(Counter(), TrainerArguments(epochs=5), checkpointer=recorder).train() == {}
    assert recorder.calls == [("load",)]


def test_a_checkpointer_must_load_a_checkpoint() -> None:
    with pytest.raises(
        TypeError, match=r"Recorder\.load\(\) returned a dict; it must return a jaxstow\.train\.Checkpoint"
    ):
        Trainer(Counter(), checkpointer=Recorder({"last_epoch": 3}))


def test_arguments_in_another_order_than_pymarlins_are_refused_naming_the_order() -> None:
    from jaxstow.errors import ArgumentError

    with pytest.raises(ArgumentError, match=r"args must be a jaxstow\.train\.TrainerArguments, not SingleProcess"):
        Trainer(Counter(), SingleProcess(), TrainerArguments(epochs=1), Recorder())  # type: ignore[arg-type]
    trainer = Trainer(
        Counter(), trainer_backend=SingleProcess(), args=TrainerArguments(epochs=1), checkpointer=Recorder()
    )
    assert trainer.args.epochs == 1


def test_an_epoch_without_batches_is_an_error() -> None:
    trainer = Trainer(Counter(batches=0), TrainerArguments(epochs=1), checkpointer=Recorder())
    with pytest.raises(ValueError, match=r"the train data loader of Counter gave no batches"):
        trainer.train()


def test_a_subclass_keeps_more_state_through_the_default_checkpointer(tmp_path: Path) -> None:
    class MyTrainer(Trainer):
        """The guide's pattern: a trainer that keeps its arguments' epochs in its state."""

        def __init__(self, module: Any, args: Any, trainer_backend: Any, checkpointer: Any) -> None:
            self.planned_before: int | None = None
            super().__init__(module, args, trainer_backend, checkpointer)

        def get_state(self) -> dict[str, Any]:
            return {**super().get_state(), "epochs": self.args.epochs}

        def update_state(self, state: dict[str, Any]) -> None:
            super().update_state(state)
            self.planned_before = state["epochs"]

    def arguments(epochs: int) -> TrainerArguments:
        checkpoints = DefaultCheckpointerArguments(save_dir=tmp_path, model_state_save_dir=None, load_dir=tmp_path)
        return TrainerArguments(epochs=epochs, checkpointer_args=checkpoints)

    first = MyTrainer(Counter(), arguments(epochs=2), SingleProcess(), None)
    assert isinstance(first.checkpointer, DefaultCheckpointer)
    first.train()
    assert sorted(os.listdir(tmp_path)) == ["checkpoint_0.jxs", "checkpoint_1.jxs"]
    resumed = MyTrainer(Counter(), arguments(epochs=3), SingleProcess(), None)
    assert (resumed.last_epoch, resumed.planned_before, resumed.module.count) == (1, 2, 4)


def test_importing_jaxstow_train_imports_no_optional_framework() -> None:
    code = "import sys, jaxstow.train; print(sorted({'equinox', 'optax', 'torch'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"


class Validated(Counter):
    """A counter with two validation sets, recording every callback it hears."""

    def __init__(self) -> None:
        super().__init__(batches=4)
        self.heard: list[tuple[Any, ...]] = []

    def get_val_dataloaders(self, sampler: Any, batch_size: int) -> dict[str, list[int]]:
        return {"small": [batch_size], "large": [10 * batch_size, 20 * batch_size]}

    def val_step(self, global_step: int, batch: int, device: Any) -> tuple[int, int]:
        return global_step, batch

    def on_begin_train_epoch(self, global_step: Any, epoch: int) -> None:
        self.heard.append(("begin", global_step, epoch))

    def on_end_train_step(self, global_step: Any, *outputs: Any) -> None:
        self.heard.append(("step", global_step, *outputs))

    def on_end_val_epoch(self, global_step: Any, *outputs: Any, key: str = "default") -> None:
        self.heard.append(("val", key, *outputs))

    def on_end_train_epoch(self, global_step: Any, *outputs: Any) -> None:
        self.heard.append(("epoch", global_step, *outputs))

    def on_end_train(self, global_step: Any) -> None:
        self.heard.append(("end", global_step))


def test_gradient_accumulation_validation_and_callbacks_in_order() -> None:
    module = Validated()
    args = TrainerArguments(epochs=1, train_batch_size=4, gpu_batch_size_limit=2, val_batch_size=3)
    trainer = Trainer(module, args, checkpointer=Recorder())
    assert (trainer.train_step_batch_size, trainer.gradient_accumulation, trainer.estimated_global_steps_per_epoch) == (
        2,
        2,
        3,
    )
    assert trainer.train() == {0: [[1.0, 2.0, 3.0, 4.0]]}
    assert module.heard == [
        ("begin", 0, 0),
        ("step", 1, [1.0, 2.0]),
        ("step", 2, [3.0, 4.0]),
        ("val", "small", [2], [3]),
        ("val", "large", [2, 2], [30, 60]),
        ("epoch", 2, [1.0, 2.0, 3.0, 4.0]),
        ("end", 2),
    ]
    assert trainer.trainer_backend.get_state() == {"global_step": 2}


@pytest.mark.parametrize("kind", ["StepLR", "MultiStepLR"])  # MultiStepLR's state holds a collections.Counter
def test_optimizers_and_schedulers_of_the_module_are_checkpointed_by_the_trainer(tmp_path: Path, kind: str) -> None:
    torch = pytest.importorskip("torch")

    class Regression(ModuleInterface):
        """A PyMarlin-style module: its state is the model's, its optimiser and scheduler are the trainer's to keep."""

        def __init__(self) -> None:
            torch.manual_seed(0)
            self.model = torch.nn.Linear(2, 1)
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)

        def get_optimizers_schedulers(self, estimated_global_steps_per_epoch: int, epochs: int) -> Any:
            steps = estimated_global_steps_per_epoch
            scheduler = (
                torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=steps)
                if kind == "StepLR"
                else torch.optim.lr_scheduler.MultiStepLR(self.optimizer, milestones=[steps, 2 * steps])
            )
            self.scheduler = scheduler
            return [self.optimizer], [scheduler]

        def get_train_dataloader(self, sampler: Any, batch_size: int) -> list[Any]:
            x = torch.arange(6.0).reshape(3, 1, 2)
            return list(zip(x, x.sum(dim=-1, keepdim=True), strict=True))

        def train_step(self, global_step: int, batch: Any, device: Any) -> float:
            x, y = batch
            self.optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(self.model(x), y)
            loss.backward()
            self.optimizer.step()
            self.scheduler.step()
            return loss.item()

        def get_state(self) -> Any:
            return self.model.state_dict()

        def update_state(self, state: Any) -> None:
            self.model.load_state_dict(state)

    def arguments(epochs: int) -> TrainerArguments:
        checkpoints = DefaultCheckpointerArguments(save_dir=tmp_path, model_state_save_dir=None, load_dir=tmp_path)
        return TrainerArguments(epochs=epochs, checkpointer_args=checkpoints)

    first = Trainer(Regression(), arguments(epochs=2))
    assert first.estimated_global_steps_per_epoch == 4
    first.train()
    resumed = Trainer(Regression(), arguments(epochs=3))
    assert resumed.last_epoch == 1
    assert resumed.schedulers[0].state_dict() == first.schedulers[0].state_dict()
    momentum = resumed.optimizers[0].state_dict()["state"][0]["momentum_buffer"]
    assert torch.equal(momentum, first.optimizers[0].state_dict()["state"][0]["momentum_buffer"])
    nothing_kept = DefaultCheckpointerArguments(checkpoint=False, load_dir=None)
    uninterrupted = Trainer(Regression(), TrainerArguments(epochs=3, checkpointer_args=nothing_kept))
    uninterrupted.train()
    resumed.train()
    for name, tensor in uninterrupted.module.get_state().items():
        assert torch.equal(resumed.module.get_state()[name], tensor)


def test_only_the_main_process_saves(tmp_path: Path) -> None:
    recorder = Recorder()
    args = TrainerArguments(epochs=2)
    args.distributed_training_args.global_rank = 1
    Trainer(Counter(), args, checkpointer=recorder).train()
    assert recorder.calls == [("load",)]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"train_batch_size": 1, "world_size": 2}, r"share of train_batch_size \(0\)"),
        ({"gpu_batch_size_limit": 0}, r"gpu_batch_size_limit must be an integer of at least 1, not 0"),
        ({"world_size": 0}, r"world_size must be an integer of at least 1, not 0"),  # was a ZeroDivisionError
        ({"epochs": "3"}, r"epochs must be an integer of at least 0, not '3'"),  # was a TypeError
        ({"epochs": 2.5}, r"epochs must be an integer of at least 0, not 2\.5"),
    ],
)
def test_batch_sizes_that_cannot_work_are_refused(overrides: dict[str, object], message: str) -> None:
    args = TrainerArguments(epochs=1)
    args.distributed_training_args.world_size = overrides.pop("world_size", 1)
    for name, value in overrides.items():
        setattr(args, name, value)
    with pytest.raises(ValueError, match=message):
        Trainer(Counter(), args, checkpointer=Recorder())
