"""Run every probe at full size and print the table (``make reliability``, or ``python -m reliability.run``).

``--scale 0.1`` runs a tenth of the trials; ``--seed`` picks other faults. The exit status is 1 if any trial was lost.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import time
import warnings

from reliability import probes

#: Each probe and its number of trials at full size.
FULL_SIZE = (
    (probes.flips_native, 1000),
    (probes.flips_npz, 1000),
    (probes.flips_checkpoint, 1000),
    (probes.fuzzed_headers, 20_000),
    (probes.hostile_folders, 1000),
    (probes.odd_trees, 2000),
    (probes.killed_saves, 100),
    (probes.killed_checkpoint_saves, 100),
    (probes.disk_full, 30),
    (probes.read_only_folders, 30),
    (probes.two_writers, 200),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the full number of trials")
    parser.add_argument("--seed", type=int, default=13)
    arguments = parser.parse_args()
    logging.getLogger("jaxstow").setLevel(logging.CRITICAL)  # taken-over locks and failed saves are expected here
    warnings.simplefilter("ignore")
    lost = 0
    print(f"{'probe':42} {'trials':>7} {'detected':>9} {'harmless':>9} {'lost':>5} {'time':>7}  notes", flush=True)
    for probe, size in FULL_SIZE:
        started = time.perf_counter()
        result = probe(max(1, round(size * arguments.scale)), random.Random(arguments.seed))
        elapsed = time.perf_counter() - started
        lost += result.lost
        notes = f"skipped: {result.skipped}" if result.skipped else "; ".join(result.notes)
        row = (
            f"{result.probe:42} {result.trials:>7} {result.detected:>9} {result.harmless:>9} {result.lost:>5} "
            f"{elapsed:>6.1f}s  {notes}"
        )
        print(row, flush=True)
    print(f"\n{'all faults detected or harmless' if lost == 0 else f'{lost} trials lost'}")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
