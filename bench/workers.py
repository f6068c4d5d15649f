"""Worker processes of the multi-process benchmarks: a free coordinator port, and each worker's last JSON line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_workers(
    worker: Path, count: int, arguments: Callable[[int], list[str]], *, env: dict[str, str] | None = None
) -> list[dict]:
    """``worker *arguments(process)`` in ``count`` processes, run to their end; each one's last line of output, as
    JSON. A worker that fails ends the benchmark, with every worker's output."""
    environment = {**os.environ, **(env or {})}
    workers = [
        subprocess.Popen(
            [sys.executable, str(worker), *arguments(i)], stdout=subprocess.PIPE, text=True, env=environment
        )
        for i in range(count)
    ]
    outputs = [worker.communicate()[0] for worker in workers]
    if any(worker.returncode for worker in workers):
        raise SystemExit(f"a worker of {worker.name} failed: {outputs}")
    return [json.loads(output.strip().splitlines()[-1]) for output in outputs]
