"""Multi-process restores that read each shared box once and gather it over jax's collectives (gloo, 1 CPU device
per process), side by side with every process reading what it holds, rounds interleaved, medians:

- ``--processes`` (4) processes restore ``ROWS`` MiB of rows (sharded) and ``REP`` MiB replicated from a SeaweedFS bucket behind a proxy
  capping the bandwidth of all clients together at ``--mib-per-s`` (``capped_proxy.py`` of the project's shared
  tools, which counts the bytes it serves): the default against ``broadcast_restore=False``.
  Targets: >= 2x the speed, the bucket serving <= 1.1x the model.
- 2 processes from a local disk: the default (every process reads there) against ``broadcast_restore=False``, and
  reading once forced. Target: the default >= 0.9x.
- As many processes with a local tier: a replaced host (process 1's local directory wiped) restores from its peers, against
  the same step from the capped bucket. Target: >= 1.5x faster, no bytes from the bucket.
- The sockets jaxstow listens on in a default save and restore, in every process of the first two cases (those of
  jax's own collectives left out). Target: none.

Run: ``python bench/bench_collectives.py [--rows 32] [--rep 64] [--mib-per-s 48] [--processes 4]``. The proxy is found at
``$JAXSTOW_CAPPED_PROXY`` or in a ``shared/tools`` folder beside the repository's; without it the bench says so.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from timing import format_table
from workers import free_port, run_workers

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "support"))
WORKER = HERE / "collectives_worker.py"


def proxy_script() -> Path | None:
    """The capped proxy: ``$JAXSTOW_CAPPED_PROXY``, else ``shared/tools/capped_proxy.py`` in a parent folder."""
    given = os.environ.get("JAXSTOW_CAPPED_PROXY")
    if given:
        return Path(given)
    for parent in HERE.parents:
        found = parent / "shared" / "tools" / "capped_proxy.py"
        if found.exists():
            return found
    return None


class Proxy:
    """The capped proxy in front of the S3 server, started for one case; ``stop()`` gives the bytes it served."""

    def __init__(self, script: Path, endpoint: str, mib_per_s: float) -> None:
        upstream = endpoint.removeprefix("http://")
        command = [sys.executable, str(script), "--upstream", upstream, "--mib-per-s", str(mib_per_s)]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        self.endpoint = self.process.stdout.readline().split()[-1]

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        out, _ = self.process.communicate(timeout=30)
        return int(out.split("served ")[-1].split()[0])


def run(mode: str, count: int, folder: str, url: str, sizes: tuple[int, int], environment: dict[str, str]) -> dict:
    """The workers' figures of one case: per method the slowest process's median seconds and the bytes all fetched."""
    port = str(free_port())
    arguments = [str(count), port, folder, url, *map(str, sizes)]
    reports = run_workers(WORKER, count, lambda i: [mode, str(i), *arguments], env=environment)
    return {
        "model": reports[0]["model"],
        "seconds": {name: max(report["seconds"][name] for report in reports) for name in reports[0]["seconds"]},
        "fetched": {name: sum(report["fetched"][name] for report in reports) for name in reports[0]["fetched"]},
        "total": sum(report["total_fetched"] for report in reports),
        "listening": sum(report["listening"] or 0 for report in reports),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--rep", type=int, default=64)
    parser.add_argument("--mib-per-s", type=float, default=48.0)
    parser.add_argument("--processes", type=int, default=4, help="in the capped cases")
    args = parser.parse_args()
    from seaweed import seaweed

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(
        f"bench_collectives at {commit or 'an unknown commit'}: {args.rows} MiB of rows + {args.rep} MiB replicated, "
        f"1 CPU device per process, gloo, load average {os.getloadavg()[0]:.1f}"
    )
    script = proxy_script()
    sizes = (args.rows, args.rep)
    rows = []
    listening = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as folder:
        found = run("local", 2, f"{folder}/local", "", sizes, {})
        listening["2 local"] = found["listening"]
        seconds = found["seconds"]
        ratio = seconds["every process reads"] / seconds["default"]
        rows.append(
            [
                "local disk",
                "2",
                f"{seconds['default']:.2f} / {seconds['every process reads']:.2f}",
                f"{ratio:.2f}x (>= 0.9 {'PASS' if ratio >= 0.9 else 'MISS'})",
                "-",
                f"read once, forced: {seconds['read once (forced)']:.2f} s",
            ]
        )
        if script is None:
            print("capped_proxy.py not found (set JAXSTOW_CAPPED_PROXY): the capped S3 cases are left out")
        else:
            with seaweed() as server:
                for mode, label in (("s3", "capped S3"), ("tiers", "replaced host")):
                    proxy = Proxy(script, server.endpoint, args.mib_per_s)
                    capped = {**server.storage_options, "client_kwargs": {"endpoint_url": proxy.endpoint}}
                    environment = {
                        "JAXSTOW_STORAGE_OPTIONS": json.dumps(server.storage_options),
                        "JAXSTOW_CAPPED_OPTIONS": json.dumps(capped),
                    }
                    try:
                        found = run(mode, args.processes, f"{folder}/{mode}", server.url(mode), sizes, environment)
                    finally:
                        served = proxy.stop()
                    rows.append(_row(label, args.processes, found, served))
                    if mode == "s3":
                        listening[f"{args.processes} capped S3"] = found["listening"]
    sockets, processes = sum(listening.values()), " + ".join(case.split()[0] for case in listening)
    found_in = ", ".join(f"{count} in {case}" for case, count in listening.items())
    verdict = f"{sockets} (0 {'PASS' if sockets == 0 else 'MISS'})"
    rows.append(["own listening sockets", processes, "-", verdict, "-", f"default save + restore: {found_in}"])
    headers = ["case", "processes", "seconds (ours / theirs)", "speed-up (target)", "bucket / model", "notes"]
    print(format_table(headers, rows))


def _row(label: str, processes: int, found: dict, served: int) -> list[str]:
    """A capped case's row: ours against theirs, the bytes fetched over the model, and what the proxy served."""
    seconds, fetched, model = found["seconds"], found["fetched"], found["model"]
    if label == "capped S3":
        ours, theirs, target = "default", "every process reads", 2.0
        bound = f"<= 1.1 {'PASS' if fetched[ours] / model <= 1.1 else 'MISS'}"
    else:
        ours, theirs, target = "replaced host from peers", "from the bucket", 1.5
        bound = f"data bytes 0: {'PASS' if fetched[ours] < (1 << 20) else 'MISS'}"
    ratio = seconds[theirs] / seconds[ours]
    return [
        label,
        str(processes),
        f"{seconds[ours]:.2f} / {seconds[theirs]:.2f}",
        f"{ratio:.2f}x (>= {target:g} {'PASS' if ratio >= target else 'MISS'})",
        f"{fetched[ours] / model:.3f} / {fetched[theirs] / model:.3f} ({bound})",
        f"in all: proxy served {served / 2**20:.0f} MiB, clients counted {found['total'] / 2**20:.0f} MiB",
    ]


if __name__ == "__main__":
    main()
