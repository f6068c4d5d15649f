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
import subprocess
import sys
import tempfile
from pathlib import Path

from timing import format_table
from workers import free_port, run_workers

WORKER = Path(__file__).with_name("distributed_worker.py")


def run(processes: int, devices: int, mib: int) -> list[dict]:
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as folder:
        port = str(free_port())
        return run_workers(WORKER, processes, lambda i: [str(i), str(processes), str(devices), port, folder, str(mib)])


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
    tiers(mib=64)


TIERS_WORKER = Path(__file__).with_name("tiers_worker.py")


def tiers(mib: int) -> None:
    """Two tiers at 2 and 4 processes (one CPU device each) against a loopback S3 server: the time ``save`` blocks
    for and the time until a step is held (local tier with a peer's copy, or S3), and a replaced host's restore of the
    newest step from its peers against the same restore from S3."""
    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent / "tests" / "support")]  # the S3 server is the tests' own
    from seaweed import seaweed

    rows = []
    with seaweed() as server, tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as folder:
        environment = {"JAXSTOW_STORAGE_OPTIONS": json.dumps(server.storage_options)}
        for count in (2, 4):
            port, url = str(free_port()), server.url(f"tiers-{count}")
            arguments = [str(count), port, f"{folder}/{count}", url, str(mib)]
            reports = run_workers(TIERS_WORKER, count, lambda i, given=arguments: [str(i), *given], env=environment)
            figures = reports[0]["figures"]
            size = mib * (1 << 20)
            rows.append(
                [
                    str(count),
                    f"{figures['local tier save blocked']:.3f} / {figures['S3 save blocked']:.3f}",
                    f"{size / figures['local tier save'] / 1e9:.2f} / {size / figures['S3 save'] / 1e9:.2f}",
                    f"{figures['replaced host restore from peers']:.2f} / {figures['restore from S3']:.2f}",
                    f"{figures['restore from S3'] / figures['replaced host restore from peers']:.2f}x",
                ]
            )
    print(f"two tiers, {mib} MiB sharded over every process, persistent tier on a loopback S3 server:")
    headers = ["processes", "save blocked s (local / S3)", "save GB/s (local / S3)", "replaced host restore s"]
    print(format_table([*headers, "peers vs S3"], rows))


if __name__ == "__main__":
    main()
