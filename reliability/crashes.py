"""Faults of the machine: writers killed with SIGKILL, two writers at once, a full disk, read-only folders."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np

import jaxstow
from jaxstow._storage.atomic import TEMPORARY_MARKER
from jaxstow.errors import JaxstowError
from reliability import kill_target
from reliability.outcomes import Result, attempt, same

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- killed and concurrent writers ----------------------------------------------------------------------------------


class _Forker:
    """The writer factory of :mod:`reliability.kill_target`, in its own process."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "reliability.kill_target"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ask(self, command: str) -> str:
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(command + "\n")
        self._process.stdin.flush()
        return self._process.stdout.readline().strip()

    def kill_after(self, command: str, delay: float) -> None:
        pid = int(self.ask(command))
        time.sleep(delay)
        os.kill(pid, signal.SIGKILL)
        assert self._process.stdout is not None
        self._process.stdout.readline()  # "reaped"

    def close(self) -> None:
        assert self._process.stdin is not None
        self._process.stdin.close()
        self._process.wait()


@contextlib.contextmanager
def _forker() -> Iterator[_Forker]:
    forker = _Forker()
    try:
        yield forker
    finally:
        forker.close()


def _temporaries(folder: str) -> list[str]:
    return [name for name in os.listdir(folder) if TEMPORARY_MARKER in name]


def killed_saves(trials: int, rng: random.Random) -> Result:
    """``jaxstow.save`` SIGKILLed at a random moment, over and over; the file must be whole, old or new, and the next
    save must leave no temporary file."""
    result = Result("SIGKILL during jaxstow.save")
    with tempfile.TemporaryDirectory() as folder, _forker() as forker:
        path = os.path.join(folder, "model.jxs")
        version = 0
        left = 0
        for _ in range(trials):
            forker.kill_after(f"save {path} {version + 1}", rng.uniform(0.0, 0.3))
            problems = []
            if os.path.exists(path):
                restored = jaxstow.load(path, as_numpy=True)
                if not kill_target.is_whole(restored):
                    problems.append("torn file")
                version = max(version, restored["version"])
            left += len(_temporaries(folder))
            version += 1
            jaxstow.save(path, kill_target.tree(version))
            if _temporaries(folder):
                problems.append(f"temporary files left after the next save: {_temporaries(folder)}")
            result.add("lost" if problems else "harmless", "; ".join(problems))
    result.notes.insert(0, f"{left} temporary files found after kills, all removed by the next save")
    return result


def killed_checkpoint_saves(trials: int, rng: random.Random) -> Result:
    """``CheckpointManager.save`` SIGKILLed at a random moment; every listed step must restore whole, none may be
    damaged, and the next manager's save must leave no temporary folder."""
    result = Result("SIGKILL during CheckpointManager.save")
    left = 0
    with tempfile.TemporaryDirectory() as root, _forker() as forker:
        step = 0
        for _ in range(trials):
            forker.kill_after(f"ckpt {root} {step + 1}", rng.uniform(0.0, 0.4))
            problems = []
            reader = jaxstow.CheckpointManager(root)
            if reader.damaged_steps():
                problems.append(f"damaged steps: {reader.damaged_steps()}")
            for committed in reader.steps():
                if not kill_target.is_whole(reader.restore(committed, as_numpy=True)["params"]):
                    problems.append(f"step {committed} is torn")
            step = max([step, *reader.steps()]) + 1
            left += len(_temporaries(root))
            with jaxstow.CheckpointManager(root, keep_last=2) as manager:
                manager.save(step, {"params": kill_target.tree(step)})
            if _temporaries(root):
                problems.append(f"temporary entries left after the next save: {_temporaries(root)}")
            result.add("lost" if problems else "harmless", "; ".join(problems))
    result.notes.insert(0, f"{left} unfinished steps found after kills, all removed by the next manager")
    return result


def two_writers(trials: int, rng: random.Random) -> Result:
    """Two processes saving the same file at once while it is read; a second checkpoint manager on a directory.

    Each trial is one load during the race (it must be a whole version) or one attempt of a second manager (it must
    be refused).
    """
    del rng
    result = Result("two writers")
    with tempfile.TemporaryDirectory() as folder, _forker() as forker:
        path = os.path.join(folder, "model.jxs")
        jaxstow.save(path, kill_target.tree(0))
        # the forker answers once both writers are done; meanwhile this thread reads the file
        thread = threading.Thread(target=forker.ask, args=(f"race {path} 1 {max(trials // 2, 2)}",))
        thread.start()
        while thread.is_alive() and result.trials < trials - 1:
            outcome, note = attempt(lambda: kill_target.is_whole(jaxstow.load(path, as_numpy=True)), True)
            result.add(outcome, note)
        thread.join()
        leftovers = _temporaries(folder)
        result.add("lost" if leftovers else "harmless", f"temporary files left by finished saves: {leftovers}")
        with jaxstow.CheckpointManager(os.path.join(folder, "run")) as manager:
            manager.save(0, {"params": kill_target.tree(0)})
            manager.wait()
            answer = forker.ask(f"lock {os.path.join(folder, 'run')}")
        result.add("detected" if answer == "refused" else "lost", f"a second manager was {answer}")
    return result


