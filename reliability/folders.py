"""Hostile folders of safetensors files loaded, opened and fitted into a tree, each within bounds of time and memory.

Every case of :mod:`reliability.folder_cases` must end in a jaxstow error that names the file at fault, or in the
tensors the folder truly holds: never other data, a builtin exception, a wait beyond ``time_limit``, or memory beyond
64 MiB and eight times its largest file. Each runs in this process under a timer (``SIGALRM``, which also ends a wait on a FIFO)
and a cap on its address space. ``python -m reliability.folders`` prints the counts by kind of case.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import resource
import shutil
import signal
import stat
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

import jaxstow
from jaxstow.errors import JaxstowError
from reliability.folder_cases import CASES
from reliability.folder_model import SHAPES, Expect, write_model
from reliability.outcomes import Result

__all__ = ["KINDS", "Expired", "bounded", "by_kind", "hostile_folders"]

KINDS = ("index", "shards", "links", "special files", "sizes")
_CALLS = ("load", "load(like=)", "open")
_ADDRESS_SPACE = 4 << 30


class Expired(BaseException):
    """The timer ran out (a BaseException: no ``except Exception`` of the code under test catches it)."""


def hostile_folders(trials: int, rng: random.Random, *, time_limit: float = 5.0) -> Result:
    """Hostile folders (index, shards, links, special files, sizes): each refused naming its file, or read right."""
    total = Result("hostile folders of safetensors files")
    for result in by_kind(trials, rng, time_limit=time_limit).values():
        total.trials += result.trials
        total.detected += result.detected
        total.harmless += result.harmless
        total.lost += result.lost
        total.notes.extend(result.notes[: 5 - len(total.notes)])
    return total


def by_kind(
    trials: int, rng: random.Random, *, time_limit: float = 5.0, log: list[str] | None = None
) -> dict[str, Result]:
    """The counts of ``trials`` cases by kind, every case in turn, each load one of ``load``, ``load(like=)``, ``open``.

    ``log``, when given, receives a line for every case lost.
    """
    results = {kind: Result(kind) for kind in KINDS}
    with tempfile.TemporaryDirectory() as base:
        cache = Path(base, "cache")
        cache.mkdir()
        warm = write_model(Path(base, "warm"), random.Random(0))
        for call in _CALLS:  # jax's caches are filled once, not by a case
            _call(call, warm.folder, warm.tensors)
        tracemalloc.start()
        try:
            for trial in range(trials):
                case = CASES[trial % len(CASES)]
                root = Path(base, str(trial))
                root.mkdir()
                try:
                    folder, expect = case.build(root, rng, cache)
                    call = rng.choice(_CALLS)
                    outcome, note = _attempt(call, folder, expect, root, time_limit)
                finally:
                    shutil.rmtree(root, ignore_errors=True)
                results[case.kind].add(outcome, f"{case.name}, {call}: {note}")
                if outcome == "lost" and log is not None:
                    log.append(f"{case.kind}: {case.name}, {call}: {note}")
        finally:
            tracemalloc.stop()
    return results


def _attempt(call: str, folder: Path, expect: Expect, root: Path, time_limit: float) -> tuple[str, str]:
    bound = (64 << 20) + 8 * _largest_file(root)
    tracemalloc.reset_peak()
    started = time.perf_counter()
    try:
        with bounded(time_limit):
            value = _call(call, folder, expect.tensors)
    except Expired:
        return "lost", f"still running after {time_limit} s"
    except JaxstowError as error:
        if expect.culprit is None or expect.culprit not in str(error):
            return "lost", f"refused, without naming {expect.culprit}: {type(error).__name__}: {str(error)[:200]}"
        outcome, note = "detected", ""
    except Exception as error:
        return "lost", f"{type(error).__name__}: {str(error)[:200]}"
    else:
        if expect.tensors is None:
            return "lost", f"loaded {sorted(value)[:4]} instead of refusing"
        if not _same(value, expect.tensors):
            return "lost", "wrong data returned without an error"
        outcome, note = "harmless", ""
    elapsed, peak = time.perf_counter() - started, tracemalloc.get_traced_memory()[1]
    if elapsed > time_limit:
        return "lost", f"took {elapsed:.1f} s"
    if peak > bound:
        return "lost", f"allocated {peak >> 20} MiB (bound {bound >> 20} MiB)"
    return outcome, note


def _call(call: str, folder: Path, tensors: dict[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    """The folder's tensors by name, as ``call`` reads them."""
    if call == "load":
        return dict(jaxstow.load(folder, as_numpy=True))
    if call == "open":
        with jaxstow.open(folder) as reader:
            return {path: np.asarray(reader[path]) for path in reader.paths}
    names = list(tensors) if tensors is not None else list(SHAPES)
    like: dict[str, Any] = {}
    for name in names:
        *parents, last = name.split(".")
        node = like
        for parent in parents:
            node = node.setdefault(parent, {})
        node[last] = np.zeros(*SHAPES[name])
    return dict(zip(sorted(names), _leaves(jaxstow.load(folder, like, as_numpy=True), sorted(names)), strict=True))


def _leaves(tree: dict[str, Any], names: list[str]) -> list[np.ndarray]:
    found = []
    for name in names:
        node = tree
        for part in name.split("."):
            node = node[part]
        found.append(node)
    return found


def _same(got: dict[str, Any], want: dict[str, np.ndarray]) -> bool:
    return sorted(got) == sorted(want) and all(
        isinstance(got[name], np.ndarray)
        and got[name].dtype == array.dtype
        and got[name].shape == array.shape
        and got[name].tobytes() == array.tobytes()
        for name, array in want.items()
    )


def _largest_file(root: Path) -> int:
    sizes = [0]
    for path in root.rglob("*"):
        status = path.lstat()
        if stat.S_ISREG(status.st_mode):
            sizes.append(status.st_size)
    return max(sizes)


@contextlib.contextmanager
def bounded(seconds: float) -> Iterator[None]:
    """A timer that raises :class:`Expired`, and a cap of a few GiB more address space than the process holds now."""

    def expire(signum: int, frame: Any) -> None:
        raise Expired

    previous = signal.signal(signal.SIGALRM, expire)
    limits = resource.getrlimit(resource.RLIMIT_AS)
    held = _address_space()
    if held is not None:
        cap = held + _ADDRESS_SPACE
        resource.setrlimit(
            resource.RLIMIT_AS, (cap if limits[1] == resource.RLIM_INFINITY else min(cap, limits[1]), limits[1])
        )
    signal.setitimer(signal.ITIMER_REAL, seconds, 0.25)  # then again, should code swallow it (a gc callback does)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        resource.setrlimit(resource.RLIMIT_AS, limits)


def _address_space() -> int | None:
    """The bytes of address space this process holds (Linux), or ``None``."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=len(CASES))
    parser.add_argument("--seed", type=int, default=13)
    arguments = parser.parse_args()
    print(f"{len(CASES)} cases; jaxstow from {Path(jaxstow.__file__).parent}")
    print(f"{'kind':15} {'trials':>7} {'detected':>9} {'harmless':>9} {'lost':>5}", flush=True)
    log: list[str] = []
    for kind, result in by_kind(arguments.trials, random.Random(arguments.seed), log=log).items():
        print(f"{kind:15} {result.trials:>7} {result.detected:>9} {result.harmless:>9} {result.lost:>5}", flush=True)
    for line in log:
        print(f"lost: {line}")
    return 1 if log else 0


if __name__ == "__main__":
    sys.exit(main())
