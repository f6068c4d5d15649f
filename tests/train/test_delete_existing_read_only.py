"""``delete_existing_checkpoints=True`` where a folder of old checkpoints may not be changed: a
:class:`~jaxstow.errors.StorageError` naming the folder, and no file of either folder deleted. Run in a child that
obeys permission bits (:mod:`tests.support.permissions`), as root ignores them."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.permissions import run_obeying_permission_bits

_PROGRAM = """
    import sys
    from jaxstow import train
    from jaxstow.errors import StorageError
    saves, models = sys.argv[1:]
    args = train.DefaultCheckpointerArguments(
        save_dir=saves, model_state_save_dir=models, load_dir=None, delete_existing_checkpoints=True
    )
    try:
        train.DefaultCheckpointer(args)
        print("made")
    except StorageError as error:
        print("refused", error)
"""


@pytest.mark.parametrize("read_only", ["saves", "models"])
def test_a_folder_of_old_checkpoints_that_may_not_change_is_named_and_nothing_is_deleted(tmp_path, read_only):
    saves, models = tmp_path / "saves", tmp_path / "models"
    for folder, names in ((saves, ["checkpoint_0.jxs", "checkpoint_1.jxs"]), (models, ["checkpoint_model_1.jxs"])):
        folder.mkdir()
        for name in names:
            (folder / name).write_bytes(b"")
    kept = {folder: sorted(os.listdir(folder)) for folder in (saves, models)}
    (tmp_path / read_only).chmod(0o555)
    try:
        finished = run_obeying_permission_bits(sys.executable, "-c", textwrap.dedent(_PROGRAM), str(saves), str(models))
    finally:
        (tmp_path / read_only).chmod(0o755)
    folder = Path(tmp_path / read_only)
    # was: Python's PermissionError, with the files of saves deleted where only models could not change
    assert finished.stdout.strip() == (
        f"refused {folder}: cannot delete this checkpointer's old files in it: permission denied; check the "
        f"permissions of {folder}"
    ), finished.stderr
    assert {folder: sorted(os.listdir(folder)) for folder in (saves, models)} == kept
