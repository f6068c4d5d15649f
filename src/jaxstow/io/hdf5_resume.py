"""Where an :class:`~jaxstow.io.HDF5Collector` puts a chain in a file that earlier runs wrote: its group reopened to
continue from the checkpoint, or made afresh where nothing a run left is lost or mixed with the new one's samples.

A chain made afresh may take the datasets of a run's chain cut short before its first checkpoint (nothing of it can
be continued), never of another run's samples, a finished run's, or a chain beside those a stopped run continues. A
chain's group is marked once its first checkpoint is committed: a file whose run stopped after that, and whose
checkpoint is gone (deleted, or left behind in a copy), is refused rather than started over, its samples lost.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from jaxstow.errors import CollectorError, StructureMismatchError
from jaxstow.io.chains import SampleLayout
from jaxstow.io.hdf5_layout import create_datasets, dataset_name, group_name, layout_problems
from jaxstow.io.hdf5_links import refuse_stored_elsewhere
from jaxstow.io.stopped_runs import StoppedRun

__all__ = ["fresh_datasets", "mark_checkpointed", "refuse_lost_checkpoint", "reopened"]

#: The attribute of a chain's group that says a checkpoint of the chain was committed.
CHECKPOINTED = "jaxstow_checkpointed"


def fresh_datasets(
    file: Any,
    chain_id: int,
    layout: SampleLayout,
    capacity: int,
    stopped: StoppedRun,
    *,
    own_file: bool,
    compression: str | None,
) -> list[Any]:
    """The datasets in ``file`` of chain ``chain_id`` of a run that starts it afresh, made (of ``capacity`` rows, with
    ``compression``), in place of those of a run cut short before its first checkpoint (reused in a file the
    collector opened itself, ``own_file``; deleted first in another); or a refusal: a file the user opened in SWMR mode
    that holds such a run is for the user to empty (mode ``"w"``), since HDF5 fails to delete a group there."""
    group = group_name(chain_id)
    if group in file:
        problems = layout_problems(file, chain_id, layout)
        if problems:
            raise StructureMismatchError(
                [*problems, "the file holds the samples of another run: use another file"], file=file.filename
            )
        if "sample_count" in file[group].attrs:
            checkpoint = f" and its checkpoint {stopped.where}" if stopped.chains else ""
            advice = f"use another file, or delete {file.filename}{checkpoint} to start over"
            waiting = stopped.waiting_after(chain_id)
            raise CollectorError(
                f"{file.filename} already holds the samples of a finished run at {group}, where this run's "
                "chain would go: a collector made anew numbers its chains from /chain~0 and continues only the "
                f"chains its checkpoint holds ({sorted(stopped.chains) or 'none'}); "
                + (advice if own_file else "open the file with mode 'w' to replace them, or use another file")
                + (f". {waiting}" if waiting else "")
            )
    stopped.refuse_new(chain_id)
    if group not in file:
        return create_datasets(file, chain_id, layout, capacity, compression)
    if CHECKPOINTED in file[group].attrs:  # not finished, and its checkpoint is gone: raises, naming every chain
        refuse_lost_checkpoint(file, stopped.where or "its checkpoint")
    if own_file:  # cut short before its first checkpoint: its rows are replaced
        return [file[dataset_name(chain_id, name)] for name in layout.names]
    if file.swmr_mode:  # HDF5 cannot delete the group, and rows left in it would stay beside this run's
        raise CollectorError(
            f"{file.filename} holds the chains of a run cut short before its first checkpoint, from {group} on, "
            "which cannot be continued: open the file with mode 'w' to start over, or use another file"
        )
    del file[group]
    return create_datasets(file, chain_id, layout, capacity, compression)


def reopened(file: Any, chain_id: int, layout: SampleLayout, sample_count: int, checkpoint: str | None) -> list[Any]:
    """The datasets of chain ``chain_id`` in ``file``, to continue from its checkpoint (at ``checkpoint``), which
    counts ``sample_count`` samples; a :class:`StructureMismatchError` if the file holds other samples there."""
    group = group_name(chain_id)
    refuse_stored_elsewhere(file, file.filename, [group])  # about to be written
    problems = layout_problems(file, chain_id, layout, sample_count) if group in file else [f"{group}: missing"]
    if problems:
        advice = (
            f"the checkpoint {checkpoint} belongs to another file or run: delete it to start the chains again"
            if group not in file
            else f"{file.filename} and its checkpoint {checkpoint} hold a run of other samples, or two different runs: "
            "continue the run with the samples it was started with and the file and checkpoint it wrote together, "
            "or move both away to start over (deleting the checkpoint alone leaves a run that cannot be continued)"
        )
        raise StructureMismatchError([*problems, advice], file=file.filename)
    if "sample_count" in file[group].attrs:  # finished, but not every chain was: the run goes on
        del file[group].attrs["sample_count"]
    return [file[dataset_name(chain_id, name)] for name in layout.names]


def mark_checkpointed(file: Any, chain_ids: Iterable[int]) -> None:
    """Mark the groups of the chains, whose first checkpoint is committed, as checkpointed; flush the file."""
    for chain_id in chain_ids:
        file[group_name(chain_id)].attrs[CHECKPOINTED] = True
    file.flush()


def refuse_lost_checkpoint(file: Any, checkpoint: str) -> None:
    """A :class:`CollectorError` if a chain of ``file`` was checkpointed but is not finished, while its checkpoint
    (at ``checkpoint``) is gone: starting over would lose its samples."""
    stopped = [f"/{key}" for key in file if _checkpointed_unfinished(file, key)]
    if stopped:
        raise CollectorError(
            f"{file.filename} holds the samples of a run that stopped before it finished ({', '.join(stopped)} "
            f"unfinished), checkpointed in {checkpoint}, which is gone: without it the run cannot be continued, and "
            f"starting over would lose its samples. Put the checkpoint back to continue the run, or move "
            f"{file.filename} away to start over, or use another file; the file is left as it is",
            file=file.filename,
        )


def _checkpointed_unfinished(file: Any, key: str) -> bool:
    """Whether ``file[key]`` is a chain's group marked as checkpointed and not finished; an object whose header a
    kill left unreadable is not (a file is flushed whole before a checkpoint is committed, and left alone after
    the last one but for rows)."""
    try:
        attributes = file[key].attrs
        return CHECKPOINTED in attributes and "sample_count" not in attributes
    except (OSError, RuntimeError, KeyError, ValueError):  # h5py's errors of a damaged object header
        return False
