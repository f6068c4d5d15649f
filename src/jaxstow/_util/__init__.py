"""Helpers that know nothing of files or trees: pausing the garbage collector, progress bars, optional packages,
moved names. They import nothing of jaxstow but :mod:`jaxstow.errors`."""
