"""The writer's lock on a real S3 server (SeaweedFS on the loopback interface): writers that take over a dead holder's
lock at the same moment end with one of them holding it, the others refused, every round; and what the server refuses
while the lock is taken is a :class:`StorageError` naming the lock object, never a bare ``OSError``."""

from __future__ import annotations

import contextlib
import http.client
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from faulty_proxy import ProxyHandler, QuietServer

from jaxstow._storage.lock import LOCK_NAME, Holder, RemoteLock
from jaxstow._storage.remote_store import RemoteStore
from jaxstow._storage.settings import StorageSettings
from jaxstow.errors import CheckpointError, StorageError

_ROUNDS = 12
_WRITERS = 3


def _dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout)


def _store(url: str, options: dict) -> RemoteStore:
    return RemoteStore(url, marker="done.json", settings=StorageSettings(options=options))


def _race(url: str, options: dict) -> tuple[list[RemoteLock], list[CheckpointError]]:
    """:data:`_WRITERS` threads taking the lock of ``url`` at once: the locks they got, and their refusals."""
    start = threading.Barrier(_WRITERS)
    won: list[RemoteLock] = []
    refused: list[CheckpointError] = []

    def writer() -> None:
        start.wait()
        try:
            won.append(RemoteLock(_store(url, options)))
        except CheckpointError as error:
            refused.append(error)

    threads = [threading.Thread(target=writer) for _ in range(_WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return won, refused


def test_writers_taking_over_a_dead_holders_lock_at_once_leave_one_holder(s3_server, monkeypatch):
    dead = Holder(_dead_pid(), socket.gethostname(), "2024-01-01T00:00:00+00:00", "0" * 16)
    is_gone = Holder.is_gone

    def slowly_gone(holder: Holder) -> bool:  # every writer reads the dead holder before any writes: the race, always
        time.sleep(0.3)
        return is_gone(holder)

    monkeypatch.setattr(Holder, "is_gone", slowly_gone)
    for round_ in range(_ROUNDS):
        url = s3_server.url(f"lock-race-{uuid.uuid4().hex[:8]}", f"round{round_}")
        store = _store(url, s3_server.storage_options)
        store.ensure()
        store.fs.pipe_file(store.path(LOCK_NAME), dead.to_json())
        won, refused = _race(url, s3_server.storage_options)
        assert len(won) == 1, f"round {round_}: {len(won)} writers hold the lock"
        assert len(refused) == _WRITERS - 1
        store.fs.invalidate_cache(store.path(LOCK_NAME))
        assert Holder.parse(store.fs.cat_file(store.path(LOCK_NAME))) == won[0]._holder
        won[0].release()
        assert not store.fs.exists(store.path(LOCK_NAME))


@contextlib.contextmanager
def _refusing_lock_puts(upstream: str) -> Iterator[str]:
    """A proxy to ``upstream`` that answers ``400 Bad Request`` to every PUT of a lock object."""
    parts = urlsplit(upstream)

    class Handler(ProxyHandler):
        def forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            if self.command == "PUT" and re.search(re.escape(LOCK_NAME), self.path):
                refusal = b"<Error><Code>InvalidRequest</Code><Message>Bad Request</Message></Error>"
                self.send_response(400, "Bad Request")
                self.send_header("Content-Length", str(len(refusal)))
                self.end_headers()
                self.wfile.write(refusal)
                return
            headers = {name: value for name, value in self.headers.items() if name.lower() != "expect"}
            connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=60)
            connection.request(self.command, self.path, body=body, headers=headers)
            answer = connection.getresponse()
            data = answer.read()
            self.send_response(answer.status, answer.reason)
            for name, value in answer.getheaders():
                if name.lower() not in {"connection", "keep-alive", "transfer-encoding", "content-length"}:
                    self.send_header(name, value)
            self.send_header("Content-Length", answer.getheader("Content-Length") or "0")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            connection.close()

        do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = forward

    server = QuietServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("stale", [False, True])
def test_a_lock_the_server_refuses_to_write_is_a_storage_error_naming_it(s3_server, stale):
    url = s3_server.url(f"lock-refused-{uuid.uuid4().hex[:8]}", "run")
    store = _store(url, s3_server.storage_options)
    store.ensure()
    if stale:
        dead = Holder(_dead_pid(), socket.gethostname(), "2024-01-01T00:00:00+00:00", "0" * 16)
        store.fs.pipe_file(store.path(LOCK_NAME), dead.to_json())
    with _refusing_lock_puts(s3_server.endpoint) as endpoint:
        options = {
            **s3_server.storage_options,
            "client_kwargs": {"endpoint_url": endpoint},
            "skip_instance_cache": True,
        }
        with pytest.raises(StorageError) as raised:
            RemoteLock(_store(url, options))
    assert raised.value.file == store.url(LOCK_NAME)
