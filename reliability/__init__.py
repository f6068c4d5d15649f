"""jaxstow's reliability suite: files attacked and machines crashing, counted.

Each probe in :mod:`reliability.probes` runs a number of trials and reports how many faults were detected (a
jaxstow error), how many were harmless (the data came back identical, or the operation succeeded as it should) and
how many were lost (wrong data, a builtin exception, a torn file, a temporary file left behind). ``make reliability``
runs them all at full size (``python -m reliability.run``); ``tests/package/test_reliability.py`` runs a small slice of each.
"""
