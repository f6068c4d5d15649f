"""Two tiers: every step saved to each process's local directory, the steps due there copied to the persistent
directory from the local files, peers keeping copies of each other's local files, and restores from the fastest tier
that holds a step in full. The multi-process cases run real ``jax.distributed`` processes
(``tests/distributed/tier_worker.py``), killed (SIGKILL) mid-run or stopped (SIGSTOP) mid-save or mid-restore.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import forked
import jax.numpy as jnp
import numpy as np
import pytest
from distributed_runs import launch

from jaxstow import CheckpointManager, KeepPolicy, LocalTier
from jaxstow.errors import ArgumentError, FormatError, StepNotFoundError

WORKER = Path(__file__).parents[1] / "distributed" / "tier_worker.py"


def _run(manager: CheckpointManager, steps: range) -> None:
    for step in steps:
        if manager.should_save(step):
            manager.save(step, {"w": jnp.full(3, step, jnp.float32)})


def test_every_step_goes_to_the_local_tier_and_the_due_ones_to_the_persistent_one(tmp_path):
    local, persistent = tmp_path / "local", tmp_path / "persistent"
    with CheckpointManager(persistent, save_every=4, local=LocalTier(local, save_every=2)) as manager:
        _run(manager, range(1, 10))
        assert manager.steps(tier="persistent") == [1, 4, 8]
        assert manager.steps(tier="local") == [6, 8]  # the local tier keeps 2 of 1, 2, 4, 6, 8
        assert manager.steps() == [1, 4, 6, 8]
        assert manager.latest_step() == 8 and manager.latest_step(tier="persistent") == 8
        assert manager.restore()["w"].tolist() == [8.0] * 3
        assert manager.restore(6)["w"].tolist() == [6.0] * 3
    for name in ("checkpoint.json", "w.safetensors"):  # copied from the local files, byte for byte
        assert (persistent / "8" / name).read_bytes() == (local / "8" / name).read_bytes()


def test_the_newest_local_step_is_restored_and_the_persistent_one_once_the_local_tier_is_lost(tmp_path):
    local, persistent = tmp_path / "local", tmp_path / "persistent"
    with CheckpointManager(persistent, save_every=4, local=LocalTier(local)) as manager:
        _run(manager, range(1, 7))
    with CheckpointManager(persistent, save_every=4, local=LocalTier(local)) as manager:
        assert manager.restore()["w"].tolist() == [6.0] * 3 and manager.restored.step == 6
    shutil.rmtree(local)
    with CheckpointManager(persistent, save_every=4, local=LocalTier(local)) as manager:
        assert manager.steps() == [1, 4]
        assert manager.restore()["w"].tolist() == [4.0] * 3 and manager.restored.step == 4
        with pytest.raises(StepNotFoundError, match="no step 6"):
            manager.restore(6)


def test_damage_is_found_in_each_step_as_a_restore_reads_it_from_the_local_tier_too(tmp_path):
    # Only the directory's steps were checked: damage in the newest local step went unseen, though restore met it,
    # and latest_intact_step skipped the intact local step 5 (restore(latest_intact_step()) gave step 4).
    local, persistent = tmp_path / "local", tmp_path / "persistent"
    with CheckpointManager(persistent, save_every=4, local=LocalTier(local, keep_last=3)) as manager:
        _run(manager, range(1, 7))
        assert manager.steps() == [1, 4, 5, 6] and manager.steps(tier="persistent") == [1, 4]
    damaged = local / "6" / "w.safetensors"
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 1
    damaged.write_bytes(bytes(data))
    with CheckpointManager(persistent, save_every=4, local=LocalTier(local, keep_last=3)) as manager:
        assert list(manager.damaged_steps()) == [6] and "checksum mismatch" in manager.damaged_steps()[6]
        assert manager.latest_intact_step() == 5
        assert manager.restore(manager.latest_intact_step())["w"].tolist() == [5.0] * 3
        # restore(fallback=True) read the directory alone: step 4, with nothing said of steps 5 and 6
        assert manager.restore(fallback=True)["w"].tolist() == [5.0] * 3
        assert manager.restored.step == 5 and list(manager.restored.skipped) == [6]
        assert manager.restore(5, fallback=True)["w"].tolist() == [5.0] * 3  # was "step 5 is not in" the directory
        with pytest.raises(StepNotFoundError, match="nor in the local tier"):
            manager.restore(3, fallback=True)
    shutil.rmtree(local / "5")
    with CheckpointManager(persistent, save_every=4, local=LocalTier(local, keep_last=3)) as manager:
        assert manager.restore(fallback=True)["w"].tolist() == [4.0] * 3 and list(manager.restored.skipped) == [6]


def _flip_last_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))


def test_a_step_held_in_both_tiers_is_read_from_its_intact_copy_and_its_damaged_one_is_named(tmp_path, caplog):
    # A damaged local copy hid the intact persistent one (fallback restored step 3); a damaged persistent copy, which
    # a new host would read, was in no query while the local one was intact.
    local, persistent = tmp_path / "local", tmp_path / "persistent"
    with CheckpointManager(persistent, save_every=2, local=LocalTier(local, keep_last=3)) as manager:
        _run(manager, range(1, 5))
        assert manager.steps(tier="persistent") == [1, 2, 4] and manager.steps(tier="local") == [2, 3, 4]
    for damaged in (local, persistent):
        copy = tmp_path / f"copy-of-{damaged.name}"
        shutil.copytree(tmp_path, copy, ignore=shutil.ignore_patterns("copy-of-*"))
        _flip_last_byte(copy / damaged.name / "4" / "w.safetensors")
        with CheckpointManager(copy / "persistent", save_every=2, local=LocalTier(copy / "local", keep_last=3)) as m:
            found = m.damaged_steps()
            assert list(found) == [4] and f"{damaged.name}/4/w.safetensors" in found[4], found
            assert m.latest_intact_step() == 4
            for restored in (m.restore(), m.restore(4), m.restore(fallback=True)):
                assert restored["w"].tolist() == [4.0] * 3 and m.restored.step == 4
    assert "step 4 is damaged there, read from" in caplog.text


def test_a_step_damaged_in_the_local_tier_alone_is_said_to_be_damaged_there(tmp_path):
    # The message named the run's persistent directory, which never held step 6: the damaged copy is the local one.
    local, persistent = tmp_path / "local", tmp_path / "persistent"
    with CheckpointManager(persistent, save_every=4, local=LocalTier(local)) as manager:
        _run(manager, range(1, 7))
        assert manager.steps(tier="persistent") == [1, 4] and manager.steps(tier="local") == [5, 6]
    _flip_last_byte(local / "6" / "w.safetensors")
    with (
        CheckpointManager(persistent, save_every=4, local=LocalTier(local)) as manager,
        pytest.raises(FormatError) as raised,
    ):
        manager.restore(6)
    message = str(raised.value)
    assert message.startswith(f"step 6 of the local tier {local} of {persistent} is damaged: "), message
    assert f"{local / '6' / 'w.safetensors'}: checksum mismatch" in message


def test_the_persistent_tier_may_be_an_object_store(tmp_path, s3_server):
    url = s3_server.url("tiers")
    options = s3_server.storage_options
    with CheckpointManager(url, save_every=2, local=LocalTier(tmp_path), storage_options=options) as manager:
        _run(manager, range(1, 6))
    shutil.rmtree(tmp_path)
    with CheckpointManager(url, local=LocalTier(tmp_path), storage_options=options) as manager:
        assert manager.steps() == [1, 2, 4]
        assert manager.restore()["w"].tolist() == [4.0] * 3


def test_a_tier_that_is_not_one_is_refused(tmp_path):
    with (
        CheckpointManager(tmp_path / "p", local=LocalTier(tmp_path / "l")) as manager,
        pytest.raises(ArgumentError, match=r"tier must be 'local', 'persistent' or None \(either tier\), not 'locale'"),
    ):
        manager.latest_step(tier="locale")  # type: ignore[arg-type]
    with CheckpointManager(tmp_path / "p") as manager:
        assert manager.steps(tier="persistent") == []
        with pytest.raises(ArgumentError, match=r"p has no local tier, so steps\(tier='local'\) has nothing to list"):
            manager.steps(tier="local")


def test_a_local_tier_setting_that_is_not_valid_is_refused(tmp_path):
    with pytest.raises(ArgumentError, match=r"^LocalTier's keep_last must be a positive integer, not 0"):
        LocalTier(tmp_path / "l", keep_last=0)
    with pytest.raises(ArgumentError, match=r"^LocalTier's save_every must be a positive integer, not 0"):
        LocalTier(tmp_path / "l", save_every=0)
    with pytest.raises(ArgumentError, match=r"^LocalTier's replicas must be a non-negative integer or None, not -1"):
        LocalTier(tmp_path / "l", replicas=-1)
    with pytest.raises(ArgumentError, match="LocalTier's directory must be a local path"):
        LocalTier("s3://bucket/local")
    with pytest.raises(ArgumentError, match=r"^local must be a jaxstow.LocalTier, such as LocalTier\('/mnt/ssd/run'\)"):
        CheckpointManager(tmp_path / "p", local=str(tmp_path / "l"))  # type: ignore[arg-type]
    assert not (tmp_path / "p").exists()


def _store_with_steps_5_and_10(store: Path) -> None:
    """A run's persistent directory, as another host left it: steps 5 and 10, with metrics, metadata and items."""
    with CheckpointManager(store, save_every=5) as manager:
        for step in (5, 10):
            manager.save(
                step,
                {"params": {"w": jnp.full(3, step, jnp.float32)}},
                metrics={"loss": 1 / step},
                metadata={"host": "old"},
            )


