"""``jaxstow watch FILE``: a sampling run's HDF5 file while the run goes on, refreshed until it ends or Ctrl-C.

Per chain the draws written so far; per variable (each element of an array) the mean, R-hat and bulk ESS over the
draws every chain has (ArviZ's), read in SWMR mode from any process (:mod:`jaxstow.io.live`). The run is ``finished``,
``running``, ``died`` or ``stopped`` (see ``_writer_state``); watching ends, with exit status 1, when it died or stopped.

>>> import os, tempfile, jax.numpy as jnp
>>> from jaxstow import io
>>> from jaxstow.cli import main
>>> def start():                                # two chains that wander: R-hat says so
...     return {"x": jnp.array([0.0, 10.0])}
>>> def step(state, t):                            # the next state, its draws, which chains go on
...     x = state["x"] + jnp.sin(t)
...     return {"x": x}, {"x": x}, jnp.ones(2, bool)
>>> path = os.path.join(tempfile.mkdtemp(), "run.h5")
>>> _ = io.run_chains(path, start, step, num_steps=40, checkpoint_every=10)
>>> main(["watch", path, "--once"])
/.../run.h5: finished, 2 chains
chain  draws  state
0         40  finished
1         40  finished
variable  mean   r_hat  ess_bulk
x         5.895  1.810         4
0
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import json
import math
import os
import stat
import sys
import time
import warnings
from typing import Any

import numpy as np

from jaxstow._storage.lock import Holder
from jaxstow._util.optional import require
from jaxstow.cli.output import Table, printable
from jaxstow.errors import FormatError, JaxstowError, MissingDependencyError
from jaxstow.io.arviz_data import from_posterior
from jaxstow.io.live import FileDraws, read_draws
from jaxstow.io.swmr import SWMR_SUPERBLOCK, read_superblock

__all__ = ["HELP", "arguments", "report", "run"]

_CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear the screen
_ENDED = ("died", "stopped")  # the states of a run that ended before it finished


#: The line of ``jaxstow --help`` that names this command.
HELP = "a sampling run's draws so far: per chain the draws, per variable mean, R-hat and bulk ESS"


def arguments(parser: argparse.ArgumentParser) -> None:
    """Read the HDF5 file of a sampling run while it goes on (in SWMR mode, from another process) and print, refreshing,
    per chain the draws written so far and per variable the mean, R-hat and bulk effective sample size (ArviZ's
    diagnostics), until the run ends or Ctrl-C. The run is finished, running, died (its writer was killed) or stopped
    (its writer gave up, or the file is a copy of a run in progress, which no process writes); the exit status is 1 if
    it died or stopped."""
    parser.add_argument("file", help="the run's HDF5 file")
    parser.add_argument("--once", action="store_true", help="print once and exit, for scripts")
    parser.add_argument("--interval", type=_seconds, default=2.0, help="seconds between refreshes (default 2)")
    parser.add_argument("--json", action="store_true", help="print each refresh as one line of JSON, for scripts")


def _seconds(text: str) -> float:
    """``--interval``: a number of seconds from 0.01 to a day."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0.01 <= seconds <= 86400:  # NaN too
        raise argparse.ArgumentTypeError(f"{text!r} is no number of seconds from 0.01 to 86400")
    return seconds


def run(args: argparse.Namespace) -> int:
    clear = sys.stdout.isatty() and not args.json and not args.once
    try:
        while True:
            try:
                current = report(args.file)
            except (JaxstowError, OSError) as error:
                if args.once or isinstance(error, MissingDependencyError) or not _may_become_a_run(args.file):
                    raise  # waiting would not help: installing a package, or another file, would
                current = {"file": args.file, "state": f"waiting: {error}", "chains": [], "variables": []}
            if clear:
                sys.stdout.write(_CLEAR)
            _show(current, as_json=args.json)
            if args.once or current["state"] in ("finished", *_ENDED):
                return 1 if current["state"] in _ENDED else 0
            sys.stdout.flush()
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


