"""One process of a ``jax.distributed`` run that tests the peer transport: ``peer_worker.py ACTION PROCESS COUNT PORT
FOLDER``.

``exchange`` sends every other process a small and a large message (4 MiB, seeded) and receives theirs in the other
order; ``stall`` stops process ``COUNT - 1`` (SIGSTOP, by itself) while the others wait for a message from it and send
it 64 MiB; ``hostile`` prints each process's pid, address and the run's secret, then process 0 expects ``first``,
``big`` and ``damaged`` (at most 1000 bytes each) and ``late`` (1 MiB, seeded) from process 1 and prints ``ready``,
while process 1 connects (sending ``first``) only once the file ``FOLDER/connect`` exists and sends ``late`` once
``FOLDER/go`` exists (the test attacks process 0 meanwhile and writes the number of its connections into ``connect``:
process 0 reports the connections it refused once it refused as many, or after 60 s); ``copy`` saves a step of
3 x 16 MiB with a local tier whose copies go to peers, process ``--victim`` sending itself ``--signal`` (KILL or STOP)
halfway through sending its file, never having read a byte of process 0's; ``replaced`` saves a step,
closes the manager, wipes process ``--victim``'s local directory and restores the step with a new manager, reporting
the bytes each process received from its peers and its share of the tree. Each prints one JSON line of what it saw
(errors, with the seconds each took to come).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import threading
import time

parser = argparse.ArgumentParser()
parser.add_argument("action", choices=["exchange", "stall", "hostile", "copy", "replaced"])
parser.add_argument("process", type=int)
parser.add_argument("count", type=int)
parser.add_argument("port", type=int)
parser.add_argument("folder")
parser.add_argument("--timeout", type=float, default=3.0)
parser.add_argument("--victim", type=int, default=1)
parser.add_argument("--signal", choices=["KILL", "STOP"], default="KILL")
args = parser.parse_args()
os.environ["JAXSTOW_HOST_NAME"] = f"host{args.process}"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(
    f"127.0.0.1:{args.port}", num_processes=args.count, process_id=args.process, heartbeat_timeout_seconds=120
)

import numpy as np  # noqa: E402

from jaxstow._coordination import Coordinator  # noqa: E402
from jaxstow.checkpoint.peer_copies import open_transport  # noqa: E402
from jaxstow.errors import CheckpointError  # noqa: E402

me, others = args.process, [k for k in range(args.count) if k != args.process]
report: dict = {"process": me}


def payload(source: int, to: int, size: int) -> bytes:
    return np.random.default_rng(1000 * source + to).integers(0, 255, size, dtype=np.uint8).tobytes()


def attempt(name: str, action) -> None:
    began = time.monotonic()
    try:
        action()
        report[name] = "ok"
    except CheckpointError as error:
        report[name] = {"error": str(error), "seconds": time.monotonic() - began}


def say(line: dict) -> None:
    print(json.dumps(line), flush=True)


def tree(step: int, rows: int):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((args.count,), ("x",))
    values = {"w": np.random.default_rng(step).standard_normal((rows, 1024), dtype=np.float32)}
    values["r"] = values["w"][0] * 3
    shardings = {"w": NamedSharding(mesh, P("x")), "r": NamedSharding(mesh, P())}
    arrays = {
        name: jax.make_array_from_callback(value.shape, shardings[name], lambda index, v=value: v[index])
        for name, value in values.items()
    }
    return values, arrays


def manager(base: str):
    from jaxstow import CheckpointManager, LocalTier

    return CheckpointManager(
        os.path.join(base, "persistent"),
        local=LocalTier(os.path.join(base, f"local{me}")),
        save_every=100,
        process_timeout=args.timeout,
    )


def end(transport=None) -> None:
    """Every process has what it needs before any leaves (process 0 hosts the coordination service)."""
    say(report)
    if transport is not None and args.action not in ("stall", "copy"):
        for other in others:
            transport.send(other, "done", b"")
        for other in others:
            transport.receive(other, "done", limit=0)
        transport.close()
    if args.action in ("stall", "copy"):
        time.sleep(60)  # killed by the test
    os._exit(0)


if args.action in ("copy", "replaced"):
    from jaxstow._storage import peer_wire

    base = args.folder
    if args.action == "copy":
        if me == args.victim:
            whole = peer_wire.file_pieces

            def halfway(file, offset, length):
                for number, piece in enumerate(whole(file, offset, length)):
                    if number == 8:  # 8 MiB of a 16 MiB file sent
                        say({"process": me, "stopping": True})
                        os.kill(os.getpid(), getattr(signal, f"SIG{args.signal}"))
                    yield piece

            peer_wire.file_pieces = halfway
            from jaxstow._storage.peers import PeerTransport

            claim = PeerTransport._claim

            def held(transport, connection, source, tag):
                if source == 0:  # never read: process 0 cannot hand all its file to the kernel before the signal
                    threading.Event().wait()
                return claim(transport, connection, source, tag)

            PeerTransport._claim = held
        values, arrays = tree(1, 4096 * args.count)  # 16 MiB of rows per process
        saving = manager(base)
        attempt("save", lambda: (saving.save(1, {"params": arrays}), saving.wait()))
        end()
    values, arrays = tree(1, 1024 * args.count)  # 4 MiB of rows per process
    with manager(base) as saving:
        saving.save(1, {"params": arrays})
    with Coordinator("replaced-test", timeout=args.timeout).conversation("wiped") as talk:
        if me == args.victim:
            shutil.rmtree(os.path.join(base, f"local{me}"))
        talk.barrier("wiped", waiting_for="its local directory")
    restoring = manager(base)
    like = {"params": {name: jax.numpy.zeros_like(array) for name, array in arrays.items()}}
    restored = restoring.restore(like=like)
    for name, want in values.items():
        for shard in restored["params"][name].addressable_shards:
            np.testing.assert_array_equal(np.asarray(shard.data), want[shard.index])
    transport = restoring._tiers.peers.transport  # type: ignore[union-attr]
    share = sum(shard.data.nbytes for array in arrays.values() for shard in array.addressable_shards)
    report.update(restored=restoring.restored.step, received=transport.received, share=share)
    report["own"] = sorted(os.listdir(os.path.join(base, f"local{me}", f"process-{me}", "1")))
    end(transport)

transport = open_transport(Coordinator("peer-test", timeout=args.timeout))
if args.action == "exchange":
    small = {other: transport.expect(other, "small", limit=100) for other in others}
    large = {other: transport.expect(other, "large", limit=8 << 20) for other in others}
    for other in others:
        transport.send(other, "large", payload(me, other, 4 << 20))
        transport.send(other, "small", f"from {me}".encode())
    report["small"] = {other: bytes(small[other].wait()).decode() for other in others}  # type: ignore[arg-type]
    report["large"] = {other: large[other].wait() == payload(other, me, 4 << 20) for other in others}
elif args.action == "stall":
    victim = args.count - 1
    if me == victim:
        say(report)
        os.kill(os.getpid(), signal.SIGSTOP)
    attempt("receive", lambda: transport.receive(victim, "never", limit=10))
    attempt("send", lambda: transport.send(victim, "large", payload(me, victim, 64 << 20)))
elif args.action == "hostile":
    from jaxstow._util import jax_compat

    stored = jax_compat.distributed_client().key_value_dir_get("jaxstow/")  # process 0 deleted the secret
    report["secret stored"] = any(transport._secret.hex() in str(value) for _, value in stored)
    say({"process": me, "pid": os.getpid(), "address": transport.address, "secret": transport._secret.hex()})
    if me == 1:
        for signal_file, tag, data in (("connect", "first", b"x"), ("go", "late", payload(1, 0, 1 << 20))):
            while not os.path.exists(os.path.join(args.folder, signal_file)):
                time.sleep(0.05)
            transport.send(0, tag, data)
            say({"sent": tag})
    else:
        expected = {tag: transport.expect(1, tag, limit=1000) for tag in ("first", "big", "damaged")}
        late = transport.expect(1, "late", limit=1 << 20)
        say({"ready": True})
        for tag, pending in expected.items():
            attempt(tag, pending.wait)
        report["late"] = late.wait() == payload(1, 0, 1 << 20)
        with open(os.path.join(args.folder, "connect")) as told:
            strangers = int(told.read())
        deadline = time.monotonic() + 60
        while transport.refused < strangers and time.monotonic() < deadline:  # taken as the machine gets to them
            time.sleep(0.05)
        report.update(refused=transport.refused, threads=threading.active_count())
end(transport)
