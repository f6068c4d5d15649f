"""Multi-process benchmark: 2 processes x 2 CPU devices save a sharded tree (1 GiB by default) with
``CheckpointManager``, with orbax's ``StandardCheckpointer`` and with raw writes + fsync, then restore it onto a mesh
of another shape. Prints aggregate GB/s, ratios to the raw limit and to orbax, and the bytes each process read
against the bytes its devices need.

Targets (issue "sharded arrays across devices and processes"): save >= 0.9x raw and >= 3x orbax.

Run: ``python bench/bench_distributed.py [--mib 1024] [--processes 2] [--devices 2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from timing import format_table

WORKER = Path(__file__).with_name("distributed_worker.py")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run(processes: int, devices: int, mib: int) -> list[dict]:
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as folder:
        port = str(free_port())
        workers = [
            subprocess.Popen(
                [sys.executable, str(WORKER), str(i), str(processes), str(devices), port, folder, str(mib)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(processes)
        ]
        outputs = [worker.communicate()[0] for worker in workers]
        if any(worker.returncode for worker in workers):
            raise SystemExit(f"a worker failed: {outputs}")
        return [json.loads(output.strip().splitlines()[-1]) for output in outputs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--devices", type=int, default=2)
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(
        f"bench_distributed at {commit or 'an unknown commit'}: {args.processes} processes x {args.devices} devices, "
        f"{args.mib} MiB, load average {os.getloadavg()[0]:.1f}"
    )
    reports = run(args.processes, args.devices, args.mib)
    figures = reports[0]["figures"]
    size = reports[0]["bytes"]
    rows = []
    for name in ("raw save", "jaxstow save", "orbax save", "jaxstow restore", "orbax restore"):
        seconds = figures[name]
        rows.append([name, f"{seconds:.2f}", f"{size / seconds / 1e9:.2f}"])
    print(format_table(["method", "seconds", "GB/s"], rows))
    save_vs_raw = figures["raw save"] / figures["jaxstow save"]
    save_vs_orbax = figures["orbax save"] / figures["jaxstow save"]
    restore_vs_orbax = figures["orbax restore"] / figures["jaxstow restore"]
    print(
        f"save: {save_vs_raw:.2f}x raw (>= 0.9: {'PASS' if save_vs_raw >= 0.9 else 'MISS'}), "
        f"{save_vs_orbax:.2f}x orbax (>= 3: {'PASS' if save_vs_orbax >= 3 else 'MISS'})"
    )
    print(f"restore onto another mesh: {restore_vs_orbax:.2f}x orbax's speed")
    print(f"checkpoint.json: {reports[0]['record_bytes']} bytes for {args.processes} processes")
    for report in reports:
        ratio = report["read"] / report["needed"]
        print(
            f"process {report['process']}: jaxstow's restore read {ratio:.3f}x the bytes its devices need, headers "
            f"and record included (<= 1.05: {'PASS' if ratio <= 1.05 else 'MISS'})"
        )


if __name__ == "__main__":
    main()
