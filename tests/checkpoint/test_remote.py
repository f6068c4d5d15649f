"""Checkpoints on fsspec URLs: ``memory://`` and a real S3 server (SeaweedFS on the loopback interface)."""

from __future__ import annotations

import json
import sys
import time
import uuid

import forked
import fsspec
import jax.numpy as jnp
import numpy as np
import pytest
from faulty_proxy import faulty_proxy

import jaxstow
from jaxstow import CheckpointManager, KeepPolicy
from jaxstow._storage.lock import LOCK_NAME, Holder
from jaxstow._storage.recent import RECENT
from jaxstow._storage.remote import RemoteSource
from jaxstow.errors import CheckpointError, CorruptFileError, FormatError, StorageError


@pytest.fixture(params=["memory", "s3"])
def remote(request) -> tuple[str, dict]:
    """A fresh URL (and its storage options) on each kind of store."""
    name = f"run-{uuid.uuid4().hex[:8]}"
    if request.param == "memory":
        return f"memory://jaxstow-tests/{name}", {}
    server = request.getfixturevalue("s3_server")
    return server.url(name), server.storage_options


def _files(url: str, options: dict) -> list[str]:
    fs, root = fsspec.core.url_to_fs(url, **options)
    fs.invalidate_cache()
    return sorted(path.removeprefix(root.rstrip("/") + "/") for path in fs.find(root))


def test_round_trip(remote):
    url, options = remote
    state = {"params": {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.zeros(3, jnp.bfloat16)}, "epoch": 4}
    with CheckpointManager(url, keep=KeepPolicy(keep_last=2), storage_options=options) as manager:
        for step in (1, 2, 3):
            manager.save(step, {**state, "epoch": step}, metrics={"loss": 1.0 / step})
        assert manager.steps() == [2, 3] and manager.metrics(3) == {"loss": 1 / 3}
        restored = manager.restore()
        fitted = manager.restore(2, like={"params": state["params"], "epoch": 0})
        numpy_only = manager.restore(items=["params"], as_numpy=True)
    np.testing.assert_array_equal(restored["params"]["w"], state["params"]["w"])
    assert restored["params"]["b"].dtype == jnp.bfloat16 and restored["epoch"] == 3 and fitted["epoch"] == 2
    assert isinstance(numpy_only["params"]["w"], np.ndarray)
    assert _files(url, options) == [
        RECENT,
        "2/checkpoint.json",
        "2/epoch.safetensors",
        "2/params.safetensors",
        "3/checkpoint.json",
        "3/epoch.safetensors",
        "3/params.safetensors",
    ]
    # Each item file is a jaxstow file that loads on its own, read by byte ranges.
    fs, root = fsspec.core.url_to_fs(url, **options)
    source = RemoteSource(fs, f"{root}/3/params.safetensors", name=f"{url}/3/params.safetensors")
    assert jaxstow.load(source, as_numpy=True)["w"].shape == (2, 3)


def test_force_replaces_a_committed_step(remote):
    url, options = remote
    with CheckpointManager(url, storage_options=options) as manager:
        manager.save(7, {"w": jnp.zeros(4)})
        manager.wait()
        with pytest.raises(CheckpointError, match="step 7 already exists"):
            manager.save(7, {"w": jnp.ones(4)})
        manager.save(7, {"w": jnp.ones(4)}, force=True)
        np.testing.assert_array_equal(manager.restore(7)["w"], np.ones(4))
    files = _files(url, options)
    assert len(files) == 3 and files[:2] == [RECENT, "7/checkpoint.json"] and files[2].startswith("7/w.")


