"""A file sent as one PUT to a store that acknowledges it without keeping it (``dropped`` of
``tests/support/faulty_proxy.py``): the save is a ``StorageError`` saying so, never a save that seems to have
succeeded while the bucket holds nothing, or the file saved before."""

from __future__ import annotations

import json
import re
import uuid

import numpy as np
import pytest
from faulty_proxy import faulty_proxy

import jaxstow
from jaxstow.cli import main
from jaxstow.errors import StorageError

UNKEPT = r"the store acknowledged [^ ]+ but does not keep it"


@pytest.fixture(scope="module")
def dropping(s3_server):
    """A proxy that drops the next PUT whose path matches its ``paths`` (its ``budget``: one), answering it ``200``."""
    with faulty_proxy(s3_server.endpoint, rate=0.0, kinds=("dropped",), methods=("PUT",), budget=1) as proxy:
        options = {**s3_server.storage_options, "client_kwargs": {"endpoint_url": proxy.endpoint}}
        yield proxy, options, s3_server.url(f"unkept-{uuid.uuid4().hex[:8]}")


def _drop(proxy, paths: str) -> None:
    proxy.faults.clear()
    proxy.rate, proxy.paths = 1.0, paths


@pytest.mark.parametrize("before", [False, True], ids=["new", "replacing"])
def test_a_save_the_store_does_not_keep_is_a_storage_error(dropping, s3_server, before):
    proxy, options, prefix = dropping
    url = f"{prefix}/model-{before}.jxs"
    if before:
        jaxstow.save(url, {"w": np.zeros(10)}, storage_options=s3_server.storage_options)
    _drop(proxy, r"/model-")
    try:
        with pytest.raises(StorageError, match=UNKEPT) as caught:
            jaxstow.save(url, {"w": np.arange(10.0)}, storage_options=options)
    finally:
        proxy.rate = 0.0
    assert proxy.faults == {"dropped": 1}
    assert str(caught.value).startswith(f"{url}: ")
    assert ("another object is there" if before else "it is not there") in str(caught.value)
    if before:  # the file saved before is there, as it was
        assert np.array_equal(jaxstow.load(url, storage_options=options, as_numpy=True)["w"], np.zeros(10))


def test_an_export_whose_index_the_store_does_not_keep_fails_and_leaves_no_shard(dropping, s3_server, tmp_path, capsys):
    proxy, options, prefix = dropping
    jaxstow.save(tmp_path / "model.jxs", {"w": np.arange(10.0), "b": np.ones(3)})
    out = f"{prefix}/exported"
    _drop(proxy, r"/exported/model\.safetensors\.index\.json")
    try:
        status = main(["export", str(tmp_path / "model.jxs"), out, "--storage-options", json.dumps(options)])
    finally:
        proxy.rate = 0.0
    assert proxy.faults == {"dropped": 1}
    assert status == 2
    assert re.search(f"{re.escape(out)}/model.safetensors.index.json: {UNKEPT}", capsys.readouterr().err)
    listed = s3_server.client().list_objects_v2(Bucket=s3_server.bucket, Prefix=out.split("/", 3)[3])
    assert listed.get("Contents", []) == []
