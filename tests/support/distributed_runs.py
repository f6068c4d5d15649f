"""Runs of real ``jax.distributed`` processes on the loopback interface: start a worker script in each, read reports.
The processes are forked from a server that has imported jax and jaxstow (``forked.py``), without initializing a
backend: each worker sets its device count, starts its backend and joins the run itself."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import forked


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def launch(
    worker: Path, count: int, arguments: Callable[[int, int], list[str]], *, env: dict[str, str] | None = None
) -> list[subprocess.Popen[str]]:
    """``worker *arguments(process, port)`` in ``count`` processes that share one free coordinator port, without
    the caller's ``XLA_FLAGS`` (each worker sets its own device count), with ``env`` added."""
    port = free_port()
    environment = {key: value for key, value in os.environ.items() if key != "XLA_FLAGS"} | (env or {})
    return [
        forked.Popen(
            [sys.executable, str(worker), *arguments(index, port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environment,
        )
        for index in range(count)
    ]


def start(
    worker: Path, action: str, count: int, devices: int, folder: Path | str, *extra: str
) -> list[subprocess.Popen[str]]:
    """``worker ACTION PROCESS COUNT DEVICES PORT FOLDER *extra`` in ``count`` processes, one coordinator port."""
    return launch(
        worker,
        count,
        lambda index, port: [action, str(index), str(count), str(devices), str(port), str(folder), *extra],
    )


def reports(processes: list[subprocess.Popen[str]], *, timeout: float = 240) -> list[dict]:
    """The last JSON line each process printed; every process must end well."""
    found = []
    for process in processes:
        out, err = process.communicate(timeout=timeout)
        assert process.returncode == 0, f"process failed ({process.returncode}):\n{out}\n{err[-3000:]}"
        found.append(json.loads(out.strip().splitlines()[-1]))
    return found
