"""The ``jaxstow`` command: look into files and checkpoint folders, check them, compare them, convert them.
The top layer: it imports the faces and the core; only ``python -m jaxstow`` imports it.

One subcommand per module of this package: ``inspect``, ``verify``, ``diff``, ``ls``, ``convert``, ``uploads``,
``watch`` and ``export``, named after it. Each gives ``HELP``, its line in ``jaxstow --help``; ``arguments(parser)``,
whose docstring is the description its ``--help`` shows; and ``run(args)``, its exit status. See
docs/command-line.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from jaxstow._version import __version__
from jaxstow.cli import convert, diff, export, inspect, ls, uploads, verify, watch
from jaxstow.cli.files import add_storage_arguments, use_storage_arguments
from jaxstow.cli.output import printable
from jaxstow.cli.standard_output import discard_output, output_failure
from jaxstow.cli.stray_errors import ignore_closed_event_loops
from jaxstow.errors import JaxstowError

__all__ = ["describe", "main"]

_COMMANDS = (inspect, verify, diff, ls, convert, uploads, watch, export)
#: The commands that read only local files, and so take no options about URLs (the others get them after their own).
_LOCAL_ONLY = (watch,)


def parser() -> argparse.ArgumentParser:
    """The argument parser of the ``jaxstow`` command, with one subcommand per module of this package."""
    top = argparse.ArgumentParser(
        prog="jaxstow",
        description="Look into jaxstow, safetensors and npz files and checkpoint folders; check, compare, convert.",
        epilog="Paths may be fsspec URLs (s3://..., gs://..., file://...). Exit status: 0 all well, 1 damage or "
        "differences found, 2 an error (one line on stderr), 141 a pipe closed early.",
    )
    top.add_argument("--version", action="store_true", help="print the version of jaxstow and exit")
    commands = top.add_subparsers(title="commands", dest="command", metavar="COMMAND")
    for command in _COMMANDS:
        name = command.__name__.rpartition(".")[2]
        sub = commands.add_parser(name, help=command.HELP, description=command.arguments.__doc__)
        command.arguments(sub)
        if command not in _LOCAL_ONLY:
            add_storage_arguments(sub)
        sub.set_defaults(run=command.run)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``jaxstow`` command line ``argv``, as the ``jaxstow`` program does.

    An error is one line on stderr, never a traceback (a missing file, missing credentials, a server out of reach, a
    file of a newer format); a reader that closes the pipe early (``jaxstow inspect f | head``) ends it quietly.

    Args:
        argv: The arguments after the program's name (``sys.argv[1:]`` by default).

    Returns:
        The exit status: 0 when all is well, 1 when ``verify`` finds damage, ``diff`` differences or ``watch`` a run whose
        writer died or stopped, 2 on an error,
        130 when interrupted, 141 when the pipe was closed early (as a shell reports it).

    >>> from jaxstow.cli import main
    >>> main(["--version"])
    jaxstow 0.1.0
    0
    """
    top = parser()
    args = top.parse_args(argv)
    if args.version:
        print(f"jaxstow {__version__}")
        return 0
    if args.command is None:
        top.print_help()
        return 2
    ignore_closed_event_loops()  # the reports of reads in flight when orbax failed: the error below names it
    try:
        use_storage_arguments(args)
        status: int = args.run(args)
        sys.stdout.flush()  # here, so that a closed pipe is met while it can still be answered quietly
    except BrokenPipeError:
        discard_output()
        return _CLOSED_PIPE
    except KeyboardInterrupt:
        print(f"jaxstow {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # a user's input never ends in a traceback: one line, exit status 2
        print(f"jaxstow {args.command}: {describe(output_failure(error) or error)}", file=sys.stderr)
        return 2
    return status


#: The exit status of a command whose reader closed the pipe early (128 + SIGPIPE, as shells report it).
_CLOSED_PIPE = 141


def describe(error: BaseException) -> str:
    """An error as one line: jaxstow's and the operating system's own messages as they are, others with their type,
    their control characters escaped (a name from a file could else drive the terminal).

    >>> from jaxstow.cli import describe
    >>> from jaxstow.errors import StructureMismatchError
    >>> describe(StructureMismatchError(["leaf 'w': missing", "leaf 'b': float32[3] vs int32[3]"], file="f.jxs"))
    "f.jxs does not fit the given structure (2 problems): - leaf 'w': missing - leaf 'b': float32[3] vs int32[3]"
    >>> describe(KeyError("w"))
    "KeyError: 'w'"
    """
    text = str(error) if isinstance(error, JaxstowError | OSError) else f"{type(error).__name__}: {error}"
    return " ".join(printable(line.strip(), backslashes=False) for line in text.splitlines() if line.strip())
