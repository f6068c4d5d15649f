"""The commit protocol on jax's coordination service at 2, 4 and 8 processes (one CPU device each): how long the
processes take to agree on the steps saved (a manager's first ``should_save``), a save of a small tree (64 KiB per
process) until committed, to the store alone and with a local tier, and the key-value messages each process sets
and reads per save. The tree is small so that the protocol, not the bytes, is what is timed.

Run: ``python bench/bench_commit.py [--processes 2 4 8] [--saves 20]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from pathlib import Path

from timing import format_table
from workers import free_port, run_workers

WORKER = Path(__file__).with_name("commit_worker.py")


def run(count: int, saves: int) -> list[dict]:
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as folder:
        port = str(free_port())
        return run_workers(WORKER, count, lambda i: [str(i), str(count), port, folder, str(saves)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--saves", type=int, default=20)
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"bench_commit at {commit or 'an unknown commit'}, load average {os.getloadavg()[0]:.1f}")
    rows = []
    for count in args.processes:
        reports = run(count, args.saves)
        first, other = reports[0], reports[-1]
        for kind in ("store", "tiers"):
            rows.append(
                [
                    str(count),
                    "store alone" if kind == "store" else "local tier + store",
                    f"{max(report[kind]['agree'] for report in reports) * 1000:.1f}",
                    f"{max(report[kind]['save'] for report in reports) * 1000:.1f}",
                    f"{first[kind]['sets']:.1f} / {first[kind]['reads']:.1f}",
                    f"{other[kind]['sets']:.1f} / {other[kind]['reads']:.1f}",
                ]
            )
        print(f"{count} processes: {len(first['keys left'])} keys left in jax's key-value store")
    header = ["processes", "saving to", "agree ms", "save ms", "process 0 sets / reads", "others sets / reads"]
    print(format_table(header, rows))


if __name__ == "__main__":
    main()