def report(path: str) -> dict[str, Any]:
    """What ``watch`` shows: the run's state (and why it ended, where it did not finish), per chain its draws, per
    variable element mean, R-hat and bulk ESS."""
    now = datetime.datetime.now().isoformat(timespec="seconds")
    try:
        draws = read_draws(path)
    except (JaxstowError, OSError):  # such as a file whose writer was killed before it let readers in
        died = _died(path)
        if died is None:
            raise
        return {"file": path, "state": "died", "why": died, "time": now, "chains": [], "variables": []}
    state, why = ("finished", None) if draws.finished else _writer_state(path)
    if state in _ENDED:  # the writer may have written more before it ended, after the draws were read: read again
        with contextlib.suppress(JaxstowError, OSError):
            draws = read_draws(path)
        state, why = ("finished", None) if draws.finished else (state, why)
    return {
        "file": path,
        "state": state,
        "why": why,
        "time": now,
        "chains": [
            {"chain": chain, "draws": done, "finished": draws.finished or None}
            for chain, done in zip(draws.ids, draws.done, strict=True)
        ],
        "variables": _diagnostics(draws, path),
    }


def _writer_state(path: str) -> tuple[str, str | None]:
    """The state of a run that has not finished and, where it ended, why.

    ``died``: its writer's lock, ``FILE.lock``, names a process of this host that no longer runs, or whose id now
    names a program without the lock file open (it was killed before the run finished); ``stopped``: no writer has
    the file open (its writer gave up, on an error or Ctrl-C, or the file is a copy of a run in progress); else
    ``running``. A writer that holds no lock of jaxstow's (an ``h5py.File`` a program opened itself) counts as running
    while the file's flags say it has the file open, and one on another host while its lock stays.
    """
    copied = _copied(path)
    if copied is not None:
        return "stopped", copied
    died = _died(path)
    if died is not None:
        return "died", died
    if os.path.exists(_lock_file(path)):
        return "running", None  # under a live writer's lock
    superblock = read_superblock(path)
    if superblock.version < SWMR_SUPERBLOCK or superblock.writer is not None:  # a writer's without a lock
        return "running", (
            "as far as can be told: a writer has it open, or had it and was killed; a file the program opened itself "
            "(h5py.File) has no writer lock of jaxstow's to tell which (HDF5Collector(path) takes one)"
        )
    return "stopped", (
        "no process writes it: its writer closed it before every chain finished (an error, or Ctrl-C); run it again "
        "to continue from its last checkpoint"
    )


def _may_become_a_run(path: str) -> bool:
    """Whether a file that cannot be read as a run yet may still become one, so that watching waits for it: it does not
    exist yet, is empty, or a writer has it open (its lock, its superblock's flags, or HDF5's own lock on the file).
    Any other file (not HDF5, or an HDF5 file no one writes that holds no run) never will: watching it ends at once.
    """
    try:
        found = os.stat(path)
        if not stat.S_ISREG(found.st_mode):  # a folder, a FIFO: never a run
            return False
        if found.st_size == 0 or os.path.exists(_lock_file(path)):
            return True
        superblock = read_superblock(path)
        with open(path, "rb") as file:
            fcntl.flock(file, fcntl.LOCK_SH | fcntl.LOCK_NB)  # fails while a writer holds HDF5's lock on it
    except (FileNotFoundError, BlockingIOError):
        return True
    except (JaxstowError, OSError):
        return False
    return superblock.writer is not None


def _copied(path: str) -> str | None:
    """Why no process writes the run, if it is a copy of a run in progress when it was copied (``cp``, rsync): its
    lock file is a copy of the writer's lock file, which names another inode; else ``None``."""
    try:
        with open(_lock_file(path), "rb") as lock:
            holder, inode = Holder.parse(lock.read()), os.fstat(lock.fileno()).st_ino
    except FileNotFoundError:
        return None
    if holder is None or holder.inode in (0, inode):
        return None
    return (
        f"a copy of a run in progress when it was copied: its writer, {holder.describe()}, writes the file it was "
        "copied from, never this copy; run it again on the copy to continue from its last checkpoint"
    )


def _died(path: str) -> str | None:
    """Why the run's writer died, if its lock file (which a writer killed leaves) names a process of this host that
    no longer runs, or whose process id now names a program without the lock file open; else ``None``."""
    try:
        with open(_lock_file(path), "rb") as lock:
            holder = Holder.parse(lock.read())
    except FileNotFoundError:
        return None
    if holder is None or not holder.left(_lock_file(path)):  # a lock being taken, or held (here, or on another host)
        return None
    return (
        f"its writer, {holder.describe()}, ended before the run finished (killed, or it exited without finishing "
        "the run: it left its lock file behind); run it again to continue from its last checkpoint"
    )


