"""jax_sgmc's ``scheduler`` module at the path its users import: the names of :mod:`jaxstow.io.scheduler`.

``from jaxstow import io, scheduler`` (jax_sgmc's form), ``import jaxstow.scheduler`` and
``from jaxstow.scheduler import static_information`` all give the same names.

>>> from jaxstow.scheduler import static_information
>>> from jaxstow.io import scheduler
>>> static_information is scheduler.static_information
True
"""

from jaxstow.io.scheduler import static_information

__all__ = ["static_information"]
