"""A trainer resumes only from what it can restore whole, and a checkpoint's index is an integer it will resume."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import jaxstow
from jaxstow import train
from jaxstow.errors import ArgumentError, CheckpointError, StructureMismatchError

torch = pytest.importorskip("torch")


class Module(train.ModuleInterface):
    def __init__(self, optimizers: int) -> None:
        self.weight = torch.nn.Parameter(torch.ones(2))
        self.count = optimizers

    def get_train_dataloader(self, sampler, batch_size):
        return range(2)

    def train_step(self, global_step, batch, device):
        loss = (self.weight**2).sum()
        loss.backward()
        for optimizer in self.optimizers:
            optimizer.step()
            optimizer.zero_grad()
        return float(loss)

    def get_optimizers_schedulers(self, estimated_global_steps_per_epoch, epochs):
        self.optimizers = [torch.optim.Adam([self.weight], lr=0.1) for _ in range(self.count)]
        return self.optimizers, []

    def get_state(self):
        return {"weight": self.weight.detach().clone()}

    def update_state(self, state):
        self.weight.data.copy_(state["weight"])


def _arguments(folder, epochs):
    checkpointing = train.DefaultCheckpointerArguments(
        save_dir=folder, model_state_save_dir=folder, load_dir=folder, log_level="ERROR"
    )
    return train.TrainerArguments(epochs=epochs, checkpointer_args=checkpointing)


def test_a_resume_with_another_number_of_optimizers_is_refused(tmp_path):
    train.Trainer(Module(1), _arguments(tmp_path, 2)).train()
    with pytest.raises(CheckpointError, match=r"holds the states of 1 optimizers but .* gave 2"):
        train.Trainer(Module(2), _arguments(tmp_path, 4))
    assert train.Trainer(Module(1), _arguments(tmp_path, 4)).last_epoch == 1


def test_a_checkpoint_without_the_trainers_state_is_refused(tmp_path):
    state = train.Checkpoint(module_interface_state={"weight": torch.ones(2)}, trainer_state={})
    jaxstow.save(tmp_path / "checkpoint_9.jxs", state)
    with pytest.raises(CheckpointError, match=r"no trainer_state\[.last_epoch.\]"):
        train.Trainer(Module(1), _arguments(tmp_path, 12))


@pytest.mark.parametrize("index", [3.0, np.float64(3), True, np.array([3])], ids=["float", "np.float64", "bool", "1-d"])
def test_an_index_that_is_not_an_integer_is_refused(tmp_path, index):
    arguments = train.DefaultCheckpointerArguments(save_dir=tmp_path, model_state_save_dir=tmp_path, load_dir=tmp_path)
    checkpointer = train.DefaultCheckpointer(arguments)
    with pytest.raises(ArgumentError, match="index must be an integer"):
        checkpointer.save(train.Checkpoint(trainer_state={"last_epoch": 3}), index)
    with pytest.raises(ArgumentError, match="index must be an integer"):
        checkpointer.save_model({"w": np.ones(1)}, index)
    assert list(tmp_path.iterdir()) == []


def test_numpy_and_jax_integer_indices_name_the_file_it_resumes(tmp_path):
    arguments = train.DefaultCheckpointerArguments(save_dir=tmp_path, model_state_save_dir=tmp_path, load_dir=tmp_path)
    checkpointer = train.DefaultCheckpointer(arguments)
    checkpointer.save(train.Checkpoint(trainer_state={"last_epoch": 1}), 1)
    checkpointer.save(train.Checkpoint(trainer_state={"last_epoch": 3}), jnp.asarray(3))
    assert train.DefaultCheckpointer(arguments).load().trainer_state == {"last_epoch": 3}
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoint_1.jxs", "checkpoint_3.jxs"]


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ({"last_epoch": "x"}, r"trainer_state\['last_epoch'\] = 'x', not an integer"),
        ({"last_epoch": 2.7}, r"trainer_state\['last_epoch'\] = 2\.7, not an integer"),
        ({"optimizers": None}, r"trainer_state\['optimizers'\] = None, not a list"),
        ({"global_step": "zz"}, r"trainer_backend_state\['global_step'\] = 'zz', not an integer"),
    ],
    ids=["string-epoch", "fractional-epoch", "no-optimizer-list", "string-step"],
)
def test_a_damaged_trainer_state_is_refused_naming_the_field(tmp_path, damage, message):
    optimizer = torch.optim.Adam([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    trainer_state = {"last_epoch": 1, "optimizers": [optimizer.state_dict()], "schedulers": []}
    backend_state = {"global_step": 2}
    for key, value in damage.items():
        (backend_state if key == "global_step" else trainer_state)[key] = value
    jaxstow.save(
        tmp_path / "checkpoint_1.jxs", train.Checkpoint({"weight": torch.ones(2)}, trainer_state, backend_state)
    )
    args = train.DefaultCheckpointerArguments(save_dir=tmp_path, model_state_save_dir=None, load_dir=tmp_path)
    with pytest.raises(CheckpointError, match=message):
        train.Trainer(Module(1), train.TrainerArguments(epochs=2, checkpointer_args=args))


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        (lambda: torch.nn.Linear(3, 1), r"'weight' is float64\[1, 3\], the model's is float32\[1, 3\]"),
        (lambda: torch.nn.Linear(3, 2).double(), r"'weight' is float64\[1, 3\], the model's is float64\[2, 3\]"),
        (lambda: torch.nn.Linear(3, 1, bias=False).double(), r"unexpected tensor 'bias'"),
    ],
)
def test_a_torch_model_resumes_only_from_tensors_of_its_own_shapes_and_dtypes(tmp_path, layer, message):
    def module(model):
        def loss_fn(model, batch):
            return model(batch).square().mean()

        data = lambda epoch: [torch.ones(4, 3, dtype=next(model.parameters()).dtype)]  # noqa: E731
        return train.TorchModule(model, torch.optim.SGD(model.parameters(), lr=0.1), loss_fn, data)

    folder = str(tmp_path)
    arguments = train.TrainerArguments(
        epochs=1,
        checkpointer_args=train.DefaultCheckpointerArguments(
            save_dir=folder, model_state_save_dir=folder, load_dir=folder
        ),
    )
    train.Trainer(module(torch.nn.Linear(3, 1).double()), arguments).train()
    other = layer()
    before = [tensor.clone() for tensor in other.state_dict().values()]
    with pytest.raises(StructureMismatchError, match=message):  # torch would cast the first silently
        train.Trainer(module(other), arguments)
    assert all(torch.equal(a, b) for a, b in zip(before, other.state_dict().values(), strict=True))


def test_a_torch_module_resumed_with_another_optimizer_is_refused_before_it_trains(tmp_path):
    # Adam's state went into SGD without a word; its first step then failed with Python's KeyError: 'momentum'.
    def module(optimizer):
        model = torch.nn.Linear(3, 1)
        return train.TorchModule(
            model, optimizer(model.parameters()), lambda m, b: m(b).square().mean(), lambda epoch: [torch.ones(4, 3)]
        )

    folder = str(tmp_path)
    arguments = train.TrainerArguments(
        epochs=1,
        checkpointer_args=train.DefaultCheckpointerArguments(
            save_dir=folder, load_dir=folder, model_state_save_dir=folder
        ),
    )
    train.Trainer(module(lambda p: torch.optim.Adam(p, lr=0.1)), arguments).train()
    with pytest.raises(
        StructureMismatchError, match=r"'optimizer': its groups have the settings \[.*'betas'.*SGD's lack"
    ):
        train.Trainer(module(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)), arguments)
    train.Trainer(module(lambda p: torch.optim.Adam(p, lr=0.1)), arguments)  # its own optimiser resumes
