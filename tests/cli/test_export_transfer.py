"""``jaxstow export`` to S3 (a real server) moves its files as ``--transfer`` says, as every other command does: a
file of more than one ``part_size`` is uploaded in parts of that size."""

from __future__ import annotations

import json
import uuid

import forked_cli
import numpy as np

import jaxstow

MiB = 1 << 20


def test_export_uploads_in_the_parts_transfer_gives(s3_server, tmp_path):
    jaxstow.save(tmp_path / "model.jxs", {"w": np.ones(3 * MiB, np.float32)})  # 12 MiB, less than the default part
    client = s3_server.client()
    prefix = f"t-{uuid.uuid4().hex[:8]}"
    options = ["--storage-options", json.dumps(s3_server.storage_options)]
    parts = {}
    for name, transfer in (("default", []), ("small", ["--transfer", json.dumps({"part_size": 5 * MiB})])):
        done = forked_cli.jaxstow_command(
            "export", tmp_path / "model.jxs", s3_server.url(prefix, name), *options, *transfer
        )
        assert done.returncode == 0, done.stderr
        etag = client.head_object(Bucket=s3_server.bucket, Key=f"{prefix}/{name}/model-00001-of-00001.safetensors")[
            "ETag"
        ]
        parts[name] = etag.strip('"').partition("-")[2]  # a multipart upload's ETag ends with its number of parts
    assert parts == {"default": "", "small": "3"}
