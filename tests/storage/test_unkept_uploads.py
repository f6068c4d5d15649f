"""A file sent as one PUT to a store that acknowledges it without keeping it (``dropped`` of
``tests/support/faulty_proxy.py``: answered ``200`` with the ETag of its body, never reaching the server): the object
is asked for once acknowledged, and the PUT sent again when the store does not hold it; a store that never keeps it
fails the save with a ``StorageError`` naming the file, the bytes sent and what the store holds, never a save that
seems to have succeeded while the bucket holds nothing, or the file saved before."""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import Iterator

import numpy as np
import pytest
from faulty_proxy import faulty_proxy

import jaxstow
from jaxstow import Transfer
from jaxstow.cli import main
from jaxstow.errors import StorageError

FAST = Transfer(attempts=3, backoff=0.02)


@pytest.fixture(scope="module")
def dropping(s3_server):
    """A proxy that drops the PUTs whose path matches its ``paths``, answering them ``200``."""
    with faulty_proxy(s3_server.endpoint, rate=0.0, kinds=("dropped",), methods=("PUT",)) as proxy:
        options = {**s3_server.storage_options, "client_kwargs": {"endpoint_url": proxy.endpoint}}
        yield proxy, options, s3_server.url(f"unkept-{uuid.uuid4().hex[:8]}")


@contextlib.contextmanager
def _dropped(proxy, paths: str, budget: int | None) -> Iterator[None]:
    """The proxy dropping the PUTs to ``paths``, ``budget`` of them (all: ``None``), for the ``with`` block."""
    proxy.faults.clear()
    proxy.rate, proxy.paths, proxy.budget = 1.0, paths, budget
    try:
        yield
    finally:
        proxy.rate = 0.0


@pytest.mark.parametrize("before", [False, True], ids=["new", "replacing"])
def test_a_save_the_store_did_not_keep_once_is_sent_again(dropping, s3_server, before):
    proxy, options, prefix = dropping
    url = f"{prefix}/once-{before}.jxs"
    if before:
        jaxstow.save(url, {"w": np.zeros(10)}, storage_options=s3_server.storage_options)
    with _dropped(proxy, r"/once-", budget=1):
        jaxstow.save(url, {"w": np.arange(10.0)}, storage_options=options, transfer=FAST)
    assert proxy.faults == {"dropped": 1}
    loaded = jaxstow.load(url, storage_options=s3_server.storage_options, as_numpy=True)
    assert np.array_equal(loaded["w"], np.arange(10.0))


@pytest.mark.parametrize("before", [False, True], ids=["new", "replacing"])
def test_a_save_the_store_never_keeps_is_a_storage_error_naming_what_it_holds(dropping, s3_server, before):
    proxy, options, prefix = dropping
    url = f"{prefix}/never-{before}.jxs"
    if before:
        jaxstow.save(url, {"w": np.zeros(20)}, storage_options=s3_server.storage_options)
    with _dropped(proxy, r"/never-", budget=None), pytest.raises(StorageError) as caught:
        jaxstow.save(url, {"w": np.arange(10.0)}, storage_options=options, transfer=FAST)
    assert proxy.faults == {"dropped": 3}  # the attempts of the transfer's policy
    message = str(caught.value)
    held = r"another object of \d+ bytes" if before else "no object"
    assert re.search(
        rf"^{re.escape(url)}: the storage failed: uploading it .* \(the last: NotKept: the store acknowledged never-{before}\.jxs but does not keep it: "
        rf"\d+ bytes sent, and it holds {held} there",
        message,
    ), message
    if before:  # the file saved before is there, as it was
        assert np.array_equal(jaxstow.load(url, storage_options=options, as_numpy=True)["w"], np.zeros(20))


def test_an_export_whose_index_the_store_never_keeps_fails_and_leaves_no_shard(dropping, s3_server, tmp_path, capsys):
    proxy, options, prefix = dropping
    jaxstow.save(tmp_path / "model.jxs", {"w": np.arange(10.0), "b": np.ones(3)})
    out = f"{prefix}/exported"
    flags = ["--storage-options", json.dumps(options), "--transfer", json.dumps({"attempts": 2, "backoff": 0.02})]
    with _dropped(proxy, r"/exported/model\.safetensors\.index\.json", budget=None):
        status = main(["export", str(tmp_path / "model.jxs"), out, *flags])
    assert proxy.faults == {"dropped": 2}
    assert status == 2
    err = capsys.readouterr().err
    assert f"{out}/model.safetensors.index.json: the storage failed: " in err, err
    assert "the store acknowledged model.safetensors.index.json but does not keep it" in err, err
    listed = s3_server.client().list_objects_v2(Bucket=s3_server.bucket, Prefix=out.split("/", 3)[3])
    assert listed.get("Contents", []) == []
