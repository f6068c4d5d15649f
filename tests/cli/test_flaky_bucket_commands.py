"""Commands on files and runs in a bucket whose answers may come with a bit flipped on the way (a faulty link or
middlebox, ``tests/support/faulty_proxy.py``): ``verify``, ``diff``, ``convert`` and ``export`` read the file again,
and only damage found twice is reported, as ``CheckpointManager.damaged_steps()`` reports it; a file damaged in the
bucket itself is still damaged."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from faulty_proxy import FaultyProxy, faulty_proxy

import jaxstow
from jaxstow import CheckpointManager, Transfer
from jaxstow.cli import main

MiB = 1 << 20
FAST = Transfer(part_size=5 * MiB, requests=4, attempts=5, backoff=0.02)
#: The answers for a file's later bytes: its data, not its header nor the first part of a step's item file.
DATA = r"bytes=[1-9]"


def _tree(scale: int) -> dict[str, np.ndarray]:
    return {f"w{i}": np.arange(MiB // 2, dtype=np.float32) * scale + i for i in range(3)}


@pytest.fixture(scope="module")
def bucket(s3_server) -> Iterator[tuple[FaultyProxy, list[str], Any]]:
    """A file and a run of two steps saved straight to the server; the proxy in front of it, clean until a test asks
    for a flipped bit, and the command's storage options through it."""
    prefix = s3_server.url(f"verify-flaky-{uuid.uuid4().hex[:8]}")
    direct = s3_server.storage_options
    jaxstow.save(f"{prefix}/model.jxs", _tree(1), storage_options=direct, transfer=FAST)
    with CheckpointManager(f"{prefix}/run", storage_options=direct, transfer=FAST) as manager:
        for step in (1, 2):
            manager.save(step, {"params": _tree(step)})
    with faulty_proxy(s3_server.endpoint, rate=0.0, kinds=("flip",), budget=1) as proxy:
        options = {**direct, "client_kwargs": {"endpoint_url": proxy.endpoint}}
        flags = ["--storage-options", json.dumps(options), "--transfer", json.dumps({"attempts": 5, "backoff": 0.02})]
        yield proxy, flags, prefix


@pytest.mark.parametrize(
    ("target", "paths"),
    [("model.jxs", r"/model\.jxs "), ("run/2/params.safetensors", r"/run/2/.* "), ("run", r"/run/2/.* ")],
    ids=["file", "item-file", "run"],
)
def test_a_bit_flipped_once_on_its_way_is_read_again_and_not_reported_as_damage(bucket, capsys, target, paths):
    proxy, flags, prefix = bucket
    proxy.faults.clear()
    proxy.rate, proxy.paths = 1.0, paths + DATA
    try:
        status = main(["verify", f"{prefix}/{target}", *flags])
    finally:
        proxy.rate = 0.0
    assert proxy.faults["flip"] >= 1
    out = capsys.readouterr().out
    assert status == 0, out
    assert "DAMAGED" not in out and out.rstrip().endswith("intact"), out


def test_a_file_damaged_in_the_bucket_is_still_damaged(bucket, s3_server, capsys):
    _, flags, prefix = bucket
    url = f"{prefix}/damaged.jxs"
    jaxstow.save(url, _tree(3), storage_options=s3_server.storage_options, transfer=FAST)
    client, key = s3_server.client(), url.removeprefix(f"s3://{s3_server.bucket}/")
    data = bytearray(client.get_object(Bucket=s3_server.bucket, Key=key)["Body"].read())
    data[-100] ^= 1
    client.put_object(Bucket=s3_server.bucket, Key=key, Body=bytes(data))
    assert main(["verify", url, *flags]) == 1
    out = capsys.readouterr().out
    assert f"DAMAGED  leaf 'w2' of {url}: checksum mismatch" in out, out


@pytest.mark.parametrize("command", ["diff", "convert", "export"])
def test_a_command_whose_read_meets_a_bit_flipped_on_its_way_reads_again_and_gives_the_saved_values(
    bucket, tmp_path, capsys, command
):
    proxy, flags, prefix = bucket
    item = f"{prefix}/run/2/params.safetensors"
    out = tmp_path / "out"
    args = {
        "diff": [item, f"{prefix}/run/2/params.safetensors"],
        "convert": [item, f"{out}.npz"],
        "export": [f"{prefix}/run/2", str(out)],
    }[command]
    proxy.faults.clear()
    proxy.rate, proxy.paths = 1.0, r"/run/2/.* " + DATA
    try:
        status = main([command, *args, *flags])
    finally:
        proxy.rate = 0.0
    assert proxy.faults["flip"] >= 1
    assert status == 0, capsys.readouterr().err
    if command == "convert":
        with np.load(f"{out}.npz") as converted:
            assert all(np.array_equal(converted[name], value) for name, value in _tree(2).items())
    if command == "export":
        tree = jaxstow.huggingface.load(str(out), as_numpy=True)
        assert all(np.array_equal(tree[name], value) for name, value in _tree(2).items()), tree.keys()
