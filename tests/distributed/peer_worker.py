"""One process of a ``jax.distributed`` run that tests the peer transport: ``peer_worker.py ACTION PROCESS COUNT PORT``.

``exchange`` sends every other process a small and a large message (4 MiB, seeded) and receives theirs in the other
order; ``stall`` stops process ``COUNT - 1`` (SIGSTOP, by itself) while the others wait for a message from it and send
it 64 MiB; ``corrupt`` has process 1 send process 0 a message whose checksum does not match its bytes, then a good one.
Each prints one JSON line of what it saw (errors, with the seconds each took to come).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

parser = argparse.ArgumentParser()
parser.add_argument("action", choices=["exchange", "stall", "corrupt"])
parser.add_argument("process", type=int)
parser.add_argument("count", type=int)
parser.add_argument("port", type=int)
parser.add_argument("--timeout", type=float, default=3.0)
args = parser.parse_args()

import jax  # noqa: E402

jax.distributed.initialize(
    f"127.0.0.1:{args.port}", num_processes=args.count, process_id=args.process, heartbeat_timeout_seconds=120
)

import numpy as np  # noqa: E402

from jaxstow._storage.peers import PeerTransport, frame_header  # noqa: E402
from jaxstow.errors import CheckpointError  # noqa: E402

peers = PeerTransport.start("test", timeout=args.timeout)
me, others = peers.process_index, [k for k in range(args.count) if k != args.process]
report: dict = {"process": me}


def payload(source: int, to: int, size: int) -> np.ndarray:
    return np.random.default_rng(1000 * source + to).integers(0, 255, size, dtype=np.uint8)


def attempt(name: str, action) -> None:
    began = time.monotonic()
    try:
        action()
        report[name] = "ok"
    except CheckpointError as error:
        report[name] = {"error": str(error), "seconds": time.monotonic() - began}


if args.action == "exchange":
    for other in others:
        peers.send(other, "large", payload(me, other, 4 << 20))
        peers.send(other, "small", f"from {me}".encode())
    report["small"] = {other: bytes(peers.receive(other, "small")).decode() for other in others}
    report["large"] = {
        other: bool(np.array_equal(np.frombuffer(peers.receive(other, "large"), np.uint8), payload(other, me, 4 << 20)))
        for other in others
    }
elif args.action == "stall":
    victim = args.count - 1
    if me == victim:
        print(json.dumps(report), flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    attempt("receive", lambda: peers.receive(victim, "never"))
    attempt("send", lambda: peers.send(victim, "large", payload(me, victim, 64 << 20)))
elif args.action == "corrupt":
    if me == 1:
        data = b"x" * 1000
        peers.send(0, "warm-up", b"")
        connection = peers._outgoing[0]
        connection.sendall(frame_header(1, "bad", data, checksum="0" * 16) + data)
        peers.send(0, "good", data)
    if me == 0:
        peers.receive(1, "warm-up")
        attempt("bad", lambda: peers.receive(1, "bad"))
        report["good"] = len(peers.receive(1, "good"))
alive = [other for other in others if args.action != "stall" or other != args.count - 1]
for other in alive:  # every process has what it needs before any leaves (process 0 hosts the coordination service)
    peers.send(other, "done", b"")
for other in alive:
    peers.receive(other, "done")
print(json.dumps(report), flush=True)
peers.close()
os._exit(0)
