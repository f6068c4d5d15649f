"""Reads from a bucket that misbehaves as real ones do, through a proxy in front of the loopback S3 server
(``tests/support/faulty_proxy.py``) that answers a seeded fraction of requests with ``503 SlowDown``, ``500``, a
reset, a body cut short, a slow answer or a stalled body.

Loads, lazy reads and restores are retried with backoff and come back bit-exact; a read that fails every time is a
``StorageError`` saying it is the storage (the URL, the operation, the attempts, the last failure), never damage, and
``restore(fallback=True)`` then ends with it instead of going on to an older step. Real damage is still damage.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import botocore.exceptions
import numpy as np
import pytest
from faulty_proxy import KINDS, FaultyProxy, faulty_proxy

import jaxstow
from jaxstow import CheckpointManager, Transfer
from jaxstow._storage.retrying import BrokenBody, transient
from jaxstow.errors import ArgumentError, CorruptFileError, FormatError, StorageError, TruncatedFileError

MiB = 1 << 20
TRIALS = 10
#: Short backoffs, so that a hundred faults cost a second; 5 attempts, as botocore's default.
FAST = Transfer(part_size=5 * MiB, requests=4, attempts=5, backoff=0.02)


@dataclasses.dataclass
class Bucket:
    proxy: FaultyProxy
    client: Any  # plain botocore, straight to the server
    bucket: str
    prefix: str
    options: dict[str, Any]  # through the proxy
    model: dict[str, np.ndarray]
    steps: dict[int, dict[str, Any]]

    def url(self, *parts: str) -> str:
        return "/".join(("s3:/", self.bucket, self.prefix, *parts))

    @contextlib.contextmanager
    def faults(self, rate: float, kinds: tuple[str, ...] = KINDS, **only: Any) -> Iterator[FaultyProxy]:
        """Faults at ``rate`` while the block runs (``only``: the proxy's ``paths``, ``methods`` or ``budget``); a
        clean proxy again after it."""
        proxy = self.proxy
        settings = {"paths": "", "methods": proxy.methods, "budget": None}
        proxy.rate, proxy.kinds = rate, kinds
        for name, value in {**settings, **only}.items():
            setattr(proxy, name, value)
        proxy.faults.clear()
        try:
            yield proxy
        finally:
            proxy.rate = 0.0
            for name, value in settings.items():
                setattr(proxy, name, value)


def _step(step: int) -> dict[str, Any]:
    return {
        "params": {f"w{i}": np.full(MiB // 4, 10 * step + i, np.float32) for i in range(3)},
        "opt": {"mu": np.full(MiB // 8, -step, np.float32)},
    }


@pytest.fixture(scope="module")
def bucket(s3_server) -> Iterator[Bucket]:
    """A model file of 6 MiB, a run of two intact steps and a run whose newest step has a flipped bit, all saved
    straight to the server; the proxy in front of it, clean until a test asks for faults."""
    prefix = f"flaky-{uuid.uuid4().hex[:8]}"
    rng = np.random.default_rng(0)
    model = {f"w{i}": rng.standard_normal(MiB // 4, dtype=np.float32) for i in range(6)}
    steps = {step: _step(step) for step in (1, 2)}
    direct = s3_server.storage_options
    jaxstow.save(s3_server.url(prefix, "model.jxs"), model, storage_options=direct, transfer=FAST)
    for run in ("run", "damaged"):
        with CheckpointManager(s3_server.url(prefix, run), storage_options=direct, transfer=FAST) as manager:
            for step, state in steps.items():
                manager.save(step, state)
    client = s3_server.client()
    key = f"{prefix}/damaged/2/params.safetensors"
    data = bytearray(client.get_object(Bucket=s3_server.bucket, Key=key)["Body"].read())
    data[-100] ^= 1  # one bit of the newest step's data, as a disk flips it
    client.put_object(Bucket=s3_server.bucket, Key=key, Body=bytes(data))
    methods = ("GET", "HEAD", "PUT", "POST", "DELETE")
    with faulty_proxy(s3_server.endpoint, rate=0.0, seed=39, slow_seconds=2.5, methods=methods) as proxy:
        options = {
            **direct,
            "client_kwargs": {"endpoint_url": proxy.endpoint},
            "config_kwargs": {"read_timeout": 1.2, "connect_timeout": 2},  # a slow answer times out
        }
        yield Bucket(proxy, client, s3_server.bucket, prefix, options, model, steps)


def _same(tree: dict[str, Any], expected: dict[str, Any]) -> bool:
    return tree.keys() == expected.keys() and all(
        _same(tree[key], value) if isinstance(value, dict) else np.array_equal(tree[key], value)
        for key, value in expected.items()
    )


def _tally(call: Callable[[], bool], trials: int = TRIALS) -> tuple[int, list[BaseException]]:
    """How many of ``trials`` calls came back right; the storage errors of the others. Damage reported, or values
    that are not the ones saved, fail the test."""
    right, failures = 0, []
    for _ in range(trials):
        try:
            same = call()
        except (FormatError, jaxstow.errors.CheckpointError) as error:
            raise AssertionError(f"damage reported where there is none: {error!r}") from error
        except StorageError as error:
            failures.append(error)
            continue
        assert same, f"{call.__name__} came back with values other than those saved"
        right += 1
    return right, failures


def test_loads_and_lazy_reads_at_8_percent_faults_come_back_right(bucket):
    url = bucket.url("model.jxs")
    model = bucket.model

    def load() -> bool:
        return _same(jaxstow.load(url, storage_options=bucket.options, transfer=FAST, as_numpy=True), model)

    def lazy() -> bool:
        with jaxstow.open(url, storage_options=bucket.options, transfer=FAST) as reader:
            rows = np.asarray(reader.read("w3", np.s_[1000:200_000]))
            return np.array_equal(rows, model["w3"][1000:200_000]) and np.array_equal(reader.read("w5"), model["w5"])

    with bucket.faults(0.08) as proxy:
        for call in (load, lazy):
            right, failures = _tally(call)
            assert right >= 9, failures
    assert sum(proxy.faults.values()) >= 3 and len(proxy.faults) >= 2, proxy.faults  # 6 of 4 kinds, as seeded


def test_restores_at_8_percent_faults_come_back_right_and_skip_only_the_damaged_step(bucket):
    expected = bucket.steps[2]

    def manager(run: str) -> CheckpointManager:
        return CheckpointManager(bucket.url(run), storage_options=bucket.options, transfer=FAST)

    def restore() -> bool:
        return _same(manager("run").restore(as_numpy=True), expected)

    def fallback() -> bool:
        run = manager("run")
        tree = run.restore(fallback=True, as_numpy=True)
        assert run.restored is not None and (run.restored.step, run.restored.skipped) == (2, {}), run.restored
        return _same(tree, expected)

    def fallback_past_damage() -> bool:
        run = manager("damaged")
        tree = run.restore(fallback=True, as_numpy=True)
        assert run.restored is not None and run.restored.step == 1, run.restored
        assert list(run.restored.skipped) == [2] and "checksum" in run.restored.skipped[2], run.restored.skipped
        return _same(tree, bucket.steps[1])

    def queries() -> bool:
        run = manager("run")
        return run.latest_intact_step() == 2 and run.damaged_steps() == {}

    with bucket.faults(0.08) as proxy:
        for call, trials in ((restore, TRIALS), (fallback, TRIALS), (fallback_past_damage, 3), (queries, 3)):
            right, failures = _tally(call, trials)
            assert right >= trials - trials // 10, (call.__name__, failures)
    assert sum(proxy.faults.values()) >= 10, proxy.faults


@pytest.mark.parametrize(
    ("kinds", "paths"),
    [
        (("503", "500", "reset", "short"), r"/run/2/.*\.safetensors"),  # every request for step 2's files
        # Their headers read whole, their data cut short (a first request that brings data with the header included).
        (("short",), r"/run/2/.*\.safetensors bytes=(?!0-65535$)"),
    ],
    ids=["every-request", "data-cut-short"],
)
def test_a_step_whose_files_always_fail_is_a_storage_error_and_no_older_step_is_restored(bucket, kinds, paths):
    """Step 2's files cannot be read: each call says the storage failed, and none skips step 2 as damaged."""
    run = CheckpointManager(bucket.url("run"), storage_options=bucket.options, transfer=FAST)
    calls = {
        "restore": lambda: run.restore(),
        "fallback": lambda: run.restore(fallback=True),
        "latest_intact_step": run.latest_intact_step,
        "damaged_steps": run.damaged_steps,
    }
    with bucket.faults(1.0, kinds=kinds, paths=paths):
        for name, call in calls.items():
            with pytest.raises(StorageError) as caught:
                call()
            message = str(caught.value)
            assert not isinstance(caught.value, FormatError), name
            assert message.startswith(f"{bucket.url('run', '2')}/"), (name, message)
            assert "the storage failed: reading" in message and "(GetObject) failed 5 times (the last: " in message
            assert "this is the storage, not the file" in message, message
            assert "jaxstow.Transfer(attempts=..., backoff=...) (now 5 attempts" in message, message
            assert "from the command line, the environment's AWS_MAX_ATTEMPTS" in message, message
    assert run.restored is None


def test_a_body_cut_short_every_time_is_a_storage_error_not_a_truncated_file(bucket):
    url = bucket.url("model.jxs")
    fewer = {**bucket.options, "config_kwargs": {**bucket.options["config_kwargs"], "retries": {"max_attempts": 1}}}
    quick = Transfer(part_size=5 * MiB, backoff=0.02)  # attempts: what the storage options say
    with bucket.faults(1.0, kinds=("short",), paths="model"):
        with pytest.raises(StorageError) as caught:
            jaxstow.load(url, storage_options=fewer, transfer=quick)
        assert str(caught.value).startswith(f"{url}: the storage failed: reading its first 65536 bytes (GetObject)")
        assert "failed 2 times (the last: " in str(caught.value)  # one attempt and botocore's max_attempts=1 retry
        with pytest.raises(StorageError, match=r"first 65536 bytes \(GetObject\) failed 3 times \(the last: "):
            jaxstow.open(url, storage_options=fewer, transfer=dataclasses.replace(quick, attempts=3))
    with jaxstow.open(url, storage_options=bucket.options, transfer=FAST) as reader:
        with bucket.faults(1.0, kinds=("short",)), pytest.raises(StorageError) as caught:
            reader.read("w4")
        assert not isinstance(caught.value, TruncatedFileError)
        # Each attempt takes up the rest where the one before broke off: half of 1 MiB, half of the rest, ...
        assert "broke off after 32768 of the 65536 bytes it promised" in str(caught.value), caught.value


def test_a_file_really_cut_short_in_the_bucket_is_still_damage(bucket):
    key = f"{bucket.prefix}/cut.jxs"
    whole = bucket.client.get_object(Bucket=bucket.bucket, Key=f"{bucket.prefix}/model.jxs")["Body"].read()
    bucket.client.put_object(Bucket=bucket.bucket, Key=key, Body=whole[: len(whole) - MiB])
    with pytest.raises(TruncatedFileError, match=f"but the file has only {len(whole) - MiB} bytes"):
        jaxstow.load(bucket.url("cut.jxs"), storage_options=bucket.options, transfer=FAST)


def test_saves_at_20_percent_faults_on_every_request_succeed(bucket):
    """Writes are retried under the same policy: a save of two parts, and steps saved by a manager."""
    url, run_url = bucket.url("saved.jxs"), bucket.url("saved-run")
    with bucket.faults(0.2, kinds=("503", "500", "reset", "short")) as proxy:
        for trial in range(2):
            jaxstow.save(url, {**bucket.model, "trial": np.int32(trial)}, storage_options=bucket.options, transfer=FAST)
        with CheckpointManager(run_url, storage_options=bucket.options, transfer=FAST, keep_last=1) as manager:
            for step in (1, 2):
                manager.save(step, _step(step))
    assert sum(proxy.faults.values()) >= 3, proxy.faults
    loaded = jaxstow.load(url, storage_options=bucket.options, transfer=FAST, as_numpy=True)
    assert _same(loaded, {**bucket.model, "trial": np.int32(1)})
    manager = CheckpointManager(run_url, storage_options=bucket.options, transfer=FAST)
    assert manager.steps() == [2] and _same(manager.restore(as_numpy=True), _step(2))


def test_a_lock_taken_by_a_request_whose_answer_was_lost_is_this_writers_own(bucket):
    """The lock's conditional PUT reaches the store, its answer is lost, and the PUT sent again is refused: the lock
    found there is this manager's, not another writer's."""
    url = bucket.url("lost-answer")
    lost = bucket.faults(1.0, kinds=("lost",), paths=r"/\.jaxstow\.lock", methods=("PUT",), budget=1)
    with lost as proxy, CheckpointManager(url, storage_options=bucket.options, transfer=FAST) as manager:
        manager.save(1, _step(1))
    assert proxy.faults == {"lost": 1}
    assert _same(CheckpointManager(url, storage_options=bucket.options).restore(as_numpy=True), _step(1))


def test_a_lock_taken_by_a_request_whose_answer_was_lost_in_a_run_with_steps_is_this_writers_own(bucket):
    """As above, in a run whose folder the manager lists before it takes the lock: the listing, which shows no lock
    object, is not taken for the store's answer; the next manager of the process takes the lock too."""
    url = bucket.url("lost-answer-again")
    with CheckpointManager(url, storage_options=bucket.options, transfer=FAST) as manager:
        manager.save(1, _step(1))
    lost = bucket.faults(1.0, kinds=("lost",), paths=r"/\.jaxstow\.lock", methods=("PUT",), budget=1)
    with lost as proxy, CheckpointManager(url, storage_options=bucket.options, transfer=FAST) as manager:
        manager.save(2, _step(2))
    assert proxy.faults == {"lost": 1}
    with CheckpointManager(url, storage_options=bucket.options, transfer=FAST) as manager:
        manager.save(3, _step(3))
    assert manager.steps() == [1, 2, 3] and _same(manager.restore(2, as_numpy=True), _step(2))


def test_a_lock_a_closed_manager_failed_to_delete_is_taken_over_by_the_next_manager_of_the_process(bucket):
    """The store refuses to delete the lock object when the manager is closed (an error saying so); the next manager
    of the same process takes the lock over rather than taking it for another writer's, and deletes it when closed."""
    url, key = bucket.url("undeleted-lock"), f"{bucket.prefix}/undeleted-lock/.jaxstow.lock"
    once = {
        **bucket.options,
        "config_kwargs": {**bucket.options["config_kwargs"], "retries": {"total_max_attempts": 1}},
    }
    manager = CheckpointManager(url, storage_options=once, transfer=FAST)  # botocore's retries of a deletion: none
    manager.save(1, _step(1))
    manager.wait()
    refused = bucket.faults(1.0, kinds=("500",), paths=r"/\.jaxstow\.lock|\?delete", methods=("DELETE", "POST"))
    with refused as proxy, pytest.raises(StorageError, match=r"undeleted-lock/\.jaxstow\.lock: the storage failed"):
        manager.close()
    assert proxy.faults["500"] >= 1
    assert bucket.client.head_object(Bucket=bucket.bucket, Key=key)  # left in the store
    with CheckpointManager(url, storage_options=bucket.options, transfer=FAST) as manager:
        manager.save(2, _step(2))
    assert manager.steps() == [1, 2]
    with pytest.raises(botocore.exceptions.ClientError, match="404"):
        bucket.client.head_object(Bucket=bucket.bucket, Key=key)


@pytest.mark.parametrize("name", [".jaxstow.lock", ".jaxstow-recent.json"])
def test_a_small_object_damaged_on_its_way_once_is_read_again(bucket, name):
    """The lock object and the run's recent changes, read through fsspec, are read again when an answer arrives with
    a bit flipped (botocore finds its checksum wrong), as data is: the save and the close go on."""
    run = f"small-flip{name.replace('.', '-')}"
    url = bucket.url(run)
    with CheckpointManager(url, storage_options=bucket.options, transfer=FAST) as manager:
        manager.save(1, _step(1))
    flipped = bucket.faults(1.0, kinds=("flip",), paths=f"/{re.escape(name)} ", methods=("GET",), budget=1)
    with flipped as proxy, CheckpointManager(url, storage_options=bucket.options, transfer=FAST) as manager:
        manager.save(2, _step(2))
    assert proxy.faults == {"flip": 1}
    assert CheckpointManager(url, storage_options=bucket.options).steps() == [1, 2]
    key = f"{bucket.prefix}/{run}/.jaxstow.lock"
    with pytest.raises(botocore.exceptions.ClientError, match="404"):  # released
        bucket.client.head_object(Bucket=bucket.bucket, Key=key)


def test_an_upload_started_by_a_request_whose_answer_was_lost_is_aborted_by_the_save(bucket):
    """CreateMultipartUpload reaches the store and its answer is lost; the one sent again starts a second upload. The
    first, whose id never came back, is aborted by the save that started it, not left for a later one."""
    url = bucket.url("lost-start", "model.jxs")
    with bucket.faults(1.0, kinds=("lost",), paths=r"\?uploads", methods=("POST",), budget=1) as proxy:
        jaxstow.save(url, bucket.model, storage_options=bucket.options, transfer=FAST)
    assert proxy.faults == {"lost": 1}
    unfinished = bucket.client.list_multipart_uploads(Bucket=bucket.bucket, Prefix=f"{bucket.prefix}/lost-start/")
    assert unfinished.get("Uploads", []) == []
    assert _same(jaxstow.load(url, storage_options=bucket.options, as_numpy=True), bucket.model)


def test_a_plain_fsspec_store_retries_too(bucket):
    """An ``http://`` URL is read through fsspec's HTTP file system, which retries nothing itself."""
    pytest.importorskip("aiohttp")
    url = f"{bucket.proxy.endpoint}/{bucket.bucket}/{bucket.prefix}/model.jxs"

    def load() -> bool:
        return _same(jaxstow.load(url, transfer=FAST, as_numpy=True), bucket.model)

    def lazy() -> bool:
        with jaxstow.open(url, transfer=FAST) as reader:
            return np.array_equal(reader.read("w2", np.s_[5:77_000]), bucket.model["w2"][5:77_000])

    with bucket.faults(0.08, kinds=("503", "500", "reset", "short")):
        for call in (load, lazy):
            right, failures = _tally(call)
            assert right >= 9, failures
    with bucket.faults(1.0, kinds=("503", "500", "reset", "short")), pytest.raises(StorageError) as caught:
        jaxstow.load(url, transfer=FAST)
    assert str(caught.value).startswith(f"{url}: the storage failed: reading "), caught.value  # its size, or bytes
    assert "failed 5 times (the last: " in str(caught.value) and "FileNotFoundError" not in str(caught.value)


def test_what_passes_is_told_from_what_does_not():
    def client_error(status: int, code: str) -> botocore.exceptions.ClientError:
        answer = {"Error": {"Code": code, "Message": "..."}, "ResponseMetadata": {"HTTPStatusCode": status}}
        return botocore.exceptions.ClientError(answer, "GetObject")  # type: ignore[arg-type]

    passing = [
        client_error(503, "SlowDown"),
        client_error(429, "TooManyRequests"),
        client_error(500, "InternalError"),
        client_error(400, "RequestTimeout"),
        botocore.exceptions.ReadTimeoutError(endpoint_url="http://s3"),
        botocore.exceptions.EndpointConnectionError(endpoint_url="http://s3"),
        ConnectionResetError(104, "Connection reset by peer"),
        BrokenBody(10, 20),
    ]
    missing = FileNotFoundError("w.jxs")
    refused_head = FileNotFoundError("w.jxs")
    refused_head.__cause__ = client_error(503, "SlowDown")
    lasting = [client_error(404, "NoSuchKey"), client_error(403, "AccessDenied"), missing, ValueError("bad")]
    assert [transient(error) for error in passing] == [True] * len(passing)
    assert [transient(error) for error in lasting] == [False] * len(lasting)
    assert transient(refused_head)


@pytest.mark.parametrize(
    ("fields", "message"),
    [({"attempts": 0}, "attempts must be an integer of at least 1"), ({"backoff": -1.0}, "backoff must be")],
)
def test_retry_settings_out_of_range_are_refused(fields, message):
    with pytest.raises(ArgumentError, match=message):
        Transfer(**fields)


def test_data_damaged_once_on_its_way_is_read_again_not_taken_for_a_damaged_step(bucket):
    """One answer for step 2's data with a bit flipped on the way: the step is read again, not skipped for step 1."""
    run = CheckpointManager(bucket.url("run"), storage_options=bucket.options, transfer=FAST)
    calls = {
        "fallback": lambda: _same(run.restore(fallback=True, as_numpy=True), bucket.steps[2]),
        "damaged_steps": lambda: run.damaged_steps() == {},
        "latest_intact_step": lambda: run.latest_intact_step() == 2,
    }
    for name, call in calls.items():
        with bucket.faults(1.0, kinds=("flip",), paths=r"/run/2/.*\.safetensors bytes=(?!0-65535$)", budget=1) as proxy:
            assert call(), name
        assert proxy.faults["flip"] >= 1, name  # one, or two drawn at once by parallel reads of the first read
    assert run.restored is not None and (run.restored.step, run.restored.skipped) == (2, {})


def test_a_file_loaded_whose_data_is_damaged_once_on_its_way_is_read_again_and_really_damaged_one_is_corrupt(bucket):
    """jaxstow.load of an intact file, one answer for its data with a bit flipped on the way: it is read again and
    comes back whole. A file whose own bytes fail their checksum fails it twice: it is corrupt."""
    url = bucket.url("model.jxs")
    with bucket.faults(1.0, kinds=("flip",), paths=r"/model\.jxs bytes=(?!0-65535$)", budget=1) as proxy:
        loaded = jaxstow.load(url, storage_options=bucket.options, transfer=FAST, as_numpy=True)
    assert proxy.faults["flip"] >= 1  # one, or a few drawn at once by the first read's parallel requests
    assert _same(loaded, bucket.model)
    with pytest.raises(CorruptFileError, match=r"damaged/2/params\.safetensors: checksum mismatch"):
        jaxstow.load(bucket.url("damaged", "2", "params.safetensors"), storage_options=bucket.options, transfer=FAST)


def test_a_file_the_store_acknowledged_but_did_not_keep_commits_no_step(bucket):
    run = CheckpointManager(bucket.url("kept"), storage_options=bucket.options, transfer=FAST)
    run.save(1, bucket.steps[1])
    run.wait()
    with bucket.faults(1.0, kinds=("dropped",), paths=r"/kept/2/.*\.safetensors", methods=("PUT",)) as proxy:
        run.save(2, bucket.steps[2])
        with pytest.raises(StorageError, match=r"the store acknowledged .*\.safetensors but does not keep"):
            run.wait()
    assert proxy.faults["dropped"] >= 1
    assert run.steps() == [1] and _same(run.restore(as_numpy=True), bucket.steps[1])
    run.close()


def test_corrupt_data_is_not_taken_for_a_storage_failure(bucket):
    """The damaged step's data, read whole and clean, is damage (and named so), not a failure to retry."""
    with pytest.raises(CorruptFileError, match="checksum"):
        CheckpointManager(bucket.url("damaged"), storage_options=bucket.options, transfer=FAST).restore(step=2)
