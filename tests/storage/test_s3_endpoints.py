"""The endpoint of ``s3://`` URLs, on a real S3 server: one given in ``storage_options`` (as ``endpoint_url`` or in
``client_kwargs``) wins over the other one fsspec's configuration names, by the environment, as a shell sets it;
two different ones in one set of options are an ArgumentError naming both."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import uuid

import numpy as np
import pytest

import jaxstow
from jaxstow.errors import ArgumentError

SCRIPT = """
import json, sys, numpy as np, jaxstow
from jaxstow import CheckpointManager
url, options = sys.argv[1], json.loads(sys.argv[2])
jaxstow.save(url + "/model.jxs", {"w": np.arange(3.0)}, storage_options=options)
with CheckpointManager(url + "/run", storage_options=options) as manager:
    manager.save(1, {"w": np.ones(2)})
print(jaxstow.load(url + "/model.jxs", as_numpy=True, storage_options=options)["w"].tolist(), manager.steps())
"""


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("place", ["client_kwargs", "endpoint_url"])
def test_an_endpoint_given_wins_over_the_configured_one(s3_server, place):
    elsewhere = f"http://127.0.0.1:{_closed_port()}"  # nothing answers there
    given = {"client_kwargs": {"endpoint_url": s3_server.endpoint}} if place == "client_kwargs" else {}
    given |= {"endpoint_url": s3_server.endpoint} if place == "endpoint_url" else {}
    # configured in the other place: FSSPEC_S3_ENDPOINT_URL is s3fs's endpoint_url, FSSPEC_S3 may hold client_kwargs
    configured = (
        {"FSSPEC_S3_ENDPOINT_URL": elsewhere}
        if place == "client_kwargs"
        else {"FSSPEC_S3": json.dumps({"client_kwargs": {"endpoint_url": elsewhere, "region_name": "us-east-1"}})}
    )
    clean = {key: value for key, value in os.environ.items() if not key.startswith(("AWS_", "FSSPEC_"))}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), s3_server.url(f"t-{uuid.uuid4().hex[:8]}"), json.dumps(given)],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **clean,
            **configured,
            "FSSPEC_S3_KEY": "jaxstow",
            "FSSPEC_S3_SECRET": "jaxstow",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_CONFIG_FILE": os.devnull,
        },
    )
    assert done.returncode == 0 and done.stdout.strip() == "[0.0, 1.0, 2.0] [1]", done.stderr[-2000:]


def test_two_endpoints_given_at_once_are_an_argument_error(s3_server):
    url = s3_server.url(f"t-{uuid.uuid4().hex[:8]}", "model.jxs")
    options = {**s3_server.storage_options, "endpoint_url": "http://127.0.0.1:1"}
    with pytest.raises(
        ArgumentError, match=r"two endpoints, endpoint_url 'http://127\.0\.0\.1:1' and client_kwargs'"
    ) as info:
        jaxstow.save(url, {"w": np.ones(2)}, storage_options=options)
    assert url in str(info.value) and s3_server.endpoint in str(info.value)
