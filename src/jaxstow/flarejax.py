"""FlareJax's API on jaxstow: FlareJax models saved and loaded by name, without pickle.

FlareJax's ``flr.save``, ``flr.load`` and ``flr.saveable`` are :func:`jaxstow.save` (which also takes FlareJax's
order, ``save(model, path)``), :func:`jaxstow.load` and :func:`jaxstow.saveable`. This face registers FlareJax's names
when ``jaxstow`` is imported: its public classes and functions, the objects its modules define (under the name policy
of model libraries), and its tree keys, saved by their attributes. Nothing here imports FlareJax. See docs/safety.md.

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
