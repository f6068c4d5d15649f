"""Checkpoints saved by several real ``jax.distributed`` processes and restored on other topologies.

Every case starts real processes (``tests/distributed/worker.py``), each with its own CPU devices, talking through
jax's coordination service and gloo collectives on the loopback interface.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import forked
import pytest
from distributed_runs import free_port, launch
from distributed_runs import reports as reports_of

import jaxstow
from jaxstow.errors import FormatError

WORKER = Path(__file__).parents[1] / "distributed" / "worker.py"
HEADERS = 64 << 10  # every file's header and the step's record, read by every process


def _start(
    action: str, count: int, devices: int, folder: Path | str, *extra: str, options: dict | None = None
) -> list[subprocess.Popen[str]]:
    arguments = [str(count), str(devices)]
    return launch(
        WORKER,
        count,
        lambda index, port: [action, str(index), *arguments, str(port), str(folder), *extra],
        env={"JAXSTOW_STORAGE_OPTIONS": json.dumps(options)},
    )


@pytest.fixture(scope="module")
def saved_by_two(tmp_path_factory) -> Path:
    """Steps 1 and 2 saved by 2 processes x 2 devices on one global 2x2 mesh."""
    folder = tmp_path_factory.mktemp("two-processes") / "run"
    reports = reports_of(_start("save", 2, 2, folder))
    assert [report["steps"] for report in reports] == [[1, 2], [1, 2]]
    return folder


def test_each_process_writes_its_own_shards_once(saved_by_two):
    record = json.loads((saved_by_two / "2" / "checkpoint.json").read_text())
    assert record["files"] == {"meta": "meta.safetensors", "params": "params.safetensors"}
    assert record["parts"] == {"meta": ["meta.p1.safetensors"], "params": ["params.p1.safetensors"]}
    sizes = {path.name: path.stat().st_size for path in (saved_by_two / "2").iterdir()}
    whole = 512 * 384 * 4 + 384 * 4 + 8 * 4  # w, b and r, each element once
    params = sizes["params.safetensors"] + sizes["params.p1.safetensors"]
    assert whole < params < whole + 4 * 4096  # the data once, plus two headers


def test_a_processs_file_loaded_alone_says_it_holds_one_processs_shards(saved_by_two):
    for name, process in (("params.p1.safetensors", 1), ("params.safetensors", 0)):  # 0: "a file may be missing"
        with pytest.raises(FormatError, match=f"holds only the shards of process {process} of a tree saved by several"):
            jaxstow.load(saved_by_two / "2" / name)


@pytest.mark.parametrize(
    ("count", "devices", "extra"),
    [(1, 4, ()), (1, 1, ("--no-target",)), (4, 1, ()), (2, 2, ())],
    ids=["1x4-other-mesh", "1x1-no-target", "4x1", "2x2"],
)
def test_restore_on_another_topology_reads_only_what_it_holds(saved_by_two, count, devices, extra):
    for report in reports_of(_start("restore", count, devices, saved_by_two, *extra)):
        assert report["steps"] == [1, 2]
        assert report["bytes_read"] <= 1.05 * report["bytes_held"] + HEADERS, report


def test_on_a_real_s3_server(s3_server):
    url = s3_server.url("two-processes")
    options = s3_server.storage_options
    assert [report["steps"] for report in reports_of(_start("save", 2, 2, url, options=options))] == [[1, 2], [1, 2]]
    for report in reports_of(_start("restore", 1, 4, url, options=options)):
        assert report["bytes_held"] > 0 and report["steps"] == [1, 2]


def test_a_process_killed_mid_save_leaves_no_step(tmp_path):
    folder = tmp_path / "run"
    processes = _start("save", 2, 2, folder, "--pause-before-commit", "3")
    assert json.loads(processes[1].stdout.readline()) == {"process": 1, "saved": 1}
    processes[1].send_signal(signal.SIGKILL)  # before it writes its part of step 2; process 0 writes all of its own
    processes[1].wait()
    out, err = processes[0].communicate(timeout=240)
    last = out.strip().splitlines()[-1] if out.strip() else "{}"
    assert "error" in json.loads(last) or processes[0].returncode != 0, (out, err[-2000:])
    assert sorted(path.name for path in folder.iterdir() if not path.name.startswith(".")) == ["1"]
    from jaxstow import CheckpointManager

    with CheckpointManager(folder) as manager:
        assert manager.steps() == [1]
        assert int(manager.restore()["meta"]["count"]) == 1


def test_processes_that_disagree_on_the_step_commit_nothing(tmp_path):
    # Process 1 saves step 3 where process 0 saves step 2, then neither saves again: process 0 is told at once, and
    # process 1, which waits for process 0's next save (of step 3, to pair), names it once the timeout passes.
    folder = tmp_path / "run"
    reports = reports_of(_start("disagree", 2, 2, folder, "--process-timeout", "3"))
    assert (
        "step 2 is not saved: the processes' saves met with other steps (process 0: step 2, process 1: step 3)"
        in (reports[0]["error"])
    )
    assert "process 0 did not report the steps of the save of step 3" in reports[1]["error"]
    assert sorted(path.name for path in folder.iterdir() if not path.name.startswith(".")) == ["1"]


def test_processes_that_save_other_trees_commit_nothing(tmp_path):
    folder = tmp_path / "run"
    reports = reports_of(_start("other-tree", 2, 2, folder))
    assert "process 1 saved other trees than process 0 for the items ['meta']" in reports[0]["error"]
    assert "(its tree has more leaves, after process 0's last, meta/count)" in reports[0]["error"]
    assert "not committed" in reports[1]["error"]
    assert sorted(path.name for path in folder.iterdir() if not path.name.startswith(".")) == ["1"]


def test_processes_that_lay_out_an_array_otherwise_commit_nothing_and_keep_the_step_before(tmp_path):
    """Process 1 builds its mesh of the same devices in reverse order: each process's shards are right for its own
    layout, but together they would cover some boxes twice and others never; step 2 is refused, step 1 kept."""
    folder = tmp_path / "run"
    reports = reports_of(_start("other-layout", 2, 2, folder))
    assert (
        "process 1 saved other trees than process 0 for the items ['params'] (from process 0's leaf params/"
        in (reports[0]["error"])
    )
    assert "in the same device order" in reports[0]["error"] and "not committed" in reports[1]["error"]
    assert sorted(path.name for path in folder.iterdir() if not path.name.startswith(".")) == ["1"]


def test_a_missing_file_of_another_process_is_named(saved_by_two, tmp_path):
    import shutil

    from jaxstow import CheckpointManager
    from jaxstow.errors import CheckpointError

    copy = tmp_path / "copy"
    shutil.copytree(saved_by_two, copy, ignore=shutil.ignore_patterns(".jaxstow.lock"))
    (copy / "2" / "params.p1.safetensors").unlink()
    with CheckpointManager(copy) as manager, pytest.raises(CheckpointError) as raised:
        manager.restore(2)
    assert "params.p1.safetensors" in str(raised.value) and "step 2" in str(raised.value)
    with CheckpointManager(copy) as manager:
        assert int(manager.restore(1)["meta"]["count"]) == 1


def test_a_file_of_another_process_replaced_by_another_steps_is_damage(saved_by_two, tmp_path):
    import shutil

    from jaxstow import CheckpointManager
    from jaxstow.errors import CorruptFileError

    copy = tmp_path / "copy"
    shutil.copytree(saved_by_two, copy, ignore=shutil.ignore_patterns(".jaxstow.lock"))
    shutil.copyfile(copy / "1" / "params.p1.safetensors", copy / "2" / "params.p1.safetensors")
    with CheckpointManager(copy) as manager:
        assert list(manager.damaged_steps()) == [2]
        with pytest.raises(CorruptFileError, match="not the one that was saved") as raised:
            manager.restore(2)
        assert "params.p1.safetensors" in str(raised.value)


def test_one_file_of_an_array_spanning_processes_is_refused(tmp_path):
    worker = tmp_path / "one_file.py"
    worker.write_text(
        "import os, sys\n"
        "os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=1'\n"
        "import jax\n"
        "jax.distributed.initialize(f'127.0.0.1:{sys.argv[2]}', num_processes=2, process_id=int(sys.argv[1]))\n"
        "import jax.numpy as jnp, jaxstow\n"
        "from jax.sharding import NamedSharding, PartitionSpec as P\n"
        "mesh = jax.make_mesh((2,), ('x',))\n"
        "w = jax.make_array_from_callback((4,), NamedSharding(mesh, P('x')), lambda i: jnp.arange(4.0)[i])\n"
        "try:\n"
        "    jaxstow.save(sys.argv[3] + f'/w{sys.argv[1]}.jxs', {'w': w})\n"
        "except jaxstow.errors.ShardingError as error:\n"
        "    print(error)\n"
        "jax.distributed.shutdown()\n"
    )
    port = str(free_port())
    processes = [
        forked.Popen([sys.executable, str(worker), str(i), port, str(tmp_path)], stdout=subprocess.PIPE, text=True)
        for i in range(2)
    ]
    outputs = [process.communicate(timeout=120)[0] for process in processes]
    for output in outputs:
        assert "leaf 'w'" in output and "jaxstow.CheckpointManager" in output
    assert not list(tmp_path.glob("w*.jxs"))