def test_a_new_host_with_an_empty_local_tier_saves_no_step_at_or_before_the_newest_persistent_one(tmp_path):
    store = tmp_path / "store"
    _store_with_steps_5_and_10(store)
    with CheckpointManager(store, save_every=5, local=LocalTier(tmp_path / "new_local", save_every=5)) as manager:
        assert [step for step in range(1, 16) if manager.should_save(step)] == [15]
    with CheckpointManager(store, save_every=5, local=LocalTier(tmp_path / "new_local")) as manager:
        assert [step for step in range(1, 11) if manager.should_save(step)] == []
        assert manager.should_save(11)  # the local tier (save_every=1) takes every step after the newest
        manager.save(11, {"params": {"w": jnp.full(3, 11.0)}})  # not due in the store (save_every=5)
        assert not manager.should_save(11) and manager.should_save(12)
        manager.save(15, {"params": {"w": jnp.full(3, 15.0)}})
        manager.wait()
        assert manager.steps(tier="persistent") == [5, 10, 15]
        assert manager.steps(tier="local") == [11, 15]
        assert manager.steps() == [5, 10, 11, 15]


def test_the_queries_count_a_step_held_by_either_tier(tmp_path):
    store, local = tmp_path / "store", tmp_path / "local"
    _store_with_steps_5_and_10(store)
    with CheckpointManager(store, save_every=5, local=LocalTier(local), keep=KeepPolicy(metric="loss")) as manager:
        assert manager.best_step() == 10
        manager.save(11, {"params": {"w": jnp.full(3, 11.0)}}, metrics={"loss": 0.01}, metadata={"host": "new"})
        assert manager.steps() == [5, 10, 11] and manager.latest_step() == 11
        assert manager.steps(tier="local") == [11] and manager.latest_step(tier="local") == 11
        assert manager.steps(tier="persistent") == [5, 10] and manager.latest_step(tier="persistent") == 10
        assert manager.best_step() == 11  # held by the local tier only
        assert manager.best_step(mode="max") == 5  # held by the persistent tier only
        assert (manager.metrics(11), manager.metadata(11), manager.items(11)) == (
            {"loss": 0.01},
            {"host": "new"},
            ["params"],
        )
        assert (manager.metrics(5), manager.metadata(5), manager.items(5)) == (
            {"loss": 0.2},
            {"host": "old"},
            ["params"],
        )
        assert manager.restore()["params"]["w"].tolist() == [11.0] * 3 and manager.restored.step == 11
        assert manager.restore(10)["params"]["w"].tolist() == [10.0] * 3
        with pytest.raises(
            StepNotFoundError,
            match=r"step 7 is neither in .*store nor in the local tier .*local; "
            r"their committed steps are \[5, 10, 11\]",
        ):
            manager.metrics(7)


