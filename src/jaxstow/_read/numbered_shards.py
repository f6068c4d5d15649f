"""The numbered shards of a Hugging Face folder (``model-00002-of-00003.safetensors``): a series whose files are not
all there, or not all named by the folder's index, is refused, since a load would leave out the tensors of the files
it lacks or passes over.

>>> from jaxstow._read.numbered_shards import refuse_unnamed_shards
>>> named = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
>>> refuse_unnamed_shards("hf", "model.safetensors.index.json", named, [*named, "consolidated.safetensors"])
>>> try:
...     refuse_unnamed_shards("hf", "model.safetensors.index.json", named[:1], named)
... except Exception as error:
...     print(error)  # doctest: +ELLIPSIS
hf/model.safetensors.index.json: names model-00001-of-00002.safetensors, but not model-00002-of-00002.safetensors...
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from jaxstow._read.folder_members import child
from jaxstow.errors import FormatError, PathNotFoundError

__all__ = ["refuse_missing_shards", "refuse_unnamed_shards"]

#: A shard's name that says how many shards its model has (``model-00002-of-00003.safetensors``).
_NUMBERED = re.compile(r"(?P<stem>.*)-(?P<number>\d+)-of-(?P<count>\d+)\.safetensors")


def refuse_missing_shards(folder: str, files: Sequence[str]) -> None:
    """Refuse a folder without an index whose numbered shards (``-00002-of-00003``) are not all there, which an
    interrupted copy, download or export leaves: it would load without the tensors of the shards it lacks."""
    present = set(files)
    for name in files:
        found = _NUMBERED.fullmatch(name)
        if found is None:
            continue
        stem, width, count = found["stem"], len(found["number"]), found["count"]
        numbers = range(1, min(int(count), len(files) + 1) + 1)  # past what the folder holds, one is surely missing
        missing = next(
            (shard for i in numbers if (shard := f"{stem}-{i:0{width}d}-of-{count}.safetensors") not in present), None
        )
        if missing is not None:
            raise PathNotFoundError(
                f"is missing: the folder holds no index and shards named {stem}-*-of-{count}.safetensors, but not "
                f"all {int(count)} of them, as an interrupted copy, download or export leaves it; fetch the missing "
                "shards, or export the model again",
                file=child(folder, missing),
            )


def refuse_unnamed_shards(folder: str, index: str, named: Sequence[str], present: Sequence[str]) -> None:
    """Refuse an index that names numbered shards of a series but not one of the series that the folder holds (an
    index edited, or cut short): every load would pass over that file and leave its tensors out."""
    series: dict[tuple[str, str], str] = {}  # a shard the index names, by its series
    for name in named:
        if (found := _NUMBERED.fullmatch(name)) is not None:
            series.setdefault((found["stem"], found["count"]), name)
    named_set = set(named)
    for name in sorted(present):
        found = _NUMBERED.fullmatch(name)
        if found is None or name in named_set or (found["stem"], found["count"]) not in series:
            continue
        raise FormatError(
            f"names {series[found['stem'], found['count']]}, but not {name}, which the folder holds: every load would leave its tensors out. Fetch "
            f"the model's {index} again, or move {name} away if it is no part of the model",
            file=child(folder, index),
        )
