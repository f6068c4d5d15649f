"""The order the suite's tests go to its workers: the modules that take longest first, dealt out among the workers.

``pytest -n N --dist worksteal`` gives each worker a contiguous Nth of the tests, in order, and a worker out of tests
takes the last half of the longest queue left. A long module near the end of a queue (a sampler killed and started
again, a page of the docs run block by block) then runs while the other workers have nothing left to take. Here the
modules, longest first by ``tests/module_seconds.json``, are dealt one by one to the share with the fewest seconds so
far, and the shares are put one after the other: each worker starts on its long modules and ends on short tests,
which the others can take. A module keeps its tests together and in order (its fixtures are set up once); a module
not in the file counts as 0 seconds; one process (no ``-n``) runs the tests in their order.

The file is written by a run of the whole suite given ``--record-module-seconds``: each module's seconds in its
setups, calls and teardowns, on this machine (what matters is the order, not the figures).

>>> deal({"a": 9.0, "b": 5.0, "c": 4.0}, {"d": 3, "c": 1, "b": 1, "a": 1}, workers=2)
['a', 'd', 'b', 'c']
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

import pytest

SECONDS = Path(__file__).parents[1] / "module_seconds.json"


def deal(seconds: Mapping[str, float], tests: Mapping[str, int], *, workers: int) -> list[str]:
    """The modules (``tests``: each module's number of tests, in the order collected) in the order that gives each
    worker its share: the modules of a second or more dealt longest first, each to the share with the fewest seconds,
    then the shorter ones to the shares with the most tests missing, so that each share is as long as the block of
    tests xdist first hands its worker."""
    sizes = []
    left = sum(tests.values())
    for share in range(workers):  # as xdist cuts the tests into the workers' first blocks
        sizes.append(left // (workers - share))
        left -= sizes[-1]
    shares: list[list[str]] = [[] for _ in range(workers)]
    totals, counts = [0.0] * workers, [0] * workers
    long = sorted((module for module in tests if seconds.get(module, 0.0) >= 1.0), key=lambda m: -seconds[m])
    for module in long:  # sorted is stable: modules of equal seconds keep their order
        least = totals.index(min(totals))
        shares[least].append(module)
        totals[least] += seconds[module]
        counts[least] += tests[module]
    for module in (module for module in tests if seconds.get(module, 0.0) < 1.0):
        emptiest = max(range(workers), key=lambda share: sizes[share] - counts[share])
        shares[emptiest].append(module)
        counts[emptiest] += tests[module]
    return [module for share in shares for module in share]


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--record-module-seconds",
        action="store_true",
        help="write each test module's seconds to tests/module_seconds.json, which orders the tests for the workers",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers < 2:
        return
    seconds = json.loads(SECONDS.read_text()) if SECONDS.exists() else {}
    by_module: dict[str, list[pytest.Item]] = defaultdict(list)
    for item in items:
        by_module[_module(item)].append(item)
    tests = {module: len(module_items) for module, module_items in by_module.items()}
    items[:] = [item for module in deal(seconds, tests, workers=workers) for item in by_module[module]]


class _Recorder:
    """In the process that reports the tests (the controller, under xdist): each module's seconds, then the file."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid.split("::")[0]] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if exitstatus == 0:
            rounded = {module: round(total, 1) for module, total in sorted(self.seconds.items())}
            SECONDS.write_text(json.dumps(rounded, indent=0) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("record_module_seconds") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Recorder(), "record-module-seconds")