def test_a_step_deleted_is_deleted_from_both_tiers_and_may_be_saved_again(tmp_path):
    local, persistent = tmp_path / "local", tmp_path / "persistent"
    with CheckpointManager(persistent, save_every=2, local=LocalTier(local, keep_last=2)) as manager:
        _run(manager, range(1, 5))  # 1, 2 and 4 persistent (the first, and every second), 3 and 4 local
        manager.delete(4)  # in both tiers
        assert manager.steps() == [1, 2, 3] and manager.steps(tier="local") == [3]
        assert manager.restore()["w"].tolist() == [3.0] * 3 and manager.restored.step == 3
        manager.delete(3)  # local only
        assert manager.steps() == [1, 2] and manager.restore()["w"].tolist() == [2.0] * 3
        manager.save(4, {"w": jnp.full(3, 40.0)})
        assert manager.restore()["w"].tolist() == [40.0] * 3
    assert manager.steps(tier="persistent") == [1, 2, 4]


def test_a_step_saved_again_with_force_is_replaced_in_both_tiers(tmp_path):
    local, persistent = tmp_path / "local", tmp_path / "persistent"
    with CheckpointManager(persistent, save_every=2, local=LocalTier(local)) as manager:
        _run(manager, range(1, 4))  # 1 and 2 persistent, 2 and 3 local
        manager.save(2, {"w": jnp.full(3, 20.0)}, metrics={"loss": 0.5}, force=True)
        manager.save(3, {"w": jnp.full(3, 30.0)}, force=True)  # a local step only: it stays one
        assert manager.restore(2)["w"].tolist() == [20.0] * 3 and manager.metrics(2) == {"loss": 0.5}
    assert manager.steps(tier="persistent") == [1, 2]
    shutil.rmtree(local)  # a host replaced: the persistent directory holds the new values
    with CheckpointManager(persistent) as manager:
        assert manager.restore()["w"].tolist() == [20.0] * 3 and manager.metrics(2) == {"loss": 0.5}


