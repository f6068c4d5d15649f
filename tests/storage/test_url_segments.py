"""A checkpoint URL with an empty, ``.`` or ``..`` path segment (``s3://bucket/runs//a``) is refused when the manager
opens, naming the URL to use: on a real S3 server (SeaweedFS on the loopback interface) such a directory would be
written, and its listings, which come back normalised, would never find a step of it."""

from __future__ import annotations

import uuid

import fsspec
import numpy as np
import pytest

import jaxstow
from jaxstow import CheckpointManager
from jaxstow.errors import ArgumentError, StorageError


@pytest.mark.parametrize(("middle", "fixed"), [("dbl//run", "dbl/run"), ("dot/./run", "dot/run"), ("a/../run", "run")])
def test_a_url_with_an_empty_or_dot_segment_is_refused_naming_the_one_to_use(s3_server, middle, fixed):
    prefix = f"segments-{uuid.uuid4().hex[:8]}"
    url = s3_server.url(prefix, middle)
    with pytest.raises(ArgumentError, match="use " + s3_server.url(prefix, fixed).replace(".", r"\.") + "$"):
        CheckpointManager(url, storage_options=s3_server.storage_options)
    fs = fsspec.filesystem("s3", **s3_server.storage_options)
    assert not fs.find(f"{s3_server.bucket}/{prefix}")  # refused before anything was written


def test_a_url_with_a_trailing_slash_lists_the_steps_saved(s3_server):
    url = s3_server.url(f"segments-{uuid.uuid4().hex[:8]}", "run") + "/"
    with CheckpointManager(url, storage_options=s3_server.storage_options) as manager:
        manager.save(1, {"v": np.ones(3)})
        manager.wait()
    with CheckpointManager(url, storage_options=s3_server.storage_options) as manager:
        assert manager.steps() == [1]


@pytest.mark.parametrize("url", ["htps://host/model.jxs", "s4://bucket/model.jxs", "foo://bucket/run"])
def test_a_url_of_an_unknown_scheme_says_so_and_what_to_give(url):
    scheme = url.partition("://")[0]
    for call in (
        lambda: jaxstow.load(url),
        lambda: jaxstow.save(url, {"v": np.ones(3)}),
        lambda: CheckpointManager(url),
    ):
        with pytest.raises(StorageError, match=f"no storage is known by the URL scheme '{scheme}'") as raised:
            call()
        assert url in str(raised.value) and "Protocol not known" not in str(raised.value)
    with pytest.raises(StorageError, match="did you mean 'https'"):
        jaxstow.load("htps://host/model.jxs")
