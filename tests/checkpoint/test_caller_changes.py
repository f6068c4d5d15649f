"""What a step holds is the tree, metrics and metadata as they were at ``save``, whatever the caller changes after it
returns (the loop goes on at once) or does to what the manager's queries hand back."""

from __future__ import annotations

import numpy as np
import pytest

from jaxstow import CheckpointManager, KeepPolicy, saveable

torch = pytest.importorskip("torch")


@saveable(name="tests.caller_changes.Book")
class Book:
    """A registered plain class, saved by its attributes."""

    def __init__(self) -> None:
        self.epoch, self.history = 0, []


def test_metadata_changed_after_save_is_saved_as_it_was(tmp_path):
    metadata = {"epoch": 0, "seen": ["a"]}
    with CheckpointManager(tmp_path) as manager:
        for step in (1, 2, 3):
            manager.save(step, {"w": np.zeros(1)}, metadata=metadata)
            metadata["epoch"] += 1
            metadata["seen"].append(str(step))
        assert manager.metadata(1) == {"epoch": 0, "seen": ["a"]}
    assert CheckpointManager(tmp_path).metadata(2) == {"epoch": 1, "seen": ["a", "1"]}


def test_changing_what_the_queries_return_changes_neither_the_record_nor_the_keep_policy(tmp_path):
    with CheckpointManager(tmp_path, keep=KeepPolicy(keep_best=1, metric="loss")) as manager:
        manager.save(1, {"w": np.zeros(1)}, metrics={"loss": 0.1}, metadata={"tag": "x"})
        manager.wait()
        manager.metrics(1)["loss"] = 10.0  # a percentage to log, say
        manager.metadata(1)["tag"] = "changed"
        manager.save(2, {"w": np.zeros(1)}, metrics={"loss": 0.5})
        manager.save(3, {"w": np.zeros(1)}, metrics={"loss": 0.6})
        assert manager.metrics(1) == {"loss": 0.1}
        assert manager.metadata(1) == {"tag": "x"}
    assert CheckpointManager(tmp_path).steps() == [1, 3]


def test_a_registered_object_changed_after_save_is_saved_as_it_was(tmp_path):
    book = Book()
    with CheckpointManager(tmp_path) as manager:
        for step in (1, 2, 3):
            book.history.append(step)
            manager.save(step, {"w": np.zeros(1_000_000, np.float32), "book": book})
            book.epoch += 1
    restored = CheckpointManager(tmp_path).restore(2)["book"]
    assert (restored.epoch, restored.history) == (1, [1, 2])


def test_a_torch_tensor_changed_in_place_after_save_with_copy_is_saved_as_it_was(tmp_path):
    weight = torch.zeros(1_000_000)
    with CheckpointManager(tmp_path) as manager:
        manager.save(1, {"weight": weight}, copy=True)
        weight.add_(1.0)  # what an optimizer's step does
    np.testing.assert_array_equal(CheckpointManager(tmp_path).restore(1, as_numpy=True)["weight"], 0.0)
