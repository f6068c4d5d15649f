"""Replicas at 2, 4 and 8 processes (1 CPU device each): the writing of replicated arrays shared by every process
holding them, and a restore from S3 (a loopback SeaweedFS, uncapped) of as many data-parallel replicas as processes
that reads each byte once and gathers it over jax's collectives (the default for an object store), against every
process reading what it needs.

A ``MIB`` MiB row-sharded array and a ``MIB`` MiB replicated one are saved; each process's share of the written bytes
is reported (goal: the largest within 10% of the smallest), then the step is restored with both arrays replicated on
every process: bytes fetched from S3 / model bytes (goal <= 1.1) and the restore time against every process reading
(rounds interleaved, medians; at 8 processes on a 2-core machine the time says little).

Run: ``python bench/bench_replicas.py [--mib 32] [--processes 2 4 8]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from timing import format_table
from workers import free_port, run_workers

sys.path.insert(0, str(Path(__file__).parents[1] / "tests" / "support"))

WORKER = Path(__file__).with_name("replicas_worker.py")


def run(processes: int, mib: int, server) -> list[dict]:
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as folder:
        port = str(free_port())
        environment = {"JAXSTOW_STORAGE_OPTIONS": json.dumps(server.storage_options)}
        arguments = [str(processes), port, folder, server.url(f"replicas-{processes}"), str(mib)]
        return run_workers(WORKER, processes, lambda i: [str(i), *arguments], env=environment)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=32)
    parser.add_argument("--processes", type=int, nargs="+", default=[2, 4, 8])
    args = parser.parse_args()
    from seaweed import seaweed

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(
        f"bench_replicas at {commit or 'an unknown commit'}: {args.mib} MiB row-sharded + {args.mib} MiB replicated, "
        f"1 CPU device per process, load average {os.getloadavg()[0]:.1f}"
    )
    rows = []
    with seaweed() as server:
        for processes in args.processes:
            reports = run(processes, args.mib, server)
            written = [report["written"] for report in reports]
            model = reports[0]["model"]
            fetched = {name: sum(report["fetched"][name] for report in reports) for name in reports[0]["fetched"]}
            seconds = {name: max(report["seconds"][name] for report in reports) for name in reports[0]["seconds"]}
            balance = max(written) / min(written)
            ratio = fetched["read once"] / model
            rows.append(
                [
                    str(processes),
                    f"{max(written) / 2**20:.1f} / {min(written) / 2**20:.1f}",
                    f"{balance:.3f} ({'PASS' if balance <= 1.1 else 'MISS'})",
                    f"{ratio:.3f} ({'PASS' if ratio <= 1.1 else 'MISS'})",
                    f"{fetched['every process reads'] / model:.3f}",
                    f"{seconds['read once']:.2f}",
                    f"{seconds['every process reads']:.2f}",
                    f"{seconds['every process reads'] / seconds['read once']:.2f}x",
                ]
            )
    headers = [
        "processes",
        "written MiB max / min",
        "max / min (<= 1.1)",
        "fetched / model, read once (<= 1.1)",
        "fetched / model, every process reads",
        "restore s, read once",
        "restore s, every process reads",
        "speed-up",
    ]
    print(format_table(headers, rows))


if __name__ == "__main__":
    main()
