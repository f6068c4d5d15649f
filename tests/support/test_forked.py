"""The forked processes the tests start (``forked.py``) behave as ``python ARGS`` started afresh would, in what the
tests look at: arguments, folder, environment, streams, exit status, signals, exit handlers, threads, tracebacks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import forked
import pytest

_PYTHON = sys.executable


def test_a_program_gets_its_arguments_folder_environment_and_exit_status(tmp_path):
    (tmp_path / "script.py").write_text(
        "import sys\nprint(__name__, __file__, sys.path[0], '' in sys.path, sys.argv)\nsys.exit(4)\n"
    )
    done = forked.run(
        [_PYTHON, "script.py", "a", "b"], cwd=tmp_path, env={**os.environ, "HELLO": "x"}, capture_output=True, text=True
    )
    assert (done.returncode, done.stderr) == (4, "")
    assert done.stdout == f"__main__ script.py {tmp_path} False ['script.py', 'a', 'b']\n"
    code = "import os, sys; print(os.getcwd(), os.environ['HELLO'], sys.argv[1:], sys.stdin.read()); sys.exit('no')"
    done = forked.run(
        [_PYTHON, "-c", code, "c"], cwd=tmp_path, env={**os.environ, "HELLO": "y"}, input=b"in", capture_output=True
    )
    assert (done.returncode, done.stdout, done.stderr) == (1, f"{tmp_path} y ['c'] in\n".encode(), b"no\n")
    done = forked.run([_PYTHON, "-m", "jaxstow", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("jaxstow ")


def test_a_child_starts_alone_with_jax_imported_and_no_backend_started():
    program = """
        import os, sys, threading
        import jax._src.xla_bridge as bridge
        print(threading.active_count(), len(os.listdir("/proc/self/task")), "jaxstow" in sys.modules, bridge._backends)
    """
    done = forked.run([_PYTHON, "-c", textwrap.dedent(program)], capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, "1 1 True {}\n", "")


def test_what_jax_reads_at_import_gets_a_server_of_its_own():
    program = "import jax; print(jax.device_count())"
    counts = [
        forked.run(
            [_PYTHON, "-c", program],
            env={**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={count}"},
            capture_output=True,
            text=True,
        ).stdout
        for count in (2, 3, 2)
    ]
    assert counts == ["2\n", "3\n", "2\n"]


def test_an_uncaught_exception_prints_the_programs_traceback_after_threads_and_exit_handlers():
    program = """
        import atexit, threading, time
        atexit.register(print, "exit handler")
        threading.Thread(target=lambda: (time.sleep(0.2), print("thread"))).start()
        1 / 0
    """
    done = forked.run([_PYTHON, "-c", textwrap.dedent(program)], capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (1, "thread\nexit handler\n")
    assert done.stderr == (
        'Traceback (most recent call last):\n  File "<string>", line 5, in <module>\n'
        "ZeroDivisionError: division by zero\n"
    )


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_a_signal_ends_a_forked_process_as_it_ends_a_fresh_one(number):
    program = "import atexit, time; atexit.register(print, 'exit handler'); print('up', flush=True); time.sleep(60)"
    process = forked.Popen([_PYTHON, "-c", program], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline() == "up\n"
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(timeout=0.1)
    process.send_signal(number)
    stdout, stderr = process.communicate(timeout=30)
    assert process.returncode == -number
    if number == signal.SIGINT:  # Python's KeyboardInterrupt, then its exit handlers
        assert (stdout, stderr.splitlines()[-1]) == ("exit handler\n", "KeyboardInterrupt")
    else:
        assert (stdout, stderr) == ("", "")


def test_the_docs_jaxstow_command_runs_forked_with_the_shells_streams_and_status(tmp_path):
    env = {**os.environ, "JAXSTOW_TESTS_FORK_SERVER": forked.server(os.environ)}
    client = [_PYTHON, "-S", "-E", os.path.join(os.path.dirname(forked.__file__), "fork_client.py")]
    done = subprocess.run([*client, "--version"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("jaxstow "), done.stderr
    done = subprocess.run([*client, "inspect", "missing.jxs"], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (2, "jaxstow inspect: missing.jxs: no such file\n")
