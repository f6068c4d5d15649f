"""Helpers that know nothing of files or trees.

Pausing the garbage collector, work handed to pools of threads, progress bars, optional packages, moved names, and
every use of jax beyond its public API (``jax_compat``). They import nothing of jaxstow but :mod:`jaxstow.errors`.
"""
