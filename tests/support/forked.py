"""``subprocess.Popen([sys.executable, ...])`` and ``subprocess.run`` for Python programs, in processes forked from a
server that has already imported numpy, jax and jaxstow (``fork_server.py``), instead of interpreters started afresh.

A fresh interpreter spends a second or more of CPU importing jax before it runs a line; the tests start hundreds.
A forked child is still a process of its own: its pid (a signal reaches it), its exit status (``-N`` when a signal
ends it), its stdin, stdout and stderr (pipes, files, or this process's), its working folder, its environment, its
session with ``start_new_session=True``; its program runs as ``python -c CODE``, ``python -m MODULE`` or ``python
SCRIPT`` runs it, in ``__main__``, and it ends as the interpreter ends (threads joined, exit handlers run). What it
cannot be is a fresh interpreter: the modules the server imported stay imported, with what they read from the
environment when they were. So each server is started with the environment of the first program it runs, and a
program whose environment differs in what is read at startup or import (``XLA_FLAGS``, ``JAX_*``, ``PYTHON*``,
glibc's ``MALLOC_*``, ...) gets a server of its own. A test of what a fresh interpreter does (its imports, their
order against exit handlers, its startup, a terminal, its memory peak to the MiB) starts one with ``subprocess``.

>>> done = run([sys.executable, "-c", "import sys; print(sys.argv[1:]); sys.exit(3)", "a"], capture_output=True)
>>> done.returncode, done.stdout.decode()
(3, "['a']\\n")
"""

from __future__ import annotations

import atexit
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Environment variables read when the C library, Python, numpy or jax start: a program whose values differ gets a
#: server of its own, started with them.
IMPORT_TIME = (
    "MALLOC_",
    "GLIBC_",
    "LD_",
    "PYTHON",
    "OPENBLAS_",
    "OMP_",
    "MKL_",
    "XLA_",
    "JAX_",
    "TF_",
    "TPU_",
    "CUDA_",
    "FSSPEC",
)
_SUPPORT = Path(__file__).parent
_lock = threading.Lock()
_servers: dict[tuple[tuple[str, str], ...], tuple[subprocess.Popen[str], str]] = {}
_MOST_SERVERS = 5


def _import_time(env: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((key, value) for key, value in env.items() if key.startswith(IMPORT_TIME)))


def _stop(process: subprocess.Popen[str], path: str) -> None:
    if process.stdin is not None:
        process.stdin.close()  # the server ends when its stdin does
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def server(env: Mapping[str, str]) -> str:
    """The socket of a server started with ``env``'s import-time variables (started now if there is none)."""
    key = _import_time(env)
    with _lock:
        if key in _servers and _servers[key][0].poll() is None:
            return _servers[key][1]
        while len(_servers) >= _MOST_SERVERS:
            _stop(*_servers.pop(next(iter(_servers))))
        folder = tempfile.mkdtemp(prefix="jaxstow-fork-")
        path = os.path.join(folder, "socket")
        code = (  # sys.path as `python -c` has it once fork_server is imported
            f"import sys; sys.path.insert(0, {str(_SUPPORT)!r}); import fork_server; del sys.path[0]; "
            f"fork_server.main({path!r})"
        )
        process = subprocess.Popen(
            [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=dict(env), text=True
        )
        assert process.stdout is not None
        ready = process.stdout.readline().strip()
        if ready != "ready":
            raise RuntimeError(f"the fork server did not start: {ready or process.wait()}")
        _servers[key] = (process, path)
        atexit.register(_stop, process, path)
        return path


class Popen(subprocess.Popen):  # type: ignore[type-arg]
    """``subprocess.Popen`` of ``[sys.executable, *ARGS]`` (ARGS: ``-c CODE``, ``-m MODULE`` or a script, then its
    arguments), the process forked from a server; the same arguments, less those that only an ``exec`` can honour."""

    def _execute_child(  # type: ignore[override]
        self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo, creationflags, shell,
        p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, *rest,
    ) -> None:  # fmt: skip
        args = [os.fspath(arg) for arg in ([args] if isinstance(args, str | bytes | os.PathLike) else args)]
        assert not shell and preexec_fn is None and not pass_fds and executable is None, "only an exec honours these"
        assert args[0] == sys.executable, f"a forked child runs Python programs, not {args[0]}"
        assert args[1] in ("-c", "-m") or not args[1].startswith("-"), f"interpreter option {args[1]}: start Python"
        environment = dict(os.environ if env is None else env)
        path = server(environment)
        request = {
            "argv": args[1:],
            "cwd": os.fspath(cwd if cwd is not None else os.getcwd()),
            "env": {os.fsdecode(key): os.fsdecode(value) for key, value in environment.items()},
            "session": bool(rest[-2]) if len(rest) >= 2 else False,  # start_new_session
        }
        streams = [
            p2cread if p2cread != -1 else 0,
            c2pwrite if c2pwrite != -1 else 1,
            errwrite if errwrite != -1 else 2,
        ]
        self._connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._connection.connect(path)
            socket.send_fds(self._connection, [json.dumps(request).encode()], streams)
            self._connection.shutdown(socket.SHUT_WR)
            self._answered = b""
            self.pid = int(self._answer())
        finally:
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)  # the child's ends
        self._child_created = True

    def _answer(self) -> bytes:
        """The server's next line: the child's pid, then its exit status."""
        while b"\n" not in self._answered:
            received = self._connection.recv(64)
            if not received:
                raise RuntimeError(f"the fork server ended before the process it forked for {self.args} did")
            self._answered += received
        line, self._answered = self._answered.split(b"\n", 1)
        return line

    def _ended(self, timeout: float | None) -> bool:
        if self.returncode is None:
            ready, _, _ = select.select([self._connection], [], [], timeout)
            if not ready:
                return False
            self.returncode = int(self._answer())
            self._connection.close()
        return True

    def _internal_poll(self, *args: Any, **kwargs: Any) -> int | None:
        self._ended(0)
        return self.returncode

    def _wait(self, timeout: float | None) -> int:
        if not self._ended(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)  # type: ignore[arg-type]
        assert self.returncode is not None
        return self.returncode


def run(
    args: list[Any], *, input: str | bytes | None = None, capture_output: bool = False, timeout: float | None = None,
    check: bool = False, **options: Any,
) -> subprocess.CompletedProcess[Any]:  # fmt: skip
    """``subprocess.run`` of a Python program, forked (see :class:`Popen`)."""
    if input is not None:
        options["stdin"] = subprocess.PIPE
    if capture_output:
        options["stdout"] = options["stderr"] = subprocess.PIPE
    with Popen(args, **options) as process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
    if check and process.returncode:
        raise subprocess.CalledProcessError(process.returncode, args, stdout, stderr)
    return subprocess.CompletedProcess(args, process.returncode, stdout, stderr)