# -- full disks and read-only folders -------------------------------------------------------------------------------


@contextlib.contextmanager
def _tmpfs(size: str) -> Iterator[str | None]:
    """A fresh tmpfs of ``size`` (when this process may mount one), else ``None``."""
    folder = tempfile.mkdtemp()
    mounted = (
        os.geteuid() == 0
        and shutil.which("mount") is not None
        and (
            subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", folder], capture_output=True
            ).returncode
            == 0
        )
    )
    try:
        yield folder if mounted else None
    finally:
        if mounted:
            subprocess.run(["umount", folder], check=True)
        os.rmdir(folder)


def disk_full(trials: int, rng: random.Random) -> Result:
    """Saves (native, npz, checkpoint steps) that run out of space on a small tmpfs; the previous file or step must
    stay whole and no temporary file may remain."""
    result = Result("disk full (8 MiB tmpfs)")
    with _tmpfs("8m") as folder:
        if folder is None:
            result.skipped = "needs root and mount to make a small tmpfs"
            return result
        small = {"w": np.arange(1000, dtype=np.float32)}
        for trial in range(trials):
            kind = ("model.jxs", "model.npz", "checkpoint")[trial % 3]
            big = {"w": np.full(rng.randint(3, 12) << 20, trial, np.float32)}  # 12 to 48 MiB: never fits
            problems = []
            try:
                if kind == "checkpoint":
                    root = os.path.join(folder, "run")
                    with jaxstow.CheckpointManager(root) as manager:
                        if not manager.steps():
                            manager.save(0, small)
                            manager.wait()
                        manager.save(max(manager.steps()) + 1, big)
                else:
                    path = os.path.join(folder, kind)
                    if not os.path.exists(path):
                        jaxstow.save(path, small)
                    jaxstow.save(path, big)
            except (OSError, JaxstowError):
                outcome = "detected"
            else:
                outcome, problems = "lost", ["a save that cannot fit reported success"]
            if kind == "checkpoint":
                reader = jaxstow.CheckpointManager(os.path.join(folder, "run"))
                if reader.damaged_steps() or not same(reader.restore(0, as_numpy=True), small):
                    problems.append("the previous step was harmed")
            elif not same(jaxstow.load(os.path.join(folder, kind), as_numpy=True), small):
                problems.append("the previous file was harmed")
            leftovers = _temporaries(folder) + _temporaries(os.path.join(folder, "run")) if kind == "checkpoint" else []
            leftovers += _temporaries(folder)
            if leftovers:
                problems.append(f"temporary files left: {sorted(set(leftovers))}")
            result.add("lost" if problems else outcome, "; ".join(problems))
    return result


@contextlib.contextmanager
def _read_only_folder() -> Iterator[tuple[str | None, Callable[[], None]]]:
    """A folder and a function that makes it read-only: a tmpfs remounted read-only when this process may mount one,
    else a folder whose mode forbids writing (which binds every user but root); ``None`` if neither works."""
    with _tmpfs("16m") as mounted:
        if mounted is not None:
            yield mounted, lambda: subprocess.run(["mount", "-o", "remount,ro", mounted], check=True)
            return
        if os.geteuid() == 0:
            yield None, lambda: None
            return
        folder = tempfile.mkdtemp()

        def protect() -> None:
            for path, _, _ in os.walk(folder):
                os.chmod(path, 0o555)

        try:
            yield folder, protect
        finally:
            for path, _, _ in os.walk(folder):
                os.chmod(path, 0o755)
            shutil.rmtree(folder)


def read_only_folders(trials: int, rng: random.Random) -> Result:
    """A folder that cannot be written: saves must fail cleanly and leave no file, loads and restores must work."""
    del rng
    result = Result("read-only folders")
    with _read_only_folder() as (folder, protect):
        if folder is None:
            result.skipped = "as root, needs mount for a read-only tmpfs (file modes do not stop root)"
            return result
        small = {"w": np.arange(10, dtype=np.float32)}
        for name in ("model.jxs", "model.npz"):
            jaxstow.save(os.path.join(folder, name), small)
        with jaxstow.CheckpointManager(os.path.join(folder, "run")) as manager:
            manager.save(0, small)
        protect()
        for trial in range(trials):
            kind = ("model.jxs", "model.npz", "checkpoint")[trial % 3]
            try:
                if kind == "checkpoint":
                    with jaxstow.CheckpointManager(os.path.join(folder, "run")) as manager:
                        manager.save(trial + 1, small)
                else:
                    jaxstow.save(os.path.join(folder, kind), {"w": np.zeros(3)})
            except (OSError, JaxstowError):
                outcome, note = "detected", ""
            else:
                outcome, note = "lost", "a save into a read-only folder reported success"
            if kind == "checkpoint":
                restored = jaxstow.CheckpointManager(os.path.join(folder, "run")).restore(as_numpy=True)
            else:
                restored = jaxstow.load(os.path.join(folder, kind), as_numpy=True)
            if not same(restored, small):
                outcome, note = "lost", "the saved data cannot be read back unchanged"
            result.add(outcome, note)
    return result
