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
    SingleProcess,
    Trainer,
    TrainerArguments,
)


class Counter:
    """A module interface without arrays: counts its steps; the loss of a step is the count after it."""

    def __init__(self, count: int = 0, batches: int = 2) -> None:
        self.count, self.batches = count, batches

    def train_data(self, epoch: int) -> range:
        return range(self.batches)

    def train_step(self, batch: int) -> float:
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
        assert checkpoint_state.trainer_state == {"last_epoch": index}
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
    assert trainer.train() == {0: 1.5, 1: 3.5, 2: 5.5}
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
    assert trainer.train() == {3: 8.5, 4: 10.5}
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


def test_an_epoch_without_batches_is_an_error() -> None:
    trainer = Trainer(Counter(batches=0), TrainerArguments(epochs=1), checkpointer=Recorder())
    with pytest.raises(ValueError, match=r"Counter\.train_data\(0\) gave no batches"):
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
