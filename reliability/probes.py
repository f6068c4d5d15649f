"""The probes: each runs real faults against real files and counts what jaxstow made of them.

A trial's outcome is *detected* (a jaxstow error, or for a fault of the machine, an error raised by the save),
*harmless* (the data came back identical, or the files are as a correct run leaves them) or *lost* (wrong data, a
builtin exception, a torn file, a temporary file left behind, a load over the time or memory bound). The first few
lost trials are described in ``notes``. Every probe is called as ``probe(trials, random.Random(seed))``.

>>> import random
>>> from reliability.probes import flips_native
>>> result = flips_native(20, random.Random(0))
>>> result.trials, result.lost
(20, 0)
"""

from reliability.crashes import disk_full, killed_checkpoint_saves, killed_saves, read_only_folders, two_writers
from reliability.flips import flips_checkpoint, flips_native, flips_npz
from reliability.folders import hostile_folders
from reliability.fuzz import fuzzed_headers, odd_trees
from reliability.outcomes import Result

__all__ = [
    "Result",
    "disk_full",
    "flips_checkpoint",
    "flips_native",
    "flips_npz",
    "fuzzed_headers",
    "hostile_folders",
    "killed_checkpoint_saves",
    "killed_saves",
    "odd_trees",
    "read_only_folders",
    "two_writers",
]