_RECORD_TOO_BIG = """
import json, resource, signal, sys, numpy as np
from jaxstow import CheckpointManager, LocalTier
from jaxstow.errors import CheckpointError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of ending the process
report = {}
with CheckpointManager(sys.argv[1], save_every=10, local=LocalTier(sys.argv[2])) as manager:
    manager.save(1, {"w": np.ones(3)})
    manager.wait()
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, resource.RLIM_INFINITY))  # the disk fills up
    notes = {"notes": "x" * (1 << 17)}  # its record (checkpoint.json) is the one file past the limit
    manager.save(2, {"w": np.full(3, 2.0)}, metadata=notes)
    try:
        manager.wait()
    except CheckpointError as error:
        report["error"] = str(error)
    report["steps_after_the_failure"] = manager.steps()
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))  # space freed
    manager.save(2, {"w": np.full(3, 2.0)}, metadata=notes)
    manager.wait()
    report["steps"], report["restored"] = manager.steps(), manager.restore(2)["w"].tolist()
print(json.dumps(report))
"""


def test_a_step_whose_local_record_could_not_be_written_is_not_held_and_may_be_saved_again(tmp_path):
    local, persistent = tmp_path / "local", tmp_path / "persistent"
    done = forked.run(
        [sys.executable, "-c", _RECORD_TOO_BIG, str(persistent), str(local)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert "saving step 2" in report["error"] and "checkpoint.json" in report["error"]
    assert report["steps_after_the_failure"] == [1]
    assert report["steps"] == [1, 2] and report["restored"] == [2.0] * 3


def test_a_newer_persistent_step_wins_over_the_local_tier_a_host_kept_from_earlier(tmp_path):
    store, local = tmp_path / "store", tmp_path / "local"
    with CheckpointManager(store, save_every=5, local=LocalTier(local)) as manager:
        _run(manager, range(1, 4))  # step 1 in both tiers, 2 and 3 locally
    with CheckpointManager(store, save_every=5) as manager:  # the run went on elsewhere, with no local tier
        _run(manager, range(4, 11))
    with CheckpointManager(store, save_every=5, local=LocalTier(local)) as manager:  # and came back to this host
        assert manager.steps(tier="local") == [2, 3] and manager.steps(tier="persistent") == [1, 5, 10]
        assert [step for step in range(1, 11) if manager.should_save(step)] == []
        assert manager.metrics(3) is None and manager.items(3) == manager.items(10) == ["w"]
        assert manager.restore()["w"].tolist() == [10.0] * 3 and manager.restored.step == 10
        assert manager.restore(3)["w"].tolist() == [3.0] * 3


def test_a_later_save_of_a_step_in_the_persistent_tier_wins_over_the_local_tiers_copy(tmp_path):
    store, local = tmp_path / "store", tmp_path / "local"
    with CheckpointManager(store, local=LocalTier(local)) as manager:
        manager.save(6, {"w": jnp.full(2, 6.0)})  # in both tiers
    with CheckpointManager(store) as elsewhere:  # another job, without this host's tier, replaced it
        elsewhere.save(6, {"w": jnp.full(2, 66.0)}, force=True)
    with CheckpointManager(store, local=LocalTier(local)) as manager:
        # was: 6.0, the local tier's copy of the save replaced, for both
        assert manager.restore(6)["w"].tolist() == [66.0] * 2 and manager.restore()["w"].tolist() == [66.0] * 2
    with CheckpointManager(store, local=LocalTier(local)) as manager:  # and a save here later than the store's wins
        manager.save(6, {"w": jnp.full(2, 7.0)}, force=True)
        assert manager.restore(6)["w"].tolist() == [7.0] * 2


@pytest.mark.parametrize(
    "options",
    [{"local_save_every": 5}, {"local_keep_last": 3}, {"local_replicas": 1}, {"local_save_every": 1}],
    ids=str,
)
def test_an_option_of_the_local_tier_without_one_is_refused_naming_it(tmp_path, options):
    ((name, value),) = options.items()
    with pytest.raises(
        ArgumentError,
        match=rf"{name}={value} sets the local tier, but the manager of .*run has no local directory: pass "
        rf"local=LocalTier\(directory, {name.removeprefix('local_')}={value}\) .* or leave {name}={value} out",
    ):
        CheckpointManager(tmp_path / "run", **options)
    with pytest.raises(ArgumentError, match=rf"{name}={value} sets the local tier, .* has no local directory"):
        CheckpointManager(tmp_path / "run", local_directory=None, **options)  # None: as if not given
    before = signal.getsignal(signal.SIGUSR1)
    with pytest.raises(ArgumentError, match=r"local_save_every=5, local_keep_last=3 set the local tier"):
        CheckpointManager(tmp_path / "run", local_save_every=5, local_keep_last=3, preemption_signals=[signal.SIGUSR1])
    assert signal.getsignal(signal.SIGUSR1) is before  # the refused manager caught no signal
    assert not (tmp_path / "run").exists()


# -- four processes -------------------------------------------------------------------------------------------------


def _start(action: str, base: Path, *extra: str) -> list[subprocess.Popen[str]]:
    return launch(WORKER, 4, lambda index, port: [action, str(index), "4", str(port), str(base), *extra])


def _reports(processes: list[subprocess.Popen[str]], *, skip: int = -1) -> list[dict]:
    reports = []
    try:
        for index, process in enumerate(processes):
            if index == skip:
                continue
            printed = iter(process.stdout.readline, "")  # type: ignore[union-attr]
            lines = (json.loads(line) for line in printed if line.startswith("{"))  # not gloo's notes
            final = next((line for line in lines if "seconds" in line), None)
            assert final, f"process {index} printed no report:\n{process.stderr.read()[-3000:]}"  # type: ignore[union-attr]
            reports.append(final)
    finally:
        for process in processes:
            process.kill()
            process.communicate()
    return reports


def _first_lines(processes: list[subprocess.Popen[str]]) -> list[dict]:
    """Each process's report, read as it waits to be killed; then every process is killed (SIGKILL)."""
    try:
        lines = [json.loads(process.stdout.readline()) for process in processes]  # type: ignore[union-attr]
    finally:
        for process in processes:
            process.send_signal(signal.SIGKILL)
            process.communicate()
    return lines


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory) -> Path:
    """Steps 1 to 6 saved by 4 processes (every step locally, 1 and 4 persistently), then every process killed."""
    base = tmp_path_factory.mktemp("killed-run")
    reports = _first_lines(_start("save", base))
    assert [(report["local"], report["persistent"]) for report in reports] == [([5, 6], [1, 4])] * 4
    assert [report["picked"] for report in reports] == [[1, 2, 3, 4, 5, 6]] * 4
    return base


@pytest.fixture
def run(killed_run, tmp_path) -> Path:
    shutil.copytree(killed_run, tmp_path / "run")
    return tmp_path / "run"


def test_a_replaced_host_gets_its_shards_of_the_newest_local_step_from_a_peer(run):
    assert sorted(os.listdir(run / "local3" / "process-3" / "peer-copies")) == ["p1"]  # process 1's keeper
    shutil.rmtree(run / "local1")
    reports = _reports(_start("restore", run))
    assert [report.get("restored") for report in reports] == [6] * 4, reports  # each checked every value it holds
    assert (run / "local1" / "process-1" / "6" / "params.p1.safetensors").read_bytes() == (
        run / "local3" / "process-3" / "peer-copies" / "p1" / "6" / "params.p1.safetensors"
    ).read_bytes()


def _move_local_directories(run: Path) -> None:
    """Process k's local directory becomes process k - 1's, as after a restart on other hosts."""
    for k in range(4):
        (run / f"local{k}").rename(run / f"was{k}")
    for k in range(4):
        (run / f"was{(k + 1) % 4}").rename(run / f"local{k}")


def test_local_directories_that_come_back_to_other_processes_restore_the_newest_step(run):
    """After a restart on other hosts, process k finds in its local directory the tier process k + 1 wrote (its
    folder process-{k+1}, with the copies it kept): step 6 is restored from those, each process's own files taken
    from where they are, never another's; before, every process saw an empty tier and restored step 4."""
    names = {k: f"params.p{k}.safetensors" if k else "params.safetensors" for k in range(4)}
    wrote = {k: (run / f"local{k}" / f"process-{k}" / "6" / names[k]).read_bytes() for k in range(4)}
    _move_local_directories(run)
    reports = _reports(_start("restore", run))
    assert [report.get("restored") for report in reports] == [6] * 4, reports  # each checked every value it holds
    for k in range(4):
        assert (run / f"local{k}" / f"process-{k}" / "6" / names[k]).read_bytes() == wrote[k]
        assert (run / f"local{k}" / f"process-{(k + 1) % 4}" / "6").is_dir()  # the tier left there is kept
    reports = _reports(_start("delete", run))  # step 6 deleted: from the tiers left there too, never restored again
    assert [(report.get("restored"), report.get("local")) for report in reports] == [(5, [5])] * 4, reports
    assert not [path for path in run.glob("local*/process-*/**/6") if path.is_dir()]


def test_a_later_save_of_the_newest_local_step_in_the_persistent_tier_is_restored_not_the_local_copies(run):
    # a job elsewhere saved step 6 again (force=True) into the persistent directory after these hosts kept theirs:
    # every process restored its own tier's older copies, silently
    later = {"params": {"w": np.random.default_rng(7).standard_normal((64, 48)).astype(np.float32)}}
    later["params"]["r"] = later["params"]["w"][0] * 3  # the worker's values of step 7
    with CheckpointManager(run / "persistent") as manager:
        manager.save(6, later, force=True)
    reports = _reports(_start("restore", run, "--step", "6", "--expect", "7"))
    assert [report.get("restored") for report in reports] == [6] * 4, reports  # each checked every value it holds


def test_a_step_held_only_in_the_tiers_other_processes_left_is_listed_and_deleted_before_any_restore(run):
    """The local directories came back to other processes: before any restore, latest_step() is step 6, as a restore
    finds it, and deleting it deletes it from the tiers left there; before, latest_step() was the persistent step 4
    (deleted instead), and the next restore brought step 6 back."""
    _move_local_directories(run)
    reports = _reports(_start("delete", run))
    assert [(report.get("restored"), report.get("local")) for report in reports] == [(5, [5])] * 4, reports
    assert (run / "persistent" / "4").is_dir()
    assert not [path for path in run.glob("local*/process-*/**/6") if path.is_dir()]


def _files(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}


def test_the_tiers_other_processes_left_are_pruned_by_the_keep_policy_but_another_run_s_is_not(run):
    """The local directories came back to other processes: process k holds the tier process k + 1 left (steps 5 and
    6, with the copies it kept), and local0 a tier of another run too. Saving step 7 deletes step 5 from the tiers
    left (keep_last=2: 6 and 7 are kept), and step 6 still restores from them; saving step 8 deletes step 6 and removes
    the emptied tiers left. The other run's tier is untouched. Before, the tiers left kept every step for ever."""
    _move_local_directories(run)
    other = run / "local0" / "process-2"
    shutil.copytree(run / "local1" / "process-2", other)
    (other / ".jaxstow-tier.json").write_text(json.dumps({"persistent": str(run / "another-run")}))
    others = _files(other)
    left = {k: run / f"local{k}" / f"process-{(k + 1) % 4}" for k in range(4)}
    reports = _reports(_start("resume", run, "--until", "7"))
    assert [(report.get("picked"), report.get("local")) for report in reports] == [([7], [6, 7])] * 4, reports
    for k in range(4):  # step 5 gone from the tier left and the copies it kept, step 6 kept in both
        assert sorted(str(path.relative_to(left[k])) for path in left[k].glob("**/[56]") if path.is_dir()) == [
            "6",
            *(f"peer-copies/{keeps.name}/6" for keeps in (left[k] / "peer-copies").iterdir()),
        ], k
    reports = _reports(_start("restore", run, "--step", "6"))  # the steps kept in the tiers left still restore
    assert [report.get("restored") for report in reports] == [6] * 4, reports
    reports = _reports(_start("resume", run))
    assert [(report.get("picked"), report.get("local")) for report in reports] == [([8], [7, 8])] * 4, reports
    assert [k for k in range(4) if left[k].exists()] == []
    assert _files(other) == others
    assert sorted(os.listdir(run / "local0")) == ["process-0", "process-2"]


@pytest.mark.parametrize("damaged", ["one-copy", "every-copy"])
def test_a_damaged_copy_of_a_process_s_files_is_never_committed_into_its_tier(run, damaged):
    """The local directories came back to other processes: process 0's files of step 6 are held by process 1 (the
    copy process 2 kept, in the tier it left there) and process 3 (process 0's tier, left there). A byte flipped in
    the first copy: process 0 takes the second, checked; in both: step 5 is restored, and step 6 is not committed
    into process 0's tier. Before, the first copy was committed unchecked, and every restore failed on it."""
    wrote = (run / "local0" / "process-0" / "6" / "params.safetensors").read_bytes()
    _move_local_directories(run)
    copies = [
        run / "local1" / "process-2" / "peer-copies" / "p0" / "6" / "params.safetensors",
        run / "local3" / "process-0" / "6" / "params.safetensors",
    ]
    for copy in copies[: 1 if damaged == "one-copy" else 2]:
        _flip_last_byte(copy)
    step = 6 if damaged == "one-copy" else 5
    for _ in range(2):  # the next restore too
        reports = _reports(_start("restore", run))
        assert [report.get("restored") for report in reports] == [step] * 4, reports
    own = run / "local0" / "process-0" / "6"
    assert (own / "params.safetensors").read_bytes() == wrote if step == 6 else not own.exists()


@pytest.mark.parametrize("lost", ["nothing", "its-own-tier"])
def test_a_step_of_which_every_copy_is_damaged_is_said_to_be_damaged_in_every_process(run, lost):
    """Process 0's files of step 6 (not in the persistent tier) are damaged in its tier and in its keeper's copy, or
    its tier is lost and the copy damaged: restore(6) names the damage and what to restore instead, the same in every
    process. Before, the first said only that there was "no step 6" (the damage in a warning), and the second raised
    the process's own CorruptFileError in process 0 and a CheckpointError in the others."""
    copies = list(run.glob("local*/process-*/peer-copies/p0/6/params.safetensors"))
    assert copies
    if lost == "its-own-tier":
        shutil.rmtree(run / "local0")
    else:
        copies.append(run / "local0" / "process-0" / "6" / "params.safetensors")
    for copy in copies:
        _flip_last_byte(copy)
    errors = [report.get("error") for report in _reports(_start("restore", run, "--step", "6"))]
    assert len(set(errors)) == 1, errors
    assert re.fullmatch(
        rf"FormatError: step 6 of the local tiers of {re.escape(str(run / 'persistent'))} is damaged: .*params"
        r"\.safetensors: checksum "
        r"mismatch .*; restore another step: manager.latest_intact_step\(\) gives the newest intact one.*",
        errors[0],
    ), errors[0]


def _copy_to_persistent(run: Path, step: int) -> None:
    """Every process's local files of ``step`` copied to the persistent tier, as a save due there would have."""
    folder = run / "persistent" / str(step)
    folder.mkdir()
    for file in run.glob(f"local*/process-*/{step}/*.safetensors"):
        shutil.copyfile(file, folder / file.name)
    shutil.copyfile(run / "local0" / "process-0" / str(step) / "checkpoint.json", folder / "checkpoint.json")


@pytest.mark.parametrize("intact", ["its-keeper-s-copy", "the-persistent-step"])
def test_a_process_s_damaged_own_files_of_a_step_are_read_from_an_intact_copy(run, intact):
    """A byte flipped in process 0's own file of step 6, of which process 2 keeps an intact copy (taken into process
    0's tier in its place), or, that copy gone, the persistent tier holds step 6 intact: step 6 is restored, every
    value checked, process 0 warning of its damaged file. Before, every process raised that step 6 is damaged."""
    own = run / "local0" / "process-0" / "6" / "params.safetensors"
    keeper = run / "local2" / "process-2" / "peer-copies" / "p0" / "6"
    if intact == "the-persistent-step":
        _copy_to_persistent(run, 6)
        shutil.rmtree(keeper)
    _flip_last_byte(own)
    reports = _reports(_start("restore", run))
    assert [report.get("restored") for report in reports] == [6] * 4, reports
    assert any(f"{own.parent}: its copy of process 0's files" in line for line in reports[0]["warnings"]), reports[0]
    if intact == "its-keeper-s-copy":
        assert own.read_bytes() == (keeper / "params.safetensors").read_bytes()


def test_a_tier_renamed_to_another_process_s_is_refused_naming_the_rename(run):
    """Process 0's folder holds process 1's files and the other way round: an error in every process, which names
    the folder to rename back, rather than a restore that takes one process's shards for another's."""
    zero, one = run / "local0" / "process-0", run / "local1" / "process-1"
    zero.rename(run / "swapped")
    one.rename(zero)
    (run / "swapped").rename(one)
    reports = _reports(_start("restore", run))
    assert all("error" in report for report in reports), reports
    for k, other in [(0, 1), (1, 0)]:
        assert re.search(
            rf"local{k}/process-{k}/5 is step 5 of process {k}'s local tier, but holds process {other}'s files "
            rf"instead of its own .*: is .*local{k}/process-{k} the tier of process {other}, renamed\? rename it back "
            rf"to process-{other}",
            reports[k]["error"],
        ), reports[k]


def test_processes_whose_local_directories_differ_agree_on_the_steps_to_save(run):
    """Processes 0 and 3 lost their local directories (replaced hosts): they hold steps 1 and 4 (persistent), the
    others 1 to 6. Asked at steps 1 to 8 without a restore, every process picks the same steps: after 6, the newest
    any process holds."""
    for index in (0, 3):
        shutil.rmtree(run / f"local{index}")
    reports = _reports(_start("resume", run))
    for report in reports:
        assert "error" not in report, report
        assert report["picked"] == [7, 8] and report["local"] == [7, 8], report
        assert report["persistent"] == [1, 4, 8], report


def test_a_step_deleted_is_gone_from_every_local_tier_and_every_peer_copy(run):
    assert (run / "local3" / "process-3" / "peer-copies" / "p1" / "6").is_dir()
    reports = _reports(_start("delete", run))
    assert [(report.get("restored"), report.get("local")) for report in reports] == [(5, [5])] * 4, reports
    copies = [path for path in run.glob("local*/process-*/peer-copies/*/*") if path.name == "6"]
    assert not copies and not list(run.glob("local*/process-*/6"))


@pytest.mark.parametrize("lost", ["every-local-directory", "a-process-and-its-keeper"])
def test_a_step_held_in_full_nowhere_locally_is_restored_from_the_persistent_tier(run, lost):
    shutil.rmtree(run / "local1")
    if lost == "every-local-directory":
        for index in (0, 2, 3):
            shutil.rmtree(run / f"local{index}")
    else:
        shutil.rmtree(run / "local3" / "process-3" / "peer-copies" / "p1")
    reports = _reports(_start("restore", run))
    assert [report.get("restored") for report in reports] == [4] * 4, reports


@pytest.mark.parametrize("stop", ["save", "copy", "fetch"])
def test_a_stopped_peer_makes_every_other_process_raise_within_the_timeout(tmp_path, run, stop):
    if stop in ("save", "copy"):  # as it sends its peers its copies of step 2, or copies step 4 to the persistent tier
        base, victim = tmp_path / "fresh", 2
        processes = _start("save", base, "--stop", stop, "--victim", "2", "--timeout", "3")
    else:
        base, victim = run, 3  # process 1's keeper, stopped as it begins to send process 1 its files
        shutil.rmtree(run / "local1")
        processes = _start("restore", base, "--stop", "fetch", "--victim", "3", "--timeout", "3")
    assert json.loads(processes[victim].stdout.readline())["stopping"]  # type: ignore[union-attr]
    reports = _reports(processes, skip=victim)
    for report in reports:
        assert "error" in report, report
        assert report["seconds"] < 3 * 5, report
    assert any("process 2" in report["error"] or "process 3" in report["error"] for report in reports)
