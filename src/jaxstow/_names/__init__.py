"""What a file may name.

The registry of functions, classes and other non-data objects (``saveable``), the known libraries and the policy of
which of their objects may be named at all, the static objects (flax nnx graph records) rebuilt from their
fields, and the rule that a structure names each of its keys, attributes and fields once. This layer imports only :mod:`jaxstow.errors` and :mod:`jaxstow._util`; it knows nothing of files.
"""