def test_unfinished_uploads_are_never_listed_and_are_removed_by_the_next_writer(remote):
    url, options = remote
    with CheckpointManager(url, storage_options=options) as manager:
        manager.save(1, {"w": jnp.ones(2)})
    fs, root = fsspec.core.url_to_fs(url, **options)
    # What a writer killed in the middle of uploads leaves: step 2 marked as being written, without its record, and
    # an orphan file in step 1. Beside them, folders of step-like names that no manager wrote: they stay.
    fs.pipe_file(f"{root}/2/.jaxstow-writing", b"")
    fs.pipe_file(f"{root}/2/w.safetensors", b"half an upload")
    fs.pipe_file(f"{root}/1/w.1234abcd.safetensors", b"a replacement never committed")
    fs.pipe_file(f"{root}/2024/results.csv", b"the user's own")
    fs.pipe_file(f"{root}/100/_CHECKPOINT_METADATA", b"an orbax step")
    with CheckpointManager(url, storage_options=options) as manager:
        assert manager.steps() == [1]
        manager.save(3, {"w": jnp.full(2, 3.0)})
        assert manager.steps() == [1, 3]
        with pytest.raises(CheckpointError, match=r"/100 holds objects that no checkpoint manager wrote"):
            manager.save(100, {"w": jnp.ones(2)})
            manager.wait()
    assert _files(url, options) == [
        RECENT,
        "1/checkpoint.json",
        "1/w.safetensors",
        "100/_CHECKPOINT_METADATA",
        "2024/results.csv",
        "3/checkpoint.json",
        "3/w.safetensors",
    ]


def test_corrupt_object_is_caught(remote):
    url, options = remote
    with CheckpointManager(url, storage_options=options) as manager:
        manager.save(1, {"w": jnp.arange(1000.0)})
    fs, root = fsspec.core.url_to_fs(url, **options)
    data = bytearray(fs.cat_file(f"{root}/1/w.safetensors"))
    data[-1] ^= 0xFF
    fs.pipe_file(f"{root}/1/w.safetensors", bytes(data))
    with pytest.raises(CorruptFileError, match=r"/1/w\.safetensors: checksum mismatch"):
        CheckpointManager(url, storage_options=options).restore()


def test_lock_object(remote):
    url, options = remote
    first = CheckpointManager(url, storage_options=options)
    first.save(0, {"w": jnp.ones(1)})
    second = CheckpointManager(url, storage_options=options)
    with pytest.raises(
        CheckpointError, match=rf"being written by another checkpoint manager .*delete {url}/{LOCK_NAME}"
    ):
        second.save(1, {"w": jnp.ones(1)})
    first.close()
    assert LOCK_NAME not in " ".join(_files(url, options))
    # The lock of a process of this host that no longer runs is taken over.
    finished = forked.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = Holder(int(finished.stdout), Holder.me().host, "2020-01-01T00:00:00+00:00", "feed")
    fs, root = fsspec.core.url_to_fs(url, **options)
    fs.pipe_file(f"{root}/{LOCK_NAME}", dead.to_json())
    second.save(1, {"w": jnp.ones(1)})
    second.close()
    assert CheckpointManager(url, storage_options=options).steps() == [0, 1]


def test_a_step_of_many_items_gets_each_header_with_its_data(s3_server):
    """A distant bucket (every request to an item file answered 0.5 s late): 80 items of 128 KiB restored 16 at a
    time are one request each, header and data, and take about 5 delays longer than with no delay (one per item each
    of the 16 threads restores), less than 6.5; not 10 (each item waiting for its header, then for its data)."""
    delay, count = 0.5, 80
    url = s3_server.url(f"many-{uuid.uuid4().hex[:8]}")
    # 128 KiB each: more than the header's first read takes
    items = {f"item{i:02d}": {"w": np.full(1 << 15, i, np.float32)} for i in range(count)}
    with CheckpointManager(url, storage_options=s3_server.storage_options) as manager:
        manager.save(1, items)
    with faulty_proxy(
        s3_server.endpoint, rate=1.0, kinds=("slow",), slow_seconds=delay, paths=r"\.safetensors"
    ) as proxy:
        options = {**s3_server.storage_options, "client_kwargs": {"endpoint_url": proxy.endpoint}}
        seconds = {}
        for rate in (0.0, 1.0):
            proxy.rate = rate
            with CheckpointManager(url, storage_options=options) as manager:
                start = time.monotonic()
                restored = manager.restore(as_numpy=True)
                seconds[rate] = time.monotonic() - start
            assert all(np.array_equal(restored[name]["w"], item["w"]) for name, item in items.items())
        assert proxy.faults["slow"] == count
    assert seconds[1.0] - seconds[0.0] < 6.5 * delay, seconds


def _flip(fs, path: str, offset: int) -> None:
    data = bytearray(fs.cat_file(path))
    data[offset] ^= 1
    fs.pipe_file(path, bytes(data))


