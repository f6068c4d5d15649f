"""What importing jaxstow changes in the process that imports it: nothing.

A fresh process records what a library could change in its host (the collector, exit hooks, signal handlers,
threads, environment variables, logging, warnings filters, interpreter hooks, numpy's and jax's settings), imports
jaxstow and its public modules, and records it again. jax and ``concurrent.futures`` are imported first: the changes
they make when first imported are theirs.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = r"""
import atexit, copyreg, faulthandler, gc, json, locale, logging, os, signal, socket, sys, threading, warnings
import concurrent.futures.thread, jax, numpy as np  # the hook of concurrent.futures is the standard library's


def loggers():
    named = {"(root)": logging.root, **logging.root.manager.loggerDict}
    return {
        name: [logger.level, logger.propagate, logger.disabled, [repr(handler) for handler in logger.handlers]]
        for name, logger in named.items()
        if isinstance(logger, logging.Logger)
        and (logger.level or not logger.propagate or logger.disabled or logger.handlers or name == "(root)")
    }


def state():
    mask = os.umask(0o22)
    os.umask(mask)
    return {
        "collector": [gc.isenabled(), gc.get_threshold(), gc.get_freeze_count(), len(gc.callbacks), gc.get_debug()],
        # CPython's own counts: there is no public way to list exit hooks
        "exit hooks": [atexit._ncallbacks(), len(threading._threading_atexits)],
        "signal handlers": {signal.Signals(number).name: repr(signal.getsignal(number))
                            for number in signal.valid_signals() if number < signal.SIGRTMIN},
        "threads": sorted(thread.name for thread in threading.enumerate()),
        "environment": dict(os.environ),
        "logging": [loggers(), logging.root.manager.disable, repr(logging.getLoggerClass()),
                    repr(logging.getLogRecordFactory()), logging.raiseExceptions, logging.lastResort is not None],
        "warnings filters": [repr(entry) for entry in warnings.filters],
        "interpreter hooks": [repr(hook) for hook in (sys.excepthook, sys.unraisablehook, threading.excepthook,
                              sys.displayhook, sys.breakpointhook, sys.getprofile(), sys.gettrace())],
        "standard streams": [id(sys.stdin), id(sys.stdout), id(sys.stderr)],
        "import system": [list(sys.path), [repr(finder) for finder in sys.meta_path], len(sys.path_hooks)],
        "pickling": sorted(map(repr, copyreg.dispatch_table)),
        "interpreter settings": [sys.getrecursionlimit(), sys.getswitchinterval(), faulthandler.is_enabled(),
                                 socket.getdefaulttimeout(), locale.setlocale(locale.LC_ALL), mask, os.getcwd()],
        "numpy settings": [np.geterr(), repr(np.get_printoptions())],
        "jax config": {name: repr(value) for name, value in jax.config.values.items()},
    }


before = state()
import jaxstow, jaxstow.checkpoint, jaxstow.io, jaxstow.train  # noqa: E401
after = state()
print(json.dumps({key: [before[key], after[key]] for key in before if before[key] != after[key]}))
"""


def changes_of_importing_jaxstow() -> dict[str, list[object]]:
    """What differs in a fresh process after it imports jaxstow: ``{what: [before, after]}``."""
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    changes: dict[str, list[object]] = json.loads(done.stdout)
    return changes


@pytest.mark.skipif(sys.implementation.name != "cpython", reason="counts CPython's exit hooks")
def test_importing_jaxstow_changes_nothing_in_the_process() -> None:
    assert changes_of_importing_jaxstow() == {}
