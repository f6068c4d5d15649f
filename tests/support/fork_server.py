"""The server side of ``forked.py``: a process that imports numpy, jax and jaxstow, then forks a child for each
request on the Unix socket SOCKET and runs a Python program in it as ``python ARGS`` would.

Started as ``python -c "import fork_server; fork_server.main(SOCKET)"``: the ``__main__`` module each child runs its
program in is then not the server's. A request is one JSON line (``argv``: the arguments after ``python``, ``cwd``,
``env``, ``session``) sent with three file descriptors, the child's stdin, stdout and stderr. The server answers on
the same connection with the child's pid, then, once the child has ended, its exit status as ``subprocess`` gives it
(``-N`` for signal N). The server starts no thread and initializes no jax backend: each child starts its own, under
the environment it is given, and the server refuses to serve if anything (a BLAS thread pool left running) would be
running beside the thread that forks. What its imports printed to stderr is printed again by each child, as a fresh
interpreter would print it.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import gc
import io
import json
import os
import runpy
import selectors
import signal
import socket
import sys
import threading

PRELOADED = ("numpy", "jax", "jaxstow", "jaxstow.cli")
_preamble = b""  # what the imports printed to stderr
_replaced: list[object] = []  # the server's own stdio objects, kept from closing descriptors 0-2 when collected


def _streams(unbuffered: bool) -> None:
    """``sys.stdin``, ``sys.stdout`` and ``sys.stderr`` on descriptors 0, 1 and 2, buffered as a fresh interpreter
    buffers them (``PYTHONUNBUFFERED`` honoured)."""

    def text(fd: int, mode: str, **options: object) -> io.TextIOWrapper:
        raw = open(fd, mode + "b", buffering=0 if unbuffered and mode == "w" else -1, closefd=False)  # noqa: SIM115
        return io.TextIOWrapper(raw, write_through=unbuffered and mode == "w", **options)  # type: ignore[arg-type]

    _replaced.extend((sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__, sys.__stderr__))
    sys.stdin = sys.__stdin__ = text(0, "r")
    sys.stdout = sys.__stdout__ = text(1, "w", line_buffering=os.isatty(1))
    sys.stderr = sys.__stderr__ = text(2, "w", line_buffering=True, errors="backslashreplace")


def _run(argv: list[str]) -> None:
    """Run ``python *argv`` in this process's ``__main__``: ``-c CODE``, ``-m MODULE`` or ``SCRIPT``, then arguments."""
    main = sys.modules["__main__"]
    main.__dict__.clear()
    main.__dict__.update(__name__="__main__", __builtins__=__builtins__, __doc__=None, __spec__=None)
    if argv[0] == "-c":
        sys.argv, sys.path[0] = ["-c", *argv[2:]], ""
        exec(compile(argv[1], "<string>", "exec"), main.__dict__)
    elif argv[0] == "-m":
        sys.argv, sys.path[0] = [argv[1], *argv[2:]], os.getcwd()
        runpy._run_module_as_main(argv[1], alter_argv=True)  # type: ignore[attr-defined]  # what `python -m` runs
    else:
        sys.argv, sys.path[0] = list(argv), os.path.dirname(os.path.realpath(argv[0]))
        main.__dict__["__file__"] = argv[0]
        with open(argv[0], "rb") as source:
            code = compile(source.read(), argv[0], "exec")
        exec(code, main.__dict__)


def _child(request: dict, fds: list[int], preamble: bytes) -> None:
    """The forked child: take the request's streams, folder and environment, run the program, and end as the
    interpreter ends (exit handlers, threads joined, the exit status of an uncaught exception)."""
    for fd, target in zip(fds, (0, 1, 2), strict=True):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    if request["session"]:
        os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    _streams(bool(request["env"].get("PYTHONUNBUFFERED")))
    faulthandler.enable()  # a crash (SIGSEGV at exit, say) prints every thread's stack to the test's stderr
    if preamble:
        sys.stderr.write(preamble.decode(errors="backslashreplace"))
    try:
        _run(request["argv"])
    except SystemExit:
        raise  # the interpreter's own ending, with the status it gives
    except BaseException as error:
        traceback = error.__traceback__
        while traceback is not None and traceback.tb_frame.f_code.co_filename == __file__:
            traceback = traceback.tb_next  # the program's frames, as a fresh interpreter prints them
        sys.excepthook(type(error), error.with_traceback(traceback), traceback)
        if isinstance(error, KeyboardInterrupt):
            _end_by_ctrl_c()
        raise SystemExit(1) from None
    raise SystemExit(0)


def _end_by_ctrl_c() -> None:
    """End as an interpreter ends on a ``KeyboardInterrupt`` nothing caught: threads joined, exit handlers run,
    then killed by SIGINT."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a flush that fails changes nothing: the signal gives the status
            stream.flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)


def _alone() -> str | None:
    """Why forking here is not safe (a thread other than this one), or ``None``."""
    pid = os.fork()  # a first fork stops the thread pools that stop at a fork (OpenBLAS's) and start again on use
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    tasks = os.listdir("/proc/self/task")
    if threading.active_count() != 1 or len(tasks) != 1:
        return f"{threading.active_count()} Python threads, {len(tasks)} threads in all after importing"
    return None


def serve(path: str) -> None:
    """Answer requests on the socket at ``path`` until the client closes the server's stdin."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wakeup_read, wakeup_write = os.pipe()
    os.set_blocking(wakeup_write, False)
    signal.set_wakeup_fd(wakeup_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wakeup_read, selectors.EVENT_READ)
    selector.register(sys.stdin, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}
    print("ready", flush=True)
    while True:
        for key, _ in selector.select():
            if key.fileobj is sys.stdin:
                return  # the client is gone
            if key.fileobj is listener:
                connection, _address = listener.accept()
                message, fds, _flags, _address = socket.recv_fds(connection, 1 << 20, 3)
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    for each in (listener, connection, selector, *children.values()):
                        each.close()  # through their objects: no descriptor of the child's is closed again later
                    os.close(wakeup_read)
                    os.close(wakeup_write)
                    _child(json.loads(message), fds, _preamble)
                for fd in fds:
                    os.close(fd)
                connection.sendall(f"{pid}\n".encode())
                children[pid] = connection
            else:
                os.read(wakeup_read, 4096)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            connection = children.pop(pid)
            connection.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
            connection.close()


def main(path: str) -> None:
    """Import, check that this process is alone, say ``ready`` (or why not) on stdout, serve."""
    global _preamble
    captured = io.StringIO()
    sys.stderr, stderr = captured, sys.stderr
    for name in PRELOADED:
        __import__(name)
    sys.stderr = stderr
    _preamble = captured.getvalue().encode()
    problem = _alone()
    if problem is not None:
        print(f"not forking: {problem}", flush=True)
        sys.exit(1)
    # What the imports made lives as long as the server: frozen, the collector of each child passes it over, when it
    # runs and when the child's interpreter ends (there, over a heap this size, a collection costs ~0.1 s of CPU and
    # copies pages that the child would otherwise share with the server), as CPython's documentation advises a server
    # that forks its workers.
    gc.collect()
    gc.freeze()
    serve(path)