def test_damage_is_checked_in_the_store_not_in_the_cache_s_intact_copies(s3_server, tmp_path):
    # The cache's copies of steps 2 and 3 were checked: both intact, though the store's were damaged and a host
    # without the copies restores neither (latest_intact_step gave 3, damaged_steps {}).
    url, options = s3_server.url(f"run-{uuid.uuid4().hex[:8]}"), s3_server.storage_options
    cached = {"storage_options": options, "cache_dir": tmp_path / "cache"}
    with CheckpointManager(url, **cached) as manager:
        for step in (1, 2, 3):
            manager.save(step, {"w": np.full(256, float(step), np.float32)})
            manager.restore(step)  # a copy of each in the cache
    fs, root = fsspec.core.url_to_fs(url, **options)
    _flip(fs, f"{root}/2/w.safetensors", 12)  # in its header
    _flip(fs, f"{root}/3/w.safetensors", -1)  # in its data
    answers = []
    for settings in (cached, {"storage_options": options}):  # this host, and a host without the copies
        with CheckpointManager(url, **settings) as manager:
            found, headers = manager.damaged_steps(), manager.damaged_steps(verify="headers")
            answers.append((sorted(found), sorted(headers), manager.latest_intact_step()))
    assert answers == [([2, 3], [2], 1)] * 2, answers
    assert "3/w.safetensors: checksum mismatch" in found[3], found
    with CheckpointManager(url, **cached) as manager:  # the copies are kept, and a restore here still reads them
        assert manager.restore(3, as_numpy=True)["w"][0] == 3.0


def test_a_step_damaged_in_the_store_and_in_the_cache_is_named_in_the_store_after_one_fetch(
    s3_server, tmp_path, caplog
):
    # The cache's damaged copy was removed, fetched again (as damaged) from the store and removed again, 19 times,
    # and the error named the cache's copy, not the file in the store.
    url, options = s3_server.url(f"run-{uuid.uuid4().hex[:8]}"), s3_server.storage_options
    cached = {"storage_options": options, "cache_dir": tmp_path / "cache"}
    with CheckpointManager(url, **cached) as manager:
        for step in (1, 2):
            manager.save(step, {"w": np.full(256, float(step), np.float32)})
            manager.restore(step)  # a copy of each in the cache
    fs, root = fsspec.core.url_to_fs(url, **options)
    _flip(fs, f"{root}/2/w.safetensors", -1)  # in its data
    copy = next((tmp_path / "cache").rglob("2/w.safetensors"))
    data = bytearray(copy.read_bytes())
    data[-1] ^= 1
    copy.write_bytes(bytes(data))
    with CheckpointManager(url, **cached) as manager, caplog.at_level("WARNING", logger="jaxstow"):
        with pytest.raises(CorruptFileError) as raised:
            manager.restore(2)
        assert manager.restore(1, as_numpy=True)["w"][0] == 1.0
    assert raised.value.file == f"{url}/2/w.safetensors" and str(raised.value).startswith(f"step 2 of {url} is damaged")
    assert caplog.text.count("is damaged (") == 1, caplog.text  # the copy removed once


def test_a_bit_flipped_on_its_way_is_read_again_not_taken_for_a_damaged_step(s3_server):
    # One answer for step 2's data came with a bit flipped by the network: restore() and restore(2) said "step 2 is
    # damaged ... restore another step", though the store holds it intact.
    url, options = s3_server.url(f"run-{uuid.uuid4().hex[:8]}"), s3_server.storage_options
    state = {"params": {"w": np.arange(1 << 16, dtype=np.float32)}}
    with CheckpointManager(url, storage_options=options) as manager:
        for step in (1, 2):
            manager.save(step, state)
    data = rf"/{url.rsplit('/', 1)[1]}/2/.*\.safetensors bytes=(?!0-65535$)"  # not the first read, of the header
    for restore in (lambda run: run.restore(as_numpy=True), lambda run: run.restore(2, as_numpy=True)):
        with faulty_proxy(s3_server.endpoint, rate=1.0, kinds=("flip",), paths=data, budget=1) as proxy:
            flaky = {**options, "client_kwargs": {"endpoint_url": proxy.endpoint}}
            restored = restore(CheckpointManager(url, storage_options=flaky))
        assert proxy.faults["flip"] == 1
        np.testing.assert_array_equal(restored["params"]["w"], state["params"]["w"])


