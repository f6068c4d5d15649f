"""The objects of an HDF5 file that jaxstow's collectors and readers use hold their bytes in that file: no link leads
elsewhere, no dataset keeps its bytes in another file, no object has two names.

HDF5 follows soft and external links, and reads and writes a dataset's external storage (``external=``: the bytes of
any file it names) and a virtual dataset's sources, as if they were the file's own. A file a stranger made could so
have a reader take another file's bytes for samples, or a run continued in it write samples into another file.
jaxstow's writers make none of these: :func:`refuse_stored_elsewhere` refuses each one under the names jaxstow uses
(``/chain~*``, ``/draws_done``, ``/warmup``), naming it and where it leads; the rest of a file is not jaxstow's.

>>> import os, tempfile, h5py, numpy as np
>>> folder = tempfile.mkdtemp()
>>> with h5py.File(os.path.join(folder, "run.h5"), "w") as file:
...     file["chain~0/w"] = np.zeros(3)
...     file["chain~1/w"] = h5py.ExternalLink("other.h5", "/w")
...     refuse_stored_elsewhere(file, "run.h5")
Traceback (most recent call last):
jaxstow.errors.FormatError: leaf '/chain~1/w' of run.h5: is an external link to '/w' in 'other.h5': ...
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from jaxstow._util.optional import require
from jaxstow.errors import FormatError, excerpt
from jaxstow.io.hdf5_layout import DRAWS_DONE, WARMUP_GROUP

__all__ = ["refuse_stored_elsewhere"]

_NOT_OURS = "jaxstow's collectors write none, so the file was not written by one (or was changed since)"
_WHY = (
    "a reader would take what it leads to for the samples there, and a run continued in the file would write there; "
    + _NOT_OURS
)


def refuse_stored_elsewhere(file: Any, name: str, only: Collection[str] | None = None) -> None:
    """Refuse, with a :class:`~jaxstow.errors.FormatError` naming ``name`` and the object, a link other than a hard
    link, an object of several hard links (one chain's group or dataset also another's), a dataset with external
    storage and a virtual dataset among the objects jaxstow uses in the open ``file`` (``only`` those of these
    names of its root group, where given: the chains a run writes or reads).

    Walked with HDF5's own visits, each dataset opened once and none made into h5py's objects: about 0.1 ms a dataset.
    An object HDF5 fails to open (a damaged header) fails the walk with the ``OSError`` a damaged file's opening gives.
    """
    h5py = require("h5py", extra="h5py", purpose=f"reading {name}")
    root = file.id
    try:
        for key in file if only is None else [key.lstrip("/") for key in only if key in file]:
            if key.startswith("chain~") or key in (DRAWS_DONE, WARMUP_GROUP):
                _refuse_below(h5py, root, key.encode(), name)
    except FormatError:
        raise
    except (KeyError, ValueError, RuntimeError) as error:  # h5py's, for an object it cannot open: a damaged file
        raise OSError(error.args[0] if error.args else str(error)) from error  # as a damaged superblock's


def _refuse_below(h5py: Any, root: Any, key: bytes, name: str) -> None:
    """Refuse the object ``key`` of the root group ``root``, and for a group every object below it."""
    kind = root.links.get_info(key).type
    if kind != h5py.h5l.TYPE_HARD:
        _refuse_link(h5py, root, key, kind, name)
    links: list[tuple[bytes, int]] = []
    first = h5py.h5o.get_info(root, key)
    objects = [(key, first.type, first.rc)]  # each visit's info is one object h5py refills: its fields are kept
    if first.type == h5py.h5o.TYPE_GROUP:
        group = h5py.h5g.open(root, key)
        group.links.visit(lambda inner, info: links.append((key + b"/" + inner, info.type)), info=True)
        h5py.h5o.visit(group, lambda inner, info: objects.append((key + b"/" + inner, info.type, info.rc)), info=True)
    for path, kind in links:
        if kind != h5py.h5l.TYPE_HARD:
            _refuse_link(h5py, root, path, kind, name)
    for path, _, names in objects:
        if names > 1:  # one object under two names: what is written under one changes what the other holds
            also = f"is one object with {names - 1} other name(s) in the file (hard links)"
            why = f"a run continued in the file would write one's samples over the other's; {_NOT_OURS}"
            raise FormatError(f"{also}: {why}", file=name, path=_shown(path))
    for path in [path for path, kind, _ in objects if kind == h5py.h5o.TYPE_DATASET]:
        made = h5py.h5d.open(root, path).get_create_plist()
        if made.get_layout() == h5py.h5d.VIRTUAL:
            sources = sorted({_text(made.get_virtual_filename(index)) for index in range(made.get_virtual_count())})
            raise FormatError(f"is a virtual dataset of {excerpt(sources)}: {_WHY}", file=name, path=_shown(path))
        if made.get_external_count():
            files = sorted({_text(made.get_external(index)[0]) for index in range(made.get_external_count())})
            raise FormatError(
                f"keeps its bytes in {excerpt(files)} (external storage): {_WHY}", file=name, path=_shown(path)
            )


def _refuse_link(h5py: Any, root: Any, path: bytes, kind: int, name: str) -> None:
    if kind == h5py.h5l.TYPE_SOFT:
        where = f"is a link to {excerpt(_text(root.links.get_val(path)))}"
    elif kind == h5py.h5l.TYPE_EXTERNAL:
        file, inside = root.links.get_val(path)
        where = f"is an external link to {excerpt(_text(inside))} in {excerpt(_text(file))}"
    else:  # a user-defined link, which only HDF5's C API makes
        where = f"is a link of a kind h5py does not know ({kind})"
    raise FormatError(f"{where}: {_WHY}", file=name, path=_shown(path))


def _text(raw: bytes | str) -> str:
    return raw if isinstance(raw, str) else raw.decode("utf-8", "backslashreplace")


def _shown(path: bytes) -> str:
    return "/" + _text(path)
