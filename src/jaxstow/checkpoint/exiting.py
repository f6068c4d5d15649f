"""The end of a manager's ``with`` block: the save in flight finished, and whose error goes on.

A save that failed in the background raises its error when the block ends well. When the block raised an error of its
own, that error goes on, as Python's own ``with`` statements let it, and the save's failure (logged when it came) is
added to it as a note: an ``except`` around the block still catches what the block raised.

>>> from jaxstow.errors import CheckpointError
>>> def failed_save() -> None:
...     raise CheckpointError("saving step 3 failed in the background: no space left")
>>> error = KeyError("lr")
>>> close_on_exit(failed_save, error)
>>> error.__notes__
['closing the checkpoint manager also failed: saving step 3 failed in the background: no space left']
"""

from __future__ import annotations

from collections.abc import Callable

from jaxstow.errors import CheckpointError

__all__ = ["close_on_exit"]


def close_on_exit(close: Callable[[], None], error: BaseException | None) -> None:
    """Call ``close``; its CheckpointError is raised unless ``error`` (the block's) goes on, holding it as a note."""
    try:
        close()
    except CheckpointError as failure:
        if error is None:
            raise
        error.add_note(f"closing the checkpoint manager also failed: {failure}")