@pytest.mark.parametrize("force", [False, True])
def test_a_delete_that_fails_once_the_record_is_written_takes_back_nothing(s3_server, force):
    # The commit's removal of its leftovers (the folder's mark, the replaced files) failed, and the save removed the
    # files of the step whose checkpoint.json it had just written: the step, old values and new, was lost for good.
    url, options = s3_server.url(f"run-{uuid.uuid4().hex[:8]}"), s3_server.storage_options
    with faulty_proxy(
        s3_server.endpoint, rate=0.0, kinds=("500",), methods=("POST",), paths=r"\?delete", budget=3
    ) as proxy:
        flaky = {
            **options,
            "client_kwargs": {"endpoint_url": proxy.endpoint},
            "config_kwargs": {"retries": {"max_attempts": 2}},
        }
        manager = CheckpointManager(url, storage_options=flaky)
        manager.save(1, {"w": np.full(4, 1.0)})
        manager.wait()
        proxy.rate = 1.0  # the first DeleteObjects from now on fails, after botocore's retry too
        manager.save(1 if force else 2, {"w": np.full(4, 5.0)}, force=force)
        manager.wait()
        manager.close()
    assert proxy.faults["500"] == 3
    with CheckpointManager(url, storage_options=options) as manager:
        assert manager.steps() == [1] if force else [1, 2]
        np.testing.assert_array_equal(manager.restore(as_numpy=True)["w"], np.full(4, 5.0))
        manager.save(3, {"w": np.zeros(1)})  # the next writer removes the leftovers
    files = _files(url, options)  # each step's record and one file: the replaced file and the marks are gone
    assert [file.split("/")[0] for file in files if file != RECENT] == [
        "1",
        "1",
        *["2", "2"][: 2 * (not force)],
        "3",
        "3",
    ]


def test_a_step_saved_whose_keep_policy_deletion_fails_is_said_saved(s3_server):
    # "saving step 2 ... failed in the background: .../1: the storage failed: ...": step 2 was committed and listed.
    url, options = s3_server.url(f"run-{uuid.uuid4().hex[:8]}"), s3_server.storage_options
    with faulty_proxy(s3_server.endpoint, rate=0.0, kinds=("500",), methods=("POST",), paths=r"\?delete") as proxy:
        flaky = {**options, "client_kwargs": {"endpoint_url": proxy.endpoint}}
        flaky["config_kwargs"] = {"retries": {"max_attempts": 2}}
        manager = CheckpointManager(url, storage_options=flaky, keep=KeepPolicy(keep_last=1))
        manager.save(1, {"w": np.full(4, 1.0)})
        manager.wait()
        proxy.rate = 1.0  # every DeleteObjects fails: step 1's deletion by the keep policy too
        manager.save(2, {"w": np.full(4, 2.0)})
        with pytest.raises(
            StorageError, match=r"step 2 is saved, but deleting step 1, which the keep policy"
        ) as raised:
            manager.wait()
        assert f"{url}/1: the storage failed" in str(raised.value)
        assert manager.steps() == [1, 2] and not manager.should_save(2)
        proxy.rate = 0.0
        manager.save(3, {"w": np.full(4, 3.0)})
        manager.close()
    with CheckpointManager(url, storage_options=options) as manager:
        assert manager.steps() == [3] and manager.restore(as_numpy=True)["w"][0] == 3.0


def test_a_record_damaged_on_its_way_is_read_again_not_taken_for_a_damaged_step(s3_server):
    # One answer for step 2's checkpoint.json with a bit flipped by the network: "step 2 ... is damaged: ... the step
    # record is not valid JSON", and restore(fallback=True) went back to step 1.
    url, options = s3_server.url(f"run-{uuid.uuid4().hex[:8]}"), s3_server.storage_options
    with CheckpointManager(url, storage_options=options) as manager:
        for step in (1, 2):
            manager.save(step, {"w": np.full(4, float(step))})
    record = rf"/{url.rsplit('/', 1)[1]}/2/checkpoint\.json"
    for restore in (lambda run: run.restore(as_numpy=True), lambda run: run.restore(fallback=True, as_numpy=True)):
        with faulty_proxy(s3_server.endpoint, rate=1.0, kinds=("flip",), paths=record, budget=1) as proxy:
            flaky = {**options, "client_kwargs": {"endpoint_url": proxy.endpoint}}
            assert restore(CheckpointManager(url, storage_options=flaky))["w"][0] == 2.0
        assert proxy.faults["flip"] == 1


