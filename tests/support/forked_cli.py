"""``python -m jaxstow ARGS`` in a process of its own, forked from one that has already imported jaxstow.

A command started as ``python -m jaxstow`` spends about a second importing jax and jaxstow before it reads a byte; the
tests run hundreds. Here one server process per test worker imports ``jaxstow.cli`` once (importing starts no thread
of jax's), and each command runs in a child forked from it: its own process, its own exit status, its own stdout and
stderr, its own working folder and environment, run by the module ``python -m jaxstow`` runs. What it cannot give is a
fresh interpreter (modules already imported stay imported): a test of what a fresh process imports, of a terminal, of
signals or of a pipe starts ``python -m jaxstow`` itself.

>>> done = jaxstow_command("--version")
>>> done.returncode, done.stdout.startswith("jaxstow ")
(0, True)
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping

_SERVER = r"""
import json, os, runpy, sys, traceback
import jaxstow.cli  # the imports every command pays, paid once


def run(request):
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_TRUNC), fd)
    sys.stdin, sys.stdout, sys.stderr = open(0, closefd=False), open(1, "w", closefd=False), open(2, "w", closefd=False)
    sys.argv = ["jaxstow", *request["args"]]
    try:
        runpy.run_module("jaxstow", run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as done:
        if isinstance(done.code, int) or done.code is None:
            return done.code or 0
        print(done.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


for line in sys.stdin:
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            status = run(json.loads(line))
        finally:
            os._exit(status)
    print(json.dumps(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])), flush=True)
"""

_lock = threading.Lock()
_server: subprocess.Popen[str] | None = None


def _started() -> subprocess.Popen[str]:
    global _server
    if _server is None or _server.poll() is not None:
        _server = subprocess.Popen(
            [sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        atexit.register(_server.kill)
    return _server


def jaxstow_command(
    *args: object, env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None
) -> subprocess.CompletedProcess[str]:
    """What ``python -m jaxstow ARGS`` prints and its exit status; ``env`` replaces the environment (default: this
    process's), ``cwd`` the working folder."""
    arguments = [str(arg) for arg in args]
    with tempfile.TemporaryDirectory() as folder:
        out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
        for path in (out, err):
            open(path, "w").close()
        request = {
            "args": arguments,
            "env": dict(os.environ if env is None else env),
            "cwd": os.fspath(cwd if cwd is not None else os.getcwd()),
            "stdout": out,
            "stderr": err,
        }
        with _lock:
            server = _started()
            assert server.stdin is not None and server.stdout is not None
            server.stdin.write(json.dumps(request) + "\n")
            server.stdin.flush()
            answer = server.stdout.readline()
        if not answer:
            raise RuntimeError("the process that runs the jaxstow commands ended")
        with open(out) as stdout, open(err) as stderr:
            return subprocess.CompletedProcess(
                [sys.executable, "-m", "jaxstow", *arguments], json.loads(answer), stdout.read(), stderr.read()
            )
