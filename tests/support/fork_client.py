"""``python -m jaxstow ARGS`` from a shell, forked from the fork server (``forked.py``) whose socket
``JAXSTOW_TESTS_FORK_SERVER`` names: a command the docs' console blocks run as ``jaxstow ARGS``, started with
``python -S -E`` (no site packages, no environment read: a few milliseconds). The forked child gets this process's
stdin, stdout and stderr, working folder and environment; this process ends as the child does (the same status, or
killed by the same signal). Run with no server named, it runs ``python -m jaxstow`` itself.
"""

import json
import os
import signal
import socket
import sys


def main() -> None:
    path = os.environ.get("JAXSTOW_TESTS_FORK_SERVER")
    argv = ["-m", "jaxstow", *sys.argv[1:]]
    if not path:
        os.execv(sys.executable, [sys.executable, *argv])
    request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "session": False}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.connect(path)
        socket.send_fds(connection, [json.dumps(request).encode()], [0, 1, 2])
        connection.shutdown(socket.SHUT_WR)
        answers = connection.makefile("r")
        pid = int(answers.readline())
        for number in (signal.SIGINT, signal.SIGTERM):  # passed on, as to a process of its own
            signal.signal(number, lambda received, _frame: os.kill(pid, received))
        status = int(answers.readline())
    if status < 0:
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    sys.exit(status)


if __name__ == "__main__":
    main()
