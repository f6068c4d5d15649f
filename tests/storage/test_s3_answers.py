"""Answers to ranged GETs that are not the bytes asked for, from a real S3 server (SeaweedFS on the loopback
interface) behind a proxy written here: one that drops ``Range`` (a ``200`` with the whole object) and one that cuts
a ``206`` in half (its ``Content-Length`` halved, its ``Content-Range`` as the server sent it). Reads get the right
bytes or a :class:`StorageError`, never other bytes, and a cut answer is never taken for a damaged file."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import numpy as np
import pytest
from rewriting_proxy import Headers, RewritingProxy, running

import jaxstow
from jaxstow import CheckpointManager
from jaxstow.errors import FormatError, StorageError

_QUICK = jaxstow.Transfer(attempts=3, backoff=0.0)


class RangeProxy(RewritingProxy):
    """Forwards to ``upstream``; ranged GETs of paths matching ``paths`` are answered as ``mode`` says.

    ``"ignore"``: the ``Range`` of a GET that does not start at 0 is dropped (the whole object, ``200``);
    ``"halve"``: a ``206`` is sent with only the first half of its body, and a ``Content-Length`` that says so;
    ``"end"``: the same, and a ``Content-Range`` that says the object ends there, for GETs after the first (which
    tells the object's size).
    """

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.mode: str | None = None
        self.paths = ""
        self.hits = 0

    def _mode(self, command: str, path: str, asked: dict[str, str]) -> tuple[str | None, re.Match[str] | None]:
        start = re.match(r"bytes=(\d+)-", asked.get("Range", ""))
        mode = self.mode if command == "GET" and start and re.search(self.paths, path) else None
        return (None if mode == "end" and start and int(start[1]) == 0 else mode), start

    def request(self, command: str, path: str, headers: dict[str, str]) -> dict[str, str]:
        mode, start = self._mode(command, path, headers)
        if mode == "ignore" and start and int(start[1]) > 0:
            self.hits += 1
            return {name: value for name, value in headers.items() if name.lower() != "range"}
        return headers

    def answer(
        self, command: str, path: str, asked: dict[str, str], status: int, headers: Headers, data: bytes
    ) -> tuple[Headers, bytes]:
        mode, start = self._mode(command, path, asked)
        if mode in ("halve", "end") and status == 206 and len(data) > 1:
            data = data[: len(data) // 2]
            self.hits += 1
        if mode == "end" and status == 206 and start:
            first = int(start[1])
            claimed = f"bytes {first}-{first + len(data) - 1}/{first + len(data)}"
            headers = [(n, claimed if n.lower() == "content-range" else v) for n, v in headers]
        return headers, data


@pytest.fixture
def proxy(s3_server) -> Iterator[RangeProxy]:
    with running(RangeProxy(s3_server.endpoint)) as proxy:
        yield proxy


def _through(s3_server, proxy: RangeProxy) -> dict:
    return {**s3_server.storage_options, "client_kwargs": {"endpoint_url": proxy.endpoint}}


def _tree() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {"a": rng.standard_normal((300, 300)).astype(np.float32), "b": rng.standard_normal((2000, 100))}


@pytest.mark.parametrize("index", [np.s_[1500:1510], np.s_[1000:1900:7], np.s_[1999]])
def test_a_server_that_ignores_range_still_gives_the_bytes_asked_for(s3_server, proxy, index):
    url = s3_server.url(f"ranges-{uuid.uuid4().hex[:8]}", "t.jxs")
    tree = _tree()
    jaxstow.save(url, tree, storage_options=s3_server.storage_options)
    proxy.mode = "ignore"
    with jaxstow.open(url, storage_options=_through(s3_server, proxy)) as reader:
        got = np.asarray(reader.read("b", index))
    assert proxy.hits
    np.testing.assert_array_equal(got, tree["b"][index])


@pytest.mark.parametrize("mode", ["halve", "end"])
def test_a_halved_answer_is_a_storage_failure_not_the_end_of_the_file(s3_server, proxy, mode):
    url = s3_server.url(f"ranges-{uuid.uuid4().hex[:8]}", "t.jxs")
    tree = _tree()
    jaxstow.save(url, tree, storage_options=s3_server.storage_options)
    proxy.mode = mode
    with (
        jaxstow.open(url, storage_options=_through(s3_server, proxy), transfer=_QUICK) as reader,
        pytest.raises(StorageError, match="failed 3 times") as raised,
    ):
        reader.read("b", np.s_[1500:1510])
    assert not isinstance(raised.value, FormatError)
    assert raised.value.file == url
    proxy.mode = None  # the file is whole
    with jaxstow.open(url, storage_options=_through(s3_server, proxy)) as reader:
        np.testing.assert_array_equal(reader.read("b", np.s_[1500:1510]), tree["b"][1500:1510])


def test_a_halved_answer_once_is_taken_up_where_it_stopped(s3_server, proxy):
    url = s3_server.url(f"ranges-{uuid.uuid4().hex[:8]}", "t.jxs")
    tree = _tree()
    jaxstow.save(url, tree, storage_options=s3_server.storage_options)
    with jaxstow.open(url, storage_options=_through(s3_server, proxy), transfer=_QUICK) as reader:
        proxy.mode = "halve"
        original = proxy.server.RequestHandlerClass.forward

        def once(handler):  # the first ranged GET after opening is halved, the others are whole
            if proxy.hits:
                proxy.mode = None
            original(handler)

        proxy.server.RequestHandlerClass.forward = once
        proxy.server.RequestHandlerClass.do_GET = once
        got = np.asarray(reader.read("b", np.s_[1500:1510]))
    assert proxy.hits == 1
    np.testing.assert_array_equal(got, tree["b"][1500:1510])


def test_restore_with_fallback_does_not_skip_a_step_whose_answers_were_cut(s3_server, proxy):
    url = s3_server.url(f"ranges-{uuid.uuid4().hex[:8]}")
    with CheckpointManager(url, storage_options=s3_server.storage_options) as manager:
        for step in (1, 2):
            manager.save(step, {"s": {"w": np.full((400, 400), float(step), np.float32)}})
    proxy.mode, proxy.paths = "halve", r"/2/"
    with (
        CheckpointManager(url, storage_options=_through(s3_server, proxy), transfer=_QUICK) as manager,
        pytest.raises(StorageError),
    ):
        manager.restore(fallback=True)
    proxy.mode = None
    with CheckpointManager(url, storage_options=_through(s3_server, proxy)) as manager:
        restored = manager.restore(fallback=True)
    assert float(np.asarray(restored["s"]["w"])[0, 0]) == 2.0


def test_restore_through_a_server_that_ignores_range_gives_the_step_saved(s3_server, proxy):
    url = s3_server.url(f"ranges-{uuid.uuid4().hex[:8]}")
    rng = np.random.default_rng(3)
    tree = {"s": {"w": rng.standard_normal((2000, 1000)).astype(np.float32), "b": rng.standard_normal(5000)}}
    tree["s"]["b"] = tree["s"]["b"].astype(np.float32)
    with CheckpointManager(url, storage_options=s3_server.storage_options) as manager:
        manager.save(1, tree)
    proxy.mode = "ignore"
    parts = jaxstow.Transfer(part_size=5 << 20)  # the file's second part is a GET that does not start at 0
    with CheckpointManager(url, storage_options=_through(s3_server, proxy), transfer=parts) as manager:
        restored = manager.restore()
    assert proxy.hits
    np.testing.assert_array_equal(np.asarray(restored["s"]["w"]), tree["s"]["w"])
    np.testing.assert_array_equal(np.asarray(restored["s"]["b"]), tree["s"]["b"])
