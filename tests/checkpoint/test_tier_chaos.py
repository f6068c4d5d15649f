"""A two-tier run of 4 real ``jax.distributed`` processes (two per host) killed together (SIGKILL) at random moments
and restarted, with 0 to 2 random local directories wiped before each restart (hosts replaced): every restart agrees
on the step it restores, checks every value it holds, and goes on saving. Seeded (``JAXSTOW_CHAOS_SEED``), so that a
failure replays; the worker is ``tests/distributed/tier_worker.py train``.
"""

from __future__ import annotations

import json
import os
import random
import select
import shutil
import subprocess
import time
from pathlib import Path

from distributed_runs import launch

WORKER = Path(__file__).parents[1] / "distributed" / "tier_worker.py"
SEED = int(os.environ.get("JAXSTOW_CHAOS_SEED", "40"))
#: Seed 40's first restarts follow wipes of a directory on each host, both of host 0's (a host replaced), and one.
CYCLES = int(os.environ.get("JAXSTOW_CHAOS_CYCLES", "4"))
SAVES = 2  # the saves each process makes after a restart before the kill may come
WAIT = 90.0  # seconds a restart may take to restore and save, on a loaded machine


def _lines(processes: list[subprocess.Popen[str]], done, *, timeout: float) -> list[list[dict]]:
    """The JSON lines each process prints, read until ``done(lines)`` holds for every process; fails on an error
    line, a process that ends, or the timeout."""
    lines: list[list[dict]] = [[] for _ in processes]
    deadline = time.monotonic() + timeout
    while not all(done(found) for found in lines):
        ready, _, _ = select.select([p.stdout for p in processes], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"not every process restored and saved within {timeout} s: {lines}"
        for index, process in enumerate(processes):
            if process.stdout in ready:
                line = process.stdout.readline()  # type: ignore[union-attr]
                assert line, f"process {index} ended ({process.wait()}): {process.stderr.read()[-3000:]}"  # type: ignore[union-attr]
                if line.startswith("{"):
                    lines[index].append(json.loads(line))
                    assert "error" not in lines[index][-1], (index, lines[index][-1])
    return lines


def test_a_run_killed_at_random_moments_with_local_directories_wiped_goes_on_every_time(tmp_path):
    chooser = random.Random(SEED)
    history = []
    for cycle in range(CYCLES):
        processes = launch(
            WORKER, 4, lambda index, port: ["train", str(index), "4", str(port), str(tmp_path), "--timeout", "30"]
        )
        try:
            lines = _lines(processes, lambda found: sum("saved" in line for line in found) >= SAVES, timeout=WAIT)
            time.sleep(chooser.uniform(0.0, 0.5))  # the kill lands anywhere in a save: held, written, copied
        finally:
            for process in processes:
                process.kill()
                process.communicate()
        restored = {line["restored"] for found in lines for line in found if "restored" in line}
        assert len(restored) == 1, f"cycle {cycle}: the processes restored different steps: {lines}"
        (step,) = restored
        first = [next(line["saved"] for line in found if "saved" in line) for found in lines]
        assert len(set(first)) == 1 and (step is None or first[0] > step), (cycle, lines)
        wiped = sorted(chooser.sample(range(4), chooser.randint(0, 2)))
        for index in wiped:
            shutil.rmtree(tmp_path / f"local{index}", ignore_errors=True)
        history.append({"restored": step, "first saved": first[0], "wiped": wiped})
    print(json.dumps(history))
    assert any(entry["restored"] for entry in history), history  # the run got past its first steps