def _lock_file(path: str) -> str:
    """The file of the lock that the run's writer holds (:class:`jaxstow.io.swmr.WriterLock`)."""
    return f"{path}.lock"


def _diagnostics(draws: FileDraws, path: str) -> list[dict[str, Any]]:
    """Mean, R-hat and bulk ESS of every element of every variable, over the draws that every chain has."""
    common = min(draws.done)
    if common == 0:
        return []
    for name in draws.chains[0]:
        if len({chain[name].shape[1:] if name in chain else None for chain in draws.chains}) > 1:
            shapes = sorted({str(list(chain[name].shape[1:])) if name in chain else "none" for chain in draws.chains})
            raise FormatError(
                f"the chains' draws of {name!r} differ in shape ({', '.join(shapes)}): they cannot be "
                "summed up together; io.live.read_draws reads each chain",
                file=path,
            )
    posterior = _real({name: np.stack([chain[name][:common] for chain in draws.chains]) for name in draws.chains[0]})
    rows = []
    diagnose = len(draws.chains) > 1 and common >= 4  # ArviZ's R-hat and ESS need two chains of four draws
    if diagnose:
        purpose = "jaxstow watch's R-hat and effective sample sizes"
        arviz = require("arviz", extra="arviz", purpose=purpose)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # few draws, constant draws: NaN, shown as '-'
            # Named v0, v1, ... for ArviZ: a variable named as one of its dimensions ("chain", "x_dim_0") stays apart.
            data = from_posterior({f"v{at}": values for at, values in enumerate(posterior.values())}, purpose=purpose)
            rhat, ess = arviz.rhat(data), arviz.ess(data, method="bulk")
    for at, (name, values) in enumerate(posterior.items()):
        means = values.reshape(values.shape[0] * values.shape[1], -1).mean(axis=0, dtype=np.float64)
        shape = values.shape[2:]
        for flat, index in enumerate(np.ndindex(*shape)):
            label = f"{name}[{','.join(map(str, index))}]" if shape else name
            row = {"variable": label, "mean": _number(means[flat]), "r_hat": None, "ess_bulk": None}
            if diagnose:
                row["r_hat"] = _number(rhat[f"v{at}"].values[index])
                row["ess_bulk"] = _number(ess[f"v{at}"].values[index])
            rows.append(row)
    return rows


def _real(posterior: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The variables in float64, as ArviZ's diagnostics take them (not bfloat16, say): a complex one as its real and
    imaginary parts, ``name.real`` and ``name.imag``."""
    real = {}
    for name, values in posterior.items():
        if np.iscomplexobj(values):
            real[f"{name}.real"], real[f"{name}.imag"] = values.real, values.imag
        else:
            real[name] = values
    return {name: values.astype(np.float64) for name, values in real.items()}


def _number(value: Any) -> float | None:
    """A finite number, else ``None`` (shown as '-', and JSON's ``null``: JSON has no NaN)."""
    number = float(value)
    return number if math.isfinite(number) else None


def _show(current: dict[str, Any], *, as_json: bool) -> None:
    if as_json:
        print(json.dumps(current), flush=True)  # one line per refresh
        return
    chains = current["chains"]
    print(f"{printable(current['file'])}: {current['state']}" + (f", {len(chains)} chains" if chains else ""))
    if current.get("why"):
        print(f"  {printable(current['why'])}")
    if not chains:
        return
    table = Table(["chain", "draws", "state"], right=["draws"])
    for chain in chains:
        table.add(chain["chain"], chain["draws"], "finished" if chain["finished"] else current["state"])
    table.show()
    variables = Table(["variable", "mean", "r_hat", "ess_bulk"], right=["mean", "r_hat", "ess_bulk"])
    for row in current["variables"]:
        variables.add(
            row["variable"],
            "-" if row["mean"] is None else f"{row['mean']:.4g}",
            "-" if row["r_hat"] is None else f"{row['r_hat']:.3f}",
            "-" if row["ess_bulk"] is None else f"{row['ess_bulk']:.0f}",
        )
    variables.show()
