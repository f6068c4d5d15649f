"""The version of jaxstow, in one place (``jaxstow.__version__``, the files' records, ``jaxstow --version``)."""

__version__ = "0.1.0"
