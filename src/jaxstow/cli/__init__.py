"""The ``jaxstow`` command: look into files and checkpoint folders, check them, compare them, convert them.

``jaxstow inspect``, ``verify``, ``diff``, ``ls`` and ``convert`` take local paths and fsspec URLs alike (an
``s3://`` URL takes its credentials from fsspec's configuration, e.g. ``FSSPEC_S3_*`` environment variables).
Exit status: 0 when all is well, 1 when ``verify`` finds damage or ``diff`` finds differences, 2 on an error.

>>> from jaxstow.cli import main
>>> main(["--version"])
jaxstow 0.1.0
0
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from jaxstow._version import __version__
from jaxstow.cli import convert, diff, inspect, ls, verify, watch
from jaxstow.errors import JaxstowError

__all__ = ["main"]

_COMMANDS = (inspect, verify, diff, ls, convert, watch)


def parser() -> argparse.ArgumentParser:
    """The argument parser of the ``jaxstow`` command, with one subcommand per module of this package."""
    top = argparse.ArgumentParser(
        prog="jaxstow",
        description="Look into jaxstow, safetensors and npz files and checkpoint folders; check, compare, convert.",
        epilog="Paths may be fsspec URLs (s3://..., gs://..., file://...). Exit status: 0 all well, 1 damage or "
        "differences found, 2 error.",
    )
    top.add_argument("--version", action="store_true", help="print the version of jaxstow and exit")
    commands = top.add_subparsers(title="commands", dest="command", metavar="COMMAND")
    for command in _COMMANDS:
        command.add(commands)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (``sys.argv[1:]`` by default); returns the exit status."""
    top = parser()
    args = top.parse_args(argv)
    if args.version:
        print(f"jaxstow {__version__}")
        return 0
    if args.command is None:
        top.print_help()
        return 2
    try:
        status: int = args.run(args)
    except (JaxstowError, ImportError, OSError) as error:
        print(f"jaxstow {args.command}: {error}", file=sys.stderr)
        return 2
    return status
