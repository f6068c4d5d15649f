"""The names of a checkpointer's files: ``{prefix}_{index}.{ext}`` for checkpoints, ``{prefix}_model_{index}.{ext}``
for model files, and finding them again in a folder.

A name matches exactly or not at all: another prefix, another extension, a model file among checkpoints or a
temporary file of a save in progress is never taken for one of this checkpointer's files. Its index is written as the
checkpointer writes it, in ASCII digits without padding: ``run_02.pt`` next to ``run_2.pt``, or ``run_\u0661\u0660.pt``
(Arabic-Indic digits), is no file of this checkpointer, whatever order the folder lists its files in. A prefix ending
in ``_model`` is refused: ``run_model_3.pt`` would be its checkpoint 3 and the model file 3 of the prefix ``run``.

>>> import os, tempfile
>>> from jaxstow.train.files import FileNames
>>> names = FileNames(prefix="run", ext="pt")
>>> names.checkpoint(12), names.model(12)
('run_12.pt', 'run_model_12.pt')
>>> folder = tempfile.mkdtemp()
>>> for name in ["run_2.pt", "run_10.pt", "run_model_11.pt", "run_9.xpt", "run_3.pt.bak", "other_7.pt", "run_010.pt"]:
...     open(os.path.join(folder, name), "wb").close()
>>> sorted(names.find(folder))
[2, 10]
>>> sorted(names.find(folder, model=True))
[11]
>>> FileNames(prefix="run_model", ext="pt")
Traceback (most recent call last):
...
jaxstow.errors.ArgumentError: file_prefix 'run_model' ends in '_model', so its checkpoints (run_model_<index>.pt) are ...
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re

from jaxstow.errors import ArgumentError

__all__ = ["FileNames"]

_MODEL = "_model"
logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class FileNames:
    """How a checkpointer names its files, given its ``prefix`` and its extension ``ext`` (without the dot)."""

    prefix: str
    ext: str

    def __post_init__(self) -> None:
        """Refuse a prefix ending in ``_model``, whose checkpoints are named as another prefix's model files."""
        base = self.prefix[: -len(_MODEL)]
        if base and self.prefix.lower().endswith(_MODEL):  # any case: a folder may not tell the cases apart
            raise ArgumentError(
                f"file_prefix {self.prefix!r} ends in {_MODEL!r}, so its checkpoints ({self.checkpoint_pattern}) are "
                f"named as the model files of the prefix {base!r} ({base}_model_<index>.{self.ext}): either "
                "checkpointer would load, list, replace or delete the other's files in a folder they share. Choose a "
                f"prefix that does not end in {_MODEL!r}, such as {base + '-model'!r} (rename the files saved with "
                f"{self.prefix!r} to resume from them: {self.checkpoint(3)} to {base}-model_3.{self.ext})"
            )

    def checkpoint(self, index: int) -> str:
        """The name of the checkpoint saved under ``index``."""
        return f"{self.prefix}_{index}.{self.ext}"

    def model(self, index: int) -> str:
        """The name of the model file saved under ``index``."""
        return f"{self.prefix}_model_{index}.{self.ext}"

    @property
    def checkpoint_pattern(self) -> str:
        """The checkpoints' names, for messages: ``{prefix}_<index>.{ext}``."""
        return f"{self.prefix}_<index>.{self.ext}"

    def _pattern(self, *, model: bool) -> re.Pattern[str]:
        infix = "_model" if model else ""
        return re.compile(rf"{re.escape(self.prefix)}{infix}_(-?[0-9]+){re.escape('.' + self.ext)}")

    def find(self, folder: str | os.PathLike[str], *, model: bool = False) -> dict[int, str]:
        """The checkpoints (or model files) in ``folder``, as ``{index: path}``; empty if the folder does not exist.

        Only names this checkpointer writes count, so that each index has one file at most; one of them that is no
        file (a broken link, a folder) is left out with a warning.
        """
        if not os.path.isdir(folder):
            return {}
        pattern = self._pattern(model=model)
        written = self.model if model else self.checkpoint
        found = {}
        for entry in os.scandir(folder):
            match = pattern.fullmatch(entry.name)
            if match is None or written(int(match.group(1))) != entry.name:
                continue
            if entry.is_file():
                found[int(match.group(1))] = entry.path
            else:  # a link to nothing, a folder: never resumed from, and never silently passed over
                logger.warning(
                    "%s is named as a checkpointer's file but is no file (a broken link?): left out", entry.path
                )
        return found
