"""A folder laid out as a Hugging Face cache snapshot reads its links only into the repository's own ``blobs``
folder: a ``blobs`` that is a link (to ``/``, or anywhere out of the repository) is refused, naming it, so that no
file elsewhere on the disk is read through it; a real cache still loads."""

from __future__ import annotations

import os

import numpy as np
import pytest
from safetensors.numpy import save_file

import jaxstow
from jaxstow.errors import PathError

SECRET = {"private": np.arange(4, dtype=np.float32)}


@pytest.fixture
def secret(tmp_path):
    """A file of someone else's, outside any folder the snapshot's author controls."""
    path = tmp_path / "elsewhere" / "secret.safetensors"
    path.parent.mkdir()
    save_file(SECRET, str(path))
    return path


def _snapshot(tmp_path, name="model.safetensors"):
    repository = tmp_path / "shipped" / "models--a--b"
    snapshot = repository / "snapshots" / "r"
    snapshot.mkdir(parents=True)
    return repository, snapshot, snapshot / name


@pytest.mark.parametrize("blobs_target", ["/", "outside"])
def test_a_blobs_folder_that_is_a_link_out_is_refused(tmp_path, secret, blobs_target):
    repository, snapshot, member = _snapshot(tmp_path)
    target = "/" if blobs_target == "/" else str(secret.parent)
    (repository / "blobs").symlink_to(target)
    inside_blobs = str(secret).lstrip("/") if blobs_target == "/" else secret.name
    member.symlink_to(f"../../blobs/{inside_blobs}")
    with pytest.raises(PathError, match=rf"{repository / 'blobs'}: is a link to .*folder of the repository's own"):
        jaxstow.load(snapshot, as_numpy=True)


def test_a_blobs_link_within_the_repository_is_refused_too(tmp_path, secret):
    repository, snapshot, member = _snapshot(tmp_path)
    (repository / "store").mkdir()
    os.replace(secret, repository / "store" / "abc")
    (repository / "blobs").symlink_to("store")
    member.symlink_to("../../blobs/abc")
    with pytest.raises(PathError, match="blobs: is a link to"):
        jaxstow.load(snapshot, as_numpy=True)


def test_a_real_cache_snapshot_still_loads(tmp_path, secret):
    repository, snapshot, member = _snapshot(tmp_path)
    (repository / "blobs").mkdir()
    os.replace(secret, repository / "blobs" / "0123")
    member.symlink_to("../../blobs/0123")
    np.testing.assert_array_equal(jaxstow.load(snapshot, as_numpy=True)["private"], SECRET["private"])