def test_a_writer_refused_by_a_damaged_record_leaves_no_lock(remote):
    url, options = remote
    with CheckpointManager(url, storage_options=options) as manager:
        manager.save(1, {"w": np.zeros(2)})
    fs, root = fsspec.core.url_to_fs(url, **options)
    fs.pipe_file(f"{root}/1/checkpoint.json", b"{")
    manager = CheckpointManager(url, storage_options=options)
    with pytest.raises(FormatError, match="the marker is not a JSON") as caught:
        manager.save(2, {"w": np.ones(2)})
    manager.close()
    fs.invalidate_cache()
    # No writer holds it, while the error is kept (its traceback, as a notebook keeps it): the next one starts.
    assert not fs.exists(f"{root}/{LOCK_NAME}") and caught.value.file == f"{url}/1/checkpoint.json"


def test_a_record_naming_a_file_outside_its_step_is_refused_by_the_next_writer(remote):
    url, options = remote
    with CheckpointManager(url, storage_options=options) as manager:
        manager.save(1, {"w": np.zeros(2)})
        manager.save(2, {"w": np.ones(2)})
    fs, root = fsspec.core.url_to_fs(url, **options)
    record = json.loads(fs.cat_file(f"{root}/1/checkpoint.json"))
    record["files"]["w"] = "../2/w.safetensors"  # what cleaning up step 1's leftovers would keep, or delete beside
    fs.pipe_file(f"{root}/1/checkpoint.json", json.dumps(record).encode())
    with (
        CheckpointManager(url, storage_options=options) as manager,
        pytest.raises(FormatError, match=r"names '\.\./2/w\.safetensors', which leads outside the folder") as caught,
    ):
        manager.save(3, {"w": np.ones(2)})
    assert caught.value.file == f"{url}/1/checkpoint.json"
    np.testing.assert_array_equal(CheckpointManager(url, storage_options=options).restore(2)["w"], np.ones(2))


def test_recent_changes_naming_a_folder_outside_the_run_are_not_read(caplog):
    url = f"memory://jaxstow-tests/run-{uuid.uuid4().hex[:8]}"
    with CheckpointManager(url) as manager:
        manager.save(1, {"w": np.zeros(2)})
    fs, root = fsspec.core.url_to_fs(url)
    fs.pipe_file(f"{root}/{RECENT}", json.dumps({"changes": [["1", True], ["../elsewhere", None]]}).encode())
    with CheckpointManager(url) as manager, caplog.at_level("WARNING", logger="jaxstow"):
        manager.save(2, {"w": np.ones(2)})
        assert manager.steps() == [1, 2]
    assert "names '../elsewhere', which leads outside the folder" in caplog.text


def test_a_header_damaged_on_its_way_is_read_again_not_taken_for_a_damaged_step(s3_server):
    # One answer for the first bytes of step 2's item file, its header, with a bit flipped by the network:
    # restore(fallback=True) went back to step 1, and damaged_steps() and latest_intact_step() called step 2 damaged.
    url, options = s3_server.url(f"run-{uuid.uuid4().hex[:8]}"), s3_server.storage_options
    with CheckpointManager(url, storage_options=options) as manager:
        for step in (1, 2):  # a header of 1,500 leaves fills the first request: its middle byte is the header's
            manager.save(step, {f"k{i:04d}": np.full(3, float(step), np.float32) for i in range(1500)})
    header = rf"/{url.rsplit('/', 1)[1]}/2/.*\.safetensors bytes=0-65535$"
    queries = {
        "restore": lambda run: run.restore(fallback=True, as_numpy=True)["k0000"][0] == 2.0,
        "damaged": lambda run: run.damaged_steps(verify="headers") == {},
        "latest": lambda run: run.latest_intact_step(verify="headers") == 2,
    }
    for name, query in queries.items():
        with faulty_proxy(s3_server.endpoint, rate=1.0, kinds=("flip",), paths=header, budget=1) as proxy:
            flaky = {**options, "client_kwargs": {"endpoint_url": proxy.endpoint}}
            assert query(CheckpointManager(url, storage_options=flaky)), name
        assert proxy.faults["flip"] == 1, name
