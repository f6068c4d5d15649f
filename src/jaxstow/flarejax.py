"""FlareJax's API on jaxstow: FlareJax models saved and loaded by name, without pickle.

FlareJax's ``flr.save``, ``flr.load`` and ``flr.saveable`` are :func:`jaxstow.save` (which takes FlareJax's order,
``save(model, path)``, as well as its own), :func:`jaxstow.load` and :func:`jaxstow.saveable` (which takes FlareJax's
``@saveable("name")``). What this face adds is FlareJax's names, registered when ``jaxstow`` is imported: once
``flarejax`` is imported in a process, a file may name FlareJax's public classes and functions (``flarejax``,
``flarejax.net``, ``flarejax.opt``) and the objects its own modules define, under the name policy of model libraries
(no serialisation, file or debugging helper), and the keys that FlareJax modules keep in their tree structure
(``AttrLookup``, ``ItemLookup``, ``PathLookup``) are saved by their attributes. Nothing here imports FlareJax.

>>> import jaxstow
>>> jaxstow.flarejax.LIBRARY.public_namespaces
('flarejax', 'flarejax.net', 'flarejax.opt')
>>> sorted(jaxstow.flarejax.LIBRARY.attribute_classes)
['flarejax.AttrLookup', 'flarejax.ItemLookup', 'flarejax.PathLookup']
"""

from __future__ import annotations

from jaxstow._names.libraries import Library, register_library

__all__ = ["LIBRARY"]

#: FlareJax as a known library of the name registry.
LIBRARY: Library = register_library(
    "flarejax",
    public_namespaces=("flarejax", "flarejax.net", "flarejax.opt"),
    searched_inside=True,
    attribute_classes=("flarejax.AttrLookup", "flarejax.ItemLookup", "flarejax.PathLookup"),
)
