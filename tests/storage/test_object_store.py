"""Files and checkpoints on a real S3 server (SeaweedFS on the loopback interface): every entry point with URLs and
storage options, saves that appear whole or not at all (a save killed with SIGKILL mid-upload included), the local
cache, the bandwidth cap and the memory a transfer takes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import botocore.client
import forked
import jax.numpy as jnp
import numpy as np
import pytest

import jaxstow
from jaxstow import CheckpointManager, KeepPolicy, Transfer
from jaxstow.errors import ArgumentError, CheckpointError, CorruptFileError, PathNotFoundError, StructureMismatchError

MiB = 1 << 20


@pytest.fixture
def s3(s3_server):
    """The server, a fresh prefix on it, and a plain botocore client to look at what is stored."""
    client = s3_server.client()
    return s3_server, f"t-{uuid.uuid4().hex[:8]}", client


def _unfinished(client, bucket: str, prefix: str) -> list[str]:
    return [upload["Key"] for upload in client.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", [])]


def _exists(client, bucket: str, key: str) -> bool:
    try:
        client.head_object(Bucket=bucket, Key=key)
    except client.exceptions.ClientError:
        return False
    return True


def _tree(mib: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f"w{i}": rng.standard_normal(MiB // 4, dtype=np.float32) for i in range(mib)}


def test_every_entry_point_takes_a_url_and_storage_options(s3):
    server, prefix, _ = s3
    options = server.storage_options
    url = server.url(prefix, "model.jxs")
    tree = {"w": np.arange(6.0, dtype=np.float32).reshape(2, 3), "depth": 2}
    jaxstow.save(url, tree, metadata={"epoch": 1}, storage_options=options)
    assert jaxstow.load(url, storage_options=options, as_numpy=True)["depth"] == 2
    assert jaxstow.load_metadata(url, storage_options=options) == {"epoch": 1}
    with jaxstow.open(url, storage_options=options) as reader:
        np.testing.assert_array_equal(reader.read("w", np.s_[1]), tree["w"][1])
    with CheckpointManager(server.url(prefix, "run"), keep=KeepPolicy(keep_last=1), storage_options=options) as manager:
        manager.save(1, {"params": {"w": jnp.ones(3)}})
        manager.save(2, {"params": {"w": jnp.full(3, 2.0)}})
        assert manager.steps() == [2] and float(manager.restore()["params"]["w"][0]) == 2.0
    objax_dir = server.url(prefix, "objax")
    checkpoint = jaxstow.objax.TreeCheckpoint(objax_dir, keep_ckpts=2, storage_options=options)
    for idx in (1, 2, 3):
        checkpoint.save({"b": jnp.full(2, idx)}, idx)
    restored, idx, path = checkpoint.restore()
    assert (idx, path, int(restored["b"][0]), checkpoint.indices()) == (
        3,
        f"{objax_dir}/ckpt/0000000003.npz",
        3,
        [2, 3],
    )

    class Var:
        def __init__(self, value):
            self.value = value

        def assign(self, value, check=True):
            self.value = value

    variables_dir = server.url(prefix, "objax-variables")
    variables = jaxstow.objax.Checkpoint(variables_dir, keep_ckpts=1, verbose=False, storage_options=options)
    variables.save({"(Linear).w": Var(jnp.ones(2))}, 5)
    fresh = {"(Linear).w": Var(jnp.zeros(2))}
    assert variables.restore(fresh) == (5, f"{variables_dir}/ckpt/0000000005.npz")
    assert float(fresh["(Linear).w"].value[0]) == 1.0


def test_environment_variables_reach_the_store(s3):
    server, prefix, _ = s3
    url = server.url(prefix, "env.jxs")
    script = textwrap.dedent(
        f"""
        import numpy as np, jaxstow
        jaxstow.save({url!r}, {{"w": np.arange(3.0)}})
        print(jaxstow.load({url!r}, as_numpy=True)["w"].tolist())
        """
    )
    clean = {key: value for key, value in os.environ.items() if not key.startswith(("AWS_", "FSSPEC_"))}
    fsspec_env = {"FSSPEC_S3_KEY": "jaxstow", "FSSPEC_S3_SECRET": "jaxstow", "FSSPEC_S3_ENDPOINT_URL": server.endpoint}
    aws_env = {"AWS_ACCESS_KEY_ID": "jaxstow", "AWS_SECRET_ACCESS_KEY": "jaxstow", "AWS_ENDPOINT_URL": server.endpoint}
    for extra in (fsspec_env, aws_env):
        done = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=120,
            env={**clean, **extra, "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": os.devnull},
        )
        assert done.returncode == 0 and done.stdout.strip() == "[0.0, 1.0, 2.0]", done.stderr[-2000:]


def test_an_interrupted_save_leaves_the_previous_object_and_no_upload(s3):
    server, prefix, client = s3
    url = server.url(prefix, "model.jxs")
    options = server.storage_options
    jaxstow.save(url, {"v": np.ones(4)}, storage_options=options)
    slow = Transfer(part_size=5 * MiB, requests=2, max_bytes_per_second=10 * MiB)
    tree = _tree(40)  # 4 s at least at the capped rate, on any machine

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    def swallowed(unraisable):
        # Ctrl-C that lands in a garbage-collection callback or a __del__ is printed and lost, as Python does for a
        # user's Ctrl-C too; the user presses it again, and so does the test.
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            signal.setitimer(signal.ITIMER_REAL, 0.1)
        else:
            previous_hook(unraisable)

    previous = signal.signal(signal.SIGALRM, interrupt)
    previous_hook = sys.unraisablehook
    sys.unraisablehook = swallowed
    signal.setitimer(signal.ITIMER_REAL, 1.5)  # a few parts in
    try:
        with pytest.raises(KeyboardInterrupt):
            jaxstow.save(url, tree, storage_options=options, transfer=slow)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        sys.unraisablehook = previous_hook
    assert jaxstow.load(url, storage_options=options, as_numpy=True)["v"].tolist() == [1.0] * 4
    assert _unfinished(client, server.bucket, prefix) == []


def test_a_save_interrupted_as_its_upload_starts_leaves_the_previous_object_and_no_upload(s3, monkeypatch):
    # Ctrl-C while CreateMultipartUpload is answered: the server made the upload, the saver never learnt its id.
    server, prefix, client = s3
    url = server.url(prefix, "model.jxs")
    options = server.storage_options
    jaxstow.save(url, {"v": np.ones(4)}, storage_options=options)
    answer = botocore.client.BaseClient._make_api_call

    def interrupted_once_answered(self, operation, params):
        answered = answer(self, operation, params)
        if operation == "CreateMultipartUpload":
            raise KeyboardInterrupt
        return answered

    monkeypatch.setattr(botocore.client.BaseClient, "_make_api_call", interrupted_once_answered)
    with pytest.raises(KeyboardInterrupt):
        jaxstow.save(url, _tree(12), storage_options=options, transfer=Transfer(part_size=5 * MiB))
    monkeypatch.undo()
    assert jaxstow.load(url, storage_options=options, as_numpy=True)["v"].tolist() == [1.0] * 4
    assert _unfinished(client, server.bucket, prefix) == []


_KILLED_SAVE = """
import sys, numpy as np, jaxstow
rng = np.random.default_rng(0)
tree = {f"w{i}": rng.standard_normal(1 << 18, dtype=np.float32) for i in range(60)}
options = {"key": "jaxstow", "secret": "jaxstow", "client_kwargs": {"endpoint_url": sys.argv[2]}}
slow = jaxstow.Transfer(part_size=5 << 20, requests=2, max_bytes_per_second=10 << 20)
if sys.argv[3] == "file":
    jaxstow.save(sys.argv[1], tree, storage_options=options, transfer=slow)
