"""jaxstow's wait at exit is one ``atexit`` handler among the program's: every other library's handler still runs, the
interpreter still shuts down, and a write that failed at exit still makes the status non-zero (120).

Every scenario is a real Python process that imports jaxstow between other libraries' exit handlers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from permissions import obey_permission_bits

from jaxstow import CheckpointManager

_HANDLERS = """
import atexit, os, sys
def announce(when):
    atexit.register(lambda: print(f"the handler registered {when} ran", file=sys.stderr, flush=True))
class Finalized:
    def __del__(self, write=os.write):  # run by the interpreter's own shutdown, after every exit handler
        write(2, b"the interpreter shut down\\n")
finalized = Finalized()
announce("before jaxstow was imported")
"""


def _run(program: str, *arguments: str, root_obeys_permissions: bool = False) -> tuple[int, str]:
    try:
        process = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(_HANDLERS) + textwrap.dedent(program), *arguments],
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            preexec_fn=obey_permission_bits if root_obeys_permissions and os.geteuid() == 0 else None,
        )
    except subprocess.SubprocessError as error:  # raised when preexec_fn fails
        pytest.skip(f"running as root without the right to drop CAP_DAC_OVERRIDE, so chmod stops nothing: {error}")
    return process.returncode, process.stderr


def _order(stderr: str, *lines: str) -> list[int]:
    """Where each of ``lines`` starts in ``stderr`` (each must be there)."""
    for line in lines:
        assert line in stderr, stderr
    return [stderr.index(line) for line in lines]


#: Ways a checkpoint step fails on the writer's thread: what breaks the run's folder once step 1 is written.
_BREAKS = {
    "read-only": "os.chmod(sys.argv[1], 0o555)",  # step 2 is refused
    "replaced by a file": "shutil.rmtree(sys.argv[1]); open(sys.argv[1], 'w').close()",  # works as root too
}


@pytest.mark.parametrize("breaking", sorted(_BREAKS))
def test_after_a_save_fails_at_exit_every_other_exit_handler_runs_and_the_status_is_120(
    tmp_path: Path, breaking: str
) -> None:
    folder = tmp_path / "run"
    program = f"""
    import os, shutil, numpy as np
    from jaxstow import CheckpointManager
    announce("after jaxstow was imported")
    manager = CheckpointManager(sys.argv[1])
    manager.save(1, {{"w": np.ones(256, np.float32)}})
    manager.wait()
    {_BREAKS[breaking]}
    manager.save(2, {{"w": np.ones(256, np.float32)}})
    """
    status, stderr = _run(program, str(folder), root_obeys_permissions=breaking == "read-only")
    if folder.is_dir():
        folder.chmod(0o755)
    assert status == 120, stderr
    positions = _order(
        stderr,
        f"jaxstow: saving step 2 to {folder}: failed before the process ended:",
        "the handler registered after jaxstow was imported ran",
        "the handler registered before jaxstow was imported ran",
        "the interpreter shut down",
    )
    assert positions == sorted(positions), stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr
    if folder.is_dir():
        assert CheckpointManager(folder).steps() == [1]


def test_a_handler_registered_before_a_save_began_finds_the_step_written(tmp_path: Path) -> None:
    program = """
    import os, numpy as np
    from jaxstow import CheckpointManager
    manager = CheckpointManager(sys.argv[1])
    atexit.register(lambda: print("step 1 on disk at exit:", "1" in os.listdir(sys.argv[1]), file=sys.stderr))
    manager.save(1, {"w": np.arange(20_000_000, dtype=np.float32)})  # 80 MB, still being written at exit
    """
    status, stderr = _run(program, str(tmp_path))
    assert status == 0, stderr
    _order(stderr, "step 1 on disk at exit: True", "the handler registered before jaxstow was imported ran")
    with CheckpointManager(tmp_path) as manager:
        assert manager.steps() == [1]


@pytest.mark.timeout(60)
def test_ctrl_c_during_the_wait_of_a_script_that_ended_well_makes_the_status_non_zero() -> None:
    program = """
    import os, signal, threading, time
    from jaxstow._write import at_exit
    from jaxstow.io.job_queue import JobQueue

    def ctrl_c_once_the_wait_has_begun():
        while not at_exit.exiting():
            time.sleep(0.05)
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGINT)

    JobQueue("slow-writer").submit(lambda: time.sleep(60))
    threading.Thread(target=ctrl_c_once_the_wait_has_begun, daemon=True).start()
    """
    status, stderr = _run(program)
    assert status == 120, stderr
    positions = _order(
        stderr,
        "jaxstow: the queued writes of slow-writer: abandoned by Ctrl-C, unfinished",
        "the handler registered before jaxstow was imported ran",
        "the interpreter shut down",
    )
    assert positions == sorted(positions), stderr


def test_a_process_whose_writes_all_ended_well_exits_as_its_script_says(tmp_path: Path) -> None:
    program = """
    import numpy as np
    from jaxstow import CheckpointManager
    CheckpointManager(sys.argv[1]).save(1, {"w": np.ones(256, np.float32)})
    sys.exit(int(sys.argv[2]))
    """
    for wanted in (0, 3):
        status, stderr = _run(program, str(tmp_path / str(wanted)), str(wanted))
        assert status == wanted, stderr
        _order(stderr, "the handler registered before jaxstow was imported ran", "the interpreter shut down")


def test_a_library_that_puts_sys_stderr_back_at_exit_does_not_hide_a_failed_save(tmp_path: Path) -> None:
    folder = tmp_path / "run"
    program = """
    import io, shutil, numpy as np
    original = sys.stderr
    class Tee(io.TextIOBase):  # a log tee, as logging libraries install and undo
        def write(self, text):
            return original.write(text)
        def flush(self):
            original.flush()
    sys.stderr = Tee()
    atexit.register(lambda: setattr(sys, "stderr", original))  # runs after jaxstow's handler: registered first
    from jaxstow import CheckpointManager
    manager = CheckpointManager(sys.argv[1])
    manager.save(1, {"w": np.ones(256, np.float32)})
    manager.wait()
    shutil.rmtree(sys.argv[1]); open(sys.argv[1], "w").close()
    manager.save(2, {"w": np.ones(256, np.float32)})
    """
    status, stderr = _run(program, str(folder))
    assert status == 120, stderr
    _order(
        stderr,
        f"jaxstow: saving step 2 to {folder}: failed before the process ended:",
        "the handler registered before jaxstow was imported ran",
        "the interpreter shut down",
    )
    assert "Traceback" not in stderr