else:
    with jaxstow.CheckpointManager(sys.argv[1], storage_options=options, transfer=slow) as manager:
        manager.save(1, {"small": np.ones(2)})
        manager.wait()
        manager.save(2, {"big": tree})
"""


def _kill_mid_upload(client, bucket: str, prefix: str, url: str, endpoint: str, kind: str) -> None:
    """Start a slow save of 60 MiB and SIGKILL it once an upload under ``prefix`` has a part stored."""
    writer = forked.Popen([sys.executable, "-c", _KILLED_SAVE, url, endpoint, kind])
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            uploads = client.list_multipart_uploads(Bucket=bucket, Prefix=prefix).get("Uploads", [])
            if uploads and client.list_parts(Bucket=bucket, Key=uploads[0]["Key"], UploadId=uploads[0]["UploadId"]).get(
                "Parts"
            ):
                break
            assert writer.poll() is None, "the save ended before it could be killed"
            time.sleep(0.05)
        else:
            raise AssertionError("no upload started")
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()


def test_a_save_killed_mid_upload_leaves_the_previous_object_and_the_next_save_aborts_its_upload(s3):
    server, prefix, client = s3
    key = f"{prefix}/model.jxs"
    url = server.url(prefix, "model.jxs")
    options = server.storage_options
    jaxstow.save(url, {"v": np.ones(4)}, storage_options=options)
    _kill_mid_upload(client, server.bucket, prefix, url, server.endpoint, "file")
    # What a SIGKILL leaves: the previous object, whole, and one unfinished upload that no one can complete.
    assert jaxstow.load(url, storage_options=options, as_numpy=True)["v"].tolist() == [1.0] * 4
    assert _unfinished(client, server.bucket, prefix) == [key]
    jaxstow.save(url, {"v": np.zeros(2)}, storage_options=options)  # the next save to the key aborts it
    assert _unfinished(client, server.bucket, prefix) == []
    assert jaxstow.load(url, storage_options=options, as_numpy=True)["v"].tolist() == [0.0, 0.0]


def test_a_program_that_ends_without_closing_its_manager_leaves_no_lock(s3):
    # The lock object stayed, and the next run (on any host) was refused until someone deleted it.
    server, prefix, client = s3
    url = server.url(prefix, "run")
    program = textwrap.dedent(
        f"""
        import json, sys, numpy as np
        from jaxstow import CheckpointManager
        manager = CheckpointManager({url!r}, storage_options=json.loads(sys.argv[1]))
        manager.save(1, {{"w": np.ones(1000)}})  # still being written as the program ends
        """
    )
    ended = forked.run([sys.executable, "-c", program, json.dumps(server.storage_options)], capture_output=True)
    assert ended.returncode == 0, ended.stderr
    assert not _exists(client, server.bucket, f"{prefix}/run/.jaxstow.lock")
    with CheckpointManager(url, storage_options=server.storage_options) as manager:
        assert manager.steps() == [1]
        manager.save(2, {"w": np.ones(2)})


def test_a_new_manager_aborts_the_uploads_a_killed_one_left(s3):
    server, prefix, client = s3
    url = server.url(prefix, "run")
    _kill_mid_upload(client, server.bucket, prefix, url, server.endpoint, "manager")
    assert len(_unfinished(client, server.bucket, prefix)) == 1
    with CheckpointManager(url, storage_options=server.storage_options) as manager:
        assert manager.steps() == [1]
        manager.save(3, {"small": np.zeros(2)})
    assert _unfinished(client, server.bucket, prefix) == []
    assert not _exists(client, server.bucket, f"{prefix}/run/2/checkpoint.json")


def test_jaxstow_uploads_lists_and_aborts_unfinished_uploads(s3):
    server, prefix, client = s3
    key = f"{prefix}/left/model.jxs"
    upload = client.create_multipart_upload(Bucket=server.bucket, Key=key)["UploadId"]
    client.upload_part(Bucket=server.bucket, Key=key, UploadId=upload, PartNumber=1, Body=b"x" * MiB)
    options = ["--storage-options", json.dumps(server.storage_options)]

    def command(*args: str) -> subprocess.CompletedProcess[str]:
        return forked.run(
            [sys.executable, "-m", "jaxstow", "uploads", server.url(prefix), *options, *args],
            capture_output=True,
            text=True,
            timeout=120,
        )

    listed = command("--json")
    assert listed.returncode == 0 and json.loads(listed.stdout)["unfinished"][0]["key"] == f"s3://{server.bucket}/{key}"
    assert "0 uploads aborted" in command("--abort", "--older-than", "3600").stdout  # too recent
    refused = command("--abort", "--older-than", "nan")  # it matched no upload, and said "0 aborted"
    assert refused.returncode == 2 and "'nan' is no number of seconds" in refused.stderr
    sibling = f"{prefix}/left2/model.jxs"  # a folder beside left/, whose name starts alike: not under left/
    client.create_multipart_upload(Bucket=server.bucket, Key=sibling)
    left = forked.run(
        [sys.executable, "-m", "jaxstow", "uploads", server.url(prefix, "left"), *options, "--abort"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "1 upload aborted" in left.stdout, left.stdout + left.stderr
    assert _unfinished(client, server.bucket, prefix) == [sibling]
    assert "1 upload aborted" in command("--abort").stdout
    assert _unfinished(client, server.bucket, prefix) == []


def test_jaxstow_uploads_of_a_folder_aborts_only_what_lies_in_it_whatever_the_keys(s3, capsys):
    from jaxstow.cli import main

    server, prefix, client = s3
    inside = [f"{prefix}/run/{name}" for name in ("1/model.jxs", "L" * 900, "new\nline [31m", "sp ace %2F+")]
    spared = [f"{prefix}/run", f"{prefix}/run2/model.jxs", f"{prefix}/runx", f"{prefix}/other/run/model.jxs"]
    for key in inside + spared:
        client.create_multipart_upload(Bucket=server.bucket, Key=key)
    options = ["--storage-options", json.dumps(server.storage_options)]
    assert main(["uploads", server.url(prefix, "run/"), *options, "--abort"]) == 0  # the folder: not the file "run"
    assert f"{len(inside)} uploads aborted under" in capsys.readouterr().out
    assert sorted(_unfinished(client, server.bucket, prefix)) == sorted(spared)


def test_jaxstow_uploads_says_which_uploads_an_abort_left_unfinished(s3, capsys):
    from jaxstow.cli import main

    server, prefix, client = s3
    client.create_multipart_upload(Bucket=server.bucket, Key=f"{prefix}/run/model.jxs")
    odd = client.create_multipart_upload(Bucket=server.bucket, Key=f"{prefix}/run/a\x01b")["UploadId"]
    # the server lists the key with U+FFFD for the control character: an abort of that key finds no upload
    options = ["--storage-options", json.dumps(server.storage_options)]
    assert main(["uploads", server.url(prefix), *options, "--abort"]) == 2
    out, err = capsys.readouterr()
    assert "1 upload aborted under" in out  # model.jxs; the other was said to be aborted too
    assert f"{server.url(prefix)}: 1 upload still unfinished after aborting: " in err
    assert f"(upload id {odd}): the server lists the key otherwise than it was written" in err
    assert len(_unfinished(client, server.bucket, prefix)) == 1


def test_a_manager_of_a_mistyped_bucket_makes_no_bucket(s3):
    server, prefix, client = s3
    url = f"s3://{server.bucket}-typo/{prefix}/run"  # s3fs's makedirs made the bucket, and the run went there
    with pytest.raises(PathNotFoundError, match=r"no bucket '.*-typo': the storage has none of that name"):
        CheckpointManager(url, storage_options=server.storage_options).save(1, {"w": np.ones(2)})
    assert f"{server.bucket}-typo" not in [bucket["Name"] for bucket in client.list_buckets()["Buckets"]]


def test_a_storage_option_s3fs_does_not_know_is_named_with_the_fix(s3):
    server, prefix, _ = s3
    options = {**server.storage_options, "region_name": "us-east-1"}  # belongs in client_kwargs: botocore's TypeError
    with pytest.raises(ArgumentError, match=r"storage_options .*'region_name'.* goes in client_kwargs"):
        jaxstow.save(server.url(prefix, "model.jxs"), {"w": np.ones(2)}, storage_options=options)


def test_a_cached_file_is_read_from_the_local_disk_while_its_header_matches(s3, tmp_path):
    server, prefix, client = s3
    url, key = server.url(prefix, "model.jxs"), f"{prefix}/model.jxs"
    options = server.storage_options
    jaxstow.save(url, {"w": np.arange(1000.0)}, storage_options=options)
    assert jaxstow.load(url, storage_options=options, cache_dir=tmp_path, as_numpy=True)["w"][5] == 5.0
    data = bytearray(client.get_object(Bucket=server.bucket, Key=key)["Body"].read())
    data[-8:] = np.full(1, -1.0).tobytes()  # the last value changed in the store, the header kept
    client.put_object(Bucket=server.bucket, Key=key, Body=bytes(data))
    with pytest.raises(CorruptFileError):
        jaxstow.load(url, storage_options=options)
    assert jaxstow.load(url, storage_options=options, cache_dir=tmp_path, as_numpy=True)["w"][-1] == 999.0
    jaxstow.save(url, {"w": np.zeros(3)}, storage_options=options)  # another header: fetched again
    assert jaxstow.load(url, storage_options=options, cache_dir=tmp_path, as_numpy=True)["w"].tolist() == [0.0] * 3


_READS_OF_W = {
    "load": lambda url, **options: jaxstow.load(url, as_numpy=True, **options)["w"],
    "reader[path]": lambda url, **options: _read_open(url, lambda reader: reader["w"], **options),
    "reader.read": lambda url, **options: _read_open(url, lambda reader: reader.read("w"), **options),
    "reader.load": lambda url, **options: _read_open(url, lambda reader: reader.load(as_numpy=True)["w"], **options),
}


def _read_open(url, read, **options):
    with jaxstow.open(url, **options) as reader:
        return read(reader)


@pytest.mark.parametrize("read", _READS_OF_W.values(), ids=_READS_OF_W.keys())
def test_a_cached_copy_damaged_on_the_local_disk_is_fetched_again(s3, tmp_path, read):
    """Was, for an open reader: the copy's damage raised at every read, for good, as the file's."""
    server, prefix, client = s3
    url, options = server.url(prefix, "model.jxs"), server.storage_options
    jaxstow.save(url, {"w": np.arange(1000.0)}, storage_options=options)
    assert jaxstow.load(url, storage_options=options, cache_dir=tmp_path, as_numpy=True)["w"][-1] == 999.0
    copy = next(path for path in tmp_path.rglob("model.jxs"))
    data = bytearray(copy.read_bytes())
    data[-8:] = np.full(1, -1.0).tobytes()  # the copy's last value damaged, its header kept: the store's intact
    copy.write_bytes(bytes(data))
    np.testing.assert_array_equal(read(url, storage_options=options, cache_dir=tmp_path), np.arange(1000.0))
    assert copy.read_bytes()[-8:] == np.full(1, 999.0).tobytes()  # the copy fetched again
    copy.write_bytes(bytes(data))
    client.put_object(Bucket=server.bucket, Key=f"{prefix}/model.jxs", Body=bytes(data))  # the store's damaged too
    with pytest.raises(CorruptFileError, match="checksum mismatch"):
        read(url, storage_options=options, cache_dir=tmp_path)


def test_a_cached_copy_cut_short_is_fetched_again_for_a_load_an_open_and_its_metadata(s3, tmp_path):
    """Was: a TruncatedFileError naming the copy at every read, for good: its header is read when the file is
    opened, before the reads that fetch a damaged copy again."""
    server, prefix, _ = s3
    url, options = server.url(prefix, "model.jxs"), server.storage_options
    jaxstow.save(url, {"w": np.arange(1000.0)}, storage_options=options, metadata={"epoch": 3})
    jaxstow.load(url, storage_options=options, cache_dir=tmp_path)
    copy = next(path for path in tmp_path.rglob("model.jxs"))
    whole = copy.read_bytes()
    reads = [
        lambda: jaxstow.load(url, storage_options=options, cache_dir=tmp_path, as_numpy=True)["w"].tolist(),
        lambda: jaxstow.open(url, storage_options=options, cache_dir=tmp_path).read("w").tolist(),
        lambda: jaxstow.load_metadata(url, storage_options=options, cache_dir=tmp_path),
    ]
    for read, expected in zip(reads, [np.arange(1000.0).tolist()] * 2 + [{"epoch": 3}], strict=True):
        copy.write_bytes(whole[: len(whole) // 2])  # as a full disk or a crash leaves a copy written in place
        assert read() == expected
        assert copy.read_bytes() == whole  # the copy fetched again


def test_a_steps_cached_copy_cut_short_or_grown_is_fetched_again_within_the_restore(s3, tmp_path):
    # was: "found damaged: it is fetched again", then ClosedError from that restore (the copy given to it, already
    # open, was closed and handed back again); only the next restore fetched it
    server, prefix, _ = s3
    url, options = server.url(prefix, "run"), server.storage_options
    with CheckpointManager(url, storage_options=options, cache_dir=tmp_path) as manager:
        manager.save(3, {"a": np.full(4096, 3.0), "b": np.arange(8)})
        manager.restore()  # the cache holds step 3
    [copy] = [path for path in tmp_path.rglob("a.safetensors") if path.parent.name == "3"]
    whole = copy.read_bytes()
    for changed in (whole[: len(whole) // 2], whole + b"\0" * 100):
        copy.write_bytes(changed)
        with CheckpointManager(url, storage_options=options, cache_dir=tmp_path) as manager:
            assert manager.restore(as_numpy=True)["a"].tolist() == [3.0] * 4096
        assert copy.read_bytes() == whole  # the copy fetched again


def test_a_step_restored_again_from_the_cache_needs_no_file_from_the_store(s3, tmp_path):
    server, prefix, client = s3
    url = server.url(prefix, "run")
    options = server.storage_options
    state = {"params": {"w": np.arange(100.0)}, "opt": {"mu": np.ones(10)}}
    with CheckpointManager(url, storage_options=options, cache_dir=tmp_path) as manager:
        manager.save(7, state)
        first = manager.restore(as_numpy=True)
    for item in ("params", "opt"):
        client.delete_object(Bucket=server.bucket, Key=f"{prefix}/run/7/{item}.safetensors")
    with CheckpointManager(url, storage_options=options, cache_dir=tmp_path) as manager:
        again = manager.restore(as_numpy=True)
    np.testing.assert_array_equal(again["params"]["w"], first["params"]["w"])
    with CheckpointManager(url, storage_options=options) as manager, pytest.raises(CheckpointError, match="missing"):
        manager.restore()


def test_a_cached_copy_gone_bad_is_fetched_again_and_never_makes_its_step_damaged(s3, tmp_path):
    # The copy's damage made the step damaged: restore(fallback=True) went back to step 1, and so did
    # latest_intact_step, though step 2 was intact in the store.
    server, prefix, _ = s3
    url, options = server.url(prefix, "run"), server.storage_options
    with CheckpointManager(url, storage_options=options, cache_dir=tmp_path) as manager:
        for step in (1, 2):
            manager.save(step, {"w": np.full(64, float(step))})
        manager.restore()  # the cache holds step 2
    [copy] = [path for path in tmp_path.rglob("w.safetensors") if path.parent.name == "2"]
    data = bytearray(copy.read_bytes())
    data[-1] ^= 1  # bit rot on the local disk
    copy.write_bytes(bytes(data))
    with CheckpointManager(url, storage_options=options, cache_dir=tmp_path) as manager:
        assert manager.restore(fallback=True, as_numpy=True)["w"][0] == 2.0 and manager.restored.step == 2
    copy.write_bytes(bytes(data))
    with CheckpointManager(url, storage_options=options, cache_dir=tmp_path) as manager:
        assert manager.latest_intact_step() == 2 and manager.damaged_steps() == {}


def test_the_bandwidth_cap_is_never_exceeded(s3):
    """The cap paces requests, so no machine moves the bytes faster than it (10% for what is not paced: the header's
    request); a slower machine may take longer, down to a third of the cap, far below what the loopback server
    gives."""
    server, prefix, _ = s3
    url = server.url(prefix, "capped.jxs")
    options = server.storage_options
    cap = 4 * MiB
    capped = Transfer(part_size=5 * MiB, requests=4, max_bytes_per_second=cap)
    tree = _tree(12)  # three parts, in flight at once
    start = time.monotonic()
    jaxstow.save(url, tree, storage_options=options, transfer=capped)
    saved = time.monotonic() - start
    start = time.monotonic()
    jaxstow.load(url, storage_options=options, transfer=capped, as_numpy=True)
    loaded = time.monotonic() - start
    size = 12 * MiB + 4096
    for seconds in (saved, loaded):
        assert cap / 3 <= size / seconds <= 1.1 * cap, (size / seconds / MiB, saved, loaded)


def test_a_capped_restore_of_many_small_items_is_paced_by_their_bytes(s3):
    """Each item's first request asks for a whole part, of which a small item fills little: the cap counts the bytes
    that come, so 16 items of 256 KiB under a cap of 4 MiB/s take about a second, not the 20 s that 16 parts of
    5 MiB would."""
    server, prefix, _ = s3
    url = server.url(prefix, "run")
    options = server.storage_options
    items = {f"item{i}": {"w": np.full(MiB // 16, i, np.float32)} for i in range(16)}
    with CheckpointManager(url, storage_options=options) as manager:
        manager.save(1, items)
    cap = 4 * MiB
    capped = Transfer(part_size=5 * MiB, requests=4, max_bytes_per_second=cap)
    with CheckpointManager(url, storage_options=options, transfer=capped) as manager:
        start = time.monotonic()
        restored = manager.restore(as_numpy=True)
        seconds = time.monotonic() - start
    assert all(np.array_equal(restored[name]["w"], item["w"]) for name, item in items.items())
    size = 16 * (MiB // 4 + 4096)
    assert cap / 3 <= size / seconds <= 1.1 * cap, (size / seconds / MiB, seconds)


_MEMORY = """
import sys, numpy as np, jaxstow
sys.path.insert(0, "bench")
from timing import measure
options = {"key": "jaxstow", "secret": "jaxstow", "client_kwargs": {"endpoint_url": sys.argv[2]}}
transfer = jaxstow.Transfer(part_size=8 << 20, requests=4)
tree = {f"w{i}": np.random.default_rng(i).standard_normal(4 << 20, dtype=np.float32) for i in range(8)}
jaxstow.save(sys.argv[1] + "-warm", {"w": np.ones(3)}, storage_options=options, transfer=transfer)
jaxstow.load(sys.argv[1] + "-warm", storage_options=options, transfer=transfer)
save = measure(lambda: jaxstow.save(sys.argv[1], tree, storage_options=options, transfer=transfer))
load = measure(lambda: jaxstow.load(sys.argv[1], storage_options=options, transfer=transfer, as_numpy=True))
print(save.peak_bytes, load.peak_bytes)
"""


def test_a_transfer_takes_no_more_memory_than_the_tree_and_the_parts_in_flight(s3):
    server, prefix, _ = s3
    done = subprocess.run(
        [sys.executable, "-c", _MEMORY, server.url(prefix, "big.jxs"), server.endpoint],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    save_peak, load_peak = map(int, done.stdout.split())
    tree, parts, slack = 128 * MiB, 4 * 8 * MiB, 16 * MiB
    assert save_peak <= parts + slack, save_peak / MiB
    assert load_peak <= tree + parts + slack, load_peak / MiB


def test_a_step_of_many_items_reads_each_file_with_one_request_per_part(s3):
    """Each item's header comes with the first part of its data, in one request; each later request starts where a
    part of the file starts (a multiple of part_size), never a few bytes past one, so that no part of the store's is
    read twice."""
    from jaxstow._storage.remote import url_filesystem
    from jaxstow._storage.s3 import _client

    server, prefix, _ = s3
    url = server.url(prefix, "run")
    options = server.storage_options
    transfer = Transfer(part_size=5 * MiB, requests=4)
    # Leaves of 1 to 17 MiB after a 4 KiB header: files of 1 to 4 parts, the last of a few bytes for some.
    sizes = {"a": MiB, "b": 5 * MiB - 4096, "c": 5 * MiB, "d": 6 * MiB, "e": 11 * MiB, "f": 17 * MiB}
    items = {name: {"w": np.full(size // 4, i, np.float32)} for i, (name, size) in enumerate(sizes.items())}
    ranges: dict[str, list[tuple[int, int]]] = {}

    def seen(params, **_):
        start, _, end = params["Range"].removeprefix("bytes=").partition("-")
        ranges.setdefault(params["Key"].rsplit("/", 1)[-1].split(".")[0], []).append((int(start), int(end)))

    client = _client(url_filesystem(url, options)[0], transfer.requests).client
    with CheckpointManager(url, storage_options=options, transfer=transfer) as manager:
        manager.save(1, items)
        manager.wait()
        client.meta.events.register("provide-client-params.s3.GetObject", seen)
        try:
            restored = manager.restore(as_numpy=True)
        finally:
            client.meta.events.unregister("provide-client-params.s3.GetObject", seen)
    assert all(np.array_equal(restored[name]["w"], item["w"]) for name, item in items.items())
    part = transfer.part_size
    for name, size in sizes.items():
        asked = sorted(ranges[name])
        assert asked[0][0] == 0 and asked[0][1] >= min(part, size + 4096) - 1, (name, asked)  # header and data
        assert all(start % part == 0 for start, _ in asked[1:]), (name, asked)
        assert len(asked) <= -(-(size + 4096) // part), (name, asked)  # at most one request per part of the file
    assert {name: len(asked) for name, asked in ranges.items()} == {"a": 1, "b": 1, "c": 2, "d": 2, "e": 2, "f": 4}


def test_a_file_of_many_leaves_is_read_in_requests_that_start_where_its_parts_start(s3):
    """The leaves of one file lie one after another from its 4 KiB header on: each request after the header's
    starts at a multiple of part_size, one request reading the end of a leaf and the start of the next, never a
    request per leaf a few bytes past a part's start (the store would read two parts for each)."""
    from jaxstow._storage.remote import url_filesystem
    from jaxstow._storage.s3 import _client

    server, prefix, _ = s3
    url = server.url(prefix, "leaves.jxs")
    options = server.storage_options
    transfer = Transfer(part_size=5 * MiB, requests=4)
    tree = {f"w{i}": np.full(size // 4, i, np.float32) for i, size in enumerate((5 * MiB, 5 * MiB, 7 * MiB, 3 * MiB))}
    jaxstow.save(url, tree, storage_options=options, transfer=transfer)
    starts: list[int] = []

    def seen(params, **_):
        starts.append(int(params["Range"].removeprefix("bytes=").partition("-")[0]))

    client = _client(url_filesystem(url, options)[0], transfer.requests).client
    client.meta.events.register("provide-client-params.s3.GetObject", seen)
    try:
        loaded = jaxstow.load(url, storage_options=options, transfer=transfer, as_numpy=True)
    finally:
        client.meta.events.unregister("provide-client-params.s3.GetObject", seen)
    assert all(np.array_equal(loaded[name], leaf) for name, leaf in tree.items())
    head, first, *rest = sorted(starts)
    assert (head, first) == (0, 4096), starts  # the header, then the data from its start
    assert rest == [part * transfer.part_size for part in range(1, 4)], starts  # 20 MiB and 4 KiB: 4 parts


def test_first_answers_of_a_restore_that_fails_before_its_reads_are_let_go(s3):
    """Restores refused after the items are opened (``like`` does not fit) leave no answer half read: the restore
    after them still gets each item's header and data in one request, as it would with none failed before."""
    from jaxstow._storage.remote import url_filesystem
    from jaxstow._storage.s3 import _client

    server, prefix, _ = s3
    url = server.url(prefix, "run")
    options = server.storage_options
    transfer = Transfer(part_size=5 * MiB, requests=2)
    items = {f"item{i}": {"w": np.full(MiB // 4, i, np.float32)} for i in range(6)}
    wrong = {name: {"w": np.zeros(3, np.float32)} for name in items}
    calls: list[str] = []

    def count(**_):
        calls.append("GetObject")

    client = _client(url_filesystem(url, options)[0], transfer.requests).client
    with CheckpointManager(url, storage_options=options, transfer=transfer) as manager:
        manager.save(1, items)
        manager.wait()
        for _ in range(3):
            with pytest.raises(StructureMismatchError):
                manager.restore(like=wrong)
        client.meta.events.register("before-call.s3.GetObject", count)
        try:
            restored = manager.restore(as_numpy=True)
        finally:
            client.meta.events.unregister("before-call.s3.GetObject", count)
    assert all(np.array_equal(restored[name]["w"], item["w"]) for name, item in items.items())
    assert len(calls) == len(items)


def test_a_missing_object_is_named(s3):
    server, prefix, _ = s3
    with pytest.raises(PathNotFoundError, match="no such file"):
        jaxstow.load(server.url(prefix, "nothing.jxs"), storage_options=server.storage_options)


def test_every_command_takes_urls_and_storage_options(s3, tmp_path, capsys):
    from jaxstow.cli import main

    server, prefix, _ = s3
    options = ["--storage-options", json.dumps(server.storage_options), "--transfer", '{"requests": 4}']
    a, b = server.url(prefix, "a.jxs"), server.url(prefix, "b.jxs")
    jaxstow.save(a, {"w": np.ones(3, np.float32)}, storage_options=server.storage_options)
    run = server.url(prefix, "run")
    with CheckpointManager(run, storage_options=server.storage_options) as manager:
        manager.save(1, {"w": np.ones(3, np.float32)})
    assert main(["convert", a, b, *options]) == 0
    assert main(["convert", b, str(tmp_path / "b.safetensors"), *options]) == 0
    assert main(["inspect", b, *options]) == 0
    assert main(["diff", a, b, *options]) == 0
    assert main(["verify", run, *options]) == 0
    assert main(["ls", run, *options]) == 0
    assert main(["uploads", server.url(prefix), *options]) == 0
    out = capsys.readouterr().out
    assert f"{a} (jaxstow) -> {b} (jaxstow)" in out and "the same: 1 leaves" in out and "1 file intact" in out
    assert main(["inspect", b, "--storage-options", "[1]"]) == 2
    assert "--storage-options must be a JSON object" in capsys.readouterr().err


def test_a_reader_that_listed_a_step_being_written_reads_it_once_committed(s3):
    # fsspec kept the listing of the step's folder made while it was written (no checkpoint.json yet): every later
    # read of this process then found "no checkpoint.json any more", even after the writer had finished.
    server, prefix, client = s3
    url, options = server.url(prefix), server.storage_options
    with CheckpointManager(url, storage_options=options) as writer:
        writer.save(1, {"w": np.ones(3)})
    with CheckpointManager(server.url(prefix + "-other"), storage_options=options) as other:
        other.save(2, {"w": np.full(3, 2.0)})  # step 2, written elsewhere and copied in as a writer writes it

    def copy(name: str) -> None:
        source = {"Bucket": server.bucket, "Key": f"{prefix}-other/2/{name}"}
        client.copy_object(Bucket=server.bucket, Key=f"{prefix}/2/{name}", CopySource=source)

    copy("w.safetensors")
    reader = CheckpointManager(url, storage_options=options)
    assert reader.steps() == [1] and float(reader.restore()["w"][0]) == 1.0  # lists 2/ without its record
    copy("checkpoint.json")  # the step committed
    assert reader.steps() == [1, 2]
    assert float(reader.restore()["w"][0]) == 2.0 and float(reader.restore(2)["w"][0]) == 2.0
    reader.close()


def test_a_file_is_not_saved_over_a_folder_of_the_store_nor_at_a_url_naming_one(s3):
    # It was, as an object beside the run's steps: `jaxstow verify` of the run then read the object, "intact".
    server, prefix, _ = s3
    options = server.storage_options
    with CheckpointManager(server.url(prefix, "run"), storage_options=options) as manager:
        manager.save(1, {"w": np.ones(3)})
    for target in (server.url(prefix, "run"), server.url(prefix, "run") + "/", server.url(prefix, "new") + "/"):
        with pytest.raises(jaxstow.errors.IsAFolderError, match="is a folder"):
            jaxstow.save(target, {"w": np.zeros(2)}, storage_options=options)
    with CheckpointManager(server.url(prefix, "run"), storage_options=options) as manager:
        assert manager.steps() == [1] and float(manager.restore()["w"][0]) == 1.0
    jaxstow.save(server.url(prefix, "run.jxs"), {"w": np.zeros(2)}, storage_options=options)  # beside it: a file


def test_a_manager_of_a_mistyped_bucket_finds_no_step_by_naming_the_bucket(s3):
    server, prefix, _ = s3
    manager = CheckpointManager(f"s3://{server.bucket}-typo/{prefix}/run", storage_options=server.storage_options)
    # was: None and [], as for a run not begun: a resume started over from step 0
    for query in (manager.latest_step, manager.steps, manager.restore):
        with pytest.raises(PathNotFoundError, match=r"no bucket '.*-typo': the storage has none of that name"):
            query()
    assert CheckpointManager(server.url(prefix, "new-run"), storage_options=server.storage_options).steps() == []
